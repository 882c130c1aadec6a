//! Wiring: settings → keys → store → backend → app → router + reconciler.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lap_vault_config::{read_config, SidecarConfig};

use crate::app::{App, AppConfig};
use crate::backend::kubernetes::KubernetesBackend;
use crate::backend::local::{parse_ro_paths, Isolation, LocalBackend, LocalConfig};
use crate::backend::sandbox::PodSettings;
use crate::backend::SandboxBackend;
use crate::crypto::Cipher;
use crate::keys;
use crate::settings::{BackendKind, KubernetesSettings, LocalIsolation, Settings};
use crate::store::{sqlite_url, Store};

/// A configuration problem: `lap-server` exits 2 with it.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(String),
    #[error("database: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("keys: {0}")]
    Keys(#[from] keys::KeyFileError),
    #[error("backend: {0}")]
    Backend(#[from] crate::backend::BackendError),
}

/// A binary next to the running executable, else on PATH; always an absolute path (sandboxes
/// start in another working directory).
pub fn find_binary(name: &str, given: Option<&Path>) -> Result<PathBuf, StartError> {
    if let Some(p) = given {
        return if p.is_file() {
            std::fs::canonicalize(p).map_err(|e| StartError::Config(format!("{}: {e}", p.display())))
        } else {
            Err(StartError::Config(format!("{} does not exist", p.display())))
        };
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_owned))
    {
        let p = dir.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(StartError::Config(format!(
        "cannot find `{name}` next to lap-server or on PATH"
    )))
}

/// The settings of `LAP_SIDECAR_BASE_CONFIG` that apply to every session, with relative
/// `upstream_ca_files` made absolute against the file's directory.
pub fn load_base_config(path: &Path) -> Result<SidecarConfig, StartError> {
    let cfg = read_config(path)
        .map_err(|e| StartError::Config(format!("LAP_SIDECAR_BASE_CONFIG {}: {e}", path.display())))?;
    let base_dir = path.parent().unwrap_or(Path::new("."));
    Ok(SidecarConfig {
        resolve: cfg.resolve,
        upstream_ca_files: cfg
            .upstream_ca_files
            .into_iter()
            .map(|p| if p.is_absolute() { p } else { base_dir.join(p) })
            .collect(),
        egress: cfg.egress,
        intercept: cfg.intercept,
        passthrough: cfg.passthrough,
        body_tripwire: cfg.body_tripwire,
        ..SidecarConfig::default()
    })
}

/// The Kubernetes backend's pod settings from `LAP_K8S_*` and `LAP_SIDECAR_BASE_CONFIG` (whose
/// `upstream_ca_files` are read here, to ship in each session's Secret).
pub fn pod_settings(k8s: &KubernetesSettings, base_config: Option<&Path>) -> Result<PodSettings, StartError> {
    k8s.validate().map_err(|e| StartError::Config(e.to_string()))?;
    let base = match base_config {
        Some(p) => load_base_config(p)?,
        None => SidecarConfig::default(),
    };
    let mut upstream_cas = Vec::new();
    for f in &base.upstream_ca_files {
        upstream_cas.push(std::fs::read(f).map_err(|e| {
            StartError::Config(format!(
                "LAP_SIDECAR_BASE_CONFIG upstream_ca_files: {}: {e}",
                f.display()
            ))
        })?);
    }
    Ok(PodSettings {
        namespace: k8s.namespace.clone(),
        api_version: k8s.api_version,
        vault_image: k8s.vault_image.clone(),
        harness_image: k8s.harness_image.clone(),
        harness_images: k8s
            .harness_image_overrides()
            .map_err(|e| StartError::Config(e.to_string()))?,
        netfilter_image: k8s.netfilter_image.clone().unwrap_or_else(|| k8s.vault_image.clone()),
        runtime_class: k8s.runtime_class.clone(),
        transparent: k8s.transparent,
        max_lifetime: k8s.max_lifetime,
        harness_port: k8s.harness_port,
        base,
        upstream_cas,
        harness_resources: k8s.harness_resources().map_err(|e| StartError::Config(e.to_string()))?,
        vault_admin_port: crate::backend::sandbox::VAULT_ADMIN_PORT,
        warm_pools: k8s.warm_pool_sizes().map_err(|e| StartError::Config(e.to_string()))?,
    })
}

/// Everything needed to serve, built from settings.
#[derive(Debug)]
pub struct Server {
    pub app: Arc<App>,
    pub keys: keys::Keys,
}

/// The data dir, 0700, and its SQLite files 0600 (older installs made them 0755/0644).
fn private_data_dir(dir: &Path) -> Result<(), StartError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let err = |e: std::io::Error| StartError::Config(format!("LAP_DATA_DIR {}: {e}", dir.display()));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(err)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
    for f in ["lap.db", "lap.db-wal", "lap.db-shm", "master_key", "encryption_key"] {
        let p = dir.join(f);
        if p.exists() {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
        }
    }
    Ok(())
}

/// `<data dir>-sandboxes`: beside the data dir, not in it.
fn default_sandbox_root(data_dir: &Path) -> PathBuf {
    let mut name = data_dir
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "lap".into());
    name.push("-sandboxes");
    data_dir.with_file_name(name)
}

/// Validate settings and build the server (creating the data dir and keys on first start).
pub async fn build(settings: &Settings) -> Result<Server, StartError> {
    private_data_dir(&settings.data_dir)?;
    let keys = keys::load_or_create(
        &settings.data_dir,
        settings.master_key.as_deref(),
        settings.encryption_key.as_deref(),
    )?;
    let backend: Arc<dyn SandboxBackend> = match settings.backend {
        BackendKind::Local => {
            let base = match &settings.sidecar_base_config {
                Some(p) => load_base_config(p)?,
                None => SidecarConfig::default(),
            };
            let data_dir = std::fs::canonicalize(&settings.data_dir).unwrap_or_else(|_| settings.data_dir.clone());
            let isolation = match settings.local_isolation {
                LocalIsolation::Bubblewrap => Isolation::Bubblewrap,
                LocalIsolation::None => {
                    tracing::warn!(
                        "LAP_LOCAL_ISOLATION=none: sessions run WITHOUT a sandbox, as this server's user; \
                         their agents can read every real key and the platform's files (development only)"
                    );
                    Isolation::None
                }
            };
            let ro_paths = parse_ro_paths(&settings.local_ro_paths).map_err(StartError::Config)?;
            Arc::new(LocalBackend::new(LocalConfig {
                root: data_dir.join("sandboxes"),
                sandbox_root: settings
                    .local_sandbox_root
                    .clone()
                    .unwrap_or_else(|| default_sandbox_root(&data_dir)),
                sidecar_bin: find_binary("vault-sidecar", settings.sidecar_bin.as_deref())?,
                harness_bin: find_binary("lap-harness", settings.harness_bin.as_deref())?,
                base,
                isolation,
                ro_paths,
                sandbox_uid: settings.local_sandbox_uid,
            })?)
        }
        BackendKind::Kubernetes => {
            let pod = pod_settings(&settings.k8s, settings.sidecar_base_config.as_deref())?;
            let client = kube::Client::try_default().await.map_err(|e| {
                StartError::Config(format!(
                    "LAP_BACKEND=kubernetes: no cluster found (in-cluster service account or KUBECONFIG): {e}"
                ))
            })?;
            let backend = KubernetesBackend::new(client, pod)?;
            for problem in backend.ensure_pools().await {
                tracing::warn!("{problem}");
            }
            Arc::new(backend)
        }
    };
    let url = settings
        .database_url
        .clone()
        .unwrap_or_else(|| sqlite_url(&settings.data_dir));
    let store = Store::connect(&url).await?;
    let cipher = Cipher::from_setting(&keys.encryption_key);
    let rehashed = store.hash_clear_tty_tokens(|id| cipher.tty_token(id)).await?;
    if rehashed > 0 {
        tracing::info!(
            sessions = rehashed,
            "terminal tokens stored in clear were replaced by hashes"
        );
    }
    let app = App::new(
        store,
        cipher,
        backend,
        AppConfig {
            master_key: keys.master_key.clone(),
            idle_timeout: settings.idle_timeout,
            create_timeout: settings.create_timeout,
            audit_retention: settings.audit_retention,
            model_gateway: settings
                .model_gateway()
                .map_err(|e| StartError::Config(e.to_string()))?,
        },
    );
    Ok(Server { app, keys })
}
