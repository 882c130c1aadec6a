//! Reaching a session's harness: over TCP (`harness_url`, the Kubernetes backend's pods), or
//! over its Unix socket (`harness_socket`: the local backend's sandboxes have no network, so no
//! harness port exists on the host). One pooled HTTP client per socket, kept until the
//! sandbox is destroyed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use crate::backend::SandboxHandle;

/// HTTP clients toward harnesses.
#[derive(Debug, Default)]
pub struct HarnessClients {
    tcp: std::sync::OnceLock<reqwest::Client>,
    by_socket: Mutex<HashMap<PathBuf, reqwest::Client>>,
}

fn builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(10))
}

impl HarnessClients {
    /// The client for `handle`'s harness (requests go to `handle.harness_url`).
    pub fn for_handle(&self, handle: &SandboxHandle) -> reqwest::Client {
        match &handle.harness_socket {
            Some(sock) => self.for_socket(sock),
            None => self.tcp.get_or_init(|| builder().build().unwrap_or_default()).clone(),
        }
    }

    /// The client whose every connection goes to the Unix socket `path`.
    pub fn for_socket(&self, path: &Path) -> reqwest::Client {
        let mut map = self.by_socket.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(path.to_owned())
            .or_insert_with(|| builder().unix_socket(path).build().unwrap_or_default())
            .clone()
    }

    /// Drop the client of a socket that is gone.
    pub fn forget(&self, path: &Path) {
        self.by_socket.lock().unwrap_or_else(|p| p.into_inner()).remove(path);
    }
}
