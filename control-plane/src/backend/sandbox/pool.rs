//! Warm pools, pure: per harness a `SandboxTemplate` and a `SandboxWarmPool`
//! (`extensions.agents.x-k8s.io/v1beta1`), their shared Secret, and per session a
//! `SandboxClaim` (agent-sandbox v0.5.6 `extensions/api/v1beta1`).
//!
//! ```text
//! SandboxTemplate lap-<harness>     the pod of sandbox.rs without a session: no stubs, no
//!                                   session settings, no HARNESS_AUTH_TOKEN; networkPolicy
//!                                   Unmanaged (deploy/base/networkpolicy.yaml applies)
//! SandboxWarmPool lap-<harness>     replicas = LAP_K8S_WARM_POOLS[harness], updateStrategy Recreate
//! Secret lap-pool-<harness>         sidecar.toml (no secrets file), admin_token, bootstrap_token
//!                                   (vault: mounted; harness: bootstrap_token only, as env)
//! SandboxClaim lap-ses-…            warmPoolRef lap-<harness>, lifecycle shutdownTime/Retain
//! ```
//!
//! After the claim is bound, the control plane pushes the session's secrets to the vault
//! (`PUT /secrets`, Bearer the pool's admin token), then the session's environment to the harness
//! (`PUT /session`, Bearer the pool's bootstrap token); see deploy/README.md, "Warm pools".

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use k8s_openapi::ByteString;
use kube::core::{ApiResource, NotUsed, Object};
use serde::{Deserialize, Serialize};

use super::{
    labels, pod, pod_env, pool_vault_config, resources, sandbox_name, BuildError, PodMetadata, PodSettings,
    PodTemplate, SandboxCondition, MANAGED_BY,
};
use crate::backend::SandboxSpec;

/// The extensions API group.
pub const EXTENSIONS_GROUP: &str = "extensions.agents.x-k8s.io";
/// The harness variable holding the pool's bootstrap token (`lap_harness::bootstrap::TOKEN_VAR`).
pub const BOOTSTRAP_TOKEN_VAR: &str = "LAP_HARNESS_BOOTSTRAP_TOKEN";
/// Label on a template, pool and pool Secret: the harness id they serve.
pub const POOL_LABEL: &str = "lap.dev/pool";

fn api_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: EXTENSIONS_GROUP.into(),
        version: "v1beta1".into(),
        api_version: format!("{EXTENSIONS_GROUP}/v1beta1"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// `SandboxTemplate`.
pub fn template_resource() -> ApiResource {
    api_resource("SandboxTemplate", "sandboxtemplates")
}
/// `SandboxWarmPool`.
pub fn warm_pool_resource() -> ApiResource {
    api_resource("SandboxWarmPool", "sandboxwarmpools")
}
/// `SandboxClaim`.
pub fn claim_resource() -> ApiResource {
    api_resource("SandboxClaim", "sandboxclaims")
}

/// `SandboxTemplate.spec` (the shared blueprint and the policies LAP sets).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateSpec {
    pub pod_template: PodTemplate,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<bool>,
    /// `Unmanaged`: LAP ships its own NetworkPolicy; `Managed` would add a default one that
    /// admits only the agent-sandbox router (shutting the control plane out) and would point
    /// the pods' DNS at public resolvers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy_management: Option<String>,
}

/// A `SandboxTemplate`.
pub type SandboxTemplate = Object<TemplateSpec, NotUsed>;

/// `SandboxWarmPool.spec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WarmPoolSpec {
    pub replicas: i32,
    pub sandbox_template_ref: NameRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
}

/// `{name}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NameRef {
    pub name: String,
}

/// `SandboxWarmPool.spec.updateStrategy`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateStrategy {
    #[serde(rename = "type")]
    pub type_: String,
}

/// `SandboxWarmPool.status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WarmPoolStatus {
    #[serde(default)]
    pub replicas: i32,
    #[serde(default)]
    pub ready_replicas: i32,
}

/// A `SandboxWarmPool`.
pub type SandboxWarmPool = Object<WarmPoolSpec, WarmPoolStatus>;

/// `SandboxClaim.spec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSpec {
    pub warm_pool_ref: NameRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<ClaimLifecycle>,
}

/// `SandboxClaim.spec.lifecycle`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimLifecycle {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_policy: Option<String>,
}

/// `SandboxClaim.status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClaimStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<SandboxCondition>,
    #[serde(default)]
    pub sandbox: ClaimedSandbox,
}

/// `SandboxClaim.status.sandbox`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClaimedSandbox {
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "podIPs", skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
}

/// A `SandboxClaim`.
pub type SandboxClaim = Object<ClaimSpec, ClaimStatus>;

/// The template's and the pool's name for a harness.
pub fn pool_name(harness_id: &str) -> String {
    format!("lap-{harness_id}")
}

/// The pool's Secret.
pub fn pool_secret_name(harness_id: &str) -> String {
    format!("lap-pool-{harness_id}")
}

/// Whether this session can take a warm pod: its harness has a pool, and nothing about it is
/// per-agent in the pod (egress rules live in the vault's config file; resources and runtime
/// class in the pod spec). Everything else is a cold start.
pub fn poolable(spec: &SandboxSpec, settings: &PodSettings) -> bool {
    settings.warm_pools.contains_key(&spec.harness_id)
        && spec.allow_out.is_empty()
        && spec.deny_out.is_empty()
        && spec.placement == crate::backend::Placement::default()
}

fn pool_labels(harness_id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
        (POOL_LABEL.to_owned(), harness_id.to_owned()),
    ])
}

/// The pool's Secret: the vault's config (no secrets file), the pool's admin token and the
/// harness bootstrap token, the upstream CAs.
pub fn pool_secret(
    harness_id: &str,
    settings: &PodSettings,
    admin_token: &str,
    bootstrap_token: &str,
) -> Result<Secret, BuildError> {
    let cfg = pool_vault_config(settings, &[], &[]);
    let toml = toml::to_string(&cfg).map_err(|e| BuildError::SidecarConfig(e.to_string()))?;
    let mut data = BTreeMap::from([
        ("sidecar.toml".to_owned(), ByteString(toml.into_bytes())),
        ("admin_token".to_owned(), ByteString(admin_token.as_bytes().to_vec())),
        (
            "bootstrap_token".to_owned(),
            ByteString(bootstrap_token.as_bytes().to_vec()),
        ),
    ]);
    for (i, pem) in settings.upstream_cas.iter().enumerate() {
        data.insert(format!("upstream-ca-{i}.pem"), ByteString(pem.clone()));
    }
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(pool_secret_name(harness_id)),
            namespace: Some(settings.namespace.clone()),
            labels: Some(pool_labels(harness_id)),
            ..ObjectMeta::default()
        },
        data: Some(data),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    })
}

/// The template of a harness's pool.
pub fn template(harness_id: &str, settings: &PodSettings) -> SandboxTemplate {
    let secret = pool_secret_name(harness_id);
    let mut env = pod_env(harness_id, settings.harness_port);
    env.push(super::from_secret(BOOTSTRAP_TOKEN_VAR, &secret, "bootstrap_token"));
    let pod_spec = pod(
        settings,
        &secret,
        settings.harness_image_for(harness_id),
        env,
        resources::harness(&settings.harness_resources, None),
        settings.runtime_class.clone(),
    );
    let mut pod_labels = pool_labels(harness_id);
    pod_labels.insert("app.kubernetes.io/name".to_owned(), "lap-sandbox".to_owned());
    pod_labels.insert(super::HARNESS_LABEL.to_owned(), harness_id.to_owned());
    let mut t = SandboxTemplate::new(
        &pool_name(harness_id),
        &template_resource(),
        TemplateSpec {
            pod_template: PodTemplate {
                metadata: PodMetadata {
                    labels: pod_labels,
                    annotations: BTreeMap::new(),
                },
                spec: pod_spec,
            },
            service: Some(true),
            network_policy_management: Some("Unmanaged".to_owned()),
        },
    )
    .within(&settings.namespace);
    t.metadata.labels = Some(pool_labels(harness_id));
    t
}

/// The warm pool of a harness.
pub fn warm_pool(harness_id: &str, settings: &PodSettings, size: i32) -> SandboxWarmPool {
    let mut p = SandboxWarmPool::new(
        &pool_name(harness_id),
        &warm_pool_resource(),
        WarmPoolSpec {
            replicas: size,
            sandbox_template_ref: NameRef {
                name: pool_name(harness_id),
            },
            // Settings changed (an image, resources): unclaimed pods are replaced at once.
            update_strategy: Some(UpdateStrategy {
                type_: "Recreate".to_owned(),
            }),
        },
    )
    .within(&settings.namespace);
    p.metadata.labels = Some(pool_labels(harness_id));
    p
}

/// The claim of a session, created at `now`: expires with `LAP_K8S_MAX_LIFETIME` like a cold
/// Sandbox.
pub fn claim(spec: &SandboxSpec, settings: &PodSettings, now: Timestamp) -> Result<SandboxClaim, BuildError> {
    let lifetime =
        SignedDuration::try_from(settings.max_lifetime).map_err(|_| BuildError::Lifetime(settings.max_lifetime))?;
    let shutdown = now
        .checked_add(lifetime)
        .map_err(|_| BuildError::Lifetime(settings.max_lifetime))?;
    let mut c = SandboxClaim::new(
        &sandbox_name(&spec.session_id),
        &claim_resource(),
        ClaimSpec {
            warm_pool_ref: NameRef {
                name: pool_name(&spec.harness_id),
            },
            lifecycle: Some(ClaimLifecycle {
                shutdown_time: Some(Time(shutdown)),
                // Retain: the claim stays with Ready=False/ClaimExpired (its Sandbox is
                // deleted), so the session ends `dead` with that reason.
                shutdown_policy: Some("Retain".to_owned()),
            }),
        },
    )
    .within(&settings.namespace);
    c.metadata.labels = Some(labels(spec));
    Ok(c)
}

/// The session's environment for the harness's `PUT /session`: [`super::session_env`] plus its
/// token.
pub fn bootstrap_env(spec: &SandboxSpec) -> BTreeMap<String, String> {
    let mut env = super::session_env(spec);
    env.insert("HARNESS_AUTH_TOKEN".to_owned(), spec.harness_token.clone());
    env
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::backend::Placement;
    use lap_vault_config::SecretSpec;
    use std::time::Duration;

    fn settings() -> PodSettings {
        PodSettings {
            namespace: "lap-sandboxes".into(),
            api_version: super::super::SandboxApiVersion::V1beta1,
            vault_image: "vault:1".into(),
            harness_image: "harness-{harness_id}:1".into(),
            harness_images: BTreeMap::new(),
            netfilter_image: "netfilter:1".into(),
            runtime_class: None,
            transparent: true,
            max_lifetime: Duration::from_secs(3600),
            harness_port: 8080,
            base: Default::default(),
            upstream_cas: vec![],
            harness_resources: Default::default(),
            vault_admin_port: super::super::VAULT_ADMIN_PORT,
            warm_pools: BTreeMap::from([("codex".into(), 2)]),
        }
    }

    fn spec() -> SandboxSpec {
        SandboxSpec {
            session_id: "ses_ab12".into(),
            harness_id: "codex".into(),
            model: Some("gpt-5".into()),
            prompt: None,
            repo_url: None,
            branch: None,
            allow_out: vec![],
            deny_out: vec![],
            secrets: vec![SecretSpec {
                name: "OPENAI_API_KEY".into(),
                stub: "sk-lapstubX0000000".into(),
                value: Some("sk-REAL-VALUE-123".into()),
                hosts: vec!["api.openai.com".into()],
                ..SecretSpec::default()
            }],
            harness_token: "htok".into(),
            tools: None,
            mcp_servers: Vec::new(),
            env: Default::default(),
            placement: Placement::default(),
            phases: None,
        }
    }

    #[test]
    fn only_plain_sessions_of_a_pooled_harness_are_poolable() {
        let st = settings();
        assert!(poolable(&spec(), &st));
        let mut s = spec();
        s.harness_id = "claude-code".into();
        assert!(!poolable(&s, &st), "no pool for this harness");
        let mut s = spec();
        s.allow_out = vec!["example.com".into()];
        assert!(!poolable(&s, &st), "egress rules are in the vault's config file");
        let mut s = spec();
        s.placement.runtime_class = Some("kata".into());
        assert!(!poolable(&s, &st), "a runtime class of its own");
    }

    #[test]
    fn the_template_has_no_session_in_it() {
        let t = template("codex", &settings());
        let json = serde_json::to_string(&t).unwrap();
        for leaked in ["sk-REAL", "sk-lapstub", "htok", "HARNESS_AUTH_TOKEN", "LAP_SESSION_ID"] {
            assert!(!json.contains(leaked), "{leaked} in the template");
        }
        assert_eq!(t.spec.network_policy_management.as_deref(), Some("Unmanaged"));
        assert_eq!(t.spec.service, Some(true));
        let pod = &t.spec.pod_template.spec;
        let h = &pod.containers[0];
        let boot = h
            .env
            .as_ref()
            .unwrap()
            .iter()
            .find(|e| e.name == "LAP_HARNESS_BOOTSTRAP_TOKEN")
            .unwrap();
        let r = boot.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        assert_eq!((r.name.as_str(), r.key.as_str()), ("lap-pool-codex", "bootstrap_token"));
        let vol = pod
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "lap-vault")
            .unwrap();
        assert_eq!(
            vol.secret.as_ref().unwrap().secret_name.as_deref(),
            Some("lap-pool-codex")
        );
        assert_eq!(
            t.spec.pod_template.metadata.labels["app.kubernetes.io/name"],
            "lap-sandbox"
        );
        let secret = pool_secret("codex", &settings(), "atok", "btok").unwrap();
        let data = secret.data.unwrap();
        let cfg = lap_vault_config::parse_config(std::str::from_utf8(&data["sidecar.toml"].0).unwrap()).unwrap();
        assert_eq!(cfg.secrets_file, None, "the vault starts empty");
        assert!(cfg.egress.deny_local);
        assert!(!data.contains_key("secrets.json"));
    }

    #[test]
    fn pool_and_claim() {
        let p = warm_pool("codex", &settings(), 2);
        assert_eq!(p.spec.replicas, 2);
        assert_eq!(p.spec.sandbox_template_ref.name, "lap-codex");
        let c = claim(&spec(), &settings(), "2026-01-02T03:04:05Z".parse().unwrap()).unwrap();
        assert_eq!(c.metadata.name.as_deref(), Some("lap-ses-ab12"));
        assert_eq!(c.spec.warm_pool_ref.name, "lap-codex");
        let l = c.spec.lifecycle.as_ref().unwrap();
        assert_eq!(l.shutdown_policy.as_deref(), Some("Retain"));
        assert_eq!(l.shutdown_time.as_ref().unwrap().0.to_string(), "2026-01-02T04:04:05Z");
        assert_eq!(c.metadata.labels.as_ref().unwrap()["lap.dev/session"], "ses_ab12");
        let env = bootstrap_env(&spec());
        assert_eq!(env["HARNESS_AUTH_TOKEN"], "htok");
        assert_eq!(env["OPENAI_API_KEY"], "sk-lapstubX0000000");
        assert_eq!(env["LAP_MODEL"], "gpt-5");
        assert!(!env.values().any(|v| v.contains("REAL")));
    }
}
