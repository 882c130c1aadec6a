//! The Kubernetes backend (SPEC §3.4): agent-sandbox resources through kube-rs.
//!
//! Two ways up, chosen per session by [`pool::poolable`]:
//!
//! - **Cold** (always available): create the session's `Secret` (replaced if a previous attempt
//!   left one), create the `Sandbox` (adopted if it already exists for this session: a retried
//!   create is a 409), make the Secret owned by the Sandbox, then *watch* the Sandbox until its
//!   conditions say ready ([`conditions::readiness`]: refusals, terminal pods, expiry and
//!   `Unschedulable` fail at once) while watching the pod's kubelet `Event`s for image pulls and
//!   crash loops ([`conditions::failure_from_event`]).
//! - **Warm**: create a `SandboxClaim` on the harness's `SandboxWarmPool`, watch it until it is
//!   bound to a Sandbox and that Sandbox is ready, push the session's secrets to the vault
//!   (`PUT /secrets` on its admin port) and then the session's environment to the harness
//!   (`PUT /session`), and follow the harness's phases to `harness_listening`.
//!
//! Either way the harness's bring-up phases (`cloning_repo`, `installing_deps`) are read from its
//! `/healthz` at the pod IP while the pod is not Ready yet. kube-runtime's watcher resumes a
//! watch that ends from the last resourceVersion, and re-lists when that is too old. The objects'
//! shapes are [`sandbox`], pure.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Event, Secret};
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::{Client, ResourceExt};
use lap_vault_config::{SecretSpec, SecretsFile};
use rand::RngCore;
use serde::{Deserialize, Serialize};

use super::sandbox::conditions::{self, Readiness};
use super::sandbox::pool::{self, SandboxClaim};
use super::sandbox::{self, PodSettings, Sandbox};
use super::{harness_phase, BackendError, Liveness, SandboxBackend, SandboxHandle, SandboxSpec};

/// How long the harness may take to answer `/healthz` once the Sandbox is `Ready` (its own
/// readiness probe already passed, so this is about the network path from the control plane).
const HARNESS_HEALTH_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the harness's `/healthz` is read for its phase while the pod comes up.
const PHASE_POLL: Duration = Duration::from_millis(250);
/// A Sandbox or Secret younger than this is never swept as an orphan: its session row may be
/// committed by another replica right now.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(60);

/// What the Kubernetes backend keeps in [`SandboxHandle::detail`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KubernetesDetail {
    pub namespace: String,
    /// The Sandbox (a warm one's name is its pool's plus a suffix).
    pub name: String,
    /// The per-session Secret (empty for a warm session: its secrets live only in the vault).
    pub secret: String,
    pub api_version: String,
    /// The session's SandboxClaim, for a warm session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// When the Sandbox (or claim) expires (RFC 3339): a Sandbox gone after it ended as
    /// designed, not "unexpectedly".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<String>,
}

/// A pool's two tokens, read from (or first written to) its Secret.
#[derive(Clone)]
struct PoolTokens {
    admin: String,
    bootstrap: String,
}

/// Runs sandboxes as agent-sandbox `Sandbox` resources.
pub struct KubernetesBackend {
    client: Client,
    settings: PodSettings,
    http: reqwest::Client,
    /// Harness id → its pool's tokens, once [`KubernetesBackend::ensure_pools`] set the pool up.
    pools: Mutex<BTreeMap<String, PoolTokens>>,
}

impl std::fmt::Debug for KubernetesBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesBackend")
            .field("namespace", &self.settings.namespace)
            .finish_non_exhaustive()
    }
}

fn failed(msg: impl Into<String>) -> BackendError {
    BackendError::Failed(msg.into())
}

fn api_failed(what: &str, e: &kube::Error) -> BackendError {
    match e {
        kube::Error::Api(s) if s.code == 403 => failed(format!(
            "{what}: the control plane's service account may not do this ({}); check its RBAC (deploy/base/rbac.yaml)",
            s.message
        )),
        kube::Error::Api(s) if s.code == 404 && (what.contains("Sandbox") || what.contains("claim")) => failed(format!(
            "{what}: the agent-sandbox API is not served ({}); install agent-sandbox with its extensions (deploy/kind-up.sh) or set LAP_K8S_SANDBOX_API_VERSION",
            s.message
        )),
        _ => failed(format!("{what}: {e}")),
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

fn random_token() -> String {
    let mut b = [0u8; 24];
    rand::thread_rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `http://IP:port` (IPv6 in brackets).
fn url(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("http://[{ip}]:{port}")
    } else {
        format!("http://{ip}:{port}")
    }
}

fn ours(labels: Option<&BTreeMap<String, String>>, session_id: &str) -> bool {
    labels.and_then(|l| l.get(sandbox::SESSION_LABEL)).map(String::as_str) == Some(session_id)
}

/// What a `SandboxClaim`'s status says before it is bound (agent-sandbox
/// `sandboxclaim_controller.go` `computeReadyCondition`): a claim that cannot be served.
fn claim_failure(status: Option<&pool::ClaimStatus>) -> Option<String> {
    let ready = status?.conditions.iter().find(|c| c.type_ == "Ready")?;
    let what = match ready.reason.as_str() {
        "TemplateNotFound" | "WarmPoolNotFound" => {
            "the warm pool for this harness is missing (LAP_K8S_WARM_POOLS; lap-server creates it at start)"
        }
        "InvalidMetadata" | "EnvVarsInjectionRejected" | "VolumeClaimTemplatesError" => "the cluster refused the claim",
        "ClaimExpired" => return Some(conditions::EXPIRED.to_owned()),
        _ => return None,
    };
    Some(format!("{what} ({}): {}", ready.reason, ready.message))
}

impl KubernetesBackend {
    /// A backend over `client` (from `Client::try_default()` in production, a fake API server
    /// in tests). Warm pools are used once [`Self::ensure_pools`] has set them up.
    pub fn new(client: Client, settings: PodSettings) -> Result<Self, BackendError> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| failed(format!("http client: {e}")))?;
        Ok(Self {
            client,
            settings,
            http,
            pools: Mutex::new(BTreeMap::new()),
        })
    }

    fn sandboxes(&self) -> Api<Sandbox> {
        Api::namespaced_with(
            self.client.clone(),
            &self.settings.namespace,
            &self.settings.api_version.api_resource(),
        )
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    fn events(&self) -> Api<Event> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    fn claims(&self) -> Api<SandboxClaim> {
        Api::namespaced_with(self.client.clone(), &self.settings.namespace, &pool::claim_resource())
    }

    fn dynamic(&self, ar: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.settings.namespace, ar)
    }

    fn detail(handle: &SandboxHandle) -> Option<KubernetesDetail> {
        serde_json::from_value(handle.detail.clone()).ok()
    }

    fn pool_tokens(&self, harness_id: &str) -> Option<PoolTokens> {
        self.pools.lock().ok()?.get(harness_id).cloned()
    }

    /// Create or replace one pool object by name (typed as JSON: template or warm pool).
    async fn apply(&self, ar: &ApiResource, obj: serde_json::Value) -> Result<(), BackendError> {
        let api = self.dynamic(ar);
        let mut desired: DynamicObject =
            serde_json::from_value(obj).map_err(|e| failed(format!("{}: {e}", ar.kind)))?;
        let name = desired.name_any();
        for _ in 0..3 {
            match api
                .get_opt(&name)
                .await
                .map_err(|e| api_failed(&format!("reading the {}", ar.kind), &e))?
            {
                None => match api.create(&PostParams::default(), &desired).await {
                    Ok(_) => return Ok(()),
                    Err(e) if is_status(&e, 409) => continue,
                    Err(e) => return Err(api_failed(&format!("creating the {}", ar.kind), &e)),
                },
                Some(current) => {
                    if current.data.get("spec") == desired.data.get("spec") {
                        return Ok(());
                    }
                    desired.metadata.resource_version = current.metadata.resource_version.clone();
                    match api.replace(&name, &PostParams::default(), &desired).await {
                        Ok(_) => return Ok(()),
                        Err(e) if is_status(&e, 409) => continue,
                        Err(e) => return Err(api_failed(&format!("replacing the {}", ar.kind), &e)),
                    }
                }
            }
        }
        Err(failed(format!("the {} {name} kept changing", ar.kind)))
    }

    /// The pool's Secret: read its tokens, or create it with new ones. Its config is rewritten
    /// when the settings changed (the tokens stay).
    async fn pool_secret(&self, harness_id: &str) -> Result<PoolTokens, BackendError> {
        let api = self.secrets();
        let name = pool::pool_secret_name(harness_id);
        let text = |s: &Secret, k: &str| {
            s.data
                .as_ref()
                .and_then(|d| d.get(k))
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
                .filter(|t| !t.is_empty())
        };
        for _ in 0..3 {
            match api
                .get_opt(&name)
                .await
                .map_err(|e| api_failed("reading the pool Secret", &e))?
            {
                None => {
                    let tokens = PoolTokens {
                        admin: random_token(),
                        bootstrap: random_token(),
                    };
                    let s = pool::pool_secret(harness_id, &self.settings, &tokens.admin, &tokens.bootstrap)
                        .map_err(|e| failed(e.to_string()))?;
                    match api.create(&PostParams::default(), &s).await {
                        Ok(_) => return Ok(tokens),
                        Err(e) if is_status(&e, 409) => continue, // another replica made it
                        Err(e) => return Err(api_failed("creating the pool Secret", &e)),
                    }
                }
                Some(current) => {
                    let (Some(admin), Some(bootstrap)) =
                        (text(&current, "admin_token"), text(&current, "bootstrap_token"))
                    else {
                        return Err(failed(format!(
                            "the pool Secret {name} has no tokens; delete it to have it recreated"
                        )));
                    };
                    let mut want = pool::pool_secret(harness_id, &self.settings, &admin, &bootstrap)
                        .map_err(|e| failed(e.to_string()))?;
                    if want.data != current.data {
                        want.metadata.resource_version = current.metadata.resource_version.clone();
                        match api.replace(&name, &PostParams::default(), &want).await {
                            Ok(_) => {}
                            Err(e) if is_status(&e, 409) => continue,
                            Err(e) => return Err(api_failed("updating the pool Secret", &e)),
                        }
                    }
                    return Ok(PoolTokens { admin, bootstrap });
                }
            }
        }
        Err(failed(format!("the pool Secret {name} kept changing")))
    }

    /// Set up the warm pools of `LAP_K8S_WARM_POOLS` (Secret, SandboxTemplate, SandboxWarmPool per
    /// harness) and remove LAP's pools for harnesses no longer listed. A harness whose pool cannot
    /// be set up (the extension CRDs are not installed, RBAC) keeps cold starts; the problems are
    /// returned, one line each.
    pub async fn ensure_pools(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (harness_id, size) in &self.settings.warm_pools {
            let r = async {
                let tokens = self.pool_secret(harness_id).await?;
                let t = serde_json::to_value(pool::template(harness_id, &self.settings))
                    .map_err(|e| failed(e.to_string()))?;
                self.apply(&pool::template_resource(), t).await?;
                let p = serde_json::to_value(pool::warm_pool(harness_id, &self.settings, *size))
                    .map_err(|e| failed(e.to_string()))?;
                self.apply(&pool::warm_pool_resource(), p).await?;
                Ok::<_, BackendError>(tokens)
            }
            .await;
            match r {
                Ok(tokens) => {
                    tracing::info!(harness = %harness_id, size, "warm pool ready");
                    if let Ok(mut p) = self.pools.lock() {
                        p.insert(harness_id.clone(), tokens);
                    }
                }
                Err(e) => problems.push(format!("warm pool for {harness_id}: {e}; its sessions start cold")),
            }
        }
        // Pools LAP made for harnesses no longer configured.
        let lp = ListParams::default().labels(&format!("{}={}", sandbox::MANAGED_BY.0, sandbox::MANAGED_BY.1));
        for ar in [pool::warm_pool_resource(), pool::template_resource()] {
            if let Ok(list) = self.dynamic(&ar).list(&lp).await {
                for o in list.items {
                    let harness = o.labels().get(pool::POOL_LABEL).cloned().unwrap_or_default();
                    if !self.settings.warm_pools.contains_key(&harness) {
                        tracing::info!(kind = %ar.kind, name = %o.name_any(), "removing a warm pool no longer configured");
                        let _ = self
                            .dynamic(&ar)
                            .delete(&o.name_any(), &DeleteParams::background())
                            .await;
                    }
                }
            }
        }
        problems
    }

    /// Create the Secret, or replace the one a previous attempt left (409 AlreadyExists).
    async fn put_secret(&self, secret: &Secret) -> Result<(), BackendError> {
        let api = self.secrets();
        let name = secret.name_any();
        match api.create(&PostParams::default(), secret).await {
            Ok(_) => return Ok(()),
            Err(e) if is_status(&e, 409) => {}
            Err(e) => return Err(api_failed("creating the session Secret", &e)),
        }
        for _ in 0..3 {
            let current = api
                .get(&name)
                .await
                .map_err(|e| api_failed("reading the session Secret", &e))?;
            let mut next = secret.clone();
            next.metadata.resource_version = current.metadata.resource_version.clone();
            match api.replace(&name, &PostParams::default(), &next).await {
                Ok(_) => return Ok(()),
                Err(e) if is_status(&e, 409) => continue, // changed meanwhile: read again
                Err(e) => return Err(api_failed("replacing the session Secret", &e)),
            }
        }
        Err(failed("the session Secret kept changing while it was being replaced"))
    }

    /// Create the Sandbox; if it exists (409) and belongs to this session, adopt it.
    async fn put_sandbox(&self, sb: &Sandbox, session_id: &str) -> Result<Sandbox, BackendError> {
        let api = self.sandboxes();
        match api.create(&PostParams::default(), sb).await {
            Ok(created) => Ok(created),
            Err(e) if is_status(&e, 409) => {
                let existing = api
                    .get(&sb.name_any())
                    .await
                    .map_err(|e| api_failed("reading the existing Sandbox", &e))?;
                if ours(existing.metadata.labels.as_ref(), session_id) {
                    tracing::info!(session = %session_id, "adopting the Sandbox a previous attempt created");
                    Ok(existing)
                } else {
                    Err(failed(format!(
                        "a Sandbox named {} exists and belongs to another session",
                        sb.name_any()
                    )))
                }
            }
            Err(e) => Err(api_failed("creating the Sandbox", &e)),
        }
    }

    /// Create the claim; if it exists (409) and belongs to this session, adopt it.
    async fn put_claim(&self, c: &SandboxClaim, session_id: &str) -> Result<(), BackendError> {
        match self.claims().create(&PostParams::default(), c).await {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 409) => {
                let existing = self
                    .claims()
                    .get(&c.name_any())
                    .await
                    .map_err(|e| api_failed("reading the existing claim", &e))?;
                if ours(existing.metadata.labels.as_ref(), session_id) {
                    Ok(())
                } else {
                    Err(failed(format!(
                        "a SandboxClaim named {} exists and belongs to another session",
                        c.name_any()
                    )))
                }
            }
            Err(e) => Err(api_failed("creating the SandboxClaim", &e)),
        }
    }

    /// Read the harness's phase from its `/healthz` (open, JSON `{"phase": …}`).
    async fn harness_phase(&self, base: &str) -> Option<String> {
        let r = self
            .http
            .get(format!("{base}/healthz"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        let v: serde_json::Value = r.json().await.ok()?;
        v["phase"].as_str().map(str::to_owned)
    }

    /// Watch the Sandbox and its pod's Events until `Ready`, or a reason it never will be. While
    /// the pod has an IP but is not Ready, the harness's phases are passed on (`follow_phases`).
    async fn wait_ready(&self, name: &str, spec: &SandboxSpec, follow_phases: bool) -> Result<Sandbox, BackendError> {
        let sandboxes = watcher(
            self.sandboxes(),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
        )
        .default_backoff();
        let events = watcher(
            self.events(),
            watcher::Config::default().fields(&format!("involvedObject.name={name}")),
        )
        .default_backoff();
        tokio::pin!(sandboxes, events);
        let mut poll = tokio::time::interval(PHASE_POLL);
        let mut pod_ip: Option<String> = None;
        loop {
            tokio::select! {
                Some(ev) = sandboxes.next() => match ev {
                    Ok(watcher::Event::Apply(sb) | watcher::Event::InitApply(sb)) => {
                        pod_ip = sb.status.as_ref().and_then(|s| s.pod_ips.first().cloned());
                        match conditions::readiness(sb.metadata.generation, sb.status.as_ref()) {
                            Readiness::Ready => return Ok(sb),
                            Readiness::Failed(reason) => return Err(failed(reason)),
                            Readiness::Expired(reason) => return Err(failed(reason)),
                            Readiness::Pending(why) => tracing::debug!(sandbox = %name, %why, "not ready yet"),
                        }
                    }
                    Ok(watcher::Event::Delete(_)) => {
                        return Err(failed("the Sandbox was deleted while it was starting"))
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(sandbox = %name, error = %e, "watching the Sandbox (retrying)"),
                },
                Some(ev) = events.next() => match ev {
                    Ok(watcher::Event::Apply(e) | watcher::Event::InitApply(e)) => {
                        if let Some(reason) = conditions::failure_from_event(&e) {
                            return Err(failed(reason));
                        }
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(sandbox = %name, error = %e, "watching Events (retrying)"),
                },
                _ = poll.tick(), if follow_phases && pod_ip.is_some() => {
                    if let Some(ip) = &pod_ip {
                        let base = url(ip, self.settings.harness_port);
                        if let Some(p) = self.harness_phase(&base).await.as_deref().and_then(harness_phase) {
                            spec.phase(p);
                        }
                    }
                }
                else => return Err(failed("the watch on the Sandbox ended")),
            }
        }
    }

    /// Watch the claim until it is bound to a Sandbox; its name.
    async fn wait_bound(&self, claim: &str) -> Result<String, BackendError> {
        let claims = watcher(
            self.claims(),
            watcher::Config::default().fields(&format!("metadata.name={claim}")),
        )
        .default_backoff();
        tokio::pin!(claims);
        while let Some(ev) = claims.next().await {
            match ev {
                Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => {
                    if let Some(why) = claim_failure(c.status.as_ref()) {
                        return Err(failed(why));
                    }
                    if let Some(name) = c
                        .status
                        .as_ref()
                        .map(|s| s.sandbox.name.clone())
                        .filter(|n| !n.is_empty())
                    {
                        return Ok(name);
                    }
                }
                Ok(watcher::Event::Delete(_)) => {
                    return Err(failed("the SandboxClaim was deleted while it was starting"))
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(claim = %claim, error = %e, "watching the SandboxClaim (retrying)"),
            }
        }
        Err(failed("the watch on the SandboxClaim ended"))
    }

    /// Poll the harness's `/healthz` (it is ready per its probe; this checks our path to it).
    async fn harness_healthy(&self, url: &str) -> Result<(), BackendError> {
        let deadline = Instant::now() + HARNESS_HEALTH_TIMEOUT;
        loop {
            match self.http.get(format!("{url}/healthz")).timeout(Duration::from_secs(3)).send().await {
                Ok(r) if r.status().is_success() => return Ok(()),
                _ if Instant::now() >= deadline => {
                    return Err(failed(format!(
                        "the sandbox is ready but the control plane cannot reach its harness at {url}; check NetworkPolicies between the control plane and the sandbox namespace"
                    )))
                }
                _ => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }

    /// The harness's base URL: the pod IP (reachable before the pod is Ready, unlike the
    /// headless Service's DNS name), else the Service's name.
    fn harness_base(&self, sb: &Sandbox) -> String {
        let status = sb.status.as_ref();
        match status.and_then(|s| s.pod_ips.first()) {
            Some(ip) => url(ip, self.settings.harness_port),
            None => {
                let host = status
                    .and_then(|s| s.service_fqdn.clone())
                    .filter(|h| !h.is_empty())
                    .unwrap_or_else(|| format!("{}.{}.svc", sb.name_any(), self.settings.namespace));
                format!("http://{host}:{}", self.settings.harness_port)
            }
        }
    }

    async fn bring_up_cold(&self, spec: &SandboxSpec) -> Result<SandboxHandle, BackendError> {
        let admin_token = random_token();
        let now = k8s_openapi::jiff::Timestamp::now();
        let objects = sandbox::build(spec, &self.settings, &admin_token, now).map_err(|e| failed(e.to_string()))?;
        let name = objects.sandbox.name_any();
        let secret_name = objects.secret.name_any();
        let shutdown_time = objects.sandbox.spec.shutdown_time.as_ref().map(|t| t.0.to_string());
        spec.phase("creating-sandbox");
        self.put_secret(&objects.secret).await?;
        let created = self.put_sandbox(&objects.sandbox, &spec.session_id).await?;
        if let Some(owner) = sandbox::owner_reference(&created, self.settings.api_version) {
            let patch = serde_json::json!({ "metadata": { "ownerReferences": [owner] } });
            if let Err(e) = self
                .secrets()
                .patch(&secret_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                // Not fatal: destroy and the orphan sweep delete the Secret by name and label.
                tracing::warn!(session = %spec.session_id, error = %e, "could not make the Secret owned by its Sandbox");
            }
        }
        spec.phase("starting-sandbox");
        let ready = self.wait_ready(&name, spec, true).await?;
        let harness_url = self.harness_base(&ready);
        spec.phase("starting-harness");
        self.harness_healthy(&harness_url).await?;
        let admin_host = harness_url
            .rsplit_once(':')
            .map_or(harness_url.as_str(), |(h, _)| h)
            .to_owned();
        let detail = KubernetesDetail {
            namespace: self.settings.namespace.clone(),
            name,
            secret: secret_name,
            api_version: self.settings.api_version.as_str().to_owned(),
            claim: None,
            shutdown_time,
        };
        Ok(SandboxHandle {
            harness_url,
            harness_socket: None,
            harness_token: spec.harness_token.clone(),
            sidecar_admin_url: format!("{admin_host}:{}", self.settings.vault_admin_port),
            sidecar_admin_token: admin_token,
            detail: serde_json::to_value(&detail).map_err(|e| failed(e.to_string()))?,
        })
    }

    /// `PUT` JSON with a Bearer token; the answer's status and body.
    async fn put_json(
        &self,
        url: &str,
        token: &str,
        body: &serde_json::Value,
    ) -> Result<(reqwest::StatusCode, serde_json::Value), reqwest::Error> {
        let r = self.http.put(url).bearer_auth(token).json(body).send().await?;
        let status = r.status();
        Ok((status, r.json().await.unwrap_or_default()))
    }

    async fn bring_up_warm(&self, spec: &SandboxSpec, tokens: PoolTokens) -> Result<SandboxHandle, BackendError> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let claim = pool::claim(spec, &self.settings, now).map_err(|e| failed(e.to_string()))?;
        let claim_name = claim.name_any();
        let shutdown_time = claim
            .spec
            .lifecycle
            .as_ref()
            .and_then(|l| l.shutdown_time.as_ref())
            .map(|t| t.0.to_string());
        spec.phase("claiming-sandbox");
        self.put_claim(&claim, &spec.session_id).await?;
        let name = self.wait_bound(&claim_name).await?;
        spec.phase("starting-sandbox");
        // Ready here is the warm pod waiting for a session (or, when the pool was empty, a
        // pod started for this claim from the same template).
        let ready = self.wait_ready(&name, spec, false).await?;
        let ip = ready
            .status
            .as_ref()
            .and_then(|s| s.pod_ips.first().cloned())
            .ok_or_else(|| failed("the claimed sandbox has no pod IP"))?;
        let vault = url(&ip, self.settings.vault_admin_port);
        let harness = url(&ip, self.settings.harness_port);

        // 1. The vault gets the session's secrets, and says how many it holds.
        spec.phase("starting-vault");
        let body = serde_json::json!({ "secrets": spec.secrets });
        let (status, answer) = self
            .put_json(&format!("{vault}/secrets"), &tokens.admin, &body)
            .await
            .map_err(|e| failed(format!("the claimed sandbox's vault cannot be reached at {vault}: {e}")))?;
        if !status.is_success() || answer["secrets"].as_u64() != Some(spec.secrets.len() as u64) {
            return Err(failed(format!(
                "the claimed sandbox's vault refused the session's secrets ({status}): {answer}"
            )));
        }
        // 2. Only then the harness gets its session (stubs, settings, token) and starts.
        spec.phase("starting-harness");
        let body = serde_json::json!({ "env": pool::bootstrap_env(spec) });
        let (status, answer) = self
            .put_json(&format!("{harness}/session"), &tokens.bootstrap, &body)
            .await
            .map_err(|e| {
                failed(format!(
                    "the claimed sandbox's harness cannot be reached at {harness}: {e}"
                ))
            })?;
        if status != reqwest::StatusCode::ACCEPTED {
            return Err(failed(format!(
                "the claimed sandbox's harness refused the session ({status}): {answer}"
            )));
        }
        // 3. Its phases until it listens with the session's token.
        let mut poll = tokio::time::interval(PHASE_POLL);
        let mut restarted_seen = false;
        let mut answered = Instant::now();
        loop {
            poll.tick().await;
            let phase = self.harness_phase(&harness).await;
            if phase.is_some() {
                answered = Instant::now();
            } else if answered.elapsed() > HARNESS_HEALTH_TIMEOUT {
                return Err(failed(format!(
                    "the claimed sandbox's harness stopped answering at {harness} during bring-up (see `kubectl logs`)"
                )));
            }
            match phase.as_deref() {
                Some("harness_listening") => break,
                Some("waiting_for_session") => {
                    // The new process answers with its phase at once; the bootstrap server
                    // again means the container restarted (a fatal bring-up error).
                    if restarted_seen {
                        return Err(failed(
                            "the harness restarted during bring-up (see `kubectl logs` for the pod's harness container)",
                        ));
                    }
                    restarted_seen = true;
                }
                Some(p) => {
                    if let Some(p) = harness_phase(p) {
                        spec.phase(p);
                    }
                }
                None => {}
            }
        }
        let detail = KubernetesDetail {
            namespace: self.settings.namespace.clone(),
            name,
            secret: String::new(),
            api_version: self.settings.api_version.as_str().to_owned(),
            claim: Some(claim_name),
            shutdown_time,
        };
        Ok(SandboxHandle {
            harness_url: harness,
            harness_socket: None,
            harness_token: spec.harness_token.clone(),
            sidecar_admin_url: vault,
            sidecar_admin_token: tokens.admin,
            detail: serde_json::to_value(&detail).map_err(|e| failed(e.to_string()))?,
        })
    }

    async fn delete_by_name(&self, name: &str, secret: &str) {
        let dp = DeleteParams::background();
        match self.sandboxes().delete(name, &dp).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {}
            Err(e) => tracing::warn!(sandbox = %name, error = %e, "deleting the Sandbox failed"),
        }
        if secret.is_empty() {
            return;
        }
        // Owned by the Sandbox, so garbage-collected anyway; deleting it now removes the real
        // values from the cluster without waiting for the collector.
        match self.secrets().delete(secret, &dp).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {}
            Err(e) => tracing::warn!(secret = %secret, error = %e, "deleting the Secret failed"),
        }
    }

    /// Read-modify-replace the session Secret's `secrets.json` (with its resourceVersion; a 409
    /// means someone else wrote: again). The kubelet refreshes the mounted file; the vault
    /// reloads it on change.
    async fn edit_secrets_file(
        &self,
        handle: &SandboxHandle,
        edit: impl Fn(&mut SecretsFile),
    ) -> Result<(), BackendError> {
        let d = Self::detail(handle).ok_or_else(|| failed("not a Kubernetes sandbox"))?;
        let api = self.secrets();
        for _ in 0..5 {
            let mut secret = api
                .get(&d.secret)
                .await
                .map_err(|e| api_failed("reading the session Secret", &e))?;
            let data = secret.data.get_or_insert_with(BTreeMap::new);
            let mut file: SecretsFile = data
                .get("secrets.json")
                .map(|b| serde_json::from_slice(&b.0))
                .transpose()
                .map_err(|e| failed(format!("the session Secret's secrets.json: {e}")))?
                .unwrap_or_default();
            edit(&mut file);
            let json = serde_json::to_vec(&file).map_err(|e| failed(format!("secrets file: {e}")))?;
            data.insert("secrets.json".to_owned(), ByteString(json));
            match api.replace(&d.secret, &PostParams::default(), &secret).await {
                Ok(_) => return Ok(()),
                Err(e) if is_status(&e, 409) => continue,
                Err(e) => return Err(api_failed("updating the session Secret", &e)),
            }
        }
        Err(failed("the session Secret kept changing during rotation"))
    }

    /// Delete a claim; the controller's owner reference takes its Sandbox and pod with it.
    async fn delete_claim(&self, name: &str) {
        match self.claims().delete(name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {}
            Err(e) => tracing::warn!(claim = %name, error = %e, "deleting the SandboxClaim failed"),
        }
    }

    /// After a failed bring-up: delete this session's claim, Sandbox and Secret, but never
    /// objects of the same name that carry another session's label.
    async fn delete_own(&self, session_id: &str) {
        let name = sandbox::sandbox_name(session_id);
        let secret = sandbox::secret_name(&name);
        let dp = DeleteParams::background();
        if let Ok(Some(c)) = self.claims().get_opt(&name).await {
            if ours(c.metadata.labels.as_ref(), session_id) {
                let _ = self.claims().delete(&name, &dp).await;
            }
        }
        if let Ok(Some(sb)) = self.sandboxes().get_opt(&name).await {
            if ours(sb.metadata.labels.as_ref(), session_id) {
                let _ = self.sandboxes().delete(&name, &dp).await;
            }
        }
        if let Ok(Some(s)) = self.secrets().get_opt(&secret).await {
            if ours(s.metadata.labels.as_ref(), session_id) {
                let _ = self.secrets().delete(&secret, &dp).await;
            }
        }
    }

    /// Names of LAP's objects of one kind with their session label and age.
    fn stale(
        meta: impl Iterator<Item = (String, Option<String>, Option<k8s_openapi::jiff::Timestamp>)>,
        keep: &HashSet<String>,
        now: k8s_openapi::jiff::Timestamp,
    ) -> Vec<String> {
        meta.filter(|(_, session, _)| session.as_ref().is_none_or(|s| !keep.contains(s)))
            .filter(|(_, _, created)| {
                created.is_none_or(|c| {
                    now.duration_since(c)
                        .as_secs()
                        .try_into()
                        .is_ok_and(|s: u64| s >= ORPHAN_GRACE.as_secs())
                })
            })
            .map(|(name, _, _)| name)
            .collect()
    }

    /// A Sandbox that is gone: over as designed if its shutdown time passed.
    fn gone(d: &KubernetesDetail, what: &str) -> Liveness {
        let expired = d
            .shutdown_time
            .as_deref()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .is_some_and(|t| k8s_openapi::jiff::Timestamp::now() >= t);
        if expired {
            Liveness::Ended(conditions::EXPIRED.to_owned())
        } else {
            Liveness::Gone(what.to_owned())
        }
    }
}

/// Replace one secret's value in a `secrets.json` (keeping its stub).
pub fn rotate_in_file(file: &mut SecretsFile, name: &str, value: &str, hosts: &[String], locations: &[String]) {
    for s in file.secrets.iter_mut().filter(|s| s.name == name) {
        *s = SecretSpec {
            name: s.name.clone(),
            stub: s.stub.clone(),
            value: Some(value.to_owned()),
            hosts: hosts.to_vec(),
            locations: (!locations.is_empty()).then(|| locations.to_vec()),
            ..SecretSpec::default()
        };
    }
}

#[async_trait]
impl SandboxBackend for KubernetesBackend {
    fn isolation(&self) -> &'static str {
        "pod"
    }

    async fn create(&self, spec: SandboxSpec) -> Result<SandboxHandle, BackendError> {
        let warm = pool::poolable(&spec, &self.settings)
            .then(|| self.pool_tokens(&spec.harness_id))
            .flatten();
        let result = match warm {
            Some(tokens) => self.bring_up_warm(&spec, tokens).await,
            None => self.bring_up_cold(&spec).await,
        };
        if result.is_err() {
            self.delete_own(&spec.session_id).await;
        }
        result
    }

    async fn liveness(&self, handle: &SandboxHandle) -> Liveness {
        let Some(d) = Self::detail(handle) else {
            return Liveness::Gone("the sandbox's record is not a Kubernetes one".into());
        };
        if let Some(claim) = &d.claim {
            match self.claims().get_opt(claim).await {
                Ok(None) => return Self::gone(&d, "its SandboxClaim is gone"),
                Ok(Some(c)) if c.metadata.deletion_timestamp.is_some() => {
                    return Self::gone(&d, "its SandboxClaim is being deleted")
                }
                Ok(Some(c)) => {
                    if let Some(why) = claim_failure(c.status.as_ref()) {
                        return if why == conditions::EXPIRED {
                            Liveness::Ended(why)
                        } else {
                            Liveness::Gone(why)
                        };
                    }
                }
                Err(e) => {
                    tracing::warn!(claim = %claim, error = %e, "liveness check failed");
                    return Liveness::Running;
                }
            }
        }
        match self.sandboxes().get_opt(&d.name).await {
            Ok(None) => Self::gone(&d, "its Sandbox resource is gone"),
            Ok(Some(sb)) if sb.metadata.deletion_timestamp.is_some() => {
                Self::gone(&d, "its Sandbox resource is being deleted")
            }
            Ok(Some(sb)) => match conditions::readiness(sb.metadata.generation, sb.status.as_ref()) {
                Readiness::Failed(why) => Liveness::Gone(why),
                Readiness::Expired(why) => Liveness::Ended(why),
                Readiness::Ready | Readiness::Pending(_) => Liveness::Running,
            },
            // The API being unreachable is not the sandbox being gone.
            Err(e) => {
                tracing::warn!(sandbox = %d.name, error = %e, "liveness check failed");
                Liveness::Running
            }
        }
    }

    async fn destroy(&self, handle: &SandboxHandle) {
        if let Some(d) = Self::detail(handle) {
            if let Some(claim) = &d.claim {
                self.delete_claim(claim).await;
            }
            self.delete_by_name(&d.name, &d.secret).await;
        }
    }

    async fn rotate_secret(
        &self,
        handle: &SandboxHandle,
        name: &str,
        value: &str,
        hosts: &[String],
        locations: &[String],
    ) -> Result<(), BackendError> {
        let d = Self::detail(handle).ok_or_else(|| failed("not a Kubernetes sandbox"))?;
        if d.claim.is_some() {
            // A warm session's secrets live only in its vault: rotate there (the stub stays).
            let mut body = serde_json::json!({ "value": value, "hosts": hosts });
            if !locations.is_empty() {
                body["locations"] = serde_json::json!(locations);
            }
            let url = format!("{}/secrets/{name}", handle.sidecar_admin_url);
            return match self.put_json(&url, &handle.sidecar_admin_token, &body).await {
                Ok((s, _)) if s.is_success() => Ok(()),
                Ok((s, answer)) => Err(failed(format!("the vault refused the rotation ({s}): {answer}"))),
                Err(e) => Err(failed(format!("the vault cannot be reached for the rotation: {e}"))),
            };
        }
        self.edit_secrets_file(handle, |file| rotate_in_file(file, name, value, hosts, locations))
            .await
    }

    async fn revoke_secret(&self, handle: &SandboxHandle, name: &str) -> Result<(), BackendError> {
        let d = Self::detail(handle).ok_or_else(|| failed("not a Kubernetes sandbox"))?;
        if d.claim.is_some() {
            // A warm session's secrets live only in its vault: revoke there.
            let url = format!("{}/secrets/{name}", handle.sidecar_admin_url);
            return match self
                .http
                .delete(&url)
                .bearer_auth(&handle.sidecar_admin_token)
                .send()
                .await
            {
                Ok(r) if r.status().is_success() || r.status() == reqwest::StatusCode::NOT_FOUND => Ok(()),
                Ok(r) => Err(failed(format!("the vault refused the revocation ({})", r.status()))),
                Err(e) => Err(failed(format!("the vault cannot be reached for the revocation: {e}"))),
            };
        }
        self.edit_secrets_file(handle, |file| file.secrets.retain(|s| s.name != name))
            .await
    }

    async fn remove(&self, session_id: &str) {
        self.delete_own(session_id).await;
    }

    async fn remove_orphans(&self, keep: &HashSet<String>) -> usize {
        let selector = format!("{}={}", sandbox::MANAGED_BY.0, sandbox::MANAGED_BY.1);
        let lp = ListParams::default().labels(&selector);
        let now = k8s_openapi::jiff::Timestamp::now();
        let mut removed = 0;
        let meta = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            (
                m.name.clone().unwrap_or_default(),
                m.labels.as_ref().and_then(|l| l.get(sandbox::SESSION_LABEL)).cloned(),
                m.creation_timestamp.as_ref().map(|t| t.0),
            )
        };
        match self.sandboxes().list(&lp).await {
            Ok(list) => {
                for name in Self::stale(list.items.iter().map(|s| meta(&s.metadata)), keep, now) {
                    tracing::info!(sandbox = %name, "deleting an orphaned Sandbox");
                    self.delete_by_name(&name, &sandbox::secret_name(&name)).await;
                    removed += 1;
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing Sandboxes for the orphan sweep failed"),
        }
        if !self.settings.warm_pools.is_empty() {
            match self.claims().list(&lp).await {
                Ok(list) => {
                    for name in Self::stale(list.items.iter().map(|c| meta(&c.metadata)), keep, now) {
                        tracing::info!(claim = %name, "deleting an orphaned SandboxClaim");
                        self.delete_claim(&name).await;
                        removed += 1;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "listing SandboxClaims for the orphan sweep failed"),
            }
        }
        // Secrets whose Sandbox was never created (a bring-up interrupted in between). A pool's
        // Secret has no session label and is never swept here.
        match self.secrets().list(&lp).await {
            Ok(list) => {
                let sessions = list
                    .items
                    .iter()
                    .filter(|s| !s.labels().contains_key(pool::POOL_LABEL))
                    .map(|s| meta(&s.metadata));
                for name in Self::stale(sessions, keep, now) {
                    match self.secrets().delete(&name, &DeleteParams::background()).await {
                        Ok(_) => tracing::info!(secret = %name, "deleted an orphaned session Secret"),
                        Err(e) if is_status(&e, 404) => {}
                        Err(e) => tracing::warn!(secret = %name, error = %e, "deleting an orphaned Secret failed"),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing Secrets for the orphan sweep failed"),
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stale_respects_keep_and_grace() {
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        let old = Some("2026-01-01T00:00:00Z".parse().unwrap());
        let fresh = Some("2026-01-01T00:59:50Z".parse().unwrap());
        let keep: HashSet<String> = ["ses_keep".to_owned()].into();
        let items = vec![
            ("a".to_owned(), Some("ses_keep".to_owned()), old),
            ("b".to_owned(), Some("ses_gone".to_owned()), old),
            ("c".to_owned(), Some("ses_gone".to_owned()), fresh),
            ("d".to_owned(), None, old),
        ];
        assert_eq!(KubernetesBackend::stale(items.into_iter(), &keep, now), ["b", "d"]);
    }

    #[test]
    fn rotation_keeps_the_stub() {
        let mut f = SecretsFile {
            secrets: vec![SecretSpec {
                name: "K".into(),
                stub: "stub-0000".into(),
                value: Some("old".into()),
                hosts: vec!["a.example".into()],
                ..SecretSpec::default()
            }],
        };
        rotate_in_file(&mut f, "K", "new", &["b.example".into()], &[]);
        assert_eq!(f.secrets[0].stub, "stub-0000");
        assert_eq!(f.secrets[0].value.as_deref(), Some("new"));
        assert_eq!(f.secrets[0].hosts, ["b.example"]);
        assert_eq!(f.secrets[0].locations, None);
    }
}
