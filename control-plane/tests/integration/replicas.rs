//! Several `lap-server` replicas over one database (SQLite here; Postgres when
//! `LAP_TEST_DATABASE_URL` is set), each with the Kubernetes backend against one fake API server
//! (`support/fake_kube.rs`): leases keep them from failing or sweeping each other's sessions.

#![allow(clippy::unwrap_used)]

use crate::support::fake_kube;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fake_kube::FakeKube;
use lap_control_plane::app::{App, AppConfig};
use lap_control_plane::backend::kubernetes::KubernetesBackend;
use lap_control_plane::backend::sandbox::{PodSettings, SandboxApiVersion};
use lap_control_plane::crypto::Cipher;
use lap_control_plane::model::{CreateAgent, CreateSession, Status};
use lap_control_plane::store::Store;
use lap_test_support::{eventually_ok, eventually_true};
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
        runtime_class: None,
        transparent: true,
        max_lifetime: Duration::from_secs(3600),
        harness_port,
        base: Default::default(),
        upstream_cas: vec![],
        harness_resources: Default::default(),
        vault_admin_port: lap_control_plane::backend::sandbox::VAULT_ADMIN_PORT,
        warm_pools: BTreeMap::new(),
    }
}

fn secret_text(secret: &Value, key: &str) -> String {
    use base64::Engine;
    let b64 = secret["data"][key].as_str().unwrap();
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).unwrap()).unwrap()
}

async fn app_over(fake: &FakeKube, url: &str, harness_port: u16) -> Arc<App> {
    let store = Store::connect(url).await.unwrap();
    let backend = KubernetesBackend::new(fake.client(), settings(harness_port)).unwrap();
    App::new(
        store,
        Cipher::from_setting("test encryption key"),
        Arc::new(backend),
        AppConfig {
            master_key: "k".into(),
            idle_timeout: Duration::from_secs(3600),
            create_timeout: Duration::from_secs(60),
            audit_retention: Duration::from_secs(30 * 86_400),
            model_gateway: None,
        },
    )
}

async fn wait_status(app: &App, id: &str, status: Status) -> lap_control_plane::model::Session {
    let what = format!("session {id} becomes {status:?}");
    eventually_ok(Duration::from_secs(30), &what, || async {
        let s = app.get_session(id).await.unwrap();
        if s.status == status {
            Ok(s)
        } else {
            Err(format!("{:?} ({:?})", s.status, s.failure_reason))
        }
    })
    .await
}

fn agent(name: &str) -> CreateAgent {
    serde_json::from_value(json!({"name": name, "harness_id": "claude-code"})).unwrap()
}

fn session_req() -> CreateSession {
    serde_json::from_value(json!({
        "env_vars": {"ANTHROPIC_API_KEY": "sk-ant-api03-SESSIONREAL-3333"}
    }))
    .unwrap()
}

/// Through the API layer: a session becomes ready when its Sandbox does, `DELETE` removes the
/// Sandbox, and a second replica on the same database neither fails the other's bring-up nor
/// sweeps its Sandbox, and skips a pass while another replica holds the reconciler lease.
async fn two_replicas(url: String, tag: &str) {
    let fake = FakeKube::start().await;
    let port = harness_health().await;
    let a = app_over(&fake, &url, port).await;
    let b = app_over(&fake, &url, port).await;
    assert_ne!(a.replica(), b.replica());

    let ag = a.create_agent(agent(&format!("coder-{tag}"))).await.unwrap();
    let s = a.create_session(&ag.id, session_req()).await.unwrap();
    let name = lap_control_plane::backend::sandbox::sandbox_name(&s.id);
    let sb = fake.wait_object("sandboxes", NS, &name).await;
    assert_eq!(sb["metadata"]["labels"]["lap.dev/session"], s.id.as_str());
    let secret = fake.get("secrets", NS, &format!("{name}-vault")).unwrap();
    assert!(secret_text(&secret, "secrets.json").contains("SESSIONREAL"));

    // Replica B reconciles while A is still bringing the session up: left alone.
    assert!(b.reconcile_once().await.unwrap());
    assert_eq!(b.get_session(&s.id).await.unwrap().status, Status::Creating);
    assert!(fake.get("sandboxes", NS, &name).is_some(), "B swept A's Sandbox");

    let pod = fake.wait_pod(NS, &name).await;
    fake.pod_running(NS, &pod, "127.0.0.1", true);
    wait_status(&a, &s.id, Status::Ready).await;
    assert!(b.reconcile_once().await.unwrap());
    assert_eq!(b.get_session(&s.id).await.unwrap().status, Status::Ready);

    // Another replica mid-pass: B skips; once released, B runs.
    let now = lap_control_plane::model::now_ms();
    assert!(a.store.try_lease("reconciler", a.replica(), now, 60_000).await.unwrap());
    assert!(!b.reconcile_once().await.unwrap());
    a.store.release_lease("reconciler", a.replica()).await.unwrap();
    assert!(b.reconcile_once().await.unwrap());

    // The Sandbox vanishes: B's pass marks the session dead.
    let s2 = a.create_session(&ag.id, session_req()).await.unwrap();
    let name2 = lap_control_plane::backend::sandbox::sandbox_name(&s2.id);
    let pod2 = fake.wait_pod(NS, &name2).await;
    fake.pod_running(NS, &pod2, "127.0.0.1", true);
    wait_status(&a, &s2.id, Status::Ready).await;

    fake.remove("sandboxes", NS, &name2);
    assert!(b.reconcile_once().await.unwrap());
    let gone = b.get_session(&s2.id).await.unwrap();
    assert_eq!(gone.status, Status::Dead);
    assert!(gone.failure_reason.unwrap().contains("stopped unexpectedly"));
    assert!(fake.get("secrets", NS, &format!("{name2}-vault")).is_none());

    // A Sandbox past its shutdownTime: the controller marks it SandboxExpired; the session ends
    // `dead` saying so (an end by design, not "stopped unexpectedly").
    let s3 = a.create_session(&ag.id, session_req()).await.unwrap();
    let name3 = lap_control_plane::backend::sandbox::sandbox_name(&s3.id);
    let pod3 = fake.wait_pod(NS, &name3).await;
    fake.pod_running(NS, &pod3, "127.0.0.1", true);
    wait_status(&a, &s3.id, Status::Ready).await;
    let mut sb3 = fake.get("sandboxes", NS, &name3).unwrap();
    sb3["spec"]["shutdownTime"] = json!("2020-01-01T00:00:00Z");
    fake.put("sandboxes", NS, sb3);
    eventually_true(Duration::from_secs(20), "the controller expires the Sandbox", || {
        fake.pod_of(NS, &name3).is_none()
    })
    .await;
    assert!(b.reconcile_once().await.unwrap());
    let ended = b.get_session(&s3.id).await.unwrap();
    assert_eq!(ended.status, Status::Dead);
    let why = ended.failure_reason.unwrap();
    assert!(
        why.contains("maximum lifetime") && !why.contains("unexpectedly"),
        "{why}"
    );
    assert!(
        fake.get("sandboxes", NS, &name3).is_none(),
        "the control plane deleted the expired Sandbox"
    );

    // DELETE through the app removes the Sandbox.
    b.stop_session(&s.id).await.unwrap();
    assert!(fake.get("sandboxes", NS, &name).is_none());
    assert!(fake.get("secrets", NS, &format!("{name}-vault")).is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_share_sessions_safely_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
    two_replicas(url, "sqlite").await;
}

/// The same on Postgres (`.ci/run` sets `LAP_TEST_DATABASE_URL`).
#[tokio::test(flavor = "multi_thread")]
async fn replicas_share_sessions_safely_postgres() {
    let url = std::env::var("LAP_TEST_DATABASE_URL").expect(
        "LAP_TEST_DATABASE_URL is not set: `. control-plane/ci/postgres.sh` starts a throwaway \
         PostgreSQL and sets it (.ci/run does)",
    );
    let tag = format!("pg-{}", std::process::id());
    two_replicas(url, &tag).await;
}

/// Field case N15 (1): a control plane that dies (nothing of it left but the database) and a new
/// one started with the idle threshold: the new one reaps both idle sessions from the persisted
/// `last_seen_at`, with no timer of the old one, and deletes their Sandboxes. (Time is moved by
/// ageing `last_seen_at` in the database, not by waiting.)
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_control_plane_reaps_idle_sessions_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("r.db").display());
    let fake = FakeKube::start().await;
    fake.kubelet_auto("127.0.0.1");
    let port = harness_health().await;
    let old = app_over(&fake, &url, port).await;
    let ag = old.create_agent(agent("coder-restart")).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let s = old.create_session(&ag.id, session_req()).await.unwrap();
        wait_status(&old, &s.id, Status::Ready).await;
        ids.push(s.id);
    }
    // The old process is gone: its App (and its in-memory state) is dropped; a new one starts.
    drop(old);
    let pool = sqlx::sqlite::SqlitePoolOptions::new().connect(&url).await.unwrap();
    sqlx::query("UPDATE sessions SET last_seen_at = last_seen_at - 7200000")
        .execute(&pool)
        .await
        .unwrap();
    let new = app_over(&fake, &url, port).await;
    assert!(new.reconcile_once().await.unwrap());
    for id in &ids {
        let s = new.get_session(id).await.unwrap();
        assert_eq!(s.status, Status::Dead, "{id}: {:?}", s.failure_reason);
        let name = lap_control_plane::backend::sandbox::sandbox_name(id);
        assert!(fake.get("sandboxes", NS, &name).is_none(), "{name} left running");
        assert!(fake.get("secrets", NS, &format!("{name}-vault")).is_none());
    }
}

/// Leases are compare-and-set: one holder at a time, renewable by it, free after expiry.
#[tokio::test]
async fn leases_have_one_holder() {
    let dir = tempfile::tempdir().unwrap();
    let mut urls = vec![format!("sqlite://{}?mode=rwc", dir.path().join("l.db").display())];
    urls.extend(std::env::var("LAP_TEST_DATABASE_URL").ok());
    for url in urls {
        let store = Store::connect(&url).await.unwrap();
        let name = format!("test-lease-{}", std::process::id());
        let t = 1_000_000;
        assert!(store.try_lease(&name, "a", t, 100).await.unwrap());
        assert!(!store.try_lease(&name, "b", t + 50, 100).await.unwrap(), "{url}");
        assert!(store.try_lease(&name, "a", t + 60, 100).await.unwrap(), "renew");
        assert_eq!(store.lease_holder(&name, t + 150).await.unwrap().as_deref(), Some("a"));
        assert!(!store.try_lease(&name, "b", t + 150, 100).await.unwrap());
        assert!(store.try_lease(&name, "b", t + 161, 100).await.unwrap(), "expired");
        assert_eq!(store.lease_holder(&name, t + 170).await.unwrap().as_deref(), Some("b"));
        store.release_lease(&name, "a").await.unwrap();
        assert_eq!(store.lease_holder(&name, t + 170).await.unwrap().as_deref(), Some("b"));
        store.release_lease(&name, "b").await.unwrap();
        assert_eq!(store.lease_holder(&name, t + 170).await.unwrap(), None);
    }
}
