//! An agent's `resources` and `runtime_class` through the REST API (router with
//! `tower::ServiceExt::oneshot`) to the pod the Kubernetes backend writes, against the fake API
//! server (`support/fake_kube.rs`): bad values are a 400 naming the field; good ones are kept,
//! shown, patched, and land on the harness container and the pod.

#![allow(clippy::unwrap_used)]

use crate::support::fake_kube;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use fake_kube::FakeKube;
use http_body_util::BodyExt;
use lap_control_plane::app::{App, AppConfig};
use lap_control_plane::backend::kubernetes::KubernetesBackend;
use lap_control_plane::backend::sandbox::{PodSettings, SandboxApiVersion};
use lap_control_plane::crypto::Cipher;
use lap_control_plane::model::Resources;
use lap_control_plane::store::Store;
use lap_test_support::eventually_ok;
use serde_json::{json, Value};
use tower::ServiceExt;

const NS: &str = "lap-test";
const KEY: &str = "test-master-key";
const A: &str = "/api/v1/managed_agents";

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
        harness_resources: Resources {
            requests: BTreeMap::from([("cpu".into(), "500m".into()), ("memory".into(), "1Gi".into())]),
            limits: BTreeMap::from([("memory".into(), "4Gi".into())]),
        },
        vault_admin_port: lap_control_plane::backend::sandbox::VAULT_ADMIN_PORT,
        warm_pools: BTreeMap::new(),
    }
}

async fn setup(dir: &std::path::Path) -> (FakeKube, Router) {
    let fake = FakeKube::start().await;
    fake.kubelet_auto("127.0.0.1");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let health = axum::Router::new().route(
        "/healthz",
        axum::routing::get(|| async { axum::Json(json!({"phase": "harness_listening"})) }),
    );
    tokio::spawn(async move { axum::serve(listener, health).await.unwrap() });
    let url = format!("sqlite://{}?mode=rwc", dir.join("p.db").display());
    let app = App::new(
        Store::connect(&url).await.unwrap(),
        Cipher::from_setting("test encryption key"),
        Arc::new(KubernetesBackend::new(fake.client(), settings(port)).unwrap()),
        AppConfig {
            master_key: KEY.into(),
            idle_timeout: Duration::from_secs(3600),
            create_timeout: Duration::from_secs(60),
            audit_retention: Duration::from_secs(30 * 86_400),
            model_gateway: None,
        },
    );
    (fake, lap_control_plane::api::router(app))
}

async fn call(router: &Router, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {KEY}"));
    let req = match body {
        Some(b) => req
            .header("content-type", "application/json")
            .body(Body::from(b.to_string())),
        None => req.body(Body::empty()),
    }
    .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn bad_resources_and_runtime_classes_are_400s_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let (_fake, router) = setup(dir.path()).await;
    let cases = [
        (
            json!({"resources": {"requests": {"gpu": "1"}}}),
            "resources.requests.gpu",
        ),
        (
            json!({"resources": {"limits": {"memory": "lots"}}}),
            "resources.limits.memory",
        ),
        (
            json!({"resources": {"requests": {"cpu": "0"}}}),
            "resources.requests.cpu",
        ),
        (
            json!({"resources": {"requests": {"memory": "8Gi"}, "limits": {"memory": "4Gi"}}}),
            "resources.requests.memory",
        ),
        (json!({"resources": {"request": {"cpu": "1"}}}), "request"),
        (json!({"runtime_class": "G Visor"}), "runtime_class"),
    ];
    for (i, (extra, field)) in cases.into_iter().enumerate() {
        let mut body = json!({"name": format!("bad-{i}"), "harness_id": "claude-code"});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (s, v) = call(&router, "POST", &format!("{A}/agents"), Some(body.clone())).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(field), "{body}: {v}");
    }
    // PATCH is checked the same way.
    let (s, a) = call(
        &router,
        "POST",
        &format!("{A}/agents"),
        Some(json!({"name": "ok", "harness_id": "claude-code"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    let id = a["id"].as_str().unwrap();
    let (s, v) = call(
        &router,
        "PATCH",
        &format!("{A}/agents/{id}"),
        Some(json!({"resources": {"limits": {"cpu": "-1"}}})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("resources.limits.cpu"), "{v}");
}

#[tokio::test]
async fn an_agents_resources_and_runtime_class_reach_its_pod() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, router) = setup(dir.path()).await;
    let (s, a) = call(
        &router,
        "POST",
        &format!("{A}/agents"),
        Some(json!({"name": "big", "harness_id": "claude-code",
                    "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"ephemeral-storage": "20Gi"}},
                    "runtime_class": "kata"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    assert_eq!(a["resources"]["requests"]["memory"], "8Gi");
    assert_eq!(a["runtime_class"], "kata");
    let id = a["id"].as_str().unwrap().to_owned();
    let (_, got) = call(&router, "GET", &format!("{A}/agents/{id}"), None).await;
    assert_eq!(got["resources"], a["resources"]);

    let (s, ses) = call(&router, "POST", &format!("{A}/agents/{id}/session"), Some(json!({}))).await;
    assert_eq!(s, StatusCode::CREATED, "{ses}");
    let name = lap_control_plane::backend::sandbox::sandbox_name(ses["id"].as_str().unwrap());
    let sb = fake.wait_object("sandboxes", NS, &name).await;
    let pod = &sb["spec"]["podTemplate"]["spec"];
    assert_eq!(
        pod["runtimeClassName"], "kata",
        "the agent's class wins over the setting"
    );
    let harness = &pod["containers"][0];
    assert_eq!(harness["name"], "harness");
    let r = &harness["resources"];
    assert_eq!(r["requests"]["cpu"], "2");
    assert_eq!(r["requests"]["memory"], "8Gi");
    assert_eq!(
        r["limits"]["memory"], "8Gi",
        "the default 4Gi limit is raised to the request"
    );
    assert_eq!(r["limits"]["ephemeral-storage"], "20Gi");
    // Every container has requests: the pod is not BestEffort.
    for c in pod["initContainers"].as_array().unwrap() {
        assert!(c["resources"]["requests"]["memory"].is_string(), "{c}");
    }

    // The session comes up (the pod is Ready at once here), then PATCH clears the class: the
    // next session's pod has the setting's.
    let ses_id = ses["id"].as_str().unwrap().to_owned();
    eventually_ok(Duration::from_secs(30), "the session becomes ready", || async {
        let (_, v) = call(&router, "GET", &format!("{A}/sessions/{ses_id}"), None).await;
        if v["status"] == "ready" {
            return Ok(());
        }
        assert!(v["status"] == "creating", "{v}");
        Err(v)
    })
    .await;
    let (s, v) = call(
        &router,
        "PATCH",
        &format!("{A}/agents/{id}"),
        Some(json!({"runtime_class": "gvisor"})),
    )
    .await;
    assert_eq!((s, &v["runtime_class"]), (StatusCode::OK, &json!("gvisor")), "{v}");
    let (_, ses2) = call(&router, "POST", &format!("{A}/agents/{id}/session"), Some(json!({}))).await;
    let name2 = lap_control_plane::backend::sandbox::sandbox_name(ses2["id"].as_str().unwrap());
    let sb2 = fake.wait_object("sandboxes", NS, &name2).await;
    assert_eq!(sb2["spec"]["podTemplate"]["spec"]["runtimeClassName"], "gvisor");
}
