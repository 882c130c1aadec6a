//! A `lap-server` child process on a free loopback port, with a REST client.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

/// A workspace binary built next to this test's executable (`target/debug/NAME`).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "{} is not built: run `cargo build --workspace` first",
        p.display()
    );
    p
}

/// Whether `bin` is on PATH.
pub fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

pub struct LapServer {
    pub url: String,
    pub key: String,
    pub data_dir: PathBuf,
    child: tokio::process::Child,
    http: reqwest::Client,
    keep_sandboxes: bool,
}

impl LapServer {
    /// Start `lap-server` with `data_dir` and extra environment; waits for `/health`.
    pub async fn start(data_dir: &Path, env: &[(&str, String)]) -> LapServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self::start_on(port, data_dir, env).await
    }

    /// [`LapServer::start`] on a given port (a restart where the last one served).
    pub async fn start_on(port: u16, data_dir: &Path, env: &[(&str, String)]) -> LapServer {
        let key = "e2e-master-key".to_owned();
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_lap-server"));
        cmd.env("LAP_LISTEN", format!("127.0.0.1:{port}"))
            .env("LAP_DATA_DIR", data_dir)
            .env("MASTER_KEY", &key)
            .env("LAP_SIDECAR_BIN", workspace_bin("vault-sidecar"))
            .env("LAP_HARNESS_BIN", workspace_bin("lap-harness"))
            .env("LAP_RECONCILE_INTERVAL", "1s")
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = http.get(format!("{url}/health")).send().await {
                if r.status().is_success() {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "lap-server did not answer /health");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        LapServer {
            url,
            key,
            data_dir: data_dir.to_owned(),
            child,
            http,
            keep_sandboxes: false,
        }
    }

    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self
            .http
            .request(m, format!("{}{path}", self.url))
            .bearer_auth(&self.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// Read an SSE response until `events` events have arrived; returns the text read.
    pub async fn sse(&self, method: &str, path: &str, body: Option<Value>, events: usize) -> String {
        use futures_util::StreamExt;
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self
            .http
            .request(m, format!("{}{path}", self.url))
            .bearer_auth(&self.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        let mut stream = r.bytes_stream();
        let mut text = String::new();
        let read = async {
            while text.matches("\n\n").count() < events {
                match stream.next().await {
                    Some(Ok(chunk)) => text.push_str(&String::from_utf8_lossy(&chunk)),
                    _ => break,
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .expect("SSE events did not arrive");
        text
    }

    /// Poll the session until it leaves `creating`.
    pub async fn wait_settled(&self, id: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let (_, v) = self
                .call("GET", &format!("/api/v1/managed_agents/sessions/{id}"), None)
                .await;
            if v["status"] != "creating" {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "session still creating after {timeout:?}: {v}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM the server and wait (up to 15 s) for it to exit; `None` if it did not.
    pub async fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let pid = self.child.id()? as i32;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM).ok()?;
        tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .ok()?
            .ok()
    }

    /// Stop the server abruptly (SIGKILL), leaving sandboxes running.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
        self.keep_sandboxes = true;
    }
}

impl Drop for LapServer {
    /// Sandboxes outlive their server by design (a restarted server adopts them); a test's
    /// must not outlive the test.
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if self.keep_sandboxes {
            return;
        }
        let Ok(entries) = std::fs::read_dir(self.data_dir.join("sandboxes")) else {
            return;
        };
        for e in entries.flatten() {
            let Ok(bytes) = std::fs::read(e.path().join("pids.json")) else {
                continue;
            };
            let pids: Vec<i32> = serde_json::from_slice(&bytes).unwrap_or_default();
            for pid in pids {
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
}
