//! A `lap-server` child process on a free loopback port, with a REST client.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use lap_test_support::{eventually, eventually_ok};
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

/// The process group leaders of a sandbox, from its `pids.json` (`[{"pid":…,"start":…}]`).
pub fn sandbox_pids(private_dir: &Path) -> Vec<i32> {
    let Ok(bytes) = std::fs::read(private_dir.join("pids.json")) else {
        return Vec::new();
    };
    let procs: Vec<Value> = serde_json::from_slice(&bytes).unwrap_or_default();
    procs
        .iter()
        .filter_map(|p| p["pid"].as_i64().and_then(|p| i32::try_from(p).ok()))
        .collect()
}

/// The `lap-harness` process of a sandbox: the child of its init (`pids.json`'s second entry,
/// pid 1 of the sandbox's pid namespace).
pub fn sandbox_harness_pid(private_dir: &Path) -> i32 {
    let init = sandbox_pids(private_dir)[1];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let ppid: i32 = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        if ppid == init {
            return pid;
        }
    }
    panic!("no process under the sandbox's init {init}");
}

/// Every file below `dir`, recursively, with its bytes.
pub fn files_below(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => out.extend(files_below(&p)),
            Ok(t) if t.is_file() => out.push((p.clone(), std::fs::read(&p).unwrap_or_default())),
            _ => {}
        }
    }
    out
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
        // Stand-in CLIs live in the test's temporary directory, which a sandbox does not see:
        // make the PATH entries there visible (read-only) inside, as an operator would with
        // LAP_LOCAL_RO_PATHS for CLIs installed outside /usr and /opt.
        if !env.iter().any(|(k, _)| *k == "LAP_LOCAL_RO_PATHS") {
            let path = env
                .iter()
                .find(|(k, _)| *k == "PATH")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            let tmp = std::env::temp_dir();
            let ro: Vec<String> = std::env::split_paths(&path)
                .filter(|p| p.starts_with(&tmp) && p.is_dir())
                .map(|p| p.display().to_string())
                .collect();
            cmd.env("LAP_LOCAL_RO_PATHS", ro.join(":"));
        }
        let child = cmd.spawn().unwrap();
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let url = format!("http://127.0.0.1:{port}");
        eventually(Duration::from_secs(30), "lap-server answers /health", || async {
            http.get(format!("{url}/health"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
                .then_some(())
        })
        .await;
        LapServer {
            url,
            key,
            data_dir: data_dir.to_owned(),
            child,
            http,
            keep_sandboxes: false,
        }
    }

    /// A session's own directory (home, tmp, ca): `<data dir>-sandboxes/<id>`, the local
    /// backend's default sandbox root.
    pub fn sandbox_dir(&self, session_id: &str) -> PathBuf {
        let mut name = self.data_dir.file_name().unwrap().to_os_string();
        name.push("-sandboxes");
        self.data_dir.with_file_name(name).join(session_id)
    }

    /// A session's private directory (sidecar config and logs): `<data dir>/sandboxes/<id>`.
    pub fn private_dir(&self, session_id: &str) -> PathBuf {
        self.data_dir.join("sandboxes").join(session_id)
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
        let what = format!("session {id} leaves creating");
        eventually_ok(timeout, &what, || async {
            let (_, v) = self
                .call("GET", &format!("/api/v1/managed_agents/sessions/{id}"), None)
                .await;
            if v["status"] != "creating" {
                Ok(v)
            } else {
                Err(v)
            }
        })
        .await
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
            for pid in sandbox_pids(&e.path()) {
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
}
