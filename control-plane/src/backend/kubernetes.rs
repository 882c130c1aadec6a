//! The Kubernetes backend (SPEC §3.4): one agent-sandbox `Sandbox` per session, through kube-rs.
//!
//! Bring-up: create the session's `Secret` (replaced if a previous attempt left one), create the
//! `Sandbox` (adopted if it already exists for this session: a retried create is a 409), make
//! the Secret owned by the Sandbox, then *watch* the Sandbox until its `Ready` condition is
//! `True` while watching the pod's `Event`s for a reason it never will be (image pull, crash
//! loop, unschedulable, quota; [`sandbox::failure_from_event`]). kube-runtime's watcher resumes
//! a watch that ends from the last resourceVersion, and re-lists when that is too old. Last, the
//! harness's `/healthz` is checked from here over the Sandbox's Service. The pod's shape is
//! [`sandbox::build`], pure.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Event, Secret};
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::{Client, ResourceExt};
use lap_vault_sidecar::config::{SecretSpec, SecretsFile};
use rand::RngCore;
use serde::{Deserialize, Serialize};

use super::sandbox::{self, PodSettings, Readiness, Sandbox};
use super::{BackendError, Liveness, SandboxBackend, SandboxHandle, SandboxSpec};

/// How long the harness may take to answer `/healthz` once the Sandbox is `Ready` (its own
/// readiness probe already passed, so this is about the network path from the control plane).
const HARNESS_HEALTH_TIMEOUT: Duration = Duration::from_secs(60);
/// A Sandbox or Secret younger than this is never swept as an orphan: its session row may be
/// committed by another replica right now.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(60);

/// What the Kubernetes backend keeps in [`SandboxHandle::detail`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KubernetesDetail {
    pub namespace: String,
    pub name: String,
    pub secret: String,
    pub api_version: String,
}

/// Runs sandboxes as agent-sandbox `Sandbox` resources.
pub struct KubernetesBackend {
    client: Client,
    settings: PodSettings,
    http: reqwest::Client,
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
        kube::Error::Api(s) if s.code == 404 && what.contains("Sandbox") => failed(format!(
            "{what}: the Sandbox API is not served ({}); install agent-sandbox (deploy/kind-up.sh) or set LAP_K8S_SANDBOX_API_VERSION",
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

impl KubernetesBackend {
    /// A backend over `client` (from `Client::try_default()` in production, a fake API server
    /// in tests).
    pub fn new(client: Client, settings: PodSettings) -> Result<Self, BackendError> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| failed(format!("http client: {e}")))?;
        Ok(Self { client, settings, http })
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

    fn detail(handle: &SandboxHandle) -> Option<KubernetesDetail> {
        serde_json::from_value(handle.detail.clone()).ok()
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
                if existing.labels().get(sandbox::SESSION_LABEL).map(String::as_str) == Some(session_id) {
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

    /// Watch the Sandbox and its Events until `Ready`, or a reason it never will be.
    async fn wait_ready(&self, name: &str) -> Result<Sandbox, BackendError> {
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
        loop {
            tokio::select! {
                Some(ev) = sandboxes.next() => match ev {
                    Ok(watcher::Event::Apply(sb) | watcher::Event::InitApply(sb)) => {
                        match sandbox::readiness(sb.status.as_ref()) {
                            Readiness::Ready => return Ok(sb),
                            Readiness::Failed(reason) => return Err(failed(reason)),
                            Readiness::Pending => {}
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
                        if let Some(reason) = sandbox::failure_from_event(&e) {
                            return Err(failed(reason));
                        }
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(sandbox = %name, error = %e, "watching Events (retrying)"),
                },
                else => return Err(failed("the watch on the Sandbox ended")),
            }
        }
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

    async fn bring_up(&self, spec: &SandboxSpec) -> Result<SandboxHandle, BackendError> {
        let admin_token = random_token();
        let objects = sandbox::build(spec, &self.settings, &admin_token, k8s_openapi::jiff::Timestamp::now())
            .map_err(|e| failed(e.to_string()))?;
        let name = objects.sandbox.name_any();
        let secret_name = objects.secret.name_any();
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
        let ready = self.wait_ready(&name).await?;
        let host = ready
            .status
            .as_ref()
            .and_then(|s| s.service_fqdn.clone())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| format!("{name}.{}.svc", self.settings.namespace));
        let harness_url = format!("http://{host}:{}", self.settings.harness_port);
        spec.phase("starting-harness");
        self.harness_healthy(&harness_url).await?;
        let detail = KubernetesDetail {
            namespace: self.settings.namespace.clone(),
            name,
            secret: secret_name,
            api_version: self.settings.api_version.as_str().to_owned(),
        };
        Ok(SandboxHandle {
            harness_url,
            harness_socket: None,
            harness_token: spec.harness_token.clone(),
            sidecar_admin_url: format!("http://{host}:{}", sandbox::VAULT_ADMIN_PORT),
            sidecar_admin_token: admin_token,
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
        // Owned by the Sandbox, so garbage-collected anyway; deleting it now removes the real
        // values from the cluster without waiting for the collector.
        match self.secrets().delete(secret, &dp).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {}
            Err(e) => tracing::warn!(secret = %secret, error = %e, "deleting the Secret failed"),
        }
    }

    /// After a failed bring-up: delete this session's Sandbox and Secret, but never objects of
    /// the same name that carry another session's label.
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

    async fn delete_own(&self, session_id: &str) {
        let name = sandbox::sandbox_name(session_id);
        let secret = sandbox::secret_name(&name);
        let ours = |labels: Option<&BTreeMap<String, String>>| {
            labels.and_then(|l| l.get(sandbox::SESSION_LABEL)).map(String::as_str) == Some(session_id)
        };
        let dp = DeleteParams::background();
        if let Ok(Some(sb)) = self.sandboxes().get_opt(&name).await {
            if ours(sb.metadata.labels.as_ref()) {
                let _ = self.sandboxes().delete(&name, &dp).await;
            }
        }
        if let Ok(Some(s)) = self.secrets().get_opt(&secret).await {
            if ours(s.metadata.labels.as_ref()) {
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
        let result = self.bring_up(&spec).await;
        if result.is_err() {
            self.delete_own(&spec.session_id).await;
        }
        result
    }

    async fn liveness(&self, handle: &SandboxHandle) -> Liveness {
        let Some(d) = Self::detail(handle) else {
            return Liveness::Gone("the sandbox's record is not a Kubernetes one".into());
        };
        match self.sandboxes().get_opt(&d.name).await {
            Ok(None) => Liveness::Gone("its Sandbox resource is gone".into()),
            Ok(Some(sb)) if sb.metadata.deletion_timestamp.is_some() => {
                Liveness::Gone("its Sandbox resource is being deleted".into())
            }
            Ok(Some(sb)) => match sandbox::readiness(sb.status.as_ref()) {
                Readiness::Failed(why) => Liveness::Gone(why),
                _ => Liveness::Running,
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
        self.edit_secrets_file(handle, |file| rotate_in_file(file, name, value, hosts, locations))
            .await
    }

    async fn revoke_secret(&self, handle: &SandboxHandle, name: &str) -> Result<(), BackendError> {
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
        match self.sandboxes().list(&lp).await {
            Ok(list) => {
                let meta = list.items.iter().map(|s| {
                    (
                        s.name_any(),
                        s.labels().get(sandbox::SESSION_LABEL).cloned(),
                        s.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    )
                });
                for name in Self::stale(meta, keep, now) {
                    tracing::info!(sandbox = %name, "deleting an orphaned Sandbox");
                    self.delete_by_name(&name, &sandbox::secret_name(&name)).await;
                    removed += 1;
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing Sandboxes for the orphan sweep failed"),
        }
        // Secrets whose Sandbox was never created (a bring-up interrupted in between).
        match self.secrets().list(&lp).await {
            Ok(list) => {
                let meta = list.items.iter().map(|s| {
                    (
                        s.name_any(),
                        s.labels().get(sandbox::SESSION_LABEL).cloned(),
                        s.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    )
                });
                for name in Self::stale(meta, keep, now) {
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
