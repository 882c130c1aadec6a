//! The Kubernetes backend against a live cluster with agent-sandbox installed (deploy/kind-up.sh):
//! what the fake API server of `kubernetes.rs` claims about the controller, checked against the
//! real one. Ignored here (no cluster in CI); run them with
//!
//! ```sh
//! deploy/build-images.sh && deploy/kind-up.sh
//! cargo test -p lap-control-plane --test kubernetes_live -- --ignored --test-threads 1
//! ```
//!
//! The cluster is the current kubeconfig context (`kind-lap`). Each test works in its own
//! namespace `lap-live-<pid>-<n>` and deletes it at the end.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota, Secret, Service};
use kube::api::{Api, DeleteParams, PostParams};
use kube::ResourceExt;
use lap_control_plane::backend::kubernetes::KubernetesBackend;
use lap_control_plane::backend::sandbox::{self, conditions, PodSettings, Readiness, SandboxApiVersion};
use lap_control_plane::backend::{Placement, SandboxBackend, SandboxSpec};
use lap_test_support::eventually_ok;
use serde_json::json;

fn settings(ns: &str) -> PodSettings {
    PodSettings {
        namespace: ns.into(),
        api_version: SandboxApiVersion::V1beta1,
        vault_image: std::env::var("LAP_K8S_VAULT_IMAGE").unwrap_or_else(|_| "lap/vault-sidecar:dev".into()),
        harness_image: std::env::var("LAP_K8S_HARNESS_IMAGE").unwrap_or_else(|_| "lap/harness-{harness_id}:dev".into()),
        harness_images: BTreeMap::new(),
        netfilter_image: std::env::var("LAP_K8S_VAULT_IMAGE").unwrap_or_else(|_| "lap/vault-sidecar:dev".into()),
        runtime_class: None,
        transparent: true,
        max_lifetime: Duration::from_secs(3600),
        harness_port: 8080,
        base: Default::default(),
        upstream_cas: vec![],
        harness_resources: lap_control_plane::model::Resources {
            requests: BTreeMap::from([("cpu".into(), "50m".into()), ("memory".into(), "64Mi".into())]),
            limits: BTreeMap::from([("memory".into(), "1Gi".into())]),
        },
        vault_admin_port: sandbox::VAULT_ADMIN_PORT,
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
        secrets: vec![],
        harness_token: "live-token".into(),
        tools: None,
        mcp_servers: Vec::new(),
        env: Default::default(),
        placement: Placement::default(),
        phases: None,
    }
}

/// A namespace of its own, labelled as given; deleted on drop (in the background).
struct TestNs {
    client: kube::Client,
    name: String,
}

impl TestNs {
    async fn new(tag: &str, labels: serde_json::Value) -> Self {
        let client = kube::Client::try_default()
            .await
            .expect("no cluster: run deploy/kind-up.sh (or point KUBECONFIG at one with agent-sandbox)");
        let name = format!("lap-live-{}-{tag}", std::process::id());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        Self { client, name }
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let (client, name) = (self.client.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let _ = Api::<Namespace>::all(client)
                    .delete(&name, &DeleteParams::background())
                    .await;
            });
        })
        .join();
    }
}

/// A Sandbox as LAP builds it becomes Ready by the real controller's conditions (with
/// `service: true`: its Service exists and `serviceFQDN` is set), with a pod IP.
#[tokio::test]
#[ignore = "needs a cluster"]
async fn live_sandbox_becomes_ready_with_its_service() {
    let ns = TestNs::new("ready", json!({"pod-security.kubernetes.io/enforce": "privileged"})).await;
    let st = settings(&ns.name);
    let objects = sandbox::build(
        &spec("ses_live_ready"),
        &st,
        "atok",
        k8s_openapi::jiff::Timestamp::now(),
    )
    .unwrap();
    Api::<Secret>::namespaced(ns.client.clone(), &ns.name)
        .create(&PostParams::default(), &objects.secret)
        .await
        .unwrap();
    let api: Api<sandbox::Sandbox> =
        Api::namespaced_with(ns.client.clone(), &ns.name, &SandboxApiVersion::V1beta1.api_resource());
    api.create(&PostParams::default(), &objects.sandbox).await.unwrap();
    let name = objects.sandbox.name_any();
    let sb = eventually_ok(Duration::from_secs(180), "the Sandbox becomes ready", || async {
        let sb = api.get(&name).await.unwrap();
        match conditions::readiness(sb.metadata.generation, sb.status.as_ref()) {
            Readiness::Ready => Ok(sb),
            Readiness::Pending(why) => Err(why),
            other => panic!("{other:?}"),
        }
    })
    .await;
    let status = sb.status.unwrap();
    assert!(!status.pod_ips.is_empty());
    assert!(status.service_fqdn.unwrap_or_default().starts_with(&name));
    Api::<Service>::namespaced(ns.client.clone(), &ns.name)
        .get(&name)
        .await
        .unwrap();
}

/// Refusals come back as `Ready=False/ReconcilerError` with the API server's message, and the
/// backend fails the session with it at once: a quota, PodSecurity `baseline` (the netfilter
/// container's NET_ADMIN), an unknown RuntimeClass.
#[tokio::test]
#[ignore = "needs a cluster"]
async fn live_refusals_fail_fast() {
    // PodSecurity.
    let ns = TestNs::new("psa", json!({"pod-security.kubernetes.io/enforce": "baseline"})).await;
    let backend = KubernetesBackend::new(ns.client.clone(), settings(&ns.name)).unwrap();
    let started = Instant::now();
    let err = backend.create(spec("ses_live_psa")).await.unwrap_err().to_string();
    assert!(err.contains("PodSecurity") && err.contains("NET_ADMIN"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "not fast: {:?}",
        started.elapsed()
    );

    // Quota.
    let ns = TestNs::new("quota", json!({"pod-security.kubernetes.io/enforce": "privileged"})).await;
    let quota: ResourceQuota =
        serde_json::from_value(json!({"metadata": {"name": "none"}, "spec": {"hard": {"pods": "0"}}})).unwrap();
    Api::<ResourceQuota>::namespaced(ns.client.clone(), &ns.name)
        .create(&PostParams::default(), &quota)
        .await
        .unwrap();
    let backend = KubernetesBackend::new(ns.client.clone(), settings(&ns.name)).unwrap();
    let err = backend.create(spec("ses_live_quota")).await.unwrap_err().to_string();
    assert!(err.contains("exceeded quota") && err.contains("ResourceQuota"), "{err}");

    // RuntimeClass.
    let ns = TestNs::new("rc", json!({"pod-security.kubernetes.io/enforce": "privileged"})).await;
    let backend = KubernetesBackend::new(ns.client.clone(), settings(&ns.name)).unwrap();
    let mut sp = spec("ses_live_rc");
    sp.placement.runtime_class = Some("lap-no-such-runtime".into());
    let err = backend.create(sp).await.unwrap_err().to_string();
    assert!(err.contains("lap-no-such-runtime"), "{err}");
}
