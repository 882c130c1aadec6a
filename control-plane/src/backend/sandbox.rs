//! The Kubernetes shape of a session, pure: the agent-sandbox `Sandbox` resource
//! (kubernetes-sigs/agent-sandbox, `agents.x-k8s.io`), its per-session `Secret`, and how to read
//! the answers back (the `Ready` condition, pod `Event`s → a `failure_reason` in words).
//!
//! [`build`] is the whole pod from (session spec, settings, time): no I/O, unit-tested field by
//! field below. [`super::kubernetes`] sends it and watches it.
//!
//! ```text
//! Sandbox lap-ses-…            (service: true, shutdownTime = now + LAP_K8S_MAX_LIFETIME)
//! └ pod
//!   init  lap-netfilter        root, NET_ADMIN only: iptables sends the harness's TCP to the vault
//!   init  vault (sidecar)      restartPolicy Always, startupProbe /readyz, uid 1337, read-only rootfs
//!   main  harness              uid 10001 (the images' user), after the vault is ready; stubs + SPEC §2.3 env
//! Secret lap-ses-…-vault       sidecar.toml, secrets.json, admin_token, harness_token
//!                              (mounted only into the vault; owner: the Sandbox)
//! emptyDir lap-shared (Memory) the pod CA: vault rw, harness ro
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    PodSecurityContext, PodSpec, Probe, SeccompProfile, Secret, SecretKeySelector, SecretVolumeSource, SecurityContext,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use k8s_openapi::ByteString;
use kube::core::{ApiResource, Object};
use lap_vault_config::{EgressConfig, SecretsFile, SidecarConfig};
use serde::{Deserialize, Serialize};

use super::SandboxSpec;

pub mod conditions;
pub mod pool;
pub mod resources;
pub use conditions::{failure_from_event, readiness, Readiness, SandboxCondition, SandboxStatus};

/// The agent-sandbox API group.
pub const GROUP: &str = "agents.x-k8s.io";
/// Label on everything LAP creates, for inventory (`app.kubernetes.io/managed-by=lap`).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "lap");
/// Label holding the session id.
pub const SESSION_LABEL: &str = "lap.dev/session";
/// Label holding the harness id.
pub const HARNESS_LABEL: &str = "lap.dev/harness";

/// The vault's explicit proxy port (HTTPS_PROXY), on the pod's loopback.
pub const VAULT_PROXY_PORT: u16 = 14322;
/// The vault's admin port (health, CA, audit, reload), reachable by the control plane.
pub const VAULT_ADMIN_PORT: u16 = 14323;
/// The vault's transparent port: iptables redirects the harness's outbound TCP here.
pub const VAULT_TRANSPARENT_PORT: u16 = 14324;
/// The vault container's user (and group); iptables lets only this user out.
pub const VAULT_UID: i64 = 1337;
/// The harness container's user (and group).
pub const HARNESS_UID: i64 = 10001;
/// Group of the pod's volumes (`fsGroup`).
pub const FS_GROUP: i64 = 2000;

/// Where the vault's files are mounted (from the Secret).
const VAULT_ETC: &str = "/etc/lap";
/// Where the pod CA is shared (in-memory emptyDir).
const SHARED: &str = "/lap-shared";
/// The harness's HOME (emptyDir); it writes the CA bundle there at start.
const HARNESS_HOME: &str = "/home/lap";
/// System roots inside the harness image (Debian layout).
const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Which served version of the `Sandbox` API to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SandboxApiVersion {
    /// `agents.x-k8s.io/v1beta1` (SPEC §3.4); writes `spec.service: true`.
    #[value(name = "v1beta1")]
    V1beta1,
    /// `agents.x-k8s.io/v1alpha1`, for controllers that serve only it. It has `service` too,
    /// and controllers since v0.4.6 create the Service only when it is `true`, so it is written
    /// the same way.
    #[value(name = "v1alpha1")]
    V1alpha1,
}

impl SandboxApiVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1beta1 => "v1beta1",
            Self::V1alpha1 => "v1alpha1",
        }
    }

    /// The `ApiResource` kube's dynamic `Api` needs for this version.
    pub fn api_resource(self) -> ApiResource {
        ApiResource {
            group: GROUP.into(),
            version: self.as_str().into(),
            api_version: format!("{GROUP}/{}", self.as_str()),
            kind: "Sandbox".into(),
            plural: "sandboxes".into(),
        }
    }
}

/// `Sandbox.spec` (agent-sandbox `api/v1beta1/sandbox_types.go`; the fields LAP uses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxResourceSpec {
    pub pod_template: PodTemplate,
    /// Ask the controller for a headless Service (`status.serviceFQDN`). Always `true`: since
    /// agent-sandbox v0.4.6 an unset `service` creates none (both API versions have the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<bool>,
    /// When the controller deletes the pod even if LAP forgot it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<Time>,
    /// `Retain`: at `shutdownTime` the controller removes the pod and Service and keeps the
    /// Sandbox with `Ready=False/SandboxExpired`, so the session ends `dead` with that reason;
    /// the control plane then deletes the Sandbox (and its Secret with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_policy: Option<String>,
}

/// `Sandbox.spec.podTemplate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodTemplate {
    #[serde(default)]
    pub metadata: PodMetadata,
    pub spec: PodSpec,
}

/// Labels and annotations of the pod (the only metadata agent-sandbox copies).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodMetadata {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The `Sandbox` resource as kube's dynamic `Api` reads and writes it.
pub type Sandbox = Object<SandboxResourceSpec, SandboxStatus>;

/// Settings of the Kubernetes backend that shape the pod (from `LAP_K8S_*`).
#[derive(Debug, Clone)]
pub struct PodSettings {
    pub namespace: String,
    pub api_version: SandboxApiVersion,
    pub vault_image: String,
    /// `{harness_id}` is replaced by the agent's harness id.
    pub harness_image: String,
    /// Per-harness overrides of `harness_image`.
    pub harness_images: BTreeMap<String, String>,
    /// Runs the iptables setup; needs `iptables` (nft or legacy) and `/bin/sh`.
    pub netfilter_image: String,
    pub runtime_class: Option<String>,
    /// Install the iptables redirect (transparent interception).
    pub transparent: bool,
    /// `shutdownTime` = creation + this.
    pub max_lifetime: Duration,
    /// The port the harness serves on.
    pub harness_port: u16,
    /// From `LAP_SIDECAR_BASE_CONFIG`: resolve, egress, intercept (its `upstream_ca_files` are
    /// paths on the control plane's host: their contents are in `upstream_cas`).
    pub base: SidecarConfig,
    /// PEM contents of the base config's `upstream_ca_files`, shipped in the Secret.
    pub upstream_cas: Vec<Vec<u8>>,
    /// Default requests and limits of the harness container (an agent's `resources` override
    /// them key by key).
    pub harness_resources: crate::model::Resources,
    /// The vault's admin port in the pod ([`VAULT_ADMIN_PORT`]; tests that run a real vault on
    /// loopback pick a free one).
    pub vault_admin_port: u16,
    /// Warm pools: harness id → pool size.
    pub warm_pools: BTreeMap<String, i32>,
}

impl PodSettings {
    /// The image for a harness id.
    pub fn harness_image_for(&self, harness_id: &str) -> String {
        self.harness_images
            .get(harness_id)
            .cloned()
            .unwrap_or_else(|| self.harness_image.replace("{harness_id}", harness_id))
    }
}

/// A problem building the objects (never a secret value in the message).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("sidecar config: {0}")]
    SidecarConfig(String),
    #[error("secrets file: {0}")]
    SecretsFile(String),
    #[error("max lifetime {0:?} is out of range")]
    Lifetime(Duration),
}

/// The Sandbox and its Secret for one session.
#[derive(Debug, Clone)]
pub struct Objects {
    pub sandbox: Sandbox,
    pub secret: Secret,
}

/// The resource name for a session: DNS-1123 (`ses_ab12…` → `lap-ses-ab12…`).
pub fn sandbox_name(session_id: &str) -> String {
    let mut n: String = session_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    n.insert_str(0, "lap-");
    n.truncate(57); // leaves room for "-vault" within 63
    n.trim_end_matches('-').to_owned()
}

/// The per-session Secret's name.
pub fn secret_name(sandbox_name: &str) -> String {
    format!("{sandbox_name}-vault")
}

/// The labels on the Sandbox, its Secret and its pod.
pub fn labels(spec: &SandboxSpec) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
        ("app.kubernetes.io/name".to_owned(), "lap-sandbox".to_owned()),
        (SESSION_LABEL.to_owned(), spec.session_id.clone()),
        (HARNESS_LABEL.to_owned(), spec.harness_id.clone()),
    ])
}

/// The vault's config inside the pod: base settings plus this pod's ports and files.
pub fn vault_config(settings: &PodSettings, allow_out: &[String], deny_out: &[String]) -> SidecarConfig {
    SidecarConfig {
        secrets_file: Some(format!("{VAULT_ETC}/secrets.json").into()),
        ..pool_vault_config(settings, allow_out, deny_out)
    }
}

/// [`vault_config`] without a secrets file: a warm-pool vault starts with no secrets and gets
/// its session's over the admin API (`PUT /secrets`) after the claim.
pub fn pool_vault_config(settings: &PodSettings, allow_out: &[String], deny_out: &[String]) -> SidecarConfig {
    let (base, upstream_cas, transparent) = (&settings.base, settings.upstream_cas.len(), settings.transparent);
    let mut egress = EgressConfig {
        allow: base.egress.allow.clone(),
        deny: base.egress.deny.clone(),
        // Always on in a pod: "this host" is the pod's network namespace, so it refuses the
        // pod's own loopback and IPs (the harness port, the vault's own ports) and link-local,
        // where the cloud metadata service (169.254.169.254, fd00:ec2::254 aside) hands out the
        // node's credentials. The NetworkPolicy excludes 169.254/16 too, but only where the CNI
        // enforces NetworkPolicies; this holds on every cluster. `[resolve]` targets stay
        // reachable (air-gapped stand-ins).
        deny_local: true,
    };
    egress.allow.extend(allow_out.iter().cloned());
    egress.deny.extend(deny_out.iter().cloned());
    SidecarConfig {
        listen: Some(format!("127.0.0.1:{VAULT_PROXY_PORT}")),
        // The control plane reads /interceptions and posts /reload (Bearer admin_token).
        admin_listen: Some(format!("0.0.0.0:{}", settings.vault_admin_port)),
        transparent_listen: transparent.then(|| format!("127.0.0.1:{VAULT_TRANSPARENT_PORT}")),
        ca_cert_path: Some(format!("{SHARED}/ca.pem").into()),
        upstream_ca_files: (0..upstream_cas)
            .map(|i| format!("{VAULT_ETC}/upstream-ca-{i}.pem").into())
            .collect(),
        intercept: Some(super::session_intercept(base)),
        passthrough: base.passthrough.clone(),
        body_tripwire: base.body_tripwire.clone(),
        admin_token_file: Some(format!("{VAULT_ETC}/admin_token").into()),
        resolve: base.resolve.clone(),
        egress,
        ..SidecarConfig::default()
    }
}

fn plain(k: &str, v: String) -> EnvVar {
    EnvVar {
        name: k.to_owned(),
        value: Some(v),
        value_from: None,
    }
}

fn from_secret(k: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: k.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_owned(),
                key: key.to_owned(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// What every harness container gets, session or warm pool: SPEC §2.3 (proxies, CA), its home,
/// port and harness id.
pub fn pod_env(harness_id: &str, harness_port: u16) -> Vec<EnvVar> {
    let proxy = format!("http://127.0.0.1:{VAULT_PROXY_PORT}");
    let no_proxy = "localhost,127.0.0.1,::1,.svc,.svc.cluster.local,.cluster.local".to_owned();
    let bundle = format!("{HARNESS_HOME}/ca-bundle.pem");
    let mut env = Vec::new();
    for k in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
        env.push(plain(k, proxy.clone()));
    }
    env.push(plain("NO_PROXY", no_proxy.clone()));
    env.push(plain("no_proxy", no_proxy));
    env.push(plain("NODE_EXTRA_CA_CERTS", format!("{SHARED}/ca.pem")));
    for k in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
        "CARGO_HTTP_CAINFO",
        "CODEX_CA_CERTIFICATE",
    ] {
        env.push(plain(k, bundle.clone()));
    }
    env.push(plain("HOME", HARNESS_HOME.to_owned()));
    env.push(plain("PORT", harness_port.to_string()));
    env.push(plain("LAP_HARNESS_HOST", "0.0.0.0".to_owned()));
    env.push(plain("LAP_HARNESS_ID", harness_id.to_owned()));
    env
}

/// The session's own part of the harness environment (name → value), `HARNESS_AUTH_TOKEN`
/// aside: its id, the agent's settings, a stub per secret. A cold pod carries it in its spec;
/// a warm-pool pod receives it (with the token) over `PUT /session` after its claim.
pub fn session_env(spec: &SandboxSpec) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([("LAP_SESSION_ID".to_owned(), spec.session_id.clone())]);
    let optional = [
        ("LAP_MODEL", &spec.model),
        ("AGENT_PROMPT", &spec.prompt),
        ("REPO_URL", &spec.repo_url),
        ("BRANCH", &spec.branch),
    ];
    for (k, v) in optional {
        if let Some(v) = v {
            env.insert(k.to_owned(), v.clone());
        }
    }
    // The agent's plain variables first: a session's stub of the same name wins.
    env.extend(spec.agent_env());
    env.extend(spec.stub_env());
    env
}

/// The harness container's environment: SPEC §2.3 (proxies, CA), the stubs, its own settings.
/// `HARNESS_AUTH_TOKEN` comes from the Secret (`secretKeyRef`), not from the Sandbox object.
pub fn harness_env(spec: &SandboxSpec, secret: &str, harness_port: u16) -> Vec<EnvVar> {
    let mut env = pod_env(&spec.harness_id, harness_port);
    env.push(from_secret("HARNESS_AUTH_TOKEN", secret, "harness_token"));
    for (k, v) in session_env(spec) {
        env.push(plain(&k, v));
    }
    env
}

/// The iptables rules of the netfilter init container (run by `/bin/sh -c`): in the pod's
/// network namespace, every outbound TCP connection of any user but the vault's goes to the
/// vault's transparent port, except loopback (the explicit proxy is on loopback); DNS (UDP 53) is
/// allowed so clients can resolve names, and replies on connections made to the pod (probes, the
/// control plane) pass; every other non-loopback packet of those users is rejected. IPv6: the
/// same users may only use loopback and answer inbound connections.
pub fn netfilter_script() -> String {
    let (uid, port) = (VAULT_UID, VAULT_TRANSPARENT_PORT);
    [
        "set -eu".to_owned(),
        "iptables -t nat -N LAP_OUTPUT".to_owned(),
        "iptables -t nat -A OUTPUT -p tcp -j LAP_OUTPUT".to_owned(),
        format!("iptables -t nat -A LAP_OUTPUT -m owner --uid-owner {uid} -j RETURN"),
        "iptables -t nat -A LAP_OUTPUT -o lo -j RETURN".to_owned(),
        format!("iptables -t nat -A LAP_OUTPUT -p tcp -j REDIRECT --to-ports {port}"),
        format!("iptables -A OUTPUT -m owner --uid-owner {uid} -j ACCEPT"),
        "iptables -A OUTPUT -o lo -j ACCEPT".to_owned(),
        // What the nat rule redirected: filter sees the new destination but still the original
        // output device, so `-o lo` does not match it.
        "iptables -A OUTPUT -d 127.0.0.0/8 -j ACCEPT".to_owned(),
        // Replies on connections made *to* the pod (probes, the control plane → harness).
        "iptables -A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT".to_owned(),
        "iptables -A OUTPUT -p udp --dport 53 -j ACCEPT".to_owned(),
        "iptables -A OUTPUT -j REJECT".to_owned(),
        "if [ -e /proc/net/if_inet6 ]; then".to_owned(),
        format!("  ip6tables -A OUTPUT -m owner --uid-owner {uid} -j ACCEPT"),
        "  ip6tables -A OUTPUT -o lo -j ACCEPT".to_owned(),
        "  ip6tables -A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT".to_owned(),
        "  ip6tables -A OUTPUT -j REJECT".to_owned(),
        "fi".to_owned(),
    ]
    .join("\n")
}

fn drop_all() -> Option<Capabilities> {
    Some(Capabilities {
        add: None,
        drop: Some(vec!["ALL".to_owned()]),
    })
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: Some(read_only),
        ..VolumeMount::default()
    }
}

fn http_probe(path: &str, port: u16, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::Int(i32::from(port)),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

/// The pod of a session.
pub fn pod_spec(spec: &SandboxSpec, settings: &PodSettings, secret: &str) -> PodSpec {
    pod(
        settings,
        secret,
        settings.harness_image_for(&spec.harness_id),
        harness_env(spec, secret, settings.harness_port),
        resources::harness(&settings.harness_resources, spec.placement.resources.as_ref()),
        spec.placement
            .runtime_class
            .clone()
            .or_else(|| settings.runtime_class.clone()),
    )
}

/// The pod around a harness container with this image, environment and resources; the vault
/// mounts `secret`.
pub fn pod(
    settings: &PodSettings,
    secret: &str,
    harness_image: String,
    harness_env: Vec<EnvVar>,
    harness_resources: k8s_openapi::api::core::v1::ResourceRequirements,
    runtime_class: Option<String>,
) -> PodSpec {
    let mut init = Vec::new();
    if settings.transparent {
        init.push(Container {
            name: "lap-netfilter".to_owned(),
            image: Some(settings.netfilter_image.clone()),
            command: Some(vec!["/bin/sh".to_owned(), "-c".to_owned(), netfilter_script()]),
            security_context: Some(SecurityContext {
                run_as_user: Some(0),
                run_as_group: Some(0),
                run_as_non_root: Some(false),
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                capabilities: Some(Capabilities {
                    add: Some(vec!["NET_ADMIN".to_owned(), "NET_RAW".to_owned()]),
                    drop: Some(vec!["ALL".to_owned()]),
                }),
                ..SecurityContext::default()
            }),
            resources: Some(resources::small("10m", "16Mi", "64Mi")),
            ..Container::default()
        });
    }
    // The vault as a native sidecar: an init container that keeps running; the harness starts
    // only once its startup probe (/readyz: CA written, listeners bound, secrets loaded) passes.
    init.push(Container {
        name: "vault".to_owned(),
        image: Some(settings.vault_image.clone()),
        args: Some(vec!["--config".to_owned(), format!("{VAULT_ETC}/sidecar.toml")]),
        restart_policy: Some("Always".to_owned()),
        ports: Some(vec![ContainerPort {
            name: Some("vault-admin".to_owned()),
            container_port: i32::from(settings.vault_admin_port),
            ..ContainerPort::default()
        }]),
        startup_probe: Some(http_probe("/readyz", settings.vault_admin_port, 1, 60)),
        resources: Some(resources::small("50m", "64Mi", "256Mi")),
        liveness_probe: Some(http_probe("/healthz", settings.vault_admin_port, 10, 3)),
        volume_mounts: Some(vec![
            mount("lap-vault", VAULT_ETC, true),
            mount("lap-shared", SHARED, false),
        ]),
        security_context: Some(SecurityContext {
            run_as_user: Some(VAULT_UID),
            run_as_group: Some(VAULT_UID),
            run_as_non_root: Some(true),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: drop_all(),
            ..SecurityContext::default()
        }),
        ..Container::default()
    });
    let start = format!(
        "cat {SYSTEM_ROOTS} {SHARED}/ca.pem > {HARNESS_HOME}/ca-bundle.pem && mkdir -p {HARNESS_HOME}/workspace && cd {HARNESS_HOME}/workspace && exec lap-harness"
    );
    let harness = Container {
        name: "harness".to_owned(),
        image: Some(harness_image),
        command: Some(vec!["/bin/sh".to_owned(), "-c".to_owned(), start]),
        env: Some(harness_env),
        ports: Some(vec![ContainerPort {
            name: Some("harness".to_owned()),
            container_port: i32::from(settings.harness_port),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(http_probe("/healthz", settings.harness_port, 2, 3)),
        resources: Some(harness_resources),
        volume_mounts: Some(vec![
            mount("lap-shared", SHARED, true),
            mount("lap-home", HARNESS_HOME, false),
        ]),
        security_context: Some(SecurityContext {
            run_as_user: Some(HARNESS_UID),
            run_as_group: Some(HARNESS_UID),
            run_as_non_root: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: drop_all(),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };
    PodSpec {
        init_containers: Some(init),
        containers: vec![harness],
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        restart_policy: Some("Always".to_owned()),
        runtime_class_name: runtime_class,
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            fs_group: Some(FS_GROUP),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                localhost_profile: None,
            }),
            ..PodSecurityContext::default()
        }),
        volumes: Some(vec![
            Volume {
                name: "lap-vault".to_owned(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(secret.to_owned()),
                    default_mode: Some(0o440),
                    items: None,
                    optional: Some(false),
                }),
                ..Volume::default()
            },
            Volume {
                name: "lap-shared".to_owned(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: Some("Memory".to_owned()),
                    size_limit: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                        "1Mi".to_owned(),
                    )),
                }),
                ..Volume::default()
            },
            Volume {
                name: "lap-home".to_owned(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            },
        ]),
        ..PodSpec::default()
    }
}

/// The Secret's data: the vault's config, the real values, the admin and harness tokens.
pub fn secret_data(
    spec: &SandboxSpec,
    settings: &PodSettings,
    admin_token: &str,
) -> Result<BTreeMap<String, ByteString>, BuildError> {
    let cfg = vault_config(settings, &spec.allow_out, &spec.deny_out);
    let toml = toml::to_string(&cfg).map_err(|e| BuildError::SidecarConfig(e.to_string()))?;
    let secrets = serde_json::to_vec(&SecretsFile {
        secrets: spec.secrets.clone(),
    })
    .map_err(|e| BuildError::SecretsFile(e.to_string()))?;
    let mut data = BTreeMap::from([
        ("sidecar.toml".to_owned(), ByteString(toml.into_bytes())),
        ("secrets.json".to_owned(), ByteString(secrets)),
        ("admin_token".to_owned(), ByteString(admin_token.as_bytes().to_vec())),
        (
            "harness_token".to_owned(),
            ByteString(spec.harness_token.as_bytes().to_vec()),
        ),
    ]);
    for (i, pem) in settings.upstream_cas.iter().enumerate() {
        data.insert(format!("upstream-ca-{i}.pem"), ByteString(pem.clone()));
    }
    Ok(data)
}

/// The Sandbox and Secret of a session, created at `now`.
pub fn build(
    spec: &SandboxSpec,
    settings: &PodSettings,
    admin_token: &str,
    now: Timestamp,
) -> Result<Objects, BuildError> {
    let name = sandbox_name(&spec.session_id);
    let secret = secret_name(&name);
    let labels = labels(spec);
    let lifetime =
        SignedDuration::try_from(settings.max_lifetime).map_err(|_| BuildError::Lifetime(settings.max_lifetime))?;
    let shutdown = now
        .checked_add(lifetime)
        .map_err(|_| BuildError::Lifetime(settings.max_lifetime))?;
    let ar = settings.api_version.api_resource();
    let mut sandbox = Sandbox::new(
        &name,
        &ar,
        SandboxResourceSpec {
            pod_template: PodTemplate {
                metadata: PodMetadata {
                    labels: labels.clone(),
                    annotations: BTreeMap::new(),
                },
                spec: pod_spec(spec, settings, &secret),
            },
            service: Some(true),
            shutdown_time: Some(Time(shutdown)),
            shutdown_policy: Some("Retain".to_owned()),
        },
    )
    .within(&settings.namespace);
    sandbox.metadata.labels = Some(labels.clone());
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(secret),
            namespace: Some(settings.namespace.clone()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        data: Some(secret_data(spec, settings, admin_token)?),
        type_: Some("Opaque".to_owned()),
        immutable: Some(false),
        ..Secret::default()
    };
    Ok(Objects { sandbox, secret })
}

/// The owner reference that makes the Secret go with its Sandbox.
pub fn owner_reference(sandbox: &Sandbox, api_version: SandboxApiVersion) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: api_version.api_resource().api_version,
        kind: "Sandbox".to_owned(),
        name: sandbox.metadata.name.clone()?,
        uid: sandbox.metadata.uid.clone()?,
        controller: Some(false),
        // Not blocking: `blockOwnerDeletion: true` needs `update` on `sandboxes/finalizers`
        // (the OwnerReferencesPermissionEnforcement admission plugin), which the control plane
        // is not granted. Garbage collection deletes the Secret after its Sandbox either way.
        block_owner_deletion: Some(false),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use lap_vault_config::SecretSpec;
    use std::collections::HashMap;

    fn spec() -> SandboxSpec {
        SandboxSpec {
            session_id: "ses_ab12".into(),
            harness_id: "codex".into(),
            model: Some("gpt-5".into()),
            prompt: None,
            repo_url: Some("https://github.com/o/r.git".into()),
            branch: None,
            allow_out: vec![],
            deny_out: vec!["evil.example".into()],
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
            placement: Default::default(),
            phases: None,
        }
    }

    fn settings() -> PodSettings {
        PodSettings {
            namespace: "lap-sandboxes".into(),
            api_version: SandboxApiVersion::V1beta1,
            vault_image: "vault:1".into(),
            harness_image: "harness-{harness_id}:1".into(),
            harness_images: BTreeMap::from([("opencode".into(), "oc:9".into())]),
            netfilter_image: "netfilter:1".into(),
            runtime_class: Some("gvisor".into()),
            transparent: true,
            max_lifetime: Duration::from_secs(3600),
            harness_port: 8080,
            base: SidecarConfig::default(),
            upstream_cas: vec![b"-----BEGIN CERTIFICATE-----\n".to_vec()],
            harness_resources: crate::model::Resources {
                requests: BTreeMap::from([("cpu".into(), "500m".into()), ("memory".into(), "1Gi".into())]),
                limits: BTreeMap::from([("memory".into(), "4Gi".into())]),
            },
            vault_admin_port: VAULT_ADMIN_PORT,
            warm_pools: BTreeMap::new(),
        }
    }

    fn now() -> Timestamp {
        "2026-01-02T03:04:05Z".parse().unwrap()
    }

    fn built() -> Objects {
        build(&spec(), &settings(), "atok", now()).unwrap()
    }

    fn init(o: &Objects, name: &str) -> Container {
        o.sandbox
            .spec
            .pod_template
            .spec
            .init_containers
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.name == name)
            .cloned()
            .unwrap()
    }

    fn harness(o: &Objects) -> Container {
        o.sandbox.spec.pod_template.spec.containers[0].clone()
    }

    #[test]
    fn names_are_dns_labels() {
        assert_eq!(sandbox_name("ses_AB12cd"), "lap-ses-ab12cd");
        assert_eq!(secret_name("lap-ses-ab12cd"), "lap-ses-ab12cd-vault");
        let long = sandbox_name(&format!("ses_{}", "a".repeat(100)));
        assert!(long.len() <= 57 && secret_name(&long).len() <= 63);
    }

    #[test]
    fn sandbox_metadata_and_lifecycle() {
        let o = built();
        let s = &o.sandbox;
        let types = s.types.as_ref().unwrap();
        assert_eq!(types.api_version, "agents.x-k8s.io/v1beta1");
        assert_eq!(types.kind, "Sandbox");
        assert_eq!(s.metadata.name.as_deref(), Some("lap-ses-ab12"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("lap-sandboxes"));
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["app.kubernetes.io/managed-by"], "lap");
        assert_eq!(labels["lap.dev/session"], "ses_ab12");
        assert_eq!(labels["lap.dev/harness"], "codex");
        assert_eq!(&s.spec.pod_template.metadata.labels, labels);
        assert_eq!(s.spec.service, Some(true));
        assert_eq!(
            s.spec.shutdown_time.as_ref().unwrap().0,
            "2026-01-02T04:04:05Z".parse::<Timestamp>().unwrap()
        );
        assert_eq!(s.spec.shutdown_policy.as_deref(), Some("Retain"));
        let json = serde_json::to_value(s).unwrap();
        assert_eq!(json["apiVersion"], "agents.x-k8s.io/v1beta1");
        assert_eq!(json["spec"]["service"], true);
        assert_eq!(json["spec"]["shutdownTime"], "2026-01-02T04:04:05Z");
        assert!(json["spec"]["podTemplate"]["spec"]["containers"].is_array());
        assert!(json.get("status").is_none());
    }

    #[test]
    fn v1alpha1_asks_for_the_service_too() {
        // Controllers since v0.4.6 create the Service only with `service: true`, in v1alpha1 too
        // (without it sessions waited for a Service that never came).
        let mut st = settings();
        st.api_version = SandboxApiVersion::V1alpha1;
        let o = build(&spec(), &st, "atok", now()).unwrap();
        assert_eq!(
            o.sandbox.types.as_ref().unwrap().api_version,
            "agents.x-k8s.io/v1alpha1"
        );
        assert_eq!(o.sandbox.spec.service, Some(true));
        assert_eq!(serde_json::to_value(&o.sandbox).unwrap()["spec"]["service"], true);
    }

    #[test]
    fn pod_security() {
        let o = built();
        let pod = &o.sandbox.spec.pod_template.spec;
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(pod.enable_service_links, Some(false));
        assert_eq!(pod.runtime_class_name.as_deref(), Some("gvisor"));
        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(psc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        for c in [init(&o, "vault"), harness(&o)] {
            let sc = c.security_context.unwrap();
            assert_eq!(sc.run_as_non_root, Some(true), "{}", c.name);
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
            let caps = sc.capabilities.unwrap();
            assert_eq!(caps.drop, Some(vec!["ALL".to_owned()]), "{}", c.name);
            assert_eq!(caps.add, None, "{}", c.name);
        }
        let vault = init(&o, "vault").security_context.unwrap();
        assert_eq!(vault.read_only_root_filesystem, Some(true));
        assert_eq!(vault.run_as_user, Some(VAULT_UID));
        assert_eq!(harness(&o).security_context.unwrap().run_as_user, Some(HARNESS_UID));
        let mut st = settings();
        st.runtime_class = None;
        let o = build(&spec(), &st, "atok", now()).unwrap();
        assert_eq!(o.sandbox.spec.pod_template.spec.runtime_class_name, None);
    }

    #[test]
    fn vault_is_a_native_sidecar_before_the_harness() {
        let o = built();
        let inits = o.sandbox.spec.pod_template.spec.init_containers.clone().unwrap();
        let names: Vec<&str> = inits.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["lap-netfilter", "vault"], "iptables first, then the vault");
        let vault = init(&o, "vault");
        assert_eq!(vault.image.as_deref(), Some("vault:1"));
        assert_eq!(vault.restart_policy.as_deref(), Some("Always"));
        let probe = vault.startup_probe.unwrap();
        let get = probe.http_get.unwrap();
        assert_eq!(get.path.as_deref(), Some("/readyz"));
        assert_eq!(get.port, IntOrString::Int(14323));
        assert_eq!(vault.args.unwrap(), ["--config", "/etc/lap/sidecar.toml"]);
        let h = harness(&o);
        assert_eq!(h.image.as_deref(), Some("harness-codex:1"));
        assert_eq!(h.restart_policy, None);
        assert_eq!(
            h.readiness_probe.unwrap().http_get.unwrap().path.as_deref(),
            Some("/healthz")
        );
        let cmd = h.command.unwrap();
        assert!(
            cmd[2].contains("/lap-shared/ca.pem > /home/lap/ca-bundle.pem"),
            "{}",
            cmd[2]
        );
        assert!(cmd[2].ends_with("exec lap-harness"));
    }

    #[test]
    fn secret_is_mounted_only_into_the_vault() {
        let o = built();
        let pod = &o.sandbox.spec.pod_template.spec;
        let vols = pod.volumes.as_ref().unwrap();
        let sv = vols.iter().find(|v| v.name == "lap-vault").unwrap();
        assert_eq!(
            sv.secret.as_ref().unwrap().secret_name.as_deref(),
            Some("lap-ses-ab12-vault")
        );
        let shared = vols.iter().find(|v| v.name == "lap-shared").unwrap();
        assert_eq!(shared.empty_dir.as_ref().unwrap().medium.as_deref(), Some("Memory"));
        let mounts = |c: &Container| -> Vec<(String, String, bool)> {
            c.volume_mounts
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|m| (m.name, m.mount_path, m.read_only.unwrap_or(false)))
                .collect()
        };
        assert_eq!(
            mounts(&init(&o, "vault")),
            [
                ("lap-vault".to_owned(), "/etc/lap".to_owned(), true),
                ("lap-shared".to_owned(), "/lap-shared".to_owned(), false)
            ]
        );
        let hm = mounts(&harness(&o));
        assert!(hm.iter().all(|(n, _, _)| n != "lap-vault"));
        assert!(hm.contains(&("lap-shared".into(), "/lap-shared".into(), true)));
        assert!(mounts(&init(&o, "lap-netfilter")).is_empty());
        // Secret contents and shape.
        let s = &o.secret;
        assert_eq!(s.metadata.name.as_deref(), Some("lap-ses-ab12-vault"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("lap-sandboxes"));
        assert_eq!(s.metadata.labels.as_ref().unwrap()["lap.dev/session"], "ses_ab12");
        let data = s.data.as_ref().unwrap();
        let text = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
        assert_eq!(text("admin_token"), "atok");
        assert_eq!(text("harness_token"), "htok");
        let file: SecretsFile = serde_json::from_str(&text("secrets.json")).unwrap();
        assert_eq!(file.secrets[0].value.as_deref(), Some("sk-REAL-VALUE-123"));
        let cfg = lap_vault_config::parse_config(&text("sidecar.toml")).unwrap();
        assert_eq!(cfg.listen.as_deref(), Some("127.0.0.1:14322"));
        assert_eq!(cfg.admin_listen.as_deref(), Some("0.0.0.0:14323"));
        assert_eq!(cfg.transparent_listen.as_deref(), Some("127.0.0.1:14324"));
        assert_eq!(cfg.ca_cert_path.unwrap().to_str(), Some("/lap-shared/ca.pem"));
        assert_eq!(cfg.secrets_file.unwrap().to_str(), Some("/etc/lap/secrets.json"));
        assert_eq!(cfg.egress.deny, ["evil.example"]);
        assert_eq!(
            cfg.upstream_ca_files,
            [std::path::PathBuf::from("/etc/lap/upstream-ca-0.pem")]
        );
        assert!(text("upstream-ca-0.pem").starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(cfg.secrets.is_empty(), "values live in secrets.json only");
        // The real value is nowhere in the Sandbox object.
        let sandbox_json = serde_json::to_string(&o.sandbox).unwrap();
        assert!(!sandbox_json.contains("sk-REAL-VALUE-123"));
        assert!(!sandbox_json.contains("htok"));
        assert!(!sandbox_json.contains("atok"));
    }

    #[test]
    fn harness_env_is_stubs_and_spec_2_3() {
        let o = built();
        let env = harness(&o).env.unwrap();
        let plain: HashMap<String, String> = env
            .iter()
            .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), v)))
            .collect();
        assert_eq!(plain["OPENAI_API_KEY"], "sk-lapstubX0000000");
        for k in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
            assert_eq!(plain[k], "http://127.0.0.1:14322");
        }
        assert!(plain["NO_PROXY"].starts_with("localhost,127.0.0.1,::1,"));
        assert!(plain["no_proxy"].contains(".svc"));
        assert_eq!(plain["NODE_EXTRA_CA_CERTS"], "/lap-shared/ca.pem");
        for k in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
            "CARGO_HTTP_CAINFO",
        ] {
            assert_eq!(plain[k], "/home/lap/ca-bundle.pem");
        }
        assert_eq!(plain["PORT"], "8080");
        assert_eq!(plain["LAP_HARNESS_HOST"], "0.0.0.0");
        assert_eq!(plain["LAP_HARNESS_ID"], "codex");
        assert_eq!(plain["LAP_MODEL"], "gpt-5");
        assert_eq!(plain["REPO_URL"], "https://github.com/o/r.git");
        assert!(!plain.contains_key("BRANCH"));
        let token = env.iter().find(|e| e.name == "HARNESS_AUTH_TOKEN").unwrap();
        assert_eq!(token.value, None);
        let r = token.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        assert_eq!(
            (r.name.as_str(), r.key.as_str()),
            ("lap-ses-ab12-vault", "harness_token")
        );
        assert!(!plain.values().any(|v| v.contains("REAL")));
    }

    #[test]
    fn netfilter_redirects_everyone_but_the_vault() {
        let o = built();
        let nf = init(&o, "lap-netfilter");
        assert_eq!(nf.image.as_deref(), Some("netfilter:1"));
        let sc = nf.security_context.unwrap();
        assert_eq!(sc.run_as_user, Some(0));
        let caps = sc.capabilities.unwrap();
        assert_eq!(caps.add.unwrap(), ["NET_ADMIN", "NET_RAW"]);
        assert_eq!(caps.drop.unwrap(), ["ALL"]);
        assert_eq!(
            nf.restart_policy, None,
            "a plain init container: runs once, before the vault"
        );
        let cmd = nf.command.unwrap();
        let script = &cmd[2];
        assert!(script.contains("--uid-owner 1337 -j RETURN"));
        assert!(script.contains("REDIRECT --to-ports 14324"));
        assert!(script.contains("iptables -A OUTPUT -j REJECT"));
        assert!(script.contains("iptables -A OUTPUT -d 127.0.0.0/8 -j ACCEPT"));
        // Inbound connections (probes, the control plane) still get their replies.
        let established = script.find("--ctstate ESTABLISHED,RELATED -j ACCEPT").unwrap();
        assert!(established < script.find("iptables -A OUTPUT -j REJECT").unwrap());
        // The RETURN for the vault comes before the REDIRECT.
        assert!(script.find("-j RETURN").unwrap() < script.find("REDIRECT").unwrap());
        let mut st = settings();
        st.transparent = false;
        let o = build(&spec(), &st, "atok", now()).unwrap();
        let names: Vec<String> = o
            .sandbox
            .spec
            .pod_template
            .spec
            .init_containers
            .unwrap()
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["vault"]);
        let cfg = vault_config(&st, &[], &[]);
        assert_eq!(cfg.transparent_listen, None);
    }

    #[test]
    fn harness_images() {
        let st = settings();
        assert_eq!(st.harness_image_for("claude-code"), "harness-claude-code:1");
        assert_eq!(st.harness_image_for("opencode"), "oc:9");
    }

    #[test]
    fn owner_reference_needs_a_uid() {
        let mut o = built();
        assert!(owner_reference(&o.sandbox, SandboxApiVersion::V1beta1).is_none());
        o.sandbox.metadata.uid = Some("u-1".into());
        let r = owner_reference(&o.sandbox, SandboxApiVersion::V1beta1).unwrap();
        assert_eq!(r.api_version, "agents.x-k8s.io/v1beta1");
        assert_eq!(r.kind, "Sandbox");
        assert_eq!(r.name, "lap-ses-ab12");
        assert_eq!(r.uid, "u-1");
    }

    #[test]
    fn every_container_has_requests_and_the_agent_overrides() {
        let o = built();
        for c in [init(&o, "lap-netfilter"), init(&o, "vault"), harness(&o)] {
            let r = c.resources.unwrap();
            let req = r.requests.unwrap();
            assert!(
                req.contains_key("cpu") && req.contains_key("memory"),
                "{}: not BestEffort",
                c.name
            );
            assert!(r.limits.unwrap().contains_key("memory"), "{}: memory is capped", c.name);
        }
        let h = harness(&o).resources.unwrap();
        assert_eq!(h.requests.unwrap()["cpu"].0, "500m");
        let mut sp = spec();
        sp.placement = crate::backend::Placement {
            resources: Some(crate::model::Resources {
                requests: BTreeMap::from([("cpu".into(), "2".into())]),
                limits: BTreeMap::new(),
            }),
            runtime_class: Some("kata".into()),
        };
        let o = build(&sp, &settings(), "atok", now()).unwrap();
        let pod = &o.sandbox.spec.pod_template.spec;
        assert_eq!(
            pod.runtime_class_name.as_deref(),
            Some("kata"),
            "the agent's runtime class wins"
        );
        let h = pod.containers[0].resources.clone().unwrap();
        assert_eq!(h.requests.as_ref().unwrap()["cpu"].0, "2");
        assert_eq!(h.requests.unwrap()["memory"].0, "1Gi", "defaults fill the rest");
    }

    /// `deny_local` in every pod's vault: the harness cannot reach the cloud metadata service
    /// or the pod's own ports through the vault, whatever the CNI does with NetworkPolicies;
    /// a `[resolve]` target on loopback (an air-gapped stand-in) stays reachable.
    #[test]
    fn the_pod_vault_refuses_local_and_link_local_targets() {
        use lap_vault_config::HostSet;
        use lap_vault_config::{AddressDenial, AddressPolicy};
        let mut base = SidecarConfig::default();
        base.resolve.insert("api.internal:443".into(), "127.0.0.1:8443".into());
        let mut st = settings();
        st.base = base;
        let cfg = vault_config(&st, &[], &[]);
        assert!(cfg.egress.deny_local);
        let toml = toml::to_string(&cfg).unwrap();
        assert!(lap_vault_config::parse_config(&toml).unwrap().egress.deny_local);
        let pod_ip: std::net::IpAddr = "10.1.2.3".parse().unwrap();
        let policy = AddressPolicy::new(
            &HostSet::default(),
            cfg.egress.deny_local,
            [pod_ip],
            ["127.0.0.1:8443".parse().unwrap()],
        );
        for target in [
            "169.254.169.254:80",
            "127.0.0.1:8080",
            "[::1]:14323",
            "10.1.2.3:8080",
            "[fe80::1]:80",
        ] {
            assert_eq!(
                policy.check(target.parse().unwrap()),
                Err(AddressDenial::Local),
                "{target}"
            );
        }
        policy.check("127.0.0.1:8443".parse().unwrap()).unwrap();
        policy.check("93.184.216.34:443".parse().unwrap()).unwrap();
    }
}
