//! `lap-harness` as a process: token checks, a message and its SSE form through a stand-in
//! agent CLI (a shell script on PATH), and the fatal start-up line when the CLI is missing.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::Duration;

use lap_test_support::eventually;

const FAKE_CLAUDE: &str = r#"#!/bin/sh
text=""; resume=none
while [ $# -gt 0 ]; do case "$1" in --resume) resume="$2"; shift ;; --) text="$2"; break ;; esac; shift; done
echo '{"type":"system","subtype":"init","session_id":"c-1"}'
echo "{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"result\":\"got:$text resume:$resume\",\"session_id\":\"c-1\"}"
"#;

fn path_with(dir: &std::path::Path, script: Option<&str>) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    if let Some(s) = script {
        std::fs::write(bin.join("claude"), s).unwrap();
        std::fs::set_permissions(bin.join("claude"), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    bin.display().to_string()
}

#[tokio::test]
async fn serves_messages_with_continuity_behind_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lap-harness"))
        .env_clear()
        .env("PATH", path_with(dir.path(), Some(FAKE_CLAUDE)))
        .env("PORT", port.to_string())
        .env("HARNESS_AUTH_TOKEN", "tok")
        .env("LAP_HARNESS_ID", "claude-code")
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    eventually(Duration::from_secs(20), "the harness starts", || async {
        http.get(format!("{url}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
            .then_some(())
    })
    .await;
    let r = http
        .post(format!("{url}/message"))
        .json(&serde_json::json!({"text": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = http
        .post(format!("{url}/message"))
        .bearer_auth("nope")
        .json(&serde_json::json!({"text": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r: serde_json::Value = http
        .post(format!("{url}/message"))
        .bearer_auth("tok")
        .json(&serde_json::json!({"text": "hi"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        r,
        serde_json::json!({"parts": [{"type": "text", "text": "got:hi resume:none"}]})
    );
    let body = http
        .post(format!("{url}/message_stream"))
        .bearer_auth("tok")
        .json(&serde_json::json!({"text": "again"}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // LAP's frames, in order: ready, the CLI's events, done.
    assert!(body.starts_with("event: ready\ndata: {}\n\n"), "{body}");
    assert!(
        body.contains("event: harness_event\ndata: {\"type\":\"system\""),
        "{body}"
    );
    assert!(
        body.contains("event: done") && body.contains("got:again resume:c-1"),
        "{body}"
    );
    assert!(body.find("event: harness_event") < body.find("event: done"), "{body}");
}

#[test]
fn a_missing_cli_is_a_fatal_reason() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lap-harness"))
        .env_clear()
        .env("PATH", path_with(dir.path(), None))
        .env("HARNESS_AUTH_TOKEN", "tok")
        .env("LAP_HARNESS_ID", "opencode")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("lap-harness: fatal: the `opencode` CLI") && err.contains("opencode-ai"),
        "{err}"
    );
}

fn git(args: &[&str], cwd: &std::path::Path) {
    let ok = std::process::Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
        .status
        .success();
    assert!(ok, "git {args:?}");
}

#[tokio::test]
async fn clones_repo_url_and_branch_before_serving() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&["init", "-q", "-b", "main"], &repo);
    std::fs::write(repo.join("README"), "hello\n").unwrap();
    git(&["add", "README"], &repo);
    git(&["commit", "-q", "-m", "one"], &repo);
    git(&["checkout", "-q", "-b", "feature"], &repo);
    std::fs::write(repo.join("FEATURE"), "x\n").unwrap();
    git(&["add", "FEATURE"], &repo);
    git(&["commit", "-q", "-m", "two"], &repo);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let path = format!(
        "{}:{}",
        path_with(dir.path(), Some(FAKE_CLAUDE)),
        std::env::var("PATH").unwrap_or_default()
    );
    let _child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lap-harness"))
        .env_clear()
        .env("PATH", path)
        .env("HOME", dir.path())
        .env("PORT", port.to_string())
        .env("HARNESS_AUTH_TOKEN", "tok")
        .env("REPO_URL", format!("file://{}", repo.display()))
        .env("BRANCH", "feature")
        .current_dir(&work)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    eventually(Duration::from_secs(30), "the harness starts", || async {
        http.get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
            .then_some(())
    })
    .await;
    assert!(
        work.join("README").is_file() && work.join("FEATURE").is_file(),
        "repo not cloned on its branch"
    );
}

#[test]
fn a_failed_clone_is_a_fatal_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = format!(
        "{}:{}",
        path_with(dir.path(), Some(FAKE_CLAUDE)),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lap-harness"))
        .env_clear()
        .env("PATH", path)
        .env("HOME", dir.path())
        .env("HARNESS_AUTH_TOKEN", "tok")
        .env("REPO_URL", format!("file://{}/no-such-repo", dir.path().display()))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("lap-harness: fatal: git clone") && err.contains("no-such-repo"),
        "{err}"
    );
}

/// `GET /events`: every message's agent events (the CLI's own JSON lines), whoever sent it;
/// bring-up phases on `/healthz` before that.
#[tokio::test]
async fn events_carry_every_messages_agent_events() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lap-harness"))
        .env_clear()
        .env("PATH", path_with(dir.path(), Some(FAKE_CLAUDE)))
        .env("PORT", port.to_string())
        .env("HARNESS_AUTH_TOKEN", "tok")
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    eventually(Duration::from_secs(20), "the harness starts", || async {
        let r = http.get(format!("{url}/healthz")).send().await.ok()?;
        let ok = r.status().is_success();
        let v: serde_json::Value = r.json().await.unwrap();
        if ok {
            assert_eq!(v["phase"], "harness_listening", "{v}");
            return Some(());
        }
        assert_eq!(v["status"], "starting", "{v}");
        None
    })
    .await;
    let r = http.get(format!("{url}/events")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let events = http
        .get(format!("{url}/events"))
        .bearer_auth("tok")
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    let r = http
        .post(format!("{url}/message"))
        .bearer_auth("tok")
        .json(&serde_json::json!({"text": "watched"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    use futures_util::StreamExt;
    let mut body = events.bytes_stream();
    let mut text = String::new();
    while !text.contains("got:watched") {
        match tokio::time::timeout(Duration::from_secs(10), body.next()).await {
            Ok(Some(Ok(chunk))) => text.push_str(&String::from_utf8_lossy(&chunk)),
            other => panic!("events ended: {other:?}; read: {text}"),
        }
    }
    assert!(text.contains("event: agent\ndata: {\"type\":\"system\""), "{text}");
}
