//! Every kind of object the Kubernetes backend generates passes the real schemas: the
//! agent-sandbox v0.5.6 CRDs (Sandbox v1beta1 and v1alpha1, SandboxTemplate, SandboxWarmPool,
//! SandboxClaim) and Kubernetes 1.33's (Secret), unknown fields refused
//! (`support/schema.rs`). The fake API server applies the same check to every write in
//! `kubernetes.rs` and `replicas.rs`; this file covers the settings those tests do not use.

#![allow(clippy::unwrap_used)]

use crate::support::schema;

use std::collections::BTreeMap;
use std::time::Duration;

use lap_control_plane::backend::sandbox::{self, pool, PodSettings, SandboxApiVersion};
use lap_control_plane::backend::{Placement, SandboxSpec};
use lap_control_plane::model::Resources;
use lap_vault_config::{SecretSpec, SidecarConfig};
use serde_json::{json, Value};

fn settings(api_version: SandboxApiVersion, transparent: bool) -> PodSettings {
    let mut base = SidecarConfig::default();
    base.resolve.insert("api.internal:443".into(), "10.0.0.9:443".into());
    base.egress.deny.push("169.254.0.0/16".into());
    PodSettings {
        namespace: "lap-sandboxes".into(),
        api_version,
        vault_image: "lap/vault-sidecar:dev".into(),
        harness_image: "lap/harness-{harness_id}:dev".into(),
        harness_images: BTreeMap::new(),
        netfilter_image: "lap/vault-sidecar:dev".into(),
        runtime_class: Some("gvisor".into()),
        transparent,
        max_lifetime: Duration::from_secs(7 * 86400),
        harness_port: 8080,
        base,
        upstream_cas: vec![b"-----BEGIN CERTIFICATE-----\n".to_vec()],
        harness_resources: Resources {
            requests: BTreeMap::from([("cpu".into(), "500m".into()), ("memory".into(), "1Gi".into())]),
            limits: BTreeMap::from([("memory".into(), "4Gi".into())]),
        },
        vault_admin_port: sandbox::VAULT_ADMIN_PORT,
        warm_pools: BTreeMap::from([("codex".into(), 2)]),
    }
}

fn spec() -> SandboxSpec {
    SandboxSpec {
        session_id: "ses_01HZX8Q2ABCDEF".into(),
        harness_id: "codex".into(),
        model: Some("gpt-5".into()),
        prompt: Some("be brief".into()),
        repo_url: Some("https://github.com/o/r.git".into()),
        branch: Some("main".into()),
        allow_out: vec!["pypi.org".into()],
        deny_out: vec!["evil.example".into()],
        secrets: vec![SecretSpec {
            name: "OPENAI_API_KEY".into(),
            stub: "sk-lapstubX0000000".into(),
            value: Some("sk-REAL".into()),
            hosts: vec!["api.openai.com".into()],
            ..SecretSpec::default()
        }],
        harness_token: "htok".into(),
        tools: None,
        mcp_servers: Vec::new(),
        env: Default::default(),
        placement: Placement {
            resources: Some(Resources {
                requests: BTreeMap::from([("cpu".into(), "2".into()), ("ephemeral-storage".into(), "10Gi".into())]),
                limits: BTreeMap::from([("memory".into(), "8Gi".into())]),
            }),
            runtime_class: Some("kata".into()),
        },
        phases: None,
    }
}

fn now() -> k8s_openapi::jiff::Timestamp {
    "2026-01-02T03:04:05Z".parse().unwrap()
}

fn with_ns(v: impl serde::Serialize) -> Value {
    let mut v = serde_json::to_value(v).unwrap();
    v["metadata"]["namespace"] = json!("lap-sandboxes");
    v
}

#[test]
fn cold_sandboxes_and_their_secrets_pass_the_schemas() {
    for api in [SandboxApiVersion::V1beta1, SandboxApiVersion::V1alpha1] {
        for transparent in [true, false] {
            let st = settings(api, transparent);
            let o = sandbox::build(&spec(), &st, "atok", now()).unwrap();
            schema::assert_valid(&with_ns(&o.sandbox));
            schema::assert_valid(&with_ns(&o.secret));
        }
    }
}

#[test]
fn warm_pool_objects_pass_the_schemas() {
    let st = settings(SandboxApiVersion::V1beta1, true);
    schema::assert_valid(&with_ns(pool::template("codex", &st)));
    schema::assert_valid(&with_ns(pool::warm_pool("codex", &st, 2)));
    let mut plain = spec();
    plain.allow_out.clear();
    plain.deny_out.clear();
    plain.placement = Placement::default();
    schema::assert_valid(&with_ns(pool::claim(&plain, &st, now()).unwrap()));
    schema::assert_valid(&with_ns(pool::pool_secret("codex", &st, "a", "b").unwrap()));
}

/// The validator is not a rubber stamp: a misspelt field, a wrong enum, a bad label value, a
/// duplicate list-map key and a wrong type are each refused.
#[test]
fn the_validator_refuses_what_the_api_server_would() {
    let st = settings(SandboxApiVersion::V1beta1, true);
    let good = with_ns(sandbox::build(&spec(), &st, "atok", now()).unwrap().sandbox);
    assert!(schema::problems(&good).is_empty());
    let mutate = |f: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        f(&mut v);
        schema::problems(&v)
    };
    assert!(
        !mutate(&|v| v["spec"]["servce"] = json!(true)).is_empty(),
        "unknown field"
    );
    assert!(
        !mutate(&|v| v["spec"]["shutdownPolicy"] = json!("Later")).is_empty(),
        "enum"
    );
    assert!(
        !mutate(&|v| v["spec"]["shutdownTime"] = json!("tomorrow")).is_empty(),
        "date-time"
    );
    assert!(
        !mutate(&|v| v["metadata"]["labels"]["lap.dev/session"] = json!("has space")).is_empty(),
        "label"
    );
    assert!(
        !mutate(&|v| v["spec"]["podTemplate"]["spec"]["containers"][0]["ports"][0]["containerPort"] = json!("eighty"))
            .is_empty(),
        "type"
    );
    let dup = mutate(&|v| {
        let c = v["spec"]["podTemplate"]["spec"]["containers"][0].clone();
        v["spec"]["podTemplate"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(c);
    });
    assert!(dup.iter().any(|p| p.contains("duplicate")), "{dup:?}");
    let secret = with_ns(sandbox::build(&spec(), &st, "atok", now()).unwrap().secret);
    let mut bad = secret.clone();
    bad["strinData"] = json!({});
    assert!(!schema::problems(&bad).is_empty(), "unknown field on a built-in kind");
}
