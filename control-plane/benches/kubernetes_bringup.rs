//! Create → ready on the Kubernetes backend, cold (a Sandbox per session) against warm (a
//! SandboxClaim on a SandboxWarmPool), over the fake API server and its port of the agent-sandbox
//! controllers (`tests/integration/support/fake_kube.rs`, an instant kubelet), and the API calls each session
//! costs the control plane, and when each bring-up phase was reported (where the time goes). Not
//! a test: it prints figures (deploy/README.md, "Measured").
//!
//!     cargo bench -p lap-control-plane --bench kubernetes_bringup
//!
//! The pod's containers are stand-ins on loopback (a `/healthz` that is listening at once, a
//! vault admin `PUT /secrets`, a harness `PUT /session`), so the figures are the control plane's
//! own path: API round trips, watches, the hand-over to a warm pod. What a real cluster adds is
//! in deploy/README.md.

#![allow(clippy::unwrap_used)]

#[path = "../tests/integration/support/fake_kube.rs"]
mod fake_kube;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_kube::FakeKube;
use lap_control_plane::backend::kubernetes::KubernetesBackend;
use lap_control_plane::backend::sandbox::{PodSettings, SandboxApiVersion};
use lap_control_plane::backend::{Placement, SandboxBackend, SandboxSpec};
use lap_vault_config::SecretSpec;
use serde_json::json;

const NS: &str = "lap-bench";
const SESSIONS: usize = 40;

/// The pod's containers, stand-ins: harness `/healthz` (listening) and `PUT /session`, vault
/// `PUT /secrets`. One port each: every fake pod is at 127.0.0.1.
async fn stand_ins() -> (u16, u16) {
    let harness = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let vault = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ports = (harness.local_addr().unwrap().port(), vault.local_addr().unwrap().port());
    let h = axum::Router::new()
        .route(
            "/healthz",
            axum::routing::get(|| async { axum::Json(json!({"phase": "harness_listening"})) }),
        )
        .route(
            "/session",
            axum::routing::put(|| async {
                (
                    axum::http::StatusCode::ACCEPTED,
                    axum::Json(json!({"status": "starting"})),
                )
            }),
        );
    let v = axum::Router::new().route(
        "/secrets",
        axum::routing::put(|axum::Json(b): axum::Json<serde_json::Value>| async move {
            axum::Json(json!({"secrets": b["secrets"].as_array().map_or(0, Vec::len)}))
        }),
    );
    tokio::spawn(async move { axum::serve(harness, h).await.unwrap() });
    tokio::spawn(async move { axum::serve(vault, v).await.unwrap() });
    ports
}

fn settings(harness_port: u16, vault_port: u16, warm: bool) -> PodSettings {
    PodSettings {
        namespace: NS.into(),
        api_version: SandboxApiVersion::V1beta1,
        vault_image: "lap/vault-sidecar:dev".into(),
        harness_image: "lap/harness-{harness_id}:dev".into(),
        harness_images: BTreeMap::new(),
        netfilter_image: "lap/vault-sidecar:dev".into(),
        runtime_class: None,
        transparent: true,
        max_lifetime: Duration::from_secs(3600),
        harness_port,
        base: Default::default(),
        upstream_cas: vec![],
        harness_resources: Default::default(),
        vault_admin_port: vault_port,
        warm_pools: if warm {
            BTreeMap::from([("claude-code".into(), 2)])
        } else {
            BTreeMap::new()
        },
    }
}

fn spec(i: usize) -> SandboxSpec {
    SandboxSpec {
        session_id: format!("ses_bench{i:03}"),
        harness_id: "claude-code".into(),
        model: None,
        prompt: None,
        repo_url: None,
        branch: None,
        allow_out: vec![],
        deny_out: vec![],
        secrets: vec![SecretSpec {
            name: "ANTHROPIC_API_KEY".into(),
            stub: format!("sk-ant-api03-lapstub-{i:010}"),
            value: Some("sk-ant-api03-REAL".into()),
            hosts: vec!["api.anthropic.com".into()],
            ..SecretSpec::default()
        }],
        harness_token: "t".into(),
        tools: None,
        mcp_servers: Vec::new(),
        env: Default::default(),
        placement: Placement::default(),
        phases: None,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

async fn run(warm: bool) {
    let fake = FakeKube::start().await;
    fake.kubelet_auto("127.0.0.1");
    let (hp, vp) = stand_ins().await;
    let backend = Arc::new(KubernetesBackend::new(fake.client(), settings(hp, vp, warm)).unwrap());
    if warm {
        assert!(backend.ensure_pools().await.is_empty());
        // Let the pool fill before the first session (as it would long before on a cluster).
        let deadline = Instant::now() + Duration::from_secs(20);
        while fake.list("sandboxwarmpools", NS)[0]["status"]["readyReplicas"] != 2 {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let mut times = Vec::new();
    // When each bring-up phase was reported, from the start of the create (where the time goes).
    let mut phase_times: BTreeMap<&'static str, Vec<Duration>> = BTreeMap::new();
    let mut calls: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..SESSIONS {
        fake.clear_requests();
        let t = Instant::now();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let stamps = tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(p) = rx.recv().await {
                seen.push((p, t.elapsed()));
            }
            seen
        });
        let mut sp = spec(i);
        sp.phases = Some(tx);
        let h = backend.create(sp).await.unwrap();
        times.push(t.elapsed());
        for (p, at) in stamps.await.unwrap() {
            phase_times.entry(p).or_default().push(at);
        }
        for line in fake.requests() {
            let (method, rest) = line.split_once(' ').unwrap();
            let path = rest.split('?').next().unwrap();
            let parts: Vec<&str> = path.split('/').collect();
            let plural = parts
                .iter()
                .position(|p| *p == "namespaces")
                .and_then(|i| parts.get(i + 2))
                .copied()
                .unwrap_or("?");
            let verb = if line.contains("watch=true") { "WATCH" } else { method };
            *calls.entry(format!("{verb} {plural}")).or_default() += 1;
        }
        backend.destroy(&h).await;
    }
    times.sort();
    let total: usize = calls.values().sum();
    println!(
        "{:<5} create→ready over {SESSIONS} sessions: median {:?}, p90 {:?}, max {:?}; API calls per session: {:.1}",
        if warm { "warm" } else { "cold" },
        percentile(&times, 0.5),
        percentile(&times, 0.9),
        times[times.len() - 1],
        total as f64 / SESSIONS as f64
    );
    for (k, n) in calls {
        println!("        {k:<28} {:.1}", n as f64 / SESSIONS as f64);
    }
    let mut phases: Vec<(Duration, &str)> = phase_times
        .into_iter()
        .map(|(p, mut v)| {
            v.sort();
            (percentile(&v, 0.5), p)
        })
        .collect();
    phases.sort();
    let line: Vec<String> = phases.iter().map(|(d, p)| format!("{p} {d:.1?}")).collect();
    println!("        phase reported at (median): {}", line.join(", "));
}

fn main() {
    // `cargo test --benches` runs this with `--bench`-less args; only measure when asked to.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        run(false).await;
        run(true).await;
    });
}
