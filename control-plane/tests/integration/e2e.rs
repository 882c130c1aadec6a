//! End-to-end: a real `lap-server`, real `vault-sidecar` and `lap-harness` processes, the real
//! `claude` CLI, and a local TLS stand-in for the Anthropic API that only answers the REAL key.

#![allow(clippy::unwrap_used)]

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use serde_json::json;
use support::anthropic::{StandIn, OPENAI_REPLY, REPLY};
use support::server::{on_path, LapServer};

const A: &str = "/api/v1/managed_agents";

fn base_config(dir: &std::path::Path, standin: &StandIn) -> std::path::PathBuf {
    standin.base_config(dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_session_gets_a_reply_through_the_vault() {
    assert!(
        on_path("claude"),
        "the `claude` CLI is not on PATH: npm install -g @anthropic-ai/claude-code (.ci/run does)"
    );
    let real = format!(
        "sk-ant-api03-REAL{}",
        lap_control_plane::app::new_id("k").replace('_', "")
    );
    let standin = StandIn::start(&real).await;
    let tmp = tempfile::tempdir().unwrap();
    let base = base_config(tmp.path(), &standin);
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[("LAP_SIDECAR_BASE_CONFIG", base.display().to_string())],
    )
    .await;

    let (s, agent) = server
        .call(
            "POST",
            &format!("{A}/agents"),
            Some(json!({"name": "e2e", "harness_id": "claude-code"})),
        )
        .await;
    assert_eq!(s, 201, "{agent}");
    let aid = agent["id"].as_str().unwrap();
    let (s, session) = server
        .call(
            "POST",
            &format!("{A}/agents/{aid}/session"),
            Some(json!({"env_vars": {"ANTHROPIC_API_KEY": real}})),
        )
        .await;
    assert_eq!(s, 201, "{session}");
    assert_eq!(session["status"], "creating");
    let sid = session["id"].as_str().unwrap().to_owned();
    let session = server.wait_settled(&sid, Duration::from_secs(90)).await;
    assert_eq!(session["status"], "ready", "{session}");

    // Private files: 0700 directories, 0600 config; the sandbox's own home and tmp 0700. No
    // file anywhere holds the real key: the sidecar got it over a pipe.
    let private = server.private_dir(&sid);
    let sandbox = server.sandbox_dir(&sid);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for d in [private.clone(), sandbox.join("home"), sandbox.join("tmp")] {
        assert_eq!(mode(&d), 0o700, "{}", d.display());
    }
    for f in ["sidecar.toml", "admin_token"] {
        assert_eq!(mode(&private.join(f)), 0o600, "{f}");
    }
    assert!(!private.join("secrets.json").exists());
    for dir in [&server.data_dir, &sandbox] {
        for (path, bytes) in support::server::files_below(dir) {
            assert!(
                !String::from_utf8_lossy(&bytes).contains(&real),
                "the real key is in {}",
                path.display()
            );
        }
    }
    let pids = support::server::sandbox_pids(&private);
    let sidecar_env = std::fs::read(format!("/proc/{}/environ", pids[2])).unwrap();
    assert!(
        !String::from_utf8_lossy(&sidecar_env).contains(&real),
        "the real key is in the sidecar's environment"
    );

    // The harness holds a stub with the real key's recognisable prefix, never the key.
    let harness = support::server::sandbox_harness_pid(&private);
    let environ = std::fs::read(format!("/proc/{harness}/environ")).unwrap();
    let env: Vec<String> = environ
        .split(|b| *b == 0)
        .map(|kv| String::from_utf8_lossy(kv).into_owned())
        .collect();
    assert!(
        !env.iter().any(|kv| kv.contains(&real)),
        "the real key reached the harness environment"
    );
    let stub = env.iter().find_map(|kv| kv.strip_prefix("ANTHROPIC_API_KEY=")).unwrap();
    assert!(stub.starts_with("sk-ant-api03-") && stub != real, "{stub}");
    for k in [
        "HTTPS_PROXY",
        "HTTP_PROXY",
        "https_proxy",
        "http_proxy",
        "NO_PROXY",
        "NODE_EXTRA_CA_CERTS",
        "SSL_CERT_FILE",
    ] {
        assert!(env.iter().any(|kv| kv.starts_with(&format!("{k}="))), "{k} missing");
    }
    assert!(env.contains(&"HOME=/home/agent".to_owned()), "{env:?}");
    assert!(
        !env.iter().any(|kv| kv.starts_with("MASTER_KEY=")),
        "server secrets leaked into the harness"
    );

    let (s, reply) = server
        .call(
            "POST",
            &format!("{A}/sessions/{sid}/message"),
            Some(json!({"text": "Say hello"})),
        )
        .await;
    assert_eq!(s, 200, "{reply}");
    let text = reply["parts"][0]["text"].as_str().unwrap();
    assert_eq!(reply["parts"][0]["type"], "text");
    assert!(text.contains(REPLY), "{reply}");
    assert!(standin.authorized.load(std::sync::atomic::Ordering::SeqCst) >= 1);

    // Conversation continuity: a second message resumes the same conversation.
    let (s, reply) = server
        .call(
            "POST",
            &format!("{A}/sessions/{sid}/message"),
            Some(json!({"text": "Again"})),
        )
        .await;
    assert_eq!(s, 200, "{reply}");

    let (s, events) = server
        .call("GET", &format!("{A}/sessions/{sid}/interceptions"), None)
        .await;
    assert_eq!(s, 200, "{events}");
    let events = events.as_array().unwrap();
    let injected = events.iter().any(|e| {
        e["host"] == "api.anthropic.com"
            && e["injected"]
                .as_array()
                .is_some_and(|i| i.iter().any(|x| x["secret"] == "ANTHROPIC_API_KEY"))
    });
    assert!(injected, "no injection of ANTHROPIC_API_KEY in {events:?}");
    assert!(!serde_json::to_string(&events).unwrap().contains(&real));

    let db = std::fs::read(server.data_dir.join("lap.db")).unwrap();
    assert!(
        !String::from_utf8_lossy(&db).contains(&real),
        "the real key reached the database"
    );

    let (s, v) = server.call("DELETE", &format!("{A}/sessions/{sid}"), None).await;
    assert_eq!((s, v["status"].as_str()), (200, Some("dead")));
    assert!(!sandbox.exists(), "the sandbox directory was not removed");
    assert!(!private.exists(), "the sandbox's private directory was not removed");
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z ")),
            "process {pid} of the stopped sandbox still runs"
        );
    }
}

/// codex: `codex login --with-api-key` with the stub at start, then `codex exec --json` and
/// `codex exec resume` per message, against a Responses API stand-in that only answers REAL.
#[tokio::test(flavor = "multi_thread")]
async fn codex_session_gets_a_reply_through_the_vault() {
    assert!(
        on_path("codex"),
        "the `codex` CLI is not on PATH: npm install -g @openai/codex (.ci/run does)"
    );
    let real = format!("sk-proj-REAL{}", lap_control_plane::app::new_id("k").replace('_', ""));
    let standin = StandIn::start(&real).await;
    let tmp = tempfile::tempdir().unwrap();
    let base = base_config(tmp.path(), &standin);
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[("LAP_SIDECAR_BASE_CONFIG", base.display().to_string())],
    )
    .await;
    let (s, agent) = server
        .call(
            "POST",
            &format!("{A}/agents"),
            Some(json!({"name": "cx", "harness_id": "codex", "model": "gpt-5"})),
        )
        .await;
    assert_eq!(s, 201, "{agent}");
    let aid = agent["id"].as_str().unwrap();
    let (s, session) = server
        .call(
            "POST",
            &format!("{A}/agents/{aid}/session"),
            Some(json!({"env_vars": {"OPENAI_API_KEY": real}})),
        )
        .await;
    assert_eq!(s, 201, "{session}");
    let sid = session["id"].as_str().unwrap().to_owned();
    let session = server.wait_settled(&sid, Duration::from_secs(90)).await;
    assert_eq!(session["status"], "ready", "{session}");
    let sandbox = server.sandbox_dir(&sid);
    let auth = std::fs::read_to_string(sandbox.join("home/.codex/auth.json")).unwrap_or_default();
    assert!(
        auth.contains("sk-proj-lapstub") && !auth.contains(&real),
        "codex login stored: {auth}"
    );

    for text in ["Say hello", "Again"] {
        let (s, reply) = server
            .call(
                "POST",
                &format!("{A}/sessions/{sid}/message"),
                Some(json!({"text": text})),
            )
            .await;
        let log = std::fs::read_to_string(sandbox.join("harness.log")).unwrap_or_default();
        assert_eq!(s, 200, "{reply}\nharness log:\n{log}");
        assert!(
            reply["parts"][0]["text"].as_str().unwrap().contains(OPENAI_REPLY),
            "{reply}"
        );
    }
    let (_, events) = server
        .call("GET", &format!("{A}/sessions/{sid}/interceptions"), None)
        .await;
    let injected = events.as_array().unwrap().iter().any(|e| {
        e["host"] == "api.openai.com"
            && e["injected"]
                .as_array()
                .is_some_and(|i| i.iter().any(|x| x["secret"] == "OPENAI_API_KEY"))
    });
    assert!(injected, "no injection of OPENAI_API_KEY in {events}");
    // codex's built-in `openai` provider speaks the Responses API's WebSocket form: both turns
    // went over it, through the vault's tunnel, with the key swapped on the upgrade request.
    assert!(
        standin.websocket_responses.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "codex did not use the Responses WebSocket: {}",
        support::model_script::summary(&standin.requests.lock().unwrap())
    );
}

/// claude-agent-sdk: each message runs the Agent SDK (`@anthropic-ai/claude-agent-sdk`, from
/// npm) through the `lap-agent-sdk` runner its image ships, with continuity, through the vault.
#[tokio::test(flavor = "multi_thread")]
async fn claude_agent_sdk_session_gets_a_reply_through_the_vault() {
    let sdk_installed = std::process::Command::new("npm")
        .args(["root", "-g"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .is_some_and(|root| {
            std::path::Path::new(&root)
                .join("@anthropic-ai/claude-agent-sdk/sdk.mjs")
                .is_file()
        });
    assert!(
        sdk_installed,
        "the Agent SDK is not installed: npm install -g @anthropic-ai/claude-agent-sdk (.ci/run does)"
    );
    let real = format!(
        "sk-ant-api03-REAL{}",
        lap_control_plane::app::new_id("k").replace('_', "")
    );
    let standin = StandIn::start(&real).await;
    let tmp = tempfile::tempdir().unwrap();
    let base = base_config(tmp.path(), &standin);
    // The runner on PATH as `lap-agent-sdk`, as in the image.
    let bin = tmp.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let runner =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../harness-images/claude-agent-sdk/lap-agent-sdk.mjs");
    std::fs::copy(&runner, bin.join("lap-agent-sdk")).unwrap();
    std::fs::set_permissions(bin.join("lap-agent-sdk"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[("LAP_SIDECAR_BASE_CONFIG", base.display().to_string()), ("PATH", path)],
    )
    .await;
    let (s, agent) = server
        .call(
            "POST",
            &format!("{A}/agents"),
            Some(json!({"name": "sdk", "harness_id": "claude-agent-sdk"})),
        )
        .await;
    assert_eq!(s, 201, "{agent}");
    let aid = agent["id"].as_str().unwrap();
    let (s, session) = server
        .call(
            "POST",
            &format!("{A}/agents/{aid}/session"),
            Some(json!({"env_vars": {"ANTHROPIC_API_KEY": real}})),
        )
        .await;
    assert_eq!(s, 201, "{session}");
    let sid = session["id"].as_str().unwrap().to_owned();
    let session = server.wait_settled(&sid, Duration::from_secs(90)).await;
    assert_eq!(session["status"], "ready", "{session}");
    let sandbox = server.data_dir.join("sandboxes").join(&sid);
    for text in ["Say hello", "Again"] {
        let (s, reply) = server
            .call(
                "POST",
                &format!("{A}/sessions/{sid}/message"),
                Some(json!({"text": text})),
            )
            .await;
        let log = std::fs::read_to_string(sandbox.join("harness.log")).unwrap_or_default();
        assert_eq!(s, 200, "{reply}\nharness log:\n{log}");
        assert!(reply["parts"][0]["text"].as_str().unwrap().contains(REPLY), "{reply}");
    }
    assert!(standin.authorized.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    // No terminal UI for the SDK harness: the terminal is a 409 that says so.
    let url = format!(
        "{}{A}/sessions/{sid}/tty?token={}",
        server.url.replacen("http://", "ws://", 1),
        session["tty_token"].as_str().unwrap()
    );
    match tokio_tungstenite::connect_async(url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            assert_eq!(r.status(), 409);
            let body = String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into_owned();
            assert!(body.contains("no terminal UI"), "{body}");
        }
        other => panic!("expected 409, got {other:?}"),
    }
}

/// Create the agent `agent`, start a session of it and wait until it leaves `creating`: its id
/// and the session as it settled.
async fn settled_session(server: &LapServer, agent: serde_json::Value) -> (String, serde_json::Value) {
    let (s, agent) = server.call("POST", &format!("{A}/agents"), Some(agent)).await;
    assert_eq!(s, 201, "{agent}");
    let aid = agent["id"].as_str().unwrap();
    let (s, session) = server.call("POST", &format!("{A}/agents/{aid}/session"), None).await;
    assert_eq!(s, 201, "{session}");
    let sid = session["id"].as_str().unwrap().to_owned();
    let v = server.wait_settled(&sid, Duration::from_secs(60)).await;
    (sid, v)
}

/// Without the agent CLI, the session fails with a reason that says so.
#[tokio::test(flavor = "multi_thread")]
async fn missing_agent_cli_fails_the_session_with_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    // Nothing on PATH but bubblewrap itself.
    let empty = tmp.path().join("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    let bwrap = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())
        .expect("bwrap on PATH (bash .ci/run installs bubblewrap)");
    std::os::unix::fs::symlink(bwrap, empty.join("bwrap")).unwrap();
    let server = LapServer::start(&tmp.path().join("data"), &[("PATH", empty.display().to_string())]).await;
    let (sid, v) = settled_session(&server, json!({"name": "nocli", "harness_id": "codex"})).await;
    assert_eq!(v["status"], "failed", "{v}");
    let reason = v["failure_reason"].as_str().unwrap();
    assert!(reason.contains("codex") && reason.contains("not installed"), "{reason}");
    assert!(!server.private_dir(&sid).exists());
    assert!(!server.sandbox_dir(&sid).exists());
}

/// A clone that fails says why in the session's `failure_reason`: git's own error line, not
/// only that the clone failed.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_clone_names_gits_error() {
    let tmp = tempfile::tempdir().unwrap();
    let path = support::fake_cli::path_with_fake_claude(tmp.path());
    let server = LapServer::start(&tmp.path().join("data"), &[("PATH", path)]).await;
    let (_, v) = settled_session(
        &server,
        json!({"name": "noclone", "harness_id": "claude-code", "repo_url": "https://git.nowhere.invalid/r.git"}),
    )
    .await;
    assert_eq!(v["status"], "failed", "{v}");
    let reason = v["failure_reason"].as_str().unwrap();
    assert!(
        reason.contains("git clone https://git.nowhere.invalid/r.git failed: ") && reason.contains("unable to access"),
        "git's error, on the one line: {reason}"
    );
    assert!(!reason.contains("Cloning into"), "{reason}");
    assert!(
        reason.contains("(the vault's last refusal: GET git.nowhere.invalid/r.git/info/refs")
            && reason.contains("dns)"),
        "and the cause the vault saw: {reason}"
    );
}

/// The README's offline demo, as a newcomer runs it: `examples/offline-demo.sh` with the built
/// binaries and the real `claude` on PATH brings up its own lap-server and model stand-in, and
/// the agent answers and runs a command through the vault, with a key it never held.
#[tokio::test(flavor = "multi_thread")]
async fn the_offline_demo_answers_and_runs_a_command_through_the_vault() {
    assert!(
        on_path("claude"),
        "the `claude` CLI is not on PATH: npm install -g @anthropic-ai/claude-code (.ci/run does)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let bins = support::server::workspace_bin("lap-server");
    let bins = bins.parent().unwrap();
    for b in ["lap", "vault-sidecar", "lap-harness"] {
        support::server::workspace_bin(b);
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/offline-demo.sh");
    let path = format!("{}:{}", bins.display(), std::env::var("PATH").unwrap_or_default());
    let run = tokio::process::Command::new("bash")
        .arg(&script)
        .env("PATH", path)
        .env("DEMO_DIR", tmp.path().join("demo"))
        .env_remove("LAP_URL")
        .env_remove("MASTER_KEY")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(240), run)
        .await
        .expect("the demo ends within 4 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let all = format!("{stdout}\n--- stderr\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{all}");
    assert!(
        stdout.contains("Hello from the offline model stand-in. You said: Say hello"),
        "{all}"
    );
    assert!(
        stdout.contains("Tool result: the sandbox runs Linux as uid 10001 in /home/agent/workspace"),
        "the command ran in the sandbox: {all}"
    );
    assert!(stdout.contains("injected ANTHROPIC_API_KEY (header)"), "{all}");
    // The stand-in answered only the real key, and the agent got answers: the vault swapped it.
    assert!(
        stdout.contains("POST /v1/messages → 200 with the real key") && !stdout.contains("→ 401"),
        "{all}"
    );
}
