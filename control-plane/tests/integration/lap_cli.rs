//! The `lap` command line against a running `lap-server` (real processes, no terminal): agents
//! created, edited and removed; the secrets registry listed, set and removed; sessions listed
//! with ages and failure reasons, stopped, audited, their events read, found by agent name or
//! id prefix; `lap send`'s progress and single error; and errors in the CLI's own words. Also
//! the other binaries' `--help`.

#![allow(clippy::unwrap_used)]

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::anthropic::StandIn;
use support::server::{workspace_bin, LapServer};

const A: &str = "/api/v1/managed_agents";

/// A `claude` for `-p`: the message `fail` gets claude's own failure shape (the API error as an
/// assistant block, then a failed result with the same words); anything else calls the
/// Messages API through the vault with its `ANTHROPIC_API_KEY` stub and answers what happened.
const CLAUDE: &str = r#"#!/bin/sh
text=""
while [ $# -gt 0 ]; do
  case "$1" in --) text="$2"; break ;; esac
  shift
done
if [ "$text" = "fail" ]; then
  echo '{"type":"assistant","message":{"content":[{"type":"text","text":"API Error: Connection error."}]}}'
  echo '{"type":"result","subtype":"success","is_error":true,"result":"API Error: Connection error.","session_id":"c"}'
  exit 1
fi
api=nokey
if [ -n "$ANTHROPIC_API_KEY" ]; then
  if curl -sS --max-time 20 https://api.anthropic.com/v1/messages \
      -H "x-api-key: $ANTHROPIC_API_KEY" -H 'content-type: application/json' \
      -d '{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}' | grep -q 'Hello from'; then
    api=authorized
  else
    api=rejected
  fi
fi
echo "{\"type\":\"assistant\",\"message\":{\"content\":[{\"type\":\"text\",\"text\":\"echo:$text api:$api\"}]}}"
echo "{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"result\":\"echo:$text api:$api\",\"session_id\":\"c\"}"
"#;

/// A `lap` run: exit code, stdout, stderr.
struct Out {
    code: Option<i32>,
    out: String,
    err: String,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.out, self.err
        )
    }
}

/// Run `bin` with `args`, `stdin`, and the environment `env` (LAP_URL/MASTER_KEY/LAP_CONFIG
/// from the caller only), killed after 60 s.
fn run(bin: &Path, args: &[&str], env: &[(&str, &str)], stdin: &str) -> Out {
    use std::io::Write;
    let mut c = Command::new(bin);
    c.args(args)
        .env_remove("LAP_URL")
        .env_remove("MASTER_KEY")
        .env_remove("HARNESS_AUTH_TOKEN")
        .env_remove("VAULT_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        }
    });
    let out = child.wait_with_output().unwrap();
    let _ = tx.send(());
    Out {
        code: out.status.code(),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `lap` logged in to `server` through the environment.
struct Lap {
    bin: PathBuf,
    url: String,
    key: String,
    config: PathBuf,
}

impl Lap {
    fn new(server: &LapServer, dir: &Path) -> Lap {
        Lap {
            bin: workspace_bin("lap"),
            url: server.url.clone(),
            key: server.key.clone(),
            config: dir.join("lap.toml"),
        }
    }

    fn run(&self, args: &[&str], stdin: &str) -> Out {
        let config = self.config.display().to_string();
        run(
            &self.bin,
            args,
            &[
                ("LAP_URL", &self.url),
                ("MASTER_KEY", &self.key),
                ("LAP_CONFIG", &config),
            ],
            stdin,
        )
    }

    /// Run and require exit 0.
    fn ok(&self, args: &[&str], stdin: &str) -> Out {
        let o = self.run(args, stdin);
        assert_eq!(o.code, Some(0), "lap {args:?}: {o:?}");
        o
    }

    /// Run and require exit 1.
    fn fails(&self, args: &[&str]) -> Out {
        let o = self.run(args, "");
        assert_eq!(o.code, Some(1), "lap {args:?}: {o:?}");
        o
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let o = self.ok(&a, "");
        serde_json::from_str(&o.out).unwrap_or_else(|e| panic!("lap {a:?}: {e}: {o:?}"))
    }
}

fn write_script(dir: &Path, name: &str, text: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), text).unwrap();
    std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A server whose sessions run [`CLAUDE`] and reach the Anthropic stand-in through the vault.
async fn server_with_standin(dir: &Path, real_key: &str) -> (LapServer, StandIn) {
    let standin = StandIn::start(real_key).await;
    let base = standin.base_config(dir);
    let bin = dir.join("fake-bin");
    write_script(&bin, "claude", CLAUDE);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let server = LapServer::start(
        &dir.join("data"),
        &[("LAP_SIDECAR_BASE_CONFIG", base.display().to_string()), ("PATH", path)],
    )
    .await;
    (server, standin)
}

/// The line of a table naming `needle`.
fn line_with<'a>(table: &'a str, needle: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{table}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn lap_manages_agents_and_the_secrets_registry() {
    let tmp = tempfile::tempdir().unwrap();
    let real = "sk-ant-api03-REAL-lap-cli-0123456789";
    let (server, _standin) = server_with_standin(tmp.path(), real).await;
    let lap = Lap::new(&server, tmp.path());

    // An agent naming a secret the registry lacks is refused, with the server's reason.
    let o = lap.fails(&[
        "agents",
        "create",
        "coder",
        "--harness",
        "claude-code",
        "--secret",
        "NOPE",
    ]);
    assert!(
        o.err.contains("NOPE") && o.err.contains("lap secrets set"),
        "in lap's words: {o:?}"
    );
    assert!(lap
        .fails(&["agents", "create", "coder"])
        .err
        .contains("--harness is required"));

    // The registry: set from stdin, listed without the value, as a table and as JSON.
    lap.ok(
        &["secrets", "set", "ANTHROPIC_API_KEY", "--host", "api.anthropic.com"],
        &format!("{real}\n"),
    );
    let o = lap.ok(&["secrets", "list"], "");
    assert!(o.out.starts_with("NAME"), "{o:?}");
    assert!(
        line_with(&o.out, "ANTHROPIC_API_KEY").contains("api.anthropic.com"),
        "{o:?}"
    );
    assert!(!o.out.contains(real) && !o.err.contains(real), "{o:?}");
    let list = lap.json(&["secrets", "list"]);
    assert_eq!(list[0]["name"], "ANTHROPIC_API_KEY", "{list}");
    assert_ne!(list[0]["value"], real);

    // create → edit → list, every field the flags name lands in the API's agent.
    let o = lap.ok(
        &[
            "agents",
            "create",
            "coder",
            "--harness",
            "claude-code",
            "--model",
            "opus",
            "--allow-out",
            "example.com",
            "--env",
            "MY_TOKEN=abc12345678",
            "--env-host",
            "MY_TOKEN=api.example.com",
        ],
        "",
    );
    assert!(o.err.contains("lap coder"), "says how to start it: {o:?}");
    let o = lap.fails(&["agents", "create", "coder", "--harness", "codex"]);
    assert!(
        o.err.contains("already exists") && o.err.contains("lap agents edit coder"),
        "{o:?}"
    );
    lap.ok(
        &[
            "agents",
            "edit",
            "coder",
            "--add-secret",
            "ANTHROPIC_API_KEY",
            "--prompt",
            "be brief",
            "--clear",
            "allow-out",
        ],
        "",
    );
    let agents = lap.json(&["agents"]);
    let coder = agents
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "coder")
        .unwrap();
    assert_eq!(coder["harness_id"], "claude-code", "{coder}");
    assert_eq!(coder["model"], "opus", "{coder}");
    assert_eq!(coder["prompt"], "be brief", "{coder}");
    assert_eq!(coder["secrets"], json!(["ANTHROPIC_API_KEY"]), "{coder}");
    assert_eq!(coder["allow_out"], json!([]), "cleared: {coder}");
    assert_eq!(
        coder["env_vars"],
        json!({"MY_TOKEN": "<redacted>"}),
        "the edit kept it: {coder}"
    );
    assert_eq!(
        coder["env_var_hosts"],
        json!({"MY_TOKEN": ["api.example.com"]}),
        "{coder}"
    );
    let o = lap.ok(&["agents"], "");
    assert!(line_with(&o.out, "coder").contains("ANTHROPIC_API_KEY"), "{o:?}");
    assert!(lap
        .fails(&["agents", "edit", "coder"])
        .err
        .contains("nothing to change"));
    assert!(lap
        .fails(&["agents", "edit", "ghost", "--model", "x"])
        .err
        .contains("no agent named `ghost`"));
    lap.ok(&["agents", "edit", "coder", "--rename", "dev"], "");
    assert!(lap.ok(&["agents"], "").out.contains("dev"));

    // rm: an agent with a live session is kept unless its sessions are stopped first.
    let o = lap.ok(&["dev", "--no-attach"], "");
    let id = o.out.trim().to_owned();
    assert!(id.starts_with("ses_"), "{o:?}");
    assert!(
        !o.err.contains("warning"),
        "the key is bound as a registry secret: {o:?}"
    );
    let o = lap.fails(&["agents", "rm", "dev"]);
    assert!(o.err.contains("--stop-sessions"), "{o:?}");
    lap.ok(&["agents", "rm", "dev", "--stop-sessions"], "");
    assert!(!lap.ok(&["agents"], "").out.contains("dev"));
    let (_, s) = server.call("GET", &format!("{A}/sessions/{id}"), None).await;
    assert_eq!(s["status"], "dead", "{s}");

    lap.ok(&["secrets", "rm", "ANTHROPIC_API_KEY"], "");
    assert!(!lap.ok(&["secrets", "list"], "").out.contains("ANTHROPIC_API_KEY"));
    assert!(lap
        .fails(&["secrets", "rm", "ANTHROPIC_API_KEY"])
        .err
        .contains("no secret named"));
}

#[tokio::test(flavor = "multi_thread")]
async fn lap_works_with_sessions_by_agent_name_and_id_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let real = "sk-ant-api03-REAL-lap-cli-9876543210";
    let (server, standin) = server_with_standin(tmp.path(), real).await;
    let lap = Lap::new(&server, tmp.path());
    lap.ok(&["agents", "create", "coder", "--harness", "claude-code"], "");
    lap.ok(
        &[
            "agents",
            "create",
            "broken",
            "--harness",
            "claude-code",
            "--repo",
            "file:///nonexistent/repo",
        ],
        "",
    );

    // Without the harness's key: a warning that says how to give it; with it, none.
    let o = lap.ok(&["coder", "--no-attach"], "");
    assert!(
        o.err.contains("warning") && o.err.contains("lap coder -e ANTHROPIC_API_KEY"),
        "{o:?}"
    );
    let keyless = o.out.trim().to_owned();
    lap.ok(&["stop", &keyless], "");
    let o = run(
        &lap.bin,
        &["coder", "--no-attach", "-e", "ANTHROPIC_API_KEY"],
        &[
            ("LAP_URL", &lap.url),
            ("MASTER_KEY", &lap.key),
            ("ANTHROPIC_API_KEY", real),
        ],
        "",
    );
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(!o.err.contains("warning"), "{o:?}");
    let id = o.out.trim().to_owned();

    // A session that fails shows why in `lap sessions`, and `lap` exits 1 saying so.
    let o = lap.fails(&["broken", "--no-attach"]);
    assert!(o.err.contains("failed"), "{o:?}");

    // `lap sessions`: ages, the failure reason; the stopped one only with --all.
    let o = lap.ok(&["sessions"], "");
    assert!(o.out.starts_with("ID"), "{o:?}");
    let ready = line_with(&o.out, &id);
    assert!(ready.contains("ready") && ready.contains("coder"), "{o:?}");
    assert!(
        ready.contains(" ago") || ready.contains("just now"),
        "relative times: {o:?}"
    );
    let (_, v) = server.call("GET", &format!("{A}/sessions/{id}"), None).await;
    assert!(
        !ready.contains(v["created_at"].as_str().unwrap()),
        "no raw ISO times: {o:?}"
    );
    let failed = line_with(&o.out, "broken");
    assert!(
        failed.contains("failed") && failed.to_lowercase().contains("clone"),
        "the reason: {o:?}"
    );
    assert!(!o.out.contains(&keyless), "stopped sessions are hidden: {o:?}");
    let o = lap.ok(&["sessions", "--all"], "");
    assert!(line_with(&o.out, &keyless).contains("dead"), "{o:?}");
    let all = lap.json(&["sessions", "--all"]);
    assert_eq!(all.as_array().unwrap().len(), 3, "{all}");

    // `lap send` by agent name: it says it is waiting, then the reply through the vault.
    let o = lap.ok(&["send", "coder", "hello"], "");
    assert_eq!(o.out.trim(), "echo:hello api:authorized", "{o:?}");
    assert!(o.err.contains("waiting for the agent's reply"), "{o:?}");
    assert!(standin.authorized.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    // An error the agent already printed is not printed again.
    let o = lap.fails(&["send", &id, "fail"]);
    let both = format!("{}{}", o.out, o.err);
    assert_eq!(both.matches("API Error: Connection error.").count(), 1, "{o:?}");
    assert!(o.err.contains("turn failed"), "{o:?}");

    // A unique id prefix (with or without `ses_`) works; an ambiguous one says which.
    let short = &id[4..12];
    let o = lap.ok(&["audit", short], "");
    assert!(o.out.starts_with("TIME"), "{o:?}");
    let interception = line_with(&o.out, "interception");
    assert!(
        interception.contains("api.anthropic.com/v1/messages → 200, injected ANTHROPIC_API_KEY (header)"),
        "{o:?}"
    );
    assert!(
        o.out.contains("session.create") && o.out.contains("session.message"),
        "{o:?}"
    );
    let audit = lap.json(&["audit", &id[..12]]);
    assert!(
        audit.as_array().unwrap().iter().all(|e| e["session_id"] == id.as_str()),
        "{audit}"
    );
    assert!(lap.fails(&["audit", "ses_"]).err.contains("give more of one"));
    assert!(lap.fails(&["audit", "zzzz"]).err.contains("not found"));

    // `lap logs`: the session's state and the agent's events.
    let o = lap.ok(&["logs", "coder", "--quiet-for", "1"], "");
    assert!(line_with(&o.out, &id).contains("ready"), "{o:?}");

    // `lap stop` by agent name stops its latest ready session.
    let o = lap.ok(&["stop", "coder"], "");
    assert!(o.err.contains(&id) && o.err.contains("dead"), "{o:?}");
    let (_, s) = server.call("GET", &format!("{A}/sessions/{id}"), None).await;
    assert_eq!(s["status"], "dead", "{s}");
    // Stopping it again says so, rather than claiming to have stopped it.
    let o = lap.ok(&["stop", &id], "");
    assert!(o.err.contains("already dead") && !o.err.contains("Stopped"), "{o:?}");
    // `logs --follow` of a dead session ends (run kills a hung lap after 60 s: exit None).
    let o = lap.ok(&["logs", &id, "--follow"], "");
    assert!(line_with(&o.out, &id).contains("dead"), "{o:?}");
    // Its harness and vault logs, kept after it stopped: the vault's audit lines name the
    // secret, and neither log holds the real key.
    let o = lap.ok(&["logs", &id, "--harness"], "");
    assert!(o.out.contains("lap-harness"), "{o:?}");
    let o = lap.ok(&["logs", &id, "--vault", "--tail", "1000"], "");
    assert!(
        o.out.contains("\"target\":\"audit\"") && o.out.contains("ANTHROPIC_API_KEY"),
        "{o:?}"
    );
    let v = lap.json(&["logs", &id, "--vault", "--tail", "2"]);
    assert_eq!(v["lines"].as_array().map(Vec::len), Some(2), "{v}");
    for source in ["--harness", "--vault"] {
        let o = lap.ok(&["logs", &id, source, "--tail", "10000"], "");
        assert!(!o.out.contains(real), "the real key in the {source} log");
    }
    let (s, v) = server
        .call("GET", &format!("{A}/sessions/{id}/logs?source=kernel"), None)
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(v["error"].as_str().unwrap().starts_with("source: "), "{v}");
    let (s, v) = server
        .call("GET", &format!("{A}/sessions/{id}/logs?tail=0"), None)
        .await;
    assert_eq!(s, 400, "{v}");
    let (s, _) = server.call("GET", &format!("{A}/sessions/ses_nope/logs"), None).await;
    assert_eq!(s, 404);
    let o = lap.fails(&["attach", "coder"]);
    assert!(o.err.contains("dead"), "the newest session of coder is stopped: {o:?}");
}

/// Errors say what to do in `lap`'s words, and every binary's `--help` works anywhere.
#[tokio::test(flavor = "multi_thread")]
async fn errors_and_help_speak_the_users_language() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("lap.toml").display().to_string();
    let lap = workspace_bin("lap");
    // A server that is down: unreachable, not "refused the key"; nothing saved.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let o = run(
        &lap,
        &["login", "--url", &url],
        &[("LAP_CONFIG", &config), ("MASTER_KEY", "k")],
        "",
    );
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(o.err.contains("unreachable") && o.err.contains("lap-server"), "{o:?}");
    assert!(!o.err.contains("refused the key"), "{o:?}");
    assert!(!Path::new(&config).exists());
    let o = run(&lap, &["sessions"], &[("LAP_CONFIG", &config)], "");
    assert!(o.err.contains("run `lap login`"), "{o:?}");
    // A wrong key: refused, with what to do.
    let server = LapServer::start(&tmp.path().join("data"), &[]).await;
    let o = run(
        &lap,
        &["agents"],
        &[("LAP_URL", &server.url), ("MASTER_KEY", "wrong")],
        "",
    );
    assert!(
        o.err.contains("refused the key") && o.err.contains("lap login") && o.err.contains(".lap/master_key"),
        "{o:?}"
    );
    assert!(!o.err.contains("401:"), "no bare status code: {o:?}");
    let as_server = |args: &[&str]| {
        run(
            &lap,
            args,
            &[
                ("LAP_URL", &server.url),
                ("MASTER_KEY", &server.key),
                ("LAP_CONFIG", &config),
            ],
            "",
        )
    };
    // The server's field names become the flags that set them, without status codes.
    let o = as_server(&["agents", "create", "x", "--harness", "nope"]);
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(o.err.contains("--harness: must be one of"), "{o:?}");
    assert!(!o.err.contains("harness_id") && !o.err.contains("400"), "{o:?}");
    let o = as_server(&["agents", "create", "x", "--harness", "codex", "--allow-out", "ex ample"]);
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(o.err.contains("--allow-out #1: "), "{o:?}");
    assert!(!o.err.contains("allow_out"), "{o:?}");
    // A URL that is not a LAP server's: said so, not a bare 404.
    let not_lap = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let not_lap_url = format!("http://{}", not_lap.local_addr().unwrap());
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut conn, _)) = not_lap.accept().await {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).await;
            let _ = conn
                .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-type: text/html\r\ncontent-length: 9\r\nconnection: close\r\n\r\nnot found")
                .await;
        }
    });
    let o = run(&lap, &["agents"], &[("LAP_URL", &not_lap_url), ("MASTER_KEY", "k")], "");
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(
        o.err.contains("404 Not Found") && o.err.contains("is it a `lap-server`"),
        "{o:?}"
    );

    let o = run(&lap, &["--help"], &[], "");
    assert_eq!(o.code, Some(0), "{o:?}");
    let first = o.out.lines().take(6).collect::<Vec<_>>().join("\n");
    assert!(first.contains("lap <agent-name>"), "the main form first: {o:?}");
    for cmd in [
        "agents", "sessions", "attach", "send", "stop", "audit", "logs", "secrets",
    ] {
        assert!(o.out.contains(&format!("  {cmd}")), "{cmd} in: {o:?}");
    }

    let harness = workspace_bin("lap-harness");
    let o = run(&harness, &["--help"], &[], "");
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(
        o.out.contains("HARNESS_AUTH_TOKEN") && o.out.contains("LAP_HARNESS_ID"),
        "{o:?}"
    );
    let o = run(&harness, &["--version"], &[], "");
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(o.out.starts_with("lap-harness "), "{o:?}");
    assert_eq!(run(&harness, &["--bogus"], &[], "").code, Some(2));

    let o = run(&workspace_bin("vault-sidecar"), &["--help"], &[], "");
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(!o.out.contains("SPEC"), "{o:?}");
    assert!(
        o.out.contains("admin_token_file") && o.out.contains("Sidecar configuration"),
        "{o:?}"
    );
}
