//! `lap-server` as a newcomer runs it: embedded defaults, first-start keys, bad configuration.

#![allow(clippy::unwrap_used)]

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use lap_test_support::eventually;
use support::server::workspace_bin;

/// Start `lap-server` in `cwd` with only LAP_LISTEN set (and the binaries); wait for /health;
/// stop it; return its stdout (the JSON log stream) and stderr.
async fn run_once(cwd: &std::path::Path) -> (String, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lap-server"))
        .current_dir(cwd)
        .env_remove("MASTER_KEY")
        .env_remove("LAP_ENCRYPTION_KEY")
        .env_remove("DATABASE_URL")
        .env_remove("LAP_DATA_DIR")
        .env("LAP_LISTEN", format!("127.0.0.1:{port}"))
        .env("LAP_SIDECAR_BIN", workspace_bin("vault-sidecar"))
        .env("LAP_HARNESS_BIN", workspace_bin("lap-harness"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    eventually(Duration::from_secs(30), "lap-server starts", || async {
        http.get(format!("http://127.0.0.1:{port}/health"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
            .then_some(())
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn first_start_creates_private_keys_and_prints_the_master_key_once() {
    let cwd = tempfile::tempdir().unwrap();
    let (log, err) = run_once(cwd.path()).await;
    let lap = cwd.path().join(".lap");
    let key = std::fs::read_to_string(lap.join("master_key"))
        .unwrap()
        .trim()
        .to_owned();
    // Shown once on stderr, for the person who started it; never in the JSON log stream.
    assert!(err.contains(&format!("MASTER_KEY={key}")), "{err}");
    assert!(!log.contains(&key), "the master key is in the log stream: {log}");
    assert!(
        log.lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()),
        "stdout holds only JSON log lines: {log}"
    );
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&lap), 0o700, "the data dir");
    assert!(lap.join("lap.db").is_file(), "SQLite under ./.lap");
    for f in ["master_key", "encryption_key", "lap.db"] {
        assert_eq!(mode(&lap.join(f)), 0o600, "{f}");
    }
    for e in std::fs::read_dir(&lap).unwrap().flatten() {
        if e.file_type().unwrap().is_file() {
            assert_eq!(
                mode(&e.path()) & 0o077,
                0,
                "{} is readable by others",
                e.path().display()
            );
        }
    }
    let (again, again_err) = run_once(cwd.path()).await;
    assert!(
        !again.contains(&key) && !again_err.contains(&key),
        "the master key was printed twice: {again}{again_err}"
    );
}

fn exit_code(env: &[(&str, &str)]) -> (i32, String) {
    let cwd = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_lap-server"));
    cmd.current_dir(cwd.path()).env("LAP_LISTEN", "127.0.0.1:0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_configuration_exits_2_naming_the_setting() {
    let (code, err) = exit_code(&[("LAP_IDLE_TIMEOUT", "soon")]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("idle-timeout") || err.contains("LAP_IDLE_TIMEOUT"),
        "{err}"
    );
    let (code, err) = exit_code(&[("LAP_BACKEND", "kubernetes"), ("LAP_SIDECAR_BIN", "/bin/true")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("kubernetes"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("base.toml");
    std::fs::write(&bad, "resolve = 7\n").unwrap();
    let (code, err) = exit_code(&[
        ("LAP_SIDECAR_BASE_CONFIG", bad.to_str().unwrap()),
        ("LAP_SIDECAR_BIN", "/bin/true"),
        ("LAP_HARNESS_BIN", "/bin/true"),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("LAP_SIDECAR_BASE_CONFIG") && err.contains("resolve"),
        "{err}"
    );
    let (code, err) = exit_code(&[("LAP_SIDECAR_BIN", "/nonexistent/vault-sidecar")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/vault-sidecar"), "{err}");
}

/// `LAP_BACKEND=kubernetes`: a bad `LAP_K8S_*` value exits 2 naming the key (before any cluster
/// is looked for); without a cluster it exits 2 saying so.
#[test]
fn kubernetes_settings_are_checked_at_start() {
    let (code, err) = exit_code(&[("LAP_BACKEND", "kubernetes"), ("LAP_K8S_NAMESPACE", "Not_A_Namespace")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("LAP_K8S_NAMESPACE"), "{err}");
    let (code, err) = exit_code(&[("LAP_BACKEND", "kubernetes"), ("LAP_K8S_HARNESS_IMAGES", "nope=img:1")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("LAP_K8S_HARNESS_IMAGES") && err.contains("nope"), "{err}");
    let (code, err) = exit_code(&[
        ("LAP_BACKEND", "kubernetes"),
        ("KUBECONFIG", "/nonexistent/kubeconfig"),
        ("KUBERNETES_SERVICE_HOST", ""),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no cluster found"), "{err}");
}

/// SIGTERM with an SSE stream open: the server still exits (after at most ~5 s).
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_exits_even_with_an_open_event_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let mut server = support::server::LapServer::start(&tmp.path().join("data"), &[]).await;
    let a = "/api/v1/managed_agents";
    let (_, agent) = server
        .call(
            "POST",
            &format!("{a}/agents"),
            Some(serde_json::json!({"name": "t", "harness_id": "opencode"})),
        )
        .await;
    let (_, session) = server
        .call(
            "POST",
            &format!("{a}/agents/{}/session", agent["id"].as_str().unwrap()),
            None,
        )
        .await;
    let sid = session["id"].as_str().unwrap().to_owned();
    let events = server.sse("GET", &format!("{a}/sessions/{sid}/events"), None, 1).await;
    assert!(events.contains("event: session"), "{events}");
    // Keep a stream open while the server is told to stop.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let open = http
        .get(format!("{}{a}/sessions/{sid}/events", server.url))
        .bearer_auth(&server.key)
        .send()
        .await
        .unwrap();
    assert_eq!(open.status(), 200);
    let started = Instant::now();
    let status = server.terminate().await;
    assert!(status.is_some(), "lap-server did not exit after SIGTERM");
    assert!(started.elapsed() < Duration::from_secs(15));
    drop(open);
}
