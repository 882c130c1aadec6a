//! Reading the agent-sandbox controller's answers, pure: a `Sandbox` (or `SandboxClaim`)
//! status → whether the session is ready, still coming up, refused, or over, with a reason a user
//! can act on.
//!
//! The rules follow the controller's own source (kubernetes-sigs/agent-sandbox v0.5.6,
//! `controllers/sandbox_controller.go` `computeReadyCondition` and friends, and the condition
//! docs in `api/v1beta1/sandbox_types.go`):
//!
//! - `Ready` is authoritative. `Suspended` is *not* consulted: the controller never clears it on
//!   resume, so a stale `Suspended=True (PodTerminated)` sits beside `Ready=True` (field case
//!   N14 a). `Ready=True` still waits for `status.podIPs` and for `observedGeneration` to catch
//!   up with `metadata.generation` (N14 e).
//! - `Ready=False` reasons: `DependenciesNotReady` (coming up; see `PodScheduled` below),
//!   `ReconcilerError` (the controller's last pass failed: when its message is the API server
//!   refusing the pod — quota, PodSecurity, an unknown RuntimeClass, an invalid spec — that is
//!   final; anything else is retried by the controller), `MultiplePods`, `SandboxSuspended`,
//!   `PodSucceeded` / `PodFailed` (the pod is terminal, with `Finished=True`), `SandboxExpired`.
//! - `PodScheduled` mirrors the pod's condition verbatim: `False/Unschedulable` means no node
//!   can run it (the scheduler's message says why).
//!
//! The controller emits no Event for any of these (its only Event is `MultiplePods`); Events the
//! kubelet writes about the pod (image pulls, crash loops) are read by [`failure_from_event`].

use k8s_openapi::api::core::v1::Event;
use serde::{Deserialize, Serialize};

/// `Sandbox.status` (lenient: every field optional).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    #[serde(default, rename = "serviceFQDN", skip_serializing_if = "Option::is_none")]
    pub service_fqdn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<SandboxCondition>,
    #[serde(default, rename = "podIPs", skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, rename = "selector", skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
}

/// A `metav1.Condition`, read leniently (a missing `lastTransitionTime` is no error here).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// What a status says about bring-up (or about a running session, for liveness).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// `Ready=True`, observed at the current generation, with a pod IP.
    Ready,
    /// Still coming up (or the controller will retry); the controller's message, if any.
    Pending(String),
    /// It will not become ready (or stopped being ready for good); the reason in words.
    Failed(String),
    /// It reached its `shutdownTime` (`SandboxExpired`): over as designed, not a failure.
    Expired(String),
}

/// The message for an expired sandbox.
pub const EXPIRED: &str =
    "the sandbox reached its maximum lifetime (its shutdownTime passed; see LAP_K8S_MAX_LIFETIME)";

fn with_message(what: String, message: &str) -> String {
    let m = message.trim();
    if m.is_empty() {
        what
    } else {
        format!("{what}: {m}")
    }
}

/// Whether a `ReconcilerError` message is the API server refusing the pod for good (admission:
/// ResourceQuota, PodSecurity, RuntimeClass, LimitRange; or validation), with a hint.
fn refusal(message: &str) -> Option<String> {
    let lower = message.to_ascii_lowercase();
    let refused = lower.contains(" is forbidden") || lower.contains(" is invalid") || lower.contains("forbidden:");
    if !refused {
        return None;
    }
    let hint = if lower.contains("exceeded quota") {
        "the namespace's ResourceQuota does not allow this sandbox; free capacity, raise the quota or lower the agent's resources"
    } else if lower.contains("podsecurity") {
        "the namespace's Pod Security level refuses the pod; label it pod-security.kubernetes.io/enforce=privileged (deploy/base/namespace.yaml) or set LAP_K8S_TRANSPARENT=false"
    } else if lower.contains("runtimeclass") {
        "the runtime class is not installed on this cluster; check LAP_K8S_RUNTIME_CLASS or the agent's runtime_class"
    } else if lower.contains("must be less than or equal to")
        || lower.contains("limitrange")
        || lower.contains("maximum")
    {
        "the pod's resources are outside what the namespace allows; check LAP_K8S_HARNESS_REQUESTS/LIMITS or the agent's resources"
    } else {
        "the cluster refused the sandbox pod"
    };
    Some(with_message(hint.to_owned(), message))
}

fn cond<'a>(conditions: &'a [SandboxCondition], t: &str) -> Option<&'a SandboxCondition> {
    conditions.iter().find(|c| c.type_ == t)
}

/// Read a Sandbox's status. `generation` is its `metadata.generation` (a `Ready` observed at
/// an older generation is stale).
pub fn readiness(generation: Option<i64>, status: Option<&SandboxStatus>) -> Readiness {
    let Some(status) = status else {
        return Readiness::Pending("the controller has not reported yet".into());
    };
    let conditions = status.conditions.as_slice();
    // Expiry first: the controller keeps `Finished` across expiry (`setSandboxExpiredCondition`),
    // so a Sandbox whose pod had ended and which then expired is over as designed.
    if cond(conditions, "Ready").is_some_and(|r| r.status == "False" && r.reason == "SandboxExpired") {
        return Readiness::Expired(EXPIRED.to_owned());
    }
    // A terminal pod, whatever Ready says (N14 b).
    if let Some(f) = cond(conditions, "Finished").filter(|c| c.status == "True") {
        let reason = if f.reason.is_empty() {
            "Finished"
        } else {
            f.reason.as_str()
        };
        return Readiness::Failed(with_message(format!("the sandbox pod stopped ({reason})"), &f.message));
    }
    let Some(ready) = cond(conditions, "Ready") else {
        return Readiness::Pending("the controller has not reported Ready yet".into());
    };
    let stale = matches!((generation, ready.observed_generation), (Some(g), Some(o)) if o < g);
    if ready.status == "True" {
        if stale {
            return Readiness::Pending(format!(
                "Ready was observed at generation {} of {}",
                ready.observed_generation.unwrap_or_default(),
                generation.unwrap_or_default()
            ));
        }
        if status.pod_ips.is_empty() {
            return Readiness::Pending("Ready, but the pod has no IP yet".into());
        }
        return Readiness::Ready;
    }
    match ready.reason.as_str() {
        "PodSucceeded" | "PodFailed" => Readiness::Failed(with_message(
            format!("the sandbox pod stopped ({})", ready.reason),
            &ready.message,
        )),
        "MultiplePods" => Readiness::Failed(with_message(
            "more than one pod is controlled by this Sandbox (MultiplePods); delete the extra pod".to_owned(),
            &ready.message,
        )),
        "SandboxSuspended" => {
            Readiness::Failed("the Sandbox was suspended (spec.operatingMode: Suspended) outside LAP".to_owned())
        }
        "ReconcilerError" => match refusal(&ready.message) {
            Some(why) => Readiness::Failed(why),
            None => Readiness::Pending(ready.message.clone()),
        },
        _ => {
            if let Some(s) =
                cond(conditions, "PodScheduled").filter(|c| c.status == "False" && c.reason == "Unschedulable")
            {
                return Readiness::Failed(with_message(
                    "no node can run the sandbox (Unschedulable); add capacity or check node selectors, taints, the runtime class and the agent's resources".to_owned(),
                    &s.message,
                ));
            }
            Readiness::Pending(ready.message.clone())
        }
    }
}

/// A pod `Event` (the kubelet's) that means bring-up will not succeed, as a reason a user can act
/// on; `None` for ordinary progress (Scheduled, Pulling, Started, a transient FailedMount…).
/// Scheduling and admission failures are read from the Sandbox's conditions instead.
pub fn failure_from_event(ev: &Event) -> Option<String> {
    if ev.type_.as_deref() != Some("Warning") {
        return None;
    }
    let reason = ev.reason.as_deref().unwrap_or_default();
    let message = ev.message.as_deref().unwrap_or_default().trim();
    let lower = message.to_ascii_lowercase();
    let pull = || {
        Some(format!(
            "an image could not be pulled; check the image name (LAP_K8S_VAULT_IMAGE / LAP_K8S_HARNESS_IMAGE) and pull access: {message}"
        ))
    };
    match reason {
        "ErrImagePull" | "ImagePullBackOff" | "InspectFailed" | "ErrImageNeverPull" => pull(),
        "Failed" if lower.contains("pull") || lower.contains("image") => pull(),
        "BackOff" if lower.contains("pulling image") || lower.contains("pull") => pull(),
        "BackOff" | "CrashLoopBackOff"
            if lower.contains("restarting failed container") || reason == "CrashLoopBackOff" =>
        {
            Some(format!(
                "a container keeps crashing (CrashLoopBackOff); see `kubectl logs` for the pod: {message}"
            ))
        }
        "FailedCreatePodSandBox" if lower.contains("runtimeclass") || lower.contains("runtime handler") => {
            Some(format!(
            "the runtime class cannot run the pod; check LAP_K8S_RUNTIME_CLASS or the agent's runtime_class: {message}"
        ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn c(t: &str, s: &str, reason: &str, message: &str) -> SandboxCondition {
        SandboxCondition {
            type_: t.into(),
            status: s.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: Some(1),
            last_transition_time: Some("2026-01-01T00:00:00Z".into()),
        }
    }

    fn st(conditions: Vec<SandboxCondition>, ips: &[&str]) -> SandboxStatus {
        SandboxStatus {
            conditions,
            pod_ips: ips.iter().map(|s| (*s).to_owned()).collect(),
            ..SandboxStatus::default()
        }
    }

    fn read(conditions: Vec<SandboxCondition>, ips: &[&str]) -> Readiness {
        readiness(Some(1), Some(&st(conditions, ips)))
    }

    #[test]
    fn nothing_reported_is_pending() {
        assert!(matches!(readiness(None, None), Readiness::Pending(_)));
        assert!(matches!(read(vec![], &[]), Readiness::Pending(_)));
        assert!(matches!(
            read(vec![c("Ready", "False", "DependenciesNotReady", "Pod exists with phase: Pending")], &[]),
            Readiness::Pending(m) if m.contains("phase: Pending")
        ));
    }

    /// N14 (a): a stale Suspended=True from an earlier stop does not hide Ready.
    #[test]
    fn n14a_stale_suspended_does_not_hide_ready() {
        let mut suspended = c(
            "Suspended",
            "True",
            "PodTerminated",
            "Pod has been terminated. Sandbox is suspended",
        );
        suspended.last_transition_time = Some("2025-12-31T00:00:00Z".into());
        let r = read(
            vec![
                suspended,
                c("Ready", "True", "DependenciesReady", "Pod is Ready; Service Exists"),
            ],
            &["10.0.0.7"],
        );
        assert_eq!(r, Readiness::Ready);
    }

    /// N14 (b): Ready=False/PodFailed with Finished=True fails, naming PodFailed.
    #[test]
    fn n14b_pod_failed_with_finished_fails() {
        let r = read(
            vec![
                c("Finished", "True", "PodFailed", "Pod failed"),
                c("Ready", "False", "PodFailed", "Pod failed"),
            ],
            &[],
        );
        assert!(
            matches!(r, Readiness::Failed(ref m) if m.contains("PodFailed")),
            "{r:?}"
        );
        // Ready=False/PodFailed alone (Finished not written yet) is already final.
        let r = read(vec![c("Ready", "False", "PodFailed", "Pod failed")], &[]);
        assert!(
            matches!(r, Readiness::Failed(ref m) if m.contains("PodFailed")),
            "{r:?}"
        );
    }

    /// N14 (c): PodSucceeded is never "creating".
    #[test]
    fn n14c_pod_succeeded_is_not_pending() {
        let r = read(
            vec![c("Ready", "False", "PodSucceeded", "Pod completed successfully")],
            &[],
        );
        assert!(
            matches!(r, Readiness::Failed(ref m) if m.contains("PodSucceeded")),
            "{r:?}"
        );
    }

    /// N14 (d): SandboxExpired is its own outcome (the session ends `dead` with it).
    #[test]
    fn n14d_expired() {
        let r = read(vec![c("Ready", "False", "SandboxExpired", "Sandbox has expired")], &[]);
        assert_eq!(r, Readiness::Expired(EXPIRED.to_owned()));
        // The controller keeps Finished across expiry: still an expiry, not a failure.
        let r = read(
            vec![
                c("Finished", "True", "PodSucceeded", "Pod completed successfully"),
                c("Ready", "False", "SandboxExpired", "Sandbox has expired"),
            ],
            &[],
        );
        assert_eq!(r, Readiness::Expired(EXPIRED.to_owned()));
    }

    /// N14 (e): Ready=True without a pod IP, or observed at an older generation, is not ready.
    #[test]
    fn n14e_ready_needs_ips_and_the_current_generation() {
        let ready = || c("Ready", "True", "DependenciesReady", "Pod is Ready; Service Exists");
        assert!(matches!(read(vec![ready()], &[]), Readiness::Pending(_)));
        let stale = readiness(Some(2), Some(&st(vec![ready()], &["10.0.0.7"])));
        assert!(
            matches!(stale, Readiness::Pending(ref m) if m.contains("generation 1 of 2")),
            "{stale:?}"
        );
        assert_eq!(
            readiness(Some(1), Some(&st(vec![ready()], &["10.0.0.7"]))),
            Readiness::Ready
        );
    }

    /// The messages the API server gives when admission refuses the pod, as the controller
    /// copies them into `Ready=False/ReconcilerError` ("Error seen: " + the create error).
    #[test]
    fn refused_pods_fail_with_the_clusters_message() {
        let cases = [
            (
                "Error seen: pods \"lap-ses-1\" is forbidden: exceeded quota: sandboxes, requested: pods=1, used: pods=4, limited: pods=4",
                "ResourceQuota",
            ),
            (
                "Error seen: pods \"lap-ses-1\" is forbidden: violates PodSecurity \"baseline:latest\": non-default capabilities (container \"lap-netfilter\" must not include \"NET_ADMIN\", \"NET_RAW\" in securityContext.capabilities.add)",
                "pod-security.kubernetes.io/enforce=privileged",
            ),
            (
                "Error seen: pods \"lap-ses-1\" is forbidden: pod rejected: RuntimeClass \"gvisor\" not found",
                "LAP_K8S_RUNTIME_CLASS",
            ),
            (
                "Error seen: Pod \"lap-ses-1\" is invalid: spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1",
                "resources",
            ),
        ];
        for (message, hint) in cases {
            let r = read(vec![c("Ready", "False", "ReconcilerError", message)], &[]);
            let Readiness::Failed(why) = r else {
                panic!("{message}: {r:?}")
            };
            assert!(why.contains(hint), "{why}");
            assert!(why.contains(message), "the cluster's message is kept: {why}");
        }
        // A transient controller error is retried by the controller: still pending.
        let r = read(
            vec![c(
                "Ready",
                "False",
                "ReconcilerError",
                "Error seen: service get failed: etcdserver: request timed out",
            )],
            &[],
        );
        assert!(matches!(r, Readiness::Pending(_)), "{r:?}");
    }

    #[test]
    fn unschedulable_multiple_pods_and_suspended_fail() {
        let r = read(
            vec![
                c(
                    "PodScheduled",
                    "False",
                    "Unschedulable",
                    "0/3 nodes are available: 3 Insufficient memory.",
                ),
                c(
                    "Ready",
                    "False",
                    "DependenciesNotReady",
                    "Pod exists with phase: Pending",
                ),
            ],
            &[],
        );
        assert!(
            matches!(r, Readiness::Failed(ref m) if m.contains("Unschedulable") && m.contains("Insufficient memory")),
            "{r:?}"
        );
        // Gated or not yet reported scheduling is still coming.
        let r = read(
            vec![
                c(
                    "PodScheduled",
                    "False",
                    "SchedulingGated",
                    "Scheduling is blocked due to non-empty scheduling gates",
                ),
                c(
                    "Ready",
                    "False",
                    "DependenciesNotReady",
                    "Pod exists with phase: Pending",
                ),
            ],
            &[],
        );
        assert!(matches!(r, Readiness::Pending(_)));
        let r = read(
            vec![c(
                "Ready",
                "False",
                "MultiplePods",
                "multiple Pods (2) are controlled by this Sandbox; refusing to choose or create a Pod",
            )],
            &[],
        );
        assert!(
            matches!(r, Readiness::Failed(ref m) if m.contains("MultiplePods")),
            "{r:?}"
        );
        let r = read(
            vec![c("Ready", "False", "SandboxSuspended", "Sandbox is suspended")],
            &[],
        );
        assert!(
            matches!(r, Readiness::Failed(ref m) if m.contains("suspended")),
            "{r:?}"
        );
    }

    #[test]
    fn status_parses_leniently() {
        let parsed: SandboxStatus = serde_json::from_value(serde_json::json!({
            "serviceFQDN": "x.ns.svc.cluster.local",
            "service": "x",
            "podIPs": ["10.1.2.3"],
            "conditions": [{"type": "Ready", "status": "True", "observedGeneration": 3}]
        }))
        .unwrap();
        assert_eq!(parsed.service_fqdn.as_deref(), Some("x.ns.svc.cluster.local"));
        assert_eq!(readiness(Some(3), Some(&parsed)), Readiness::Ready);
        assert!(matches!(readiness(Some(4), Some(&parsed)), Readiness::Pending(_)));
    }

    fn event(type_: &str, reason: &str, message: &str) -> Event {
        Event {
            type_: Some(type_.into()),
            reason: Some(reason.into()),
            message: Some(message.into()),
            ..Event::default()
        }
    }

    #[test]
    fn kubelet_events_to_failure_reasons() {
        let f = |t, r, m| failure_from_event(&event(t, r, m));
        let pull = f("Warning", "Failed", "Failed to pull image \"nope:1\": not found").unwrap();
        assert!(
            pull.contains("image could not be pulled") && pull.contains("nope:1"),
            "{pull}"
        );
        assert!(f("Warning", "BackOff", "Back-off pulling image \"nope:1\"")
            .unwrap()
            .contains("image could not be pulled"));
        let crash = f(
            "Warning",
            "BackOff",
            "Back-off restarting failed container harness in pod lap-ses-1_ns(uid)",
        )
        .unwrap();
        assert!(crash.contains("CrashLoopBackOff"), "{crash}");
        assert!(f(
            "Warning",
            "FailedCreatePodSandBox",
            "no runtime handler for runtimeclass gvisor"
        )
        .unwrap()
        .contains("LAP_K8S_RUNTIME_CLASS"));
        // Progress and transient warnings are not failures; nor is an Event the agent-sandbox
        // controller never writes for its pods (FailedCreate is the ReplicaSet controller's).
        assert_eq!(f("Normal", "Pulling", "Pulling image \"x\""), None);
        assert_eq!(f("Normal", "Scheduled", "Successfully assigned"), None);
        assert_eq!(f("Warning", "FailedMount", "secret \"x\" not found"), None);
        assert_eq!(f("Warning", "Unhealthy", "Startup probe failed"), None);
        assert_eq!(
            f("Warning", "FailedCreate", "pods \"x\" is forbidden: exceeded quota"),
            None
        );
    }
}
