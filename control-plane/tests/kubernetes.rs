//! The Kubernetes backend against a fake API server (`support/fake_kube.rs`): the real kube-rs
//! client, watcher and backend; only the cluster is fake. The harness's `/healthz` is served by
//! the test on loopback (the fake reports `serviceFQDN: 127.0.0.1`).

#![allow(clippy::unwrap_used)]

#[path = "support/fake_kube.rs"]
mod fake_kube;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_kube::FakeKube;
use lap_control_plane::backend::kubernetes::KubernetesBackend;
use lap_control_plane::backend::sandbox::{PodSettings, SandboxApiVersion};
use lap_control_plane::backend::{BackendError, Liveness, SandboxBackend, SandboxHandle, SandboxSpec};
use lap_vault_sidecar::config::{SecretSpec, SecretsFile};
use serde_json::{json, Value};

const NS: &str = "lap-test";

/// A harness stand-in: `GET /healthz` → 200, on a loopback port.
async fn harness_health() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
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
        phases: None,
    }
}

struct Setup {
    fake: FakeKube,
    backend: Arc<KubernetesBackend>,
}

async fn setup() -> Setup {
    let fake = FakeKube::start().await;
    let port = harness_health().await;
    let backend = Arc::new(KubernetesBackend::new(fake.client(), settings(port)).unwrap());
    Setup { fake, backend }
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

fn lists<'a>(log: &'a [String], plural: &str) -> Vec<&'a String> {
    log.iter()
        .filter(|l| l.starts_with("GET ") && l.contains(&format!("/{plural}?")) && !l.contains("watch=true"))
        .collect()
}

/// Start a create in the background.
fn start_create(
    backend: &Arc<KubernetesBackend>,
    session: &str,
) -> tokio::task::JoinHandle<Result<SandboxHandle, BackendError>> {
    let (b, s) = (backend.clone(), spec(session));
    tokio::spawn(async move { b.create(s).await })
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("timed out")
}

/// Create → Sandbox + Secret of the right shape → Ready (after a watch that ended and was
/// resumed from its resourceVersion, without a new list) → harness health → handle.
#[tokio::test]
async fn create_waits_for_ready_across_a_resumed_watch() {
    let Setup { fake, backend } = setup().await;
    fake.cut_next_watches("sandboxes", 1);
    let task = start_create(&backend, "ses_one");

    let name = "lap-ses-one";
    let sb = fake.wait_object("sandboxes", NS, name).await;
    assert_eq!(sb["apiVersion"], "agents.x-k8s.io/v1beta1");
    assert_eq!(sb["kind"], "Sandbox");
    assert_eq!(sb["metadata"]["labels"]["app.kubernetes.io/managed-by"], "lap");
    assert_eq!(sb["metadata"]["labels"]["lap.dev/session"], "ses_one");
    assert_eq!(sb["spec"]["service"], true);
    assert!(sb["spec"]["shutdownTime"].is_string());
    let pod = &sb["spec"]["podTemplate"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["runtimeClassName"], "gvisor");
    assert_eq!(pod["initContainers"][0]["name"], "lap-netfilter");
    assert_eq!(pod["initContainers"][1]["name"], "vault");
    assert_eq!(pod["initContainers"][1]["restartPolicy"], "Always");
    assert_eq!(pod["initContainers"][1]["startupProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(pod["containers"][0]["name"], "harness");
    assert_eq!(pod["containers"][0]["image"], "lap/harness-claude-code:test");
    let text = sb.to_string();
    assert!(
        !text.contains("REALVALUE") && !text.contains("harness-token-1"),
        "{text}"
    );

    // The Secret: real values, only in it, owned by the Sandbox.
    let secret = fake.wait_object("secrets", NS, "lap-ses-one-vault").await;
    assert!(secret_text(&secret, "secrets.json").contains("sk-ant-api03-REALVALUE-1111"));
    assert_eq!(secret_text(&secret, "harness_token"), "harness-token-1");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = fake.get("secrets", NS, "lap-ses-one-vault").unwrap();
        if let Some(owner) = s["metadata"]["ownerReferences"].get(0) {
            assert_eq!(owner["kind"], "Sandbox");
            assert_eq!(owner["name"], name);
            assert_eq!(owner["uid"], sb["metadata"]["uid"]);
            break;
        }
        assert!(Instant::now() < deadline, "the Secret never got its owner reference");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Not ready yet; the first watch delivers that, then ends.
    fake.wait_requests("a watch on sandboxes", |l| !watches(l, "sandboxes").is_empty())
        .await;
    fake.set_sandbox_status(NS, name, "False", "DependenciesNotReady", "127.0.0.1");
    let rv = fake.get("sandboxes", NS, name).unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    fake.wait_requests("the watch to be resumed", |l| watches(l, "sandboxes").len() >= 2)
        .await;
    let log = fake.requests();
    let resumed = watches(&log, "sandboxes")[1];
    assert!(resumed.contains(&format!("resourceVersion={rv}")), "{resumed}");
    assert_eq!(
        lists(&log, "sandboxes").len(),
        1,
        "resumed without a new list: {log:#?}"
    );
    assert!(!task.is_finished(), "ready before the Ready condition");

    fake.set_sandbox_status(NS, name, "True", "DependenciesReady", "127.0.0.1");
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
    assert_eq!(handle.detail["name"], name);
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

    // Delete removes the Sandbox (and its Secret); the sandbox is then gone.
    backend.destroy(&handle).await;
    assert!(fake.get("sandboxes", NS, name).is_none());
    assert!(fake.get("secrets", NS, "lap-ses-one-vault").is_none());
    assert!(
        matches!(backend.liveness(&handle).await, Liveness::Gone(why) if why.contains("gone") || why.contains("deleted"))
    );
    backend.destroy(&handle).await; // idempotent
}

/// Pod Events that mean the sandbox will never be ready become a `failure_reason` in words,
/// and everything created is deleted again.
#[tokio::test]
async fn pod_events_become_failure_reasons() {
    let Setup { fake, backend } = setup().await;
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
        (
            "ses_sched",
            "FailedScheduling",
            "0/3 nodes are available: 3 Insufficient memory.",
            "unschedulable",
        ),
        (
            "ses_quota",
            "FailedCreate",
            "pods \"lap-ses-quota\" is forbidden: exceeded quota: sandboxes, requested: pods=1",
            "quota",
        ),
    ];
    for (session, reason, message, expect) in cases {
        let task = start_create(&backend, session);
        let name = format!("lap-{}", session.replace('_', "-"));
        fake.wait_object("sandboxes", NS, &name).await;
        // Ordinary progress first: not a failure.
        fake.add_event(NS, &name, "Normal", "Scheduled", "Successfully assigned");
        fake.add_event(NS, &name, reason_type(reason), reason, message);
        let err = within(task).await.unwrap().unwrap_err().to_string();
        assert!(err.contains(expect), "{session}: {err}");
        assert!(
            err.contains(message),
            "{session}: the Kubernetes message is kept: {err}"
        );
        assert!(
            fake.get("sandboxes", NS, &name).is_none(),
            "{session}: Sandbox left behind"
        );
        assert!(
            fake.get("secrets", NS, &format!("{name}-vault")).is_none(),
            "{session}: Secret left behind"
        );
    }
}

fn reason_type(_reason: &str) -> &'static str {
    "Warning"
}

/// A 409 on create: a Sandbox and Secret left by an earlier attempt for the same session are
/// adopted (the Secret replaced with this attempt's values, a Conflict on that replace retried);
/// a Sandbox of another session with the name is an error.
#[tokio::test]
async fn conflict_on_create_is_handled() {
    let Setup { fake, backend } = setup().await;
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
            "2026-01-01T00:00:00Z".parse().unwrap(),
        )
        .unwrap()
        .sandbox,
    )
    .unwrap();
    old["metadata"]["namespace"] = json!(NS);
    fake.put("sandboxes", NS, old);
    fake.fail_next("PUT", "secrets", 409, "Conflict");

    let task = start_create(&backend, "ses_again");
    fake.wait_requests("the replaced Secret", |l| {
        l.iter()
            .filter(|r| r.starts_with("PUT ") && r.contains("/secrets/lap-ses-again-vault"))
            .count()
            >= 2
    })
    .await;
    fake.set_sandbox_status(NS, "lap-ses-again", "True", "DependenciesReady", "127.0.0.1");
    let handle = within(task).await.unwrap().unwrap();
    let secret = fake.get("secrets", NS, "lap-ses-again-vault").unwrap();
    assert_eq!(secret_text(&secret, "admin_token"), handle.sidecar_admin_token);
    assert_ne!(handle.sidecar_admin_token, "stale");
    assert!(secret_text(&secret, "secrets.json").contains("REALVALUE"));
    let log = fake.requests();
    assert!(
        log.iter().any(|r| r.starts_with("POST ") && r.contains("/sandboxes")),
        "create was tried first: {log:#?}"
    );

    // Same name, another session's Sandbox: refused, and it is not deleted.
    let mut foreign = fake.get("sandboxes", NS, "lap-ses-again").unwrap();
    foreign["metadata"]["labels"]["lap.dev/session"] = json!("ses_someone_else");
    fake.put("sandboxes", NS, foreign);
    let err = within(backend.create(spec("ses_again"))).await.unwrap_err().to_string();
    assert!(err.contains("belongs to another session"), "{err}");
    let still = fake.get("sandboxes", NS, "lap-ses-again").unwrap();
    assert_eq!(still["metadata"]["labels"]["lap.dev/session"], "ses_someone_else");
}

/// Inventory by label: LAP's Sandboxes (and stray Secrets) whose session is not kept are
/// deleted; kept ones and other people's Sandboxes stay.
#[tokio::test]
async fn orphaned_sandboxes_are_deleted() {
    let Setup { fake, backend } = setup().await;
    let sandbox = |name: &str, labels: Value| {
        json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
               "metadata": {"name": name, "labels": labels},
               "spec": {"podTemplate": {"spec": {"containers": []}}}})
    };
    let lap = |s: &str| json!({"app.kubernetes.io/managed-by": "lap", "lap.dev/session": s});
    fake.put("sandboxes", NS, sandbox("lap-ses-keep", lap("ses_keep")));
    fake.put("sandboxes", NS, sandbox("lap-ses-orphan", lap("ses_orphan")));
    fake.put("sandboxes", NS, sandbox("not-ours", json!({"app": "other"})));
    let secret = |name: &str, labels: Value| json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "labels": labels}});
    fake.put("secrets", NS, secret("lap-ses-orphan-vault", lap("ses_orphan")));
    fake.put("secrets", NS, secret("lap-ses-stray-vault", lap("ses_stray")));
    fake.put("secrets", NS, secret("lap-ses-keep-vault", lap("ses_keep")));

    let keep: HashSet<String> = ["ses_keep".to_owned()].into();
    assert_eq!(backend.remove_orphans(&keep).await, 1);
    assert!(fake.get("sandboxes", NS, "lap-ses-keep").is_some());
    assert!(fake.get("sandboxes", NS, "not-ours").is_some());
    assert!(fake.get("sandboxes", NS, "lap-ses-orphan").is_none());
    assert!(fake.get("secrets", NS, "lap-ses-orphan-vault").is_none());
    assert!(fake.get("secrets", NS, "lap-ses-stray-vault").is_none());
    assert!(fake.get("secrets", NS, "lap-ses-keep-vault").is_some());
    let log = fake.requests();
    assert!(
        log.iter()
            .any(|r| r.contains("/sandboxes?") && r.contains("labelSelector=app.kubernetes.io%2Fmanaged-by%3Dlap")),
        "inventory by label: {log:#?}"
    );
}
