//! The Kubernetes backend against a fake API server that runs a port of the agent-sandbox
//! v0.5.6 controllers (`support/fake_kube.rs`): the real kube-rs client, watcher and backend;
//! the tests play the kubelet and the scheduler (pod phases, readiness, kubelet Events) and the
//! admission plugins (quota, PodSecurity, RuntimeClass). Every object the backend writes passes
//! the real CRD / Kubernetes schemas, or the fake answers 422 as the API server would. The
//! harness is a stand-in on loopback (pod IP 127.0.0.1), except in the warm-pool test, which runs
//! the real `lap-harness` and `vault-sidecar` binaries.

#![allow(clippy::unwrap_used)]

use crate::support::fake_kube;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fake_kube::FakeKube;
use lap_control_plane::backend::kubernetes::KubernetesBackend;
use lap_control_plane::backend::sandbox::{PodSettings, SandboxApiVersion};
use lap_control_plane::backend::{BackendError, Liveness, Placement, SandboxBackend, SandboxHandle, SandboxSpec};
use lap_test_support::{eventually, eventually_ok, eventually_true};
use lap_vault_config::{SecretSpec, SecretsFile};
use serde_json::{json, Value};

const NS: &str = "lap-test";
const IP: &str = "127.0.0.1";

/// A harness stand-in on loopback: `GET /healthz` reports `phase` (503 until
/// `harness_listening`), as `lap-harness` does.
struct Harness {
    port: u16,
    phase: Arc<Mutex<&'static str>>,
}

impl Harness {
    async fn start(phase: &'static str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Mutex::new(phase));
        let p = shared.clone();
        let app = axum::Router::new().route(
            "/healthz",
            axum::routing::get(move || {
                let phase = *p.lock().unwrap();
                async move {
                    let code = if phase == "harness_listening" { 200 } else { 503 };
                    (
                        axum::http::StatusCode::from_u16(code).unwrap(),
                        axum::Json(json!({"phase": phase})),
                    )
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { port, phase: shared }
    }

    fn set(&self, phase: &'static str) {
        *self.phase.lock().unwrap() = phase;
    }
}

fn settings(harness_port: u16) -> PodSettings {
    PodSettings {
        namespace: NS.into(),
        api_version: SandboxApiVersion::V1beta1,
        vault_image: "lap/vault-sidecar:test".into(),
        harness_image: "lap/harness-{harness_id}:test".into(),
        harness_images: BTreeMap::new(),
        netfilter_image: "lap/vault-sidecar:test".into(),
        runtime_class: Some("gvisor".into()),
        transparent: true,
        max_lifetime: Duration::from_secs(3600),
        harness_port,
        base: Default::default(),
        upstream_cas: vec![],
        harness_resources: lap_control_plane::model::Resources {
            requests: BTreeMap::from([("cpu".into(), "500m".into()), ("memory".into(), "1Gi".into())]),
            limits: BTreeMap::from([("memory".into(), "4Gi".into())]),
        },
        vault_admin_port: lap_control_plane::backend::sandbox::VAULT_ADMIN_PORT,
        warm_pools: BTreeMap::new(),
    }
}

fn spec(session: &str) -> SandboxSpec {
    SandboxSpec {
        session_id: session.into(),
        harness_id: "claude-code".into(),
        model: None,
        prompt: None,
        repo_url: None,
        branch: None,
        allow_out: vec![],
        deny_out: vec![],
        secrets: vec![SecretSpec {
            name: "ANTHROPIC_API_KEY".into(),
            stub: "sk-ant-api03-lapstub-0000000000".into(),
            value: Some("sk-ant-api03-REALVALUE-1111".into()),
            hosts: vec!["api.anthropic.com".into()],
            ..SecretSpec::default()
        }],
        harness_token: "harness-token-1".into(),
        tools: None,
        mcp_servers: Vec::new(),
        env: Default::default(),
        placement: Placement::default(),
        phases: None,
    }
}

struct Setup {
    fake: FakeKube,
    backend: Arc<KubernetesBackend>,
    harness: Harness,
}

async fn setup_with(f: impl FnOnce(&mut PodSettings)) -> Setup {
    let fake = FakeKube::start().await;
    let harness = Harness::start("harness_listening").await;
    let mut st = settings(harness.port);
    f(&mut st);
    let backend = Arc::new(KubernetesBackend::new(fake.client(), st).unwrap());
    Setup { fake, backend, harness }
}

async fn setup() -> Setup {
    setup_with(|_| {}).await
}

fn name_of(session: &str) -> String {
    lap_control_plane::backend::sandbox::sandbox_name(session)
}

fn secret_text(secret: &Value, key: &str) -> String {
    use base64::Engine;
    let b64 = secret["data"][key].as_str().unwrap();
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).unwrap()).unwrap()
}

fn watches<'a>(log: &'a [String], plural: &str) -> Vec<&'a String> {
    log.iter()
        .filter(|l| l.starts_with("GET ") && l.contains(&format!("/{plural}?")) && l.contains("watch=true"))
        .collect()
}

/// Wait until the backend has judged every change to the Sandbox `name` so far: a watch on
/// sandboxes has resumed from its current resourceVersion or later. Watches must be cut after
/// each event (`cut_next_watches`), so that each resumption follows the judging of one event.
async fn wait_judged(fake: &FakeKube, name: &str) {
    let sb = fake.get("sandboxes", NS, name).expect("the Sandbox exists");
    let rv: u64 = sb["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
    fake.wait_requests("the watch to resume past the last change", |log| {
        watches(log, "sandboxes").iter().any(|w| {
            w.split(['?', '&'])
                .find_map(|kv| kv.strip_prefix("resourceVersion="))
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|from| from >= rv)
        })
    })
    .await;
}

fn lists<'a>(log: &'a [String], plural: &str) -> Vec<&'a String> {
    log.iter()
        .filter(|l| l.starts_with("GET ") && l.contains(&format!("/{plural}?")) && !l.contains("watch=true"))
        .collect()
}

type Created = tokio::task::JoinHandle<Result<SandboxHandle, BackendError>>;

/// Start a create in the background.
fn start_create(backend: &Arc<KubernetesBackend>, spec: SandboxSpec) -> Created {
    let b = backend.clone();
    tokio::spawn(async move { b.create(spec).await })
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("timed out")
}

/// Create a session and bring its pod to Ready (the kubelet's part).
async fn ready_session(s: &Setup, session: &str) -> SandboxHandle {
    let task = start_create(&s.backend, spec(session));
    let pod = s.fake.wait_pod(NS, &name_of(session)).await;
    s.fake.pod_running(NS, &pod, IP, true);
    within(task).await.unwrap().unwrap()
}

/// Create → Sandbox + Secret of the right shape → the controller makes the pod and Service →
/// Ready (after a watch that ended and was resumed from its resourceVersion, without a new list)
/// → harness health → handle.
#[tokio::test]
async fn create_waits_for_ready_across_a_resumed_watch() {
    let Setup { fake, backend, .. } = setup().await;
    fake.cut_next_watches("sandboxes", usize::MAX);
    let task = start_create(&backend, spec("ses_one"));

    let name = "lap-ses-one";
    let sb = fake.wait_object("sandboxes", NS, name).await;
    assert_eq!(sb["apiVersion"], "agents.x-k8s.io/v1beta1");
    assert_eq!(sb["metadata"]["labels"]["lap.dev/session"], "ses_one");
    assert_eq!(sb["spec"]["service"], true);
    assert_eq!(sb["spec"]["shutdownPolicy"], "Retain");
    let pod = &sb["spec"]["podTemplate"]["spec"];
    assert_eq!(pod["runtimeClassName"], "gvisor");
    assert_eq!(pod["initContainers"][1]["startupProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(pod["containers"][0]["resources"]["requests"]["cpu"], "500m");
    let text = sb.to_string();
    assert!(
        !text.contains("REALVALUE") && !text.contains("harness-token-1"),
        "{text}"
    );

    // The Secret: real values, only in it, owned (not blocking) by the Sandbox.
    let secret = fake.wait_object("secrets", NS, "lap-ses-one-vault").await;
    assert!(secret_text(&secret, "secrets.json").contains("sk-ant-api03-REALVALUE-1111"));
    let owner = eventually(
        Duration::from_secs(20),
        "the Secret gets its owner reference",
        || async {
            let s = fake.get("secrets", NS, "lap-ses-one-vault").unwrap();
            s["metadata"]["ownerReferences"].get(0).cloned()
        },
    )
    .await;
    assert_eq!(
        (owner["kind"].as_str(), owner["name"].as_str()),
        (Some("Sandbox"), Some(name))
    );
    assert_eq!(owner["uid"], sb["metadata"]["uid"]);
    assert_eq!(
        owner["blockOwnerDeletion"], false,
        "the Role has no sandboxes/finalizers"
    );

    // The controller made the pod and the Service; the pod is not Ready yet.
    let pod = fake.wait_pod(NS, name).await;
    assert_eq!(pod, name);
    fake.wait_object("services", NS, name).await;
    // The kubelet starts the pod (not Ready yet). Every watch ends after one event; the
    // watcher resumes from its resourceVersion each time, without listing again.
    fake.wait_requests("the first watch", |l| !watches(l, "sandboxes").is_empty())
        .await;
    fake.pod_running(NS, &pod, IP, false);
    fake.wait_requests("the watch to be resumed", |l| watches(l, "sandboxes").len() >= 2)
        .await;
    let log = fake.requests();
    assert!(watches(&log, "sandboxes")[1].contains("resourceVersion="), "{log:#?}");
    assert_eq!(
        lists(&log, "sandboxes").len(),
        1,
        "resumed without a new list: {log:#?}"
    );
    wait_judged(&fake, name).await;
    assert!(!task.is_finished(), "ready before the Ready condition");

    fake.pod_running(NS, &pod, IP, true);
    let handle = within(task).await.unwrap().unwrap();
    assert!(
        handle.harness_url.starts_with("http://127.0.0.1:"),
        "{}",
        handle.harness_url
    );
    assert_eq!(handle.harness_token, "harness-token-1");
    assert_eq!(handle.sidecar_admin_url, "http://127.0.0.1:14323");
    let secret = fake.get("secrets", NS, "lap-ses-one-vault").unwrap();
    assert_eq!(secret_text(&secret, "admin_token"), handle.sidecar_admin_token);
    assert_eq!(backend.liveness(&handle).await, Liveness::Running);

    // Rotation rewrites secrets.json in the Secret (stub kept), retrying a 409 Conflict.
    fake.fail_next("PUT", "secrets", 409, "Conflict");
    backend
        .rotate_secret(
            &handle,
            "ANTHROPIC_API_KEY",
            "sk-ant-api03-ROTATED-2222",
            &["api.anthropic.com".into()],
            &[],
        )
        .await
        .unwrap();
    let secret = fake.get("secrets", NS, "lap-ses-one-vault").unwrap();
    let file: SecretsFile = serde_json::from_str(&secret_text(&secret, "secrets.json")).unwrap();
    assert_eq!(file.secrets[0].value.as_deref(), Some("sk-ant-api03-ROTATED-2222"));
    assert_eq!(file.secrets[0].stub, "sk-ant-api03-lapstub-0000000000");

    // Delete removes the Sandbox, its Secret, and (garbage collection) its pod and Service.
    backend.destroy(&handle).await;
    for (plural, n) in [
        ("sandboxes", name),
        ("secrets", "lap-ses-one-vault"),
        ("pods", name),
        ("services", name),
    ] {
        assert!(fake.get(plural, NS, n).is_none(), "{plural}/{n} left");
    }
    assert!(matches!(backend.liveness(&handle).await, Liveness::Gone(_)));
    backend.destroy(&handle).await; // idempotent
}

/// The harness's bring-up phases show while the pod is not Ready: the backend reads them from
/// the harness's `/healthz` at the pod IP.
#[tokio::test]
async fn harness_phases_show_before_ready() {
    let s = setup().await;
    s.harness.set("cloning_repo");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut sp = spec("ses_phases");
    sp.phases = Some(tx);
    let task = start_create(&s.backend, sp);
    let pod = s.fake.wait_pod(NS, &name_of("ses_phases")).await;
    s.fake.pod_running(NS, &pod, IP, false);
    let mut seen = Vec::new();
    wait_for_phase(&mut rx, &mut seen, "cloning_repo").await;
    s.harness.set("installing_deps");
    wait_for_phase(&mut rx, &mut seen, "installing_deps").await;
    s.harness.set("harness_listening");
    s.fake.pod_running(NS, &pod, IP, true);
    within(task).await.unwrap().unwrap();
    let order: Vec<&str> = seen.iter().copied().filter(|p| p.contains('_')).collect();
    assert!(order.starts_with(&["cloning_repo"]), "{seen:?}");
    assert!(
        seen.contains(&"creating-sandbox") && seen.contains(&"starting-sandbox"),
        "{seen:?}"
    );
}

async fn wait_for_phase(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<&'static str>,
    seen: &mut Vec<&'static str>,
    want: &str,
) {
    while let Some(p) = within(rx.recv()).await {
        seen.push(p);
        if p == want {
            return;
        }
    }
    panic!("the phases ended before {want}: {seen:?}");
}

/// Kubelet Events that mean the pod will never be ready become a `failure_reason` in words,
/// and everything created is deleted again.
#[tokio::test]
async fn kubelet_events_become_failure_reasons() {
    let s = setup().await;
    let cases = [
        (
            "ses_pull",
            "Failed",
            "Failed to pull image \"lap/harness-claude-code:test\": not found",
            "image could not be pulled",
        ),
        (
            "ses_pullbo",
            "BackOff",
            "Back-off pulling image \"lap/vault-sidecar:test\"",
            "image could not be pulled",
        ),
        (
            "ses_crash",
            "BackOff",
            "Back-off restarting failed container harness in pod lap-ses-crash",
            "CrashLoopBackOff",
        ),
    ];
    for (session, reason, message, expect) in cases {
        let task = start_create(&s.backend, spec(session));
        let name = name_of(session);
        let pod = s.fake.wait_pod(NS, &name).await;
        // Ordinary progress first: not a failure.
        s.fake
            .add_event(NS, &pod, "Normal", "Scheduled", "Successfully assigned");
        s.fake.add_event(NS, &pod, "Warning", reason, message);
        let err = within(task).await.unwrap().unwrap_err().to_string();
        assert!(err.contains(expect) && err.contains(message), "{session}: {err}");
        assert!(
            s.fake.get("sandboxes", NS, &name).is_none(),
            "{session}: Sandbox left behind"
        );
        assert!(
            s.fake.get("secrets", NS, &format!("{name}-vault")).is_none(),
            "{session}: Secret left behind"
        );
        assert!(s.fake.get("pods", NS, &name).is_none(), "{session}: pod left behind");
    }
}

/// When the cluster refuses the pod (quota, PodSecurity, an unknown RuntimeClass), the
/// controller emits no Event: it sets `Ready=False/ReconcilerError` with the API server's
/// message. The session fails at once with that message and a hint, not after the create
/// timeout.
#[tokio::test]
async fn pods_the_cluster_refuses_fail_fast_with_its_message() {
    let s = setup().await;
    let session_of = |pod: &Value| {
        pod["metadata"]["labels"]["lap.dev/session"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    s.fake.admission(move |pod| {
        if session_of(pod) == "ses_quota" {
            return Err("exceeded quota: sandboxes, requested: limits.memory=4608Mi, used: limits.memory=16Gi, limited: limits.memory=16Gi".into());
        }
        Ok(())
    });
    s.fake.admission(|pod| {
        let caps = pod["spec"]["initContainers"].as_array().into_iter().flatten().any(|c| {
            c["securityContext"]["capabilities"]["add"].as_array().is_some_and(|a| a.contains(&json!("NET_ADMIN")))
        });
        if caps && pod["metadata"]["labels"]["lap.dev/session"] == "ses_psa" {
            return Err("violates PodSecurity \"baseline:latest\": non-default capabilities (container \"lap-netfilter\" must not include \"NET_ADMIN\", \"NET_RAW\" in securityContext.capabilities.add)".into());
        }
        Ok(())
    });
    s.fake.admission(|pod| match pod["spec"]["runtimeClassName"].as_str() {
        Some("gvisor") | None => Ok(()),
        Some(rc) => Err(format!("pod rejected: RuntimeClass \"{rc}\" not found")),
    });
    let mut kata = spec("ses_rc");
    kata.placement.runtime_class = Some("kata".into());
    let cases = [
        (spec("ses_quota"), "ResourceQuota", "exceeded quota: sandboxes"),
        (
            spec("ses_psa"),
            "pod-security.kubernetes.io/enforce=privileged",
            "violates PodSecurity",
        ),
        (
            kata,
            "runtime class is not installed",
            "RuntimeClass \"kata\" not found",
        ),
    ];
    for (sp, hint, message) in cases {
        let session = sp.session_id.clone();
        let started = Instant::now();
        let err = within(s.backend.create(sp)).await.unwrap_err().to_string();
        assert!(err.contains(hint) && err.contains(message), "{session}: {err}");
        assert!(started.elapsed() < Duration::from_secs(20), "{session}: not fast");
        let name = name_of(&session);
        assert!(
            s.fake.get("sandboxes", NS, &name).is_none(),
            "{session}: Sandbox left behind"
        );
        assert!(
            s.fake.get("secrets", NS, &format!("{name}-vault")).is_none(),
            "{session}: Secret left behind"
        );
    }
    // No Event was needed, and the fake controller wrote none.
    assert!(s.fake.list("events", NS).is_empty());
}

/// `PodScheduled=False/Unschedulable` (mirrored from the pod), a terminal pod, and a second pod
/// under one Sandbox (`MultiplePods`) each fail the session with their reason.
#[tokio::test]
async fn unschedulable_terminal_and_multiple_pods_fail() {
    let s = setup().await;
    let task = start_create(&s.backend, spec("ses_sched"));
    let pod = s.fake.wait_pod(NS, &name_of("ses_sched")).await;
    s.fake
        .pod_unschedulable(NS, &pod, "0/3 nodes are available: 3 Insufficient memory.");
    let err = within(task).await.unwrap().unwrap_err().to_string();
    assert!(
        err.contains("Unschedulable") && err.contains("Insufficient memory"),
        "{err}"
    );

    // N14 (b): the pod failed: Ready=False/PodFailed, Finished=True.
    let task = start_create(&s.backend, spec("ses_podfail"));
    let pod = s.fake.wait_pod(NS, &name_of("ses_podfail")).await;
    s.fake.pod_phase(NS, &pod, "Failed");
    let err = within(task).await.unwrap().unwrap_err().to_string();
    assert!(err.contains("PodFailed"), "{err}");

    // N14 (c): PodSucceeded is never "creating".
    let task = start_create(&s.backend, spec("ses_podok"));
    let pod = s.fake.wait_pod(NS, &name_of("ses_podok")).await;
    s.fake.pod_phase(NS, &pod, "Succeeded");
    let err = within(task).await.unwrap().unwrap_err().to_string();
    assert!(err.contains("PodSucceeded"), "{err}");

    let task = start_create(&s.backend, spec("ses_multi"));
    let name = name_of("ses_multi");
    let pod = s.fake.wait_pod(NS, &name).await;
    let mut extra = s.fake.get("pods", NS, &pod).unwrap();
    extra["metadata"]["name"] = json!(format!("{name}-extra"));
    s.fake.put("pods", NS, extra);
    let err = within(task).await.unwrap().unwrap_err().to_string();
    assert!(err.contains("MultiplePods"), "{err}");
}

/// A running session's Sandbox that expires, is suspended, or whose pod completes: liveness says
/// so, with the reason (expiry is an end by design, not "stopped unexpectedly"). N15 (3): a
/// Sandbox deleted out of band takes its Secret (owner reference) with it and the session is gone.
#[tokio::test]
async fn liveness_reads_expiry_suspension_and_terminal_pods() {
    let s = setup().await;
    let h = ready_session(&s, "ses_exp").await;
    let name = name_of("ses_exp");
    let mut sb = s.fake.get("sandboxes", NS, &name).unwrap();
    sb["spec"]["shutdownTime"] = json!("2020-01-01T00:00:00Z");
    s.fake.put("sandboxes", NS, sb);
    let live = eventually_ok(Duration::from_secs(20), "liveness leaves Running", || async {
        let l = s.backend.liveness(&h).await;
        if l != Liveness::Running {
            Ok(l)
        } else {
            Err(format!("{l:?}"))
        }
    })
    .await;
    assert!(
        matches!(&live, Liveness::Ended(r) if r.contains("maximum lifetime")),
        "{live:?}"
    );
    assert!(
        s.fake.get("pods", NS, &name).is_none(),
        "the controller removed the pod at expiry"
    );
    assert!(
        s.fake.get("sandboxes", NS, &name).is_some(),
        "Retain: the Sandbox stays for LAP to read"
    );
    s.backend.destroy(&h).await;
    assert!(s.fake.get("secrets", NS, &format!("{name}-vault")).is_none());

    let h = ready_session(&s, "ses_susp").await;
    let mut sb = s.fake.get("sandboxes", NS, &name_of("ses_susp")).unwrap();
    sb["spec"]["operatingMode"] = json!("Suspended");
    s.fake.put("sandboxes", NS, sb);
    let live = s.backend.liveness(&h).await;
    assert!(
        matches!(&live, Liveness::Gone(r) if r.contains("suspended")),
        "{live:?}"
    );

    let h = ready_session(&s, "ses_done").await;
    s.fake.pod_phase(NS, &name_of("ses_done"), "Succeeded");
    let live = s.backend.liveness(&h).await;
    assert!(
        matches!(&live, Liveness::Gone(r) if r.contains("PodSucceeded")),
        "{live:?}"
    );

    let h = ready_session(&s, "ses_oob").await;
    let name = name_of("ses_oob");
    s.fake.remove("sandboxes", NS, &name);
    for (plural, n) in [
        ("secrets", format!("{name}-vault")),
        ("pods", name.clone()),
        ("services", name.clone()),
    ] {
        assert!(
            s.fake.get(plural, NS, &n).is_none(),
            "{plural}/{n} was not garbage-collected"
        );
    }
    assert!(matches!(s.backend.liveness(&h).await, Liveness::Gone(r) if r.contains("gone")));
}

/// Field case N14, with the status written directly (as another controller version leaves
/// it), through the status subresource: (a) a stale `Suspended=True` beside `Ready=True` is
/// ready; (e) `Ready=True` without pod IPs, or observed at an older generation, is not.
#[tokio::test]
async fn n14_status_combinations() {
    let s = setup().await;
    s.fake.pause_controller(true);
    s.fake.cut_next_watches("sandboxes", usize::MAX);
    let task = start_create(&s.backend, spec("ses_n14"));
    let name = name_of("ses_n14");
    let sb = s.fake.wait_object("sandboxes", NS, &name).await;
    let generation = sb["metadata"]["generation"].as_i64().unwrap();
    let c = |t: &str, st: &str, reason: &str, g: i64, ltt: &str| json!({"type": t, "status": st, "reason": reason, "message": "", "observedGeneration": g, "lastTransitionTime": ltt});
    // (e) no pod IP yet.
    s.fake.write_status(
        "sandboxes",
        NS,
        &name,
        json!({"conditions": [c("Ready", "True", "DependenciesReady", generation, "2026-01-02T00:00:00Z")]}),
    );
    // (e) an older generation's Ready.
    s.fake.write_status("sandboxes", NS, &name, json!({"podIPs": [IP], "conditions": [c("Ready", "True", "DependenciesReady", generation - 1, "2026-01-02T00:00:00Z")]}));
    wait_judged(&s.fake, &name).await;
    assert!(!task.is_finished(), "ready without a pod IP or at an old generation");
    // (a) stale Suspended=True (older) and Ready=True at this generation with an IP.
    s.fake.write_status(
        "sandboxes",
        NS,
        &name,
        json!({"podIPs": [IP], "serviceFQDN": format!("{name}.{NS}.svc.cluster.local"), "conditions": [
            c("Suspended", "True", "PodTerminated", generation, "2026-01-01T00:00:00Z"),
            c("Ready", "True", "DependenciesReady", generation, "2026-01-02T00:00:00Z"),
        ]}),
    );
    within(task).await.unwrap().unwrap();
}

/// v1alpha1 mode (controllers that serve only it) writes `service: true` too, so the controller
/// creates the Service and the Sandbox becomes Ready.
#[tokio::test]
async fn v1alpha1_sandboxes_get_their_service() {
    let s = setup_with(|st| st.api_version = SandboxApiVersion::V1alpha1).await;
    let task = start_create(&s.backend, spec("ses_alpha"));
    let name = name_of("ses_alpha");
    let sb = s.fake.wait_object("sandboxes", NS, &name).await;
    assert_eq!(sb["apiVersion"], "agents.x-k8s.io/v1alpha1");
    assert_eq!(sb["spec"]["service"], true);
    let pod = s.fake.wait_pod(NS, &name).await;
    s.fake.pod_running(NS, &pod, IP, true);
    within(task).await.unwrap().unwrap();
    assert!(s.fake.get("services", NS, &name).is_some());
    assert!(s
        .fake
        .requests()
        .iter()
        .any(|r| r.contains("/apis/agents.x-k8s.io/v1alpha1/")));
}

/// A 409 on create: a Sandbox and Secret left by an earlier attempt for the same session are
/// adopted (the Secret replaced with this attempt's values, a Conflict on that replace retried);
/// a Sandbox of another session with the name is an error.
#[tokio::test]
async fn conflict_on_create_is_handled() {
    let s = setup().await;
    let fake = &s.fake;
    fake.kubelet_auto(IP);
    fake.put(
        "secrets",
        NS,
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "lap-ses-again-vault", "labels": {"lap.dev/session": "ses_again"}},
               "data": {"admin_token": "c3RhbGU="}}),
    );
    let mut old = serde_json::to_value(
        lap_control_plane::backend::sandbox::build(
            &spec("ses_again"),
            &settings(1),
            "stale",
            // An earlier attempt a moment ago (not past its shutdownTime).
            k8s_openapi::jiff::Timestamp::now(),
        )
        .unwrap()
        .sandbox,
    )
    .unwrap();
    old["metadata"]["namespace"] = json!(NS);
    fake.put("sandboxes", NS, old);
    fake.fail_next("PUT", "secrets", 409, "Conflict");

    let handle = within(s.backend.create(spec("ses_again"))).await.unwrap();
    let secret = fake.get("secrets", NS, "lap-ses-again-vault").unwrap();
    assert_eq!(secret_text(&secret, "admin_token"), handle.sidecar_admin_token);
    assert_ne!(handle.sidecar_admin_token, "stale");
    assert!(secret_text(&secret, "secrets.json").contains("REALVALUE"));
    let log = fake.requests();
    assert!(
        log.iter().any(|r| r.starts_with("POST ") && r.contains("/sandboxes")),
        "create was tried first: {log:#?}"
    );
    assert!(
        log.iter()
            .filter(|r| r.starts_with("PUT ") && r.contains("/secrets/lap-ses-again-vault"))
            .count()
            >= 2,
        "{log:#?}"
    );

    // Same name, another session's Sandbox: refused, and it is not deleted.
    let mut foreign = fake.get("sandboxes", NS, "lap-ses-again").unwrap();
    foreign["metadata"]["labels"]["lap.dev/session"] = json!("ses_someone_else");
    fake.put("sandboxes", NS, foreign);
    let err = within(s.backend.create(spec("ses_again")))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("belongs to another session"), "{err}");
    let still = fake.get("sandboxes", NS, "lap-ses-again").unwrap();
    assert_eq!(still["metadata"]["labels"]["lap.dev/session"], "ses_someone_else");
}

/// Field case N15 (2): inventory by label: LAP's Sandboxes (and stray Secrets and claims) whose
/// session is not kept are deleted once past the grace period; kept ones, younger ones and other
/// people's Sandboxes stay.
#[tokio::test]
async fn orphaned_sandboxes_are_deleted_after_a_grace_period() {
    let s = setup_with(|st| {
        st.warm_pools.insert("codex".into(), 0);
    })
    .await;
    let fake = &s.fake;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let sandbox = |name: &str, labels: Value, created: &str| {
        json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
               "metadata": {"name": name, "labels": labels, "creationTimestamp": created},
               "spec": {"podTemplate": {"spec": {"containers": []}}}})
    };
    let lap = |s: &str| json!({"app.kubernetes.io/managed-by": "lap", "lap.dev/session": s});
    let old = "2020-01-01T00:00:00Z";
    fake.pause_controller(true);
    fake.put("sandboxes", NS, sandbox("lap-ses-keep", lap("ses_keep"), old));
    fake.put("sandboxes", NS, sandbox("lap-ses-orphan", lap("ses_orphan"), old));
    fake.put("sandboxes", NS, sandbox("lap-ses-young", lap("ses_young"), &now));
    fake.put("sandboxes", NS, sandbox("not-ours", json!({"app": "other"}), old));
    let secret = |name: &str, labels: Value| json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "labels": labels}});
    fake.put("secrets", NS, secret("lap-ses-orphan-vault", lap("ses_orphan")));
    fake.put("secrets", NS, secret("lap-ses-stray-vault", lap("ses_stray")));
    fake.put("secrets", NS, secret("lap-ses-keep-vault", lap("ses_keep")));
    fake.put(
        "secrets",
        NS,
        secret(
            "lap-pool-codex",
            json!({"app.kubernetes.io/managed-by": "lap", "lap.dev/pool": "codex"}),
        ),
    );
    fake.put(
        "sandboxclaims",
        NS,
        json!({"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
               "metadata": {"name": "lap-ses-gone", "labels": lap("ses_gone")},
               "spec": {"warmPoolRef": {"name": "lap-codex"}}}),
    );

    let keep: HashSet<String> = ["ses_keep".to_owned()].into();
    assert_eq!(s.backend.remove_orphans(&keep).await, 2);
    for kept in ["lap-ses-keep", "lap-ses-young", "not-ours"] {
        assert!(fake.get("sandboxes", NS, kept).is_some(), "{kept} was swept");
    }
    assert!(fake.get("sandboxes", NS, "lap-ses-orphan").is_none());
    assert!(fake.get("sandboxclaims", NS, "lap-ses-gone").is_none());
    assert!(fake.get("secrets", NS, "lap-ses-orphan-vault").is_none());
    assert!(fake.get("secrets", NS, "lap-ses-stray-vault").is_none());
    assert!(fake.get("secrets", NS, "lap-ses-keep-vault").is_some());
    assert!(
        fake.get("secrets", NS, "lap-pool-codex").is_some(),
        "a pool's Secret is not a session's"
    );
    let log = fake.requests();
    assert!(
        log.iter()
            .any(|r| r.contains("/sandboxes?") && r.contains("labelSelector=app.kubernetes.io%2Fmanaged-by%3Dlap")),
        "inventory by label: {log:#?}"
    );
}

/// The schema check is real: the fake refuses what the CRD refuses, as the API server would.
#[tokio::test]
async fn the_fake_api_server_refuses_what_the_schema_refuses() {
    let fake = FakeKube::start().await;
    let api: kube::Api<kube::core::DynamicObject> =
        kube::Api::namespaced_with(fake.client(), NS, &SandboxApiVersion::V1beta1.api_resource());
    let bad: kube::core::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
        "metadata": {"name": "x"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "c"}]}}, "operatingMode": "Paused", "servce": true},
    }))
    .unwrap();
    let err = api.create(&Default::default(), &bad).await.unwrap_err();
    let kube::Error::Api(s) = err else { panic!("{err}") };
    assert_eq!(s.code, 422);
    assert!(
        s.message.contains("operatingMode") && s.message.contains("servce"),
        "{}",
        s.message
    );
}

// ---------------------------------------------------------------------------------------------
// Warm pools, with the real vault and harness binaries standing in for the pod's containers.

/// A workspace binary built next to this test's executable (`target/debug/NAME`).
fn workspace_bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().and_then(std::path::Path::parent).unwrap().join(name);
    assert!(
        p.is_file(),
        "{} is not built: run `cargo build --workspace` first",
        p.display()
    );
    p
}

/// A stand-in `claude` that answers with the key it holds.
const FAKE_CLAUDE: &str = r#"#!/bin/sh
echo '{"type":"system","subtype":"init","session_id":"c-1"}'
echo "{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"result\":\"key:$ANTHROPIC_API_KEY\",\"session_id\":\"c-1\"}"
"#;

/// A real `vault-sidecar` on loopback with the pool's config: no secrets, the pool's admin token.
struct Vault {
    _child: tokio::process::Child,
    admin_port: u16,
}

async fn start_vault(dir: &std::path::Path, admin_token: &str) -> Vault {
    std::fs::write(dir.join("admin_token"), admin_token).unwrap();
    let cfg = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nca_cert_path = \"{d}/ca.pem\"\nadmin_token_file = \"{d}/admin_token\"\nready_file = \"{d}/ready\"\n",
        d = dir.display()
    );
    std::fs::write(dir.join("sidecar.toml"), cfg).unwrap();
    let child = tokio::process::Command::new(workspace_bin("vault-sidecar"))
        .arg("--config")
        .arg(dir.join("sidecar.toml"))
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let ready: Value = eventually(Duration::from_secs(20), "the vault starts", || async {
        std::fs::read(dir.join("ready"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    })
    .await;
    let admin: std::net::SocketAddr = ready["admin_listen"].as_str().unwrap().parse().unwrap();
    Vault {
        _child: child,
        admin_port: admin.port(),
    }
}

/// A real `lap-harness` in warm-pool mode (the fake `claude` on PATH).
fn start_harness(dir: &std::path::Path, port: u16, bootstrap_token: &str) -> tokio::process::Child {
    use std::os::unix::fs::PermissionsExt;
    let home = dir.join("home");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("claude"), FAKE_CLAUDE).unwrap();
    std::fs::set_permissions(bin.join("claude"), std::fs::Permissions::from_mode(0o755)).unwrap();
    tokio::process::Command::new(workspace_bin("lap-harness"))
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("HOME", &home)
        .env("PORT", port.to_string())
        .env("LAP_HARNESS_ID", "claude-code")
        .env("LAP_HARNESS_BOOTSTRAP_TOKEN", bootstrap_token)
        .current_dir(&home)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A session takes a warm pod with a SandboxClaim: the template and pool exist per harness, the
/// pod spec holds no session value, the vault starts empty and gets the session's secrets over
/// its admin API after the claim, then the harness gets its session and serves with the
/// session's token and stub. Delete gives the pod back to nobody (the claim and its Sandbox go)
/// and the pool refills.
#[tokio::test]
async fn a_warm_pool_serves_a_session() {
    use base64::Engine;
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeKube::start().await;
    fake.kubelet_auto(IP);
    let harness_port = free_port();
    // The pool Secret as another replica left it: its tokens are kept, its config brought up to date.
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    fake.put(
        "secrets",
        NS,
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "lap-pool-claude-code", "labels": {"app.kubernetes.io/managed-by": "lap", "lap.dev/pool": "claude-code"}},
               "data": {"admin_token": b64("pool-admin-token"), "bootstrap_token": b64("pool-bootstrap-token"), "sidecar.toml": b64("")}}),
    );
    let vault = start_vault(dir.path(), "pool-admin-token").await;
    let _harness = start_harness(dir.path(), harness_port, "pool-bootstrap-token");
    let mut st = settings(harness_port);
    st.warm_pools.insert("claude-code".into(), 1);
    st.vault_admin_port = vault.admin_port;
    let backend = Arc::new(KubernetesBackend::new(fake.client(), st).unwrap());
    assert!(backend.ensure_pools().await.is_empty());
    let pool_secret = fake.get("secrets", NS, "lap-pool-claude-code").unwrap();
    assert_eq!(secret_text(&pool_secret, "admin_token"), "pool-admin-token");
    assert!(secret_text(&pool_secret, "sidecar.toml").contains(&format!("0.0.0.0:{}", vault.admin_port)));

    // The pool's objects, and a warm Sandbox made from the template by the pool controller.
    let template = fake.wait_object("sandboxtemplates", NS, "lap-claude-code").await;
    assert_eq!(template["spec"]["networkPolicyManagement"], "Unmanaged");
    let pool = fake.wait_object("sandboxwarmpools", NS, "lap-claude-code").await;
    assert_eq!(pool["spec"]["replicas"], 1);
    let warm = eventually(Duration::from_secs(20), "a warm sandbox", || async {
        fake.list("sandboxes", NS)
            .into_iter()
            .find(|s| s["metadata"]["labels"]["agents.x-k8s.io/warm-pool-sandbox"].is_string())
    })
    .await;
    let warm_name = warm["metadata"]["name"].as_str().unwrap().to_owned();
    assert!(warm_name.starts_with("lap-claude-code-"), "{warm_name}");
    for leaked in ["REALVALUE", "lapstub", "harness-token-1"] {
        assert!(!fake
            .list("sandboxes", NS)
            .iter()
            .any(|s| s.to_string().contains(leaked)));
        assert!(!template.to_string().contains(leaked));
    }

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut sp = spec("ses_warm");
    sp.phases = Some(tx);
    let handle = within(backend.create(sp)).await.unwrap();
    let mut phases = Vec::new();
    while let Ok(p) = rx.try_recv() {
        phases.push(p);
    }
    assert!(
        phases.contains(&"claiming-sandbox") && phases.contains(&"starting-vault"),
        "{phases:?}"
    );

    // It took the warm pod: the claim is bound to the warm Sandbox, now owned by the claim.
    let claim = fake.get("sandboxclaims", NS, "lap-ses-warm").unwrap();
    assert_eq!(claim["status"]["sandbox"]["name"], warm_name.as_str());
    let adopted = fake.get("sandboxes", NS, &warm_name).unwrap();
    assert_eq!(adopted["metadata"]["ownerReferences"][0]["kind"], "SandboxClaim");
    assert_eq!(adopted["metadata"]["labels"]["agents.x-k8s.io/launch-type"], "warm");
    assert_eq!(handle.detail["claim"], "lap-ses-warm");
    // No per-session Secret: the real value is only in the vault's memory.
    assert!(fake.get("secrets", NS, "lap-ses-warm-vault").is_none());
    assert!(!fake
        .list("secrets", NS)
        .iter()
        .any(|s| s.to_string().contains("UkVBTFZBTFVF")));

    // The harness serves with the session's token, holding the stub.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let r: Value = http
        .post(format!("{}/message", handle.harness_url))
        .bearer_auth("harness-token-1")
        .json(&json!({"text": "hi"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["parts"][0]["text"], "key:sk-ant-api03-lapstub-0000000000", "{r}");
    // The vault holds the session's secret: rotate it through the admin API.
    backend
        .rotate_secret(
            &handle,
            "ANTHROPIC_API_KEY",
            "sk-ant-api03-ROTATED-2222",
            &["api.anthropic.com".into()],
            &[],
        )
        .await
        .unwrap();
    assert_eq!(backend.liveness(&handle).await, Liveness::Running);

    // Delete: the claim goes, and with it (owner reference) the Sandbox and pod; the pool refills.
    backend.destroy(&handle).await;
    assert!(fake.get("sandboxclaims", NS, "lap-ses-warm").is_none());
    assert!(fake.get("sandboxes", NS, &warm_name).is_none());
    assert!(fake.get("pods", NS, &warm_name).is_none());
    assert!(matches!(backend.liveness(&handle).await, Liveness::Gone(_)));
    eventually_true(Duration::from_secs(20), "the pool refills", || {
        fake.list("sandboxes", NS)
            .iter()
            .any(|s| s["metadata"]["labels"]["agents.x-k8s.io/warm-pool-sandbox"].is_string())
    })
    .await;
}

/// What a warm session cannot use goes cold: a harness without a pool, an agent with egress
/// rules or its own resources. A claim on a pool that vanished fails at once with the claim's
/// reason.
#[tokio::test]
async fn sessions_that_cannot_take_a_warm_pod_start_cold() {
    let s = setup_with(|st| {
        st.warm_pools.insert("claude-code".into(), 0);
    })
    .await;
    s.fake.kubelet_auto(IP);
    assert!(s.backend.ensure_pools().await.is_empty());
    let mut egress = spec("ses_egress");
    egress.allow_out = vec!["example.com".into()];
    within(s.backend.create(egress)).await.unwrap();
    assert!(
        s.fake.get("sandboxes", NS, "lap-ses-egress").is_some(),
        "a cold Sandbox of its own"
    );
    assert!(s.fake.get("sandboxclaims", NS, "lap-ses-egress").is_none());

    s.fake.remove("sandboxwarmpools", NS, "lap-claude-code");
    let err = within(s.backend.create(spec("ses_nopool")))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("WarmPoolNotFound"), "{err}");
    assert!(
        s.fake.get("sandboxclaims", NS, "lap-ses-nopool").is_none(),
        "the claim is deleted again"
    );
}
