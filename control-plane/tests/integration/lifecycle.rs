//! Session lifecycle against real processes: restart adoption, a vanished sandbox, the idle
//! timeout, the create timeout, and secret rotation reaching a running session. The agent CLI
//! is a small fake `claude` (see `support/fake_cli.rs`) that still calls the API through the
//! real vault sidecar with `curl`.

#![allow(clippy::unwrap_used)]

use crate::support;

use std::time::Duration;

use lap_test_support::{eventually_ok, eventually_true};
use serde_json::{json, Value};
use support::anthropic::StandIn;
use support::fake_cli::path_with_fake_claude;
use support::server::LapServer;

const A: &str = "/api/v1/managed_agents";

async fn ready_session(server: &LapServer, body: Value, agent: Value) -> String {
    let (s, agent) = server.call("POST", &format!("{A}/agents"), Some(agent)).await;
    assert_eq!(s, 201, "{agent}");
    let aid = agent["id"].as_str().unwrap();
    let (s, session) = server
        .call("POST", &format!("{A}/agents/{aid}/session"), Some(body))
        .await;
    assert_eq!(s, 201, "{session}");
    let sid = session["id"].as_str().unwrap().to_owned();
    let v = server.wait_settled(&sid, Duration::from_secs(60)).await;
    assert_eq!(v["status"], "ready", "{v}");
    sid
}

async fn message(server: &LapServer, sid: &str, text: &str) -> (u16, Value) {
    server
        .call(
            "POST",
            &format!("{A}/sessions/{sid}/message"),
            Some(json!({"text": text})),
        )
        .await
}

async fn wait_status(server: &LapServer, sid: &str, want: &str, timeout: Duration) -> Value {
    let what = format!("session {sid} becomes {want}");
    eventually_ok(timeout, &what, || async {
        let (_, v) = server.call("GET", &format!("{A}/sessions/{sid}"), None).await;
        if v["status"] == want {
            Ok(v)
        } else {
            Err(v)
        }
    })
    .await
}

/// `[harness (bubblewrap), sidecar]`: the order the local backend starts them in.
fn sandbox_pids(server: &LapServer, sid: &str) -> Vec<i32> {
    support::server::sandbox_pids(&server.private_dir(sid))
}

fn base_config(dir: &std::path::Path, standin: &StandIn) -> String {
    standin.base_config(dir).display().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn continuity_restart_adoption_and_vanished_sandbox() {
    let tmp = tempfile::tempdir().unwrap();
    let path = path_with_fake_claude(tmp.path());
    let data = tmp.path().join("data");
    let server = LapServer::start(&data, &[("PATH", path.clone())]).await;
    let sid = ready_session(&server, json!({}), json!({"name": "a", "harness_id": "claude-code"})).await;

    let (s, r) = message(&server, &sid, "one").await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["parts"][0]["text"], "echo:one api:nokey resume:none");
    let (_, r) = message(&server, &sid, "two").await;
    assert_eq!(
        r["parts"][0]["text"], "echo:two api:nokey resume:fake-conv-1",
        "continuity"
    );

    // The same through SSE; and the session's event stream starts with its current state.
    let sse = server
        .sse(
            "POST",
            &format!("{A}/sessions/{sid}/message_stream"),
            Some(json!({"text": "s"})),
            100,
        )
        .await;
    assert!(
        sse.starts_with("event: ready")
            && sse.contains("event: harness_event")
            && sse.contains("event: done")
            && sse.contains("echo:s api:nokey resume:fake-conv-1"),
        "{sse}"
    );
    let sse = server.sse("GET", &format!("{A}/sessions/{sid}/events"), None, 1).await;
    assert!(
        sse.contains("event: session") && sse.contains("\"status\":\"ready\""),
        "{sse}"
    );

    // The server dies; its sandboxes keep running and the next server adopts them.
    server.kill().await;
    let server = LapServer::start(&data, &[("PATH", path.clone())]).await;
    let (_, v) = server.call("GET", &format!("{A}/sessions/{sid}"), None).await;
    assert_eq!(v["status"], "ready", "{v}");
    let (s, r) = message(&server, &sid, "three").await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["parts"][0]["text"], "echo:three api:nokey resume:fake-conv-1");

    // The harness disappears: the reconciler marks the session dead and cleans up.
    let pids = sandbox_pids(&server, &sid);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pids[0]), nix::sys::signal::Signal::SIGKILL).unwrap();
    let v = wait_status(&server, &sid, "dead", Duration::from_secs(30)).await;
    assert!(
        v["failure_reason"].as_str().unwrap().contains("stopped unexpectedly"),
        "{v}"
    );
    let (s, _) = message(&server, &sid, "four").await;
    assert_eq!(s, 409);
    wait_removed(&server.private_dir(&sid)).await;
    wait_removed(&server.sandbox_dir(&sid)).await;
}

async fn wait_removed(dir: &std::path::Path) {
    let what = format!("{} is removed", dir.display());
    eventually_true(Duration::from_secs(15), &what, || !dir.exists()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn initial_prompt_is_sent_once_ready() {
    let tmp = tempfile::tempdir().unwrap();
    let path = path_with_fake_claude(tmp.path());
    let server = LapServer::start(&tmp.path().join("data"), &[("PATH", path)]).await;
    let sid = ready_session(
        &server,
        json!({"title": "boot", "initial_prompt": "set up the repo"}),
        json!({"name": "init", "harness_id": "claude-code"}),
    )
    .await;
    let (_, v) = server.call("GET", &format!("{A}/sessions/{sid}"), None).await;
    assert_eq!(v["title"], "boot");
    let calls = server.sandbox_dir(&sid).join("home/fake-claude-calls.log");
    eventually_true(Duration::from_secs(30), "the initial prompt reaches the agent", || {
        std::fs::read_to_string(&calls)
            .unwrap_or_default()
            .contains("set up the repo")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_sessions_are_reaped() {
    let tmp = tempfile::tempdir().unwrap();
    let path = path_with_fake_claude(tmp.path());
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[
            ("PATH", path),
            ("LAP_IDLE_TIMEOUT", "2s".into()),
            ("LAP_RECONCILE_INTERVAL", "1s".into()),
        ],
    )
    .await;
    let sid = ready_session(&server, json!({}), json!({"name": "idle", "harness_id": "claude-code"})).await;
    let (_, v) = server.call("GET", &format!("{A}/sessions/{sid}"), None).await;
    assert_eq!(v["idle_timeout_ms"], 2000);
    let v = wait_status(&server, &sid, "dead", Duration::from_secs(30)).await;
    assert!(v["stopped_at"].is_string());
    wait_removed(&server.data_dir.join("sandboxes").join(&sid)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stuck_creating_fails_after_the_create_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    // A "harness" that never answers /healthz.
    let hang = tmp.path().join("hang.sh");
    std::fs::write(&hang, "#!/bin/sh\nexec sleep 600\n").unwrap();
    std::fs::set_permissions(&hang, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[
            ("LAP_HARNESS_BIN", hang.display().to_string()),
            ("LAP_CREATE_TIMEOUT", "3s".into()),
        ],
    )
    .await;
    let (_, agent) = server
        .call(
            "POST",
            &format!("{A}/agents"),
            Some(json!({"name": "h", "harness_id": "opencode"})),
        )
        .await;
    let aid = agent["id"].as_str().unwrap();
    let (_, session) = server.call("POST", &format!("{A}/agents/{aid}/session"), None).await;
    let sid = session["id"].as_str().unwrap();
    let v = wait_status(&server, sid, "failed", Duration::from_secs(30)).await;
    assert!(
        v["failure_reason"].as_str().unwrap().contains("LAP_CREATE_TIMEOUT"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn registry_rotation_and_session_env_vars_reach_the_vault() {
    let real = "sk-ant-api03-ROTATEDREALKEY";
    let standin = StandIn::start(real).await;
    let tmp = tempfile::tempdir().unwrap();
    let path = path_with_fake_claude(tmp.path());
    let base = base_config(tmp.path(), &standin);
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[("PATH", path), ("LAP_SIDECAR_BASE_CONFIG", base)],
    )
    .await;

    // A per-session env var: the harness holds a stub, the vault swaps in the real key.
    let sid = ready_session(
        &server,
        json!({"env_vars": {"ANTHROPIC_API_KEY": real}}),
        json!({"name": "per-session", "harness_id": "claude-code"}),
    )
    .await;
    let (_, r) = message(&server, &sid, "x").await;
    assert_eq!(r["parts"][0]["text"], "echo:x api:authorized resume:none", "{r}");

    // A registry secret with a wrong value, then rotated: the running session picks it up.
    let (s, v) = server
        .call(
            "POST",
            "/api/v1/secrets",
            Some(json!({"name": "ANTHROPIC_API_KEY", "value": "sk-ant-api03-WRONG", "hosts": ["api.anthropic.com"]})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let sid = ready_session(
        &server,
        json!({}),
        json!({"name": "registry", "harness_id": "claude-code", "secrets": ["ANTHROPIC_API_KEY"]}),
    )
    .await;
    let (_, r) = message(&server, &sid, "y").await;
    assert_eq!(r["parts"][0]["text"], "echo:y api:rejected resume:none", "{r}");
    let (s, v) = server
        .call(
            "PUT",
            "/api/v1/secrets/ANTHROPIC_API_KEY",
            Some(json!({"value": real, "hosts": ["api.anthropic.com"]})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (_, r) = message(&server, &sid, "z").await;
    assert_eq!(r["parts"][0]["text"], "echo:z api:authorized resume:fake-conv-1", "{r}");
    // Deleted from the registry: revoked from the running session at once.
    let (s, v) = server.call("DELETE", "/api/v1/secrets/ANTHROPIC_API_KEY", None).await;
    assert_eq!(s, 204, "{v}");
    let (_, r) = message(&server, &sid, "after-delete").await;
    assert_eq!(
        r["parts"][0]["text"], "echo:after-delete api:rejected resume:fake-conv-1",
        "{r}"
    );
    let (_, audit) = server.call("GET", "/api/v1/audit?kind=secret.delete", None).await;
    assert_eq!(
        audit["data"][0]["detail"]["revoked_from_sessions"],
        json!([sid]),
        "{audit}"
    );

    // An agent's own env_vars, patched: the running session gets the new value.
    let (s, agent) = server
        .call(
            "POST",
            &format!("{A}/agents"),
            Some(json!({"name": "agent-level", "harness_id": "claude-code", "env_vars": {"ANTHROPIC_API_KEY": "sk-ant-api03-WRONG"}})),
        )
        .await;
    assert_eq!(s, 201, "{agent}");
    let aid = agent["id"].as_str().unwrap();
    let (s, session) = server
        .call("POST", &format!("{A}/agents/{aid}/session"), Some(json!({})))
        .await;
    assert_eq!(s, 201, "{session}");
    let asid = session["id"].as_str().unwrap().to_owned();
    assert_eq!(
        server.wait_settled(&asid, Duration::from_secs(60)).await["status"],
        "ready"
    );
    let (_, r) = message(&server, &asid, "a").await;
    assert_eq!(r["parts"][0]["text"], "echo:a api:rejected resume:none", "{r}");
    let (s, v) = server
        .call(
            "PATCH",
            &format!("{A}/agents/{aid}"),
            Some(json!({"env_vars": {"ANTHROPIC_API_KEY": real}})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (_, r) = message(&server, &asid, "b").await;
    assert_eq!(r["parts"][0]["text"], "echo:b api:authorized resume:fake-conv-1", "{r}");

    let (_, events) = server
        .call("GET", &format!("{A}/sessions/{sid}/interceptions"), None)
        .await;
    let events = events.as_array().unwrap();
    assert!(
        events
            .iter()
            .filter(|e| e["injected"].as_array().is_some_and(|i| !i.is_empty()))
            .count()
            >= 2
    );
}
