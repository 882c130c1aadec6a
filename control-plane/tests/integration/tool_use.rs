//! Agents that act: through `POST /sessions/{id}/message`, each real agent CLI (claude, codex,
//! opencode, the Claude Agent SDK) edits a file in its workspace and runs a command, and the
//! reply carries the result; a follow-up message still sees that tool-using turn. The model is
//! the scripted stand-in (`support::model_script`) on loopback, reached through the session's
//! vault: it only answers the REAL key, which only the vault holds.

#![allow(clippy::unwrap_used)]

use crate::support;

use std::time::Duration;

use lap_test_support::eventually_true;
use serde_json::{json, Value};
use support::anthropic::{StandIn, MCP_URL, OPENAI_REPLY, REPLY};
use support::model_script::END;
use support::server::{on_path, LapServer};

const A: &str = "/api/v1/managed_agents";
/// The harness's working directory inside its bubblewrap sandbox.
const WORKSPACE: &str = "/home/agent/workspace";

fn base_config(dir: &std::path::Path, standin: &StandIn) -> std::path::PathBuf {
    standin.base_config(dir)
}

/// The CLI a harness needs, or a failure saying how to install it.
fn require(harness: &str) {
    let ok = match harness {
        "claude-code" => on_path("claude"),
        "codex" => on_path("codex"),
        "opencode" => on_path("opencode"),
        "claude-agent-sdk" => std::process::Command::new("npm")
            .args(["root", "-g"])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .is_some_and(|root| {
                std::path::Path::new(&root)
                    .join("@anthropic-ai/claude-agent-sdk/sdk.mjs")
                    .is_file()
            }),
        _ => false,
    };
    let install = match harness {
        "claude-code" => "npm install -g @anthropic-ai/claude-code",
        "codex" => "npm install -g @openai/codex",
        "opencode" => "npm install -g opencode-ai",
        _ => "npm install -g @anthropic-ai/claude-agent-sdk",
    };
    assert!(ok, "the {harness} agent is not installed: {install} (.ci/run does)");
}

struct Running {
    server: LapServer,
    standin: StandIn,
    sid: String,
    /// The model key's REAL value (the vault's only).
    real: String,
    _tmp: tempfile::TempDir,
}

impl Running {
    /// A ready session of a new agent `{harness_id, …agent}` holding `key` (the REAL value,
    /// which goes to the vault only).
    async fn start(harness: &str, agent: Value) -> Running {
        Running::start_holding(harness, agent, json!({})).await
    }

    /// [`Running::start`], the session holding `more_env_vars` too.
    async fn start_holding(harness: &str, agent: Value, more_env_vars: Value) -> Running {
        require(harness);
        let (key_name, real) = if harness == "codex" {
            (
                "OPENAI_API_KEY",
                format!("sk-proj-REAL{}", lap_control_plane::app::new_id("k").replace('_', "")),
            )
        } else {
            (
                "ANTHROPIC_API_KEY",
                format!(
                    "sk-ant-api03-REAL{}",
                    lap_control_plane::app::new_id("k").replace('_', "")
                ),
            )
        };
        let standin = StandIn::start(&real).await;
        let tmp = tempfile::tempdir().unwrap();
        let base = base_config(tmp.path(), &standin);
        let server = LapServer::start(
            &tmp.path().join("data"),
            &[("LAP_SIDECAR_BASE_CONFIG", base.display().to_string())],
        )
        .await;
        let mut body = json!({"name": format!("act-{harness}"), "harness_id": harness});
        if harness == "codex" {
            body["model"] = "gpt-5".into();
        }
        for (k, v) in agent.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (s, agent) = server.call("POST", &format!("{A}/agents"), Some(body)).await;
        assert_eq!(s, 201, "{agent}");
        let aid = agent["id"].as_str().unwrap();
        let mut env_vars = more_env_vars;
        env_vars[key_name] = real.clone().into();
        let (s, session) = server
            .call(
                "POST",
                &format!("{A}/agents/{aid}/session"),
                Some(json!({ "env_vars": env_vars })),
            )
            .await;
        assert_eq!(s, 201, "{session}");
        let sid = session["id"].as_str().unwrap().to_owned();
        let session = server.wait_settled(&sid, Duration::from_secs(120)).await;
        assert_eq!(session["status"], "ready", "{session}");
        Running {
            server,
            standin,
            sid,
            real,
            _tmp: tmp,
        }
    }

    /// The stand-in's requests so far, summarised.
    fn requests(&self) -> String {
        support::model_script::summary(&self.standin.requests.lock().unwrap())
    }

    /// The session's workspace as seen from the host.
    fn workspace(&self) -> std::path::PathBuf {
        self.server.sandbox_dir(&self.sid).join("home/workspace")
    }

    /// One message; the reply's text (asserting a 200, with the harness log if not).
    async fn say(&self, text: &str) -> String {
        let path = format!("{A}/sessions/{}/message", self.sid);
        let call = self.server.call("POST", &path, Some(json!({ "text": text })));
        let Ok((s, reply)) = tokio::time::timeout(Duration::from_secs(180), call).await else {
            let n = self.standin.requests.lock().unwrap().len();
            panic!(
                "no reply to {text:?} within 180 s; the model was asked {n} times:\n{}",
                self.requests()
            );
        };
        let log = std::fs::read_to_string(self.server.private_dir(&self.sid).join("harness.log")).unwrap_or_default();
        assert_eq!(s, 200, "{reply}\nharness log:\n{log}");
        reply["parts"][0]["text"].as_str().unwrap_or_default().to_owned()
    }
}

/// Edit (write a new file), run a command that reads it, then a plain follow-up: the three
/// replies carry the tool results, and the follow-up quotes the earlier command's output.
async fn edits_runs_and_remembers(harness: &str) {
    let r = Running::start(harness, json!({})).await;
    let marker = format!("written by {harness}");
    let reply = r
        .say(&format!(
            "Create the note.\nLAP-WRITE: {WORKSPACE}/note.txt = {marker}{END}"
        ))
        .await;
    assert!(
        reply.contains("Tool result"),
        "edit: {reply}\nrequests:\n{}",
        r.requests()
    );
    let on_disk = std::fs::read_to_string(r.workspace().join("note.txt")).unwrap_or_default();
    assert_eq!(on_disk.trim_end(), marker, "the file the agent wrote");

    let reply = r
        .say(&format!(
            "Run it.\nLAP-RUN: cat note.txt; echo \"sum=$((6*7))\"; id -u > ran-by.txt{END}"
        ))
        .await;
    assert!(
        reply.contains("Tool result"),
        "run: {reply}\nrequests:\n{}",
        r.requests()
    );
    assert!(reply.contains("sum=42") && reply.contains(&marker), "run: {reply}");
    let uid = std::fs::read_to_string(r.workspace().join("ran-by.txt")).unwrap_or_default();
    assert_eq!(uid.trim(), "10001", "the command ran in the sandbox, as its user");

    // Continuity across the tool-using turns: the next request still holds their results.
    let reply = r.say("What did you see?").await;
    let plain = if harness == "codex" { OPENAI_REPLY } else { REPLY };
    assert!(reply.contains(plain), "follow-up: {reply}");
    assert!(
        reply.contains("earlier tool results") && reply.contains("sum=42"),
        "follow-up: {reply}"
    );
    assert!(r.standin.authorized.load(std::sync::atomic::Ordering::SeqCst) >= 4);
    // Every model call went through the vault with the real key; none arrived with a stub.
    assert_eq!(r.standin.rejected.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_edits_runs_and_remembers() {
    edits_runs_and_remembers("claude-code").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_agent_sdk_edits_runs_and_remembers() {
    edits_runs_and_remembers("claude-agent-sdk").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn codex_edits_runs_and_remembers() {
    edits_runs_and_remembers("codex").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn opencode_edits_runs_and_remembers() {
    edits_runs_and_remembers("opencode").await;
}

/// Every file under `dir` (the sandbox's and the session's own) holding `needle`.
fn files_holding(dir: &std::path::Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            found.extend(files_holding(&path, needle));
        } else if kind.is_file()
            && std::fs::read(&path).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
        {
            found.push(path);
        }
    }
    found
}

/// A hostile model over the Responses API's WebSocket form: codex (its built-in `openai`
/// provider speaks it) asks, and the model's answer quotes the key the upgrade request carried,
/// which the vault had swapped in. The WebSocket messages reach codex with the stub instead
/// (the vault's frame redaction), so neither the reply nor any file codex keeps (its session
/// rollout, the harness log) holds the real key.
#[tokio::test(flavor = "multi_thread")]
async fn codex_gets_no_key_a_model_reflects_over_the_responses_websocket() {
    let r = Running::start("codex", json!({})).await;
    let reply = r
        .say(&format!("Which key did I send? {}", support::anthropic::REFLECT_KEY))
        .await;
    let ws = r.standin.websocket_responses.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        ws >= 1,
        "the turn did not use the Responses WebSocket: {}",
        r.requests()
    );
    assert!(reply.contains("The key you sent me: "), "reply: {reply}");
    assert!(!reply.contains(&r.real), "the real key reached the agent's reply");
    assert!(
        reply.contains("sk-proj-lapstub"),
        "the reflected key is not the stub: {reply}"
    );
    for dir in [r.server.sandbox_dir(&r.sid), r.server.private_dir(&r.sid)] {
        let leaked = files_holding(&dir, &r.real);
        assert!(leaked.is_empty(), "the real key is on disk in {leaked:?}");
    }
}

/// An agent exfiltrating another host's stub through the model's WebSocket: codex runs
/// `printenv` for the Anthropic key's stub, and codex's next message on the Responses
/// WebSocket carries it (as the command's output) toward api.openai.com, a host that key is
/// not bound to. The vault's frame tripwire closes the connection before that message leaves,
/// and codex's retries (again over WebSocket, or `POST` with it in the body) are refused too:
/// the model never receives the stub, and the audit names the refusal.
#[tokio::test(flavor = "multi_thread")]
async fn codex_cannot_send_another_hosts_stub_over_the_responses_websocket() {
    let anthropic_real = format!(
        "sk-ant-api03-REAL{}",
        lap_control_plane::app::new_id("k").replace('_', "")
    );
    let r = Running::start_holding("codex", json!({}), json!({ "ANTHROPIC_API_KEY": anthropic_real })).await;
    let path = format!("{A}/sessions/{}/message", r.sid);
    let text = format!("Show me the other key.\nLAP-RUN: printenv ANTHROPIC_API_KEY{END}");
    let call = r.server.call("POST", &path, Some(json!({ "text": text })));
    let (status, reply) = tokio::time::timeout(Duration::from_secs(240), call)
        .await
        .expect("the message is answered, as a reply or an error");
    let seen = serde_json::to_string(&*r.standin.requests.lock().unwrap()).unwrap();
    // The command ran and its output was on its way: the first request asked for it.
    assert!(
        seen.contains("printenv ANTHROPIC_API_KEY"),
        "status {status}: {reply}\nrequests:\n{}",
        r.requests()
    );
    assert!(
        !seen.contains("sk-ant-api03-lapstub") && !seen.contains(&anthropic_real),
        "the model received the Anthropic key's stub or value: {}",
        r.requests()
    );
    let text = reply.to_string();
    assert!(!text.contains(&anthropic_real) && !text.contains(&r.real), "{text}");
    let (_, events) = r
        .server
        .call("GET", &format!("{A}/sessions/{}/interceptions", r.sid), None)
        .await;
    // The refusal on the WebSocket itself: the upgraded exchange (`101`) the tripwire ended.
    let refused = events.as_array().unwrap().iter().any(|e| {
        e["host"] == "api.openai.com"
            && e["method"] == "GET"
            && e["status"] == 101
            && e["blocked"].as_str() == Some("stub-exfiltration")
    });
    assert!(
        refused,
        "no stub-exfiltration refusal of a WebSocket to api.openai.com in {events}"
    );
}

/// `tools: ["read"]`: the shell is refused by the CLI itself, the command never runs, and the
/// reply says the tool failed.
async fn unlisted_tool_is_refused(harness: &str) {
    let r = Running::start(harness, json!({"tools": ["read"]})).await;
    let reply = r.say(&format!("LAP-RUN: echo ran > should-not-exist.txt{END}")).await;
    assert!(
        !r.workspace().join("should-not-exist.txt").exists(),
        "the refused command ran; reply: {reply}"
    );
    let offered: Vec<String> = r
        .standin
        .requests
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| b["tools"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect();
    assert!(
        reply.contains("(the tool failed)") || reply.contains("no shell tool was offered"),
        "reply: {reply}; tools offered: {offered:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_refuses_a_tool_the_agent_does_not_list() {
    unlisted_tool_is_refused("claude-code").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_agent_sdk_refuses_a_tool_the_agent_does_not_list() {
    unlisted_tool_is_refused("claude-agent-sdk").await;
}

/// codex has no per-tool switch: a list without `bash` runs it with `--sandbox read-only`, so
/// its command is refused.
#[tokio::test(flavor = "multi_thread")]
async fn codex_refuses_a_tool_the_agent_does_not_list() {
    unlisted_tool_is_refused("codex").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn opencode_refuses_a_tool_the_agent_does_not_list() {
    unlisted_tool_is_refused("opencode").await;
}

/// The pids of processes whose command line is exactly `argv`.
fn pids_running(argv: &[&str]) -> Vec<i32> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

/// `POST /sessions/{id}/abort` while the agent runs a long command: that message answers 409,
/// the command is gone, the session stays ready and the next message works.
async fn abort_stops_the_running_turn_and_the_session_stays_ready(harness: &str) {
    let r = Running::start(harness, json!({})).await;
    let (s, v) = r
        .server
        .call("POST", &format!("{A}/sessions/{}/abort", r.sid), None)
        .await;
    assert_eq!((s, &v), (200, &json!({"aborted": false})), "no turn is running yet");

    let url = format!("{}{A}/sessions/{}/message", r.server.url, r.sid);
    let key = r.server.key.clone();
    let turn = tokio::spawn(async move {
        let resp = reqwest::Client::new()
            .post(url)
            .bearer_auth(key)
            .json(&json!({"text": format!("LAP-RUN: touch started && sleep 313 && touch finished{END}")}))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json::<Value>().await.unwrap_or_default())
    });
    let started = r.workspace().join("started");
    eventually_true(Duration::from_secs(90), "the command starts", || started.exists()).await;
    eventually_true(Duration::from_secs(10), "the sleep runs", || {
        !pids_running(&["sleep", "313"]).is_empty()
    })
    .await;

    let (s, v) = r
        .server
        .call("POST", &format!("{A}/sessions/{}/abort", r.sid), None)
        .await;
    assert_eq!((s, &v), (200, &json!({"aborted": true})));
    let (status, body) = tokio::time::timeout(Duration::from_secs(20), turn)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap().contains("aborted"), "{body}");
    eventually_true(Duration::from_secs(10), "the aborted command ends", || {
        pids_running(&["sleep", "313"]).is_empty()
    })
    .await;
    assert!(!r.workspace().join("finished").exists());

    let (_, session) = r.server.call("GET", &format!("{A}/sessions/{}", r.sid), None).await;
    assert_eq!(session["status"], "ready", "{session}");
    let reply = r.say(&format!("LAP-RUN: echo after-abort{END}")).await;
    assert!(
        reply.contains("Tool result") && reply.contains("after-abort"),
        "{reply}"
    );
}

/// `POST /sessions/{id}/restart`: a new harness in the same sandbox (its `boot` differs), the
/// workspace's files kept, and it answers messages.
async fn restart_replaces_the_harness_and_keeps_the_workspace(harness: &str) {
    let r = Running::start(harness, json!({})).await;
    let reply = r
        .say(&format!("LAP-WRITE: {WORKSPACE}/kept.txt = before restart{END}"))
        .await;
    assert!(reply.contains("Tool result"), "{reply}");
    let private = r.server.private_dir(&r.sid);
    let harness_before = support::server::sandbox_harness_pid(&private);

    let (s, v) = r
        .server
        .call("POST", &format!("{A}/sessions/{}/restart", r.sid), None)
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["status"], "ready", "{v}");
    // The same process (replaced in place, so the sandbox is the same), a new harness.
    assert_eq!(support::server::sandbox_harness_pid(&private), harness_before);
    let log = std::fs::read_to_string(r.server.private_dir(&r.sid).join("harness.log")).unwrap_or_default();
    assert!(log.contains("restarting the harness"), "{log}");
    assert_eq!(
        std::fs::read_to_string(r.workspace().join("kept.txt"))
            .unwrap()
            .trim_end(),
        "before restart"
    );
    let reply = r.say(&format!("LAP-RUN: cat kept.txt{END}")).await;
    assert!(reply.contains("before restart"), "{reply}");
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_abort_stops_the_running_turn() {
    abort_stops_the_running_turn_and_the_session_stays_ready("claude-code").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_agent_sdk_abort_stops_the_running_turn() {
    abort_stops_the_running_turn_and_the_session_stays_ready("claude-agent-sdk").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn codex_abort_stops_the_running_turn() {
    abort_stops_the_running_turn_and_the_session_stays_ready("codex").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn opencode_abort_stops_the_running_turn() {
    abort_stops_the_running_turn_and_the_session_stays_ready("opencode").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_restart_keeps_the_workspace() {
    restart_replaces_the_harness_and_keeps_the_workspace("claude-code").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_agent_sdk_restart_keeps_the_workspace() {
    restart_replaces_the_harness_and_keeps_the_workspace("claude-agent-sdk").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn codex_restart_keeps_the_workspace() {
    restart_replaces_the_harness_and_keeps_the_workspace("codex").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn opencode_restart_keeps_the_workspace() {
    restart_replaces_the_harness_and_keeps_the_workspace("opencode").await;
}

/// An agent's `requirements` run in the workspace at bring-up; a failing one fails the session
/// with its output.
#[tokio::test(flavor = "multi_thread")]
async fn requirements_run_at_bring_up_and_a_failure_fails_the_session() {
    let r = Running::start("claude-code", json!({"requirements": "echo installed > deps.txt"})).await;
    assert_eq!(
        std::fs::read_to_string(r.workspace().join("deps.txt")).unwrap().trim(),
        "installed"
    );
    let (s, agent) = r
        .server
        .call(
            "POST",
            &format!("{A}/agents"),
            Some(json!({"name": "broken-deps", "harness_id": "claude-code",
                "requirements": "echo cannot-install-left-pad >&2; exit 3"})),
        )
        .await;
    assert_eq!(s, 201, "{agent}");
    let aid = agent["id"].as_str().unwrap();
    let (s, session) = r.server.call("POST", &format!("{A}/agents/{aid}/session"), None).await;
    assert_eq!(s, 201, "{session}");
    let sid = session["id"].as_str().unwrap();
    let v = r.server.wait_settled(sid, Duration::from_secs(120)).await;
    assert_eq!(v["status"], "failed", "{v}");
    assert!(
        v["failure_reason"]
            .as_str()
            .unwrap()
            .contains("cannot-install-left-pad"),
        "{v}"
    );
}

/// The agent's plain `env` reaches the harness (and the commands the agent runs) as it is.
#[tokio::test(flavor = "multi_thread")]
async fn plain_env_reaches_the_agents_commands() {
    let r = Running::start(
        "claude-code",
        json!({"env": {"API_BASE": "https://api.example.com/v1"}}),
    )
    .await;
    let reply = r.say(&format!("LAP-RUN: echo \"base=$API_BASE\"{END}")).await;
    assert!(reply.contains("base=https://api.example.com/v1"), "{reply}");
}

/// An agent's `mcp_servers` reach its CLI: through the vault, the CLI initialises the server and
/// lists its tools, and the model's request names the server's `lap_probe` tool.
async fn lists_the_agents_mcp_server(harness: &str) {
    let r = Running::start(
        harness,
        json!({"mcp_servers": [{"name": "probe", "url": MCP_URL}], "allow_out": ["api.anthropic.com", "api.openai.com"]}),
    )
    .await;
    let reply = r.say("hello").await;
    assert!(!reply.is_empty(), "no reply");
    let calls = r.standin.mcp_calls.lock().unwrap().clone();
    assert!(
        calls.iter().any(|m| m == "initialize") && calls.iter().any(|m| m == "tools/list"),
        "the MCP server was asked: {calls:?}\nrequests:\n{}",
        r.requests()
    );
    // Offered as a tool, or named where the CLI defers tools until the model searches for them
    // (Claude Code's ToolSearch, codex's `mcp__probe` namespace).
    let offered = r
        .standin
        .requests
        .lock()
        .unwrap()
        .iter()
        .any(|b| b.to_string().contains("lap_probe"));
    assert!(offered, "no model request named lap_probe:\n{}", r.requests());
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_lists_the_agents_mcp_server() {
    lists_the_agents_mcp_server("claude-code").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_agent_sdk_lists_the_agents_mcp_server() {
    lists_the_agents_mcp_server("claude-agent-sdk").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn opencode_lists_the_agents_mcp_server() {
    lists_the_agents_mcp_server("opencode").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn codex_lists_the_agents_mcp_server() {
    lists_the_agents_mcp_server("codex").await;
}
