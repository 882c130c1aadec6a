//! `lap-harness` in a warm-pool pod: it waits for its session on `PUT /session` (behind the pool's
//! bootstrap token), then becomes the ordinary harness with the session's token and settings, and
//! the pool's token is gone from its environment.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::Duration;

use lap_test_support::eventually;

/// A stand-in `claude` that answers with what it sees of the environment.
const FAKE_CLAUDE: &str = r#"#!/bin/sh
echo '{"type":"system","subtype":"init","session_id":"c-1"}'
echo "{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"result\":\"key:$ANTHROPIC_API_KEY pool:${LAP_HARNESS_BOOTSTRAP_TOKEN:-none}\",\"session_id\":\"c-1\"}"
"#;

async fn healthz(http: &reqwest::Client, url: &str) -> Option<serde_json::Value> {
    let r = http.get(format!("{url}/healthz")).send().await.ok()?;
    r.json().await.ok()
}

#[tokio::test]
async fn waits_for_its_session_then_serves_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("claude"), FAKE_CLAUDE).unwrap();
    std::fs::set_permissions(bin.join("claude"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lap-harness"))
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("PORT", port.to_string())
        .env("HOME", dir.path())
        .env("LAP_HARNESS_ID", "claude-code")
        .env("LAP_HARNESS_BOOTSTRAP_TOKEN", "pool-token")
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let waiting = eventually(Duration::from_secs(20), "the harness starts", || healthz(&http, &url)).await;
    assert_eq!(waiting["phase"], "waiting_for_session");

    // No message is served before the session, and the session needs the pool's token.
    let r = http
        .post(format!("{url}/message"))
        .bearer_auth("s-tok")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let body = serde_json::json!({"env": {"HARNESS_AUTH_TOKEN": "s-tok", "ANTHROPIC_API_KEY": "sk-ant-stub-1"}});
    let r = http
        .put(format!("{url}/session"))
        .bearer_auth("nope")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let bad = serde_json::json!({"env": {"HARNESS_AUTH_TOKEN": "s-tok", "HTTPS_PROXY": "http://evil"}});
    let r = http
        .put(format!("{url}/session"))
        .bearer_auth("pool-token")
        .json(&bad)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let r = http
        .put(format!("{url}/session"))
        .bearer_auth("pool-token")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);

    // The same process, now the ordinary harness: the session's token, the stub, no pool token.
    eventually(
        Duration::from_secs(20),
        "the harness comes back with its session",
        || async { healthz(&http, &url).await.filter(|h| h["phase"] == "harness_listening") },
    )
    .await;
    let r = http
        .post(format!("{url}/message"))
        .bearer_auth("pool-token")
        .json(&serde_json::json!({"text": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r: serde_json::Value = http
        .post(format!("{url}/message"))
        .bearer_auth("s-tok")
        .json(&serde_json::json!({"text": "hi"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = r["parts"][0]["text"].as_str().unwrap();
    assert_eq!(text, "key:sk-ant-stub-1 pool:none", "{r}");
}
