//! The local sandbox, attacked from inside: an agent that runs whatever it is told (a stand-in
//! `claude` that executes its prompt as a shell command, through the real harness and the real
//! bubblewrap sandbox) tries to read every real key and the platform's keys, to see other
//! sessions and the sidecar, and to connect past the vault. Nothing is readable, nothing
//! connects, and the same agent still reaches the model through the vault. Then the faults a
//! sandbox must be noticed in (a stopped vault), and the fail-closed start-up paths.

#![allow(clippy::unwrap_used)]

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use lap_test_support::{eventually, eventually_ok, eventually_true};
use serde_json::{json, Value};
use support::anthropic::StandIn;
use support::server::{files_below, sandbox_pids, LapServer};

const A: &str = "/api/v1/managed_agents";

/// A `claude` that runs its `-p` prompt with `sh -c` and answers with the output: the agent
/// that does what it is told, which is what an attacker's prompt makes of any agent.
const OBEDIENT_CLAUDE: &str = r#"#!/usr/bin/env python3
import json, subprocess, sys
args = sys.argv[1:]
text = args[args.index("--") + 1] if "--" in args else ""
r = subprocess.run(["sh", "-c", text], capture_output=True, text=True, timeout=60)
print(json.dumps({"type": "system", "subtype": "init", "session_id": "obedient"}))
print(json.dumps({"type": "result", "subtype": "success", "is_error": False,
                  "result": r.stdout + r.stderr, "session_id": "obedient"}))
"#;

fn obedient_path(dir: &std::path::Path) -> String {
    let bin = dir.join("obedient-bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("claude"), OBEDIENT_CLAUDE).unwrap();
    std::fs::set_permissions(bin.join("claude"), std::fs::Permissions::from_mode(0o755)).unwrap();
    format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default())
}

fn base_config(dir: &std::path::Path, standin: &StandIn) -> String {
    standin.base_config(dir).display().to_string()
}

async fn session(server: &LapServer, name: &str, env_vars: Value) -> Value {
    session_of(server, json!({"name": name, "harness_id": "claude-code"}), env_vars).await
}

async fn session_of(server: &LapServer, agent: Value, env_vars: Value) -> Value {
    let (s, agent) = server.call("POST", &format!("{A}/agents"), Some(agent)).await;
    assert_eq!(s, 201, "{agent}");
    let (s, session) = server
        .call(
            "POST",
            &format!("{A}/agents/{}/session", agent["id"].as_str().unwrap()),
            Some(json!({ "env_vars": env_vars })),
        )
        .await;
    assert_eq!(s, 201, "{session}");
    server
        .wait_settled(session["id"].as_str().unwrap(), Duration::from_secs(60))
        .await
}

/// Run `command` inside the session (as its agent would) and return what it printed.
async fn run(server: &LapServer, sid: &str, command: &str) -> String {
    let (s, r) = server
        .call(
            "POST",
            &format!("{A}/sessions/{sid}/message"),
            Some(json!({ "text": command })),
        )
        .await;
    assert_eq!(s, 200, "{command}: {r}");
    r["parts"][0]["text"].as_str().unwrap().to_owned()
}

fn real_key(tag: &str) -> String {
    format!(
        "sk-ant-api03-REAL{tag}{}",
        lap_control_plane::app::new_id("k").replace('_', "")
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_cannot_read_a_key_or_reach_past_the_vault() {
    let real = real_key("A");
    let other_real = real_key("B");
    let standin = StandIn::start(&real).await;
    let tmp = tempfile::tempdir().unwrap();
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[
            ("PATH", obedient_path(tmp.path())),
            ("LAP_SIDECAR_BASE_CONFIG", base_config(tmp.path(), &standin)),
        ],
    )
    .await;
    // A registry secret, an agent-level one, and a second session with a key of its own.
    let (s, v) = server
        .call(
            "POST",
            "/api/v1/secrets",
            Some(json!({"name": "GITHUB_TOKEN", "value": "ghp_REALREGISTRYVALUE0123456789", "hosts": ["github.com"]})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let other = session(&server, "other", json!({"ANTHROPIC_API_KEY": other_real})).await;
    assert_eq!(other["status"], "ready", "{other}");
    let oid = other["id"].as_str().unwrap();
    std::fs::write(
        server.sandbox_dir(oid).join("home/workspace/other-secret.txt"),
        "OTHER-SESSION-FILE",
    )
    .unwrap();
    let me = session_of(
        &server,
        json!({"name": "me", "harness_id": "claude-code", "secrets": ["GITHUB_TOKEN"]}),
        json!({"ANTHROPIC_API_KEY": real}),
    )
    .await;
    assert_eq!(me["status"], "ready", "{me}");
    assert_eq!(me["isolation"], "bubblewrap");
    let sid = me["id"].as_str().unwrap().to_owned();
    let master_key = std::fs::read_to_string(server.data_dir.join("encryption_key")).unwrap();
    let data = server.data_dir.display().to_string();
    let private = server.private_dir(&sid).display().to_string();
    let other_dir = server.sandbox_dir(oid).display().to_string();
    let sidecar_pid = sandbox_pids(&server.private_dir(&sid))[2];
    let lap_port = server.url.rsplit(':').next().unwrap().to_owned();
    let mut seen = String::new();

    // Who and where it is: an unprivileged uid, its own pid namespace, a read-only system.
    let out = run(&server, &sid, "id -u; echo pid1=$(cat /proc/1/comm); ls /proc | grep -c '^[0-9]'; touch /usr/x 2>&1; touch /etc/x 2>&1; echo done").await;
    seen += &out;
    assert!(out.starts_with("10001\n"), "{out}");
    assert!(out.contains("pid1=bwrap"), "its own pid namespace: {out}");
    assert!(out.contains("/usr/x': Read-only file system"), "{out}");
    assert!(out.contains("/etc/x': Read-only file system"), "{out}");
    let procs: usize = out.lines().nth(2).unwrap().trim().parse().unwrap();
    assert!(
        procs < 12,
        "only the sandbox's own processes are visible ({procs}): {out}"
    );

    // The platform's files, the sidecar's, another session's, the host's home and /tmp.
    let files = [
        format!("{data}/master_key"),
        format!("{data}/encryption_key"),
        format!("{data}/lap.db"),
        format!("{private}/sidecar.toml"),
        format!("{private}/admin_token"),
        format!("{private}/sidecar.log"),
        format!("{other_dir}/home/workspace/other-secret.txt"),
        format!("/proc/{sidecar_pid}/environ"),
        format!("/proc/{sidecar_pid}/mem"),
        "/root/.bash_history".to_owned(),
    ];
    for f in &files {
        let out = run(&server, &sid, &format!("cat '{f}' 2>&1 | head -c 300; echo")).await;
        seen += &out;
        assert!(out.contains("No such file or directory"), "{f} is visible: {out}");
    }
    let out = run(
        &server,
        &sid,
        &format!(
            "ls -a {data} {} /root /home /tmp 2>&1; echo",
            server.data_dir.parent().unwrap().display()
        ),
    )
    .await;
    seen += &out;
    assert!(!out.contains("lap.db") && !out.contains("master_key"), "{out}");

    // Everything it can read: every process's environment, its whole home, /run, /tmp.
    let out = run(&server, &sid, "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; grep -rs . /run/lap /tmp $HOME --exclude-dir=.npm 2>/dev/null | head -c 200000").await;
    seen += &out;
    assert!(
        out.contains("ANTHROPIC_API_KEY=sk-ant-api03-"),
        "the harness environment was read: {out}"
    );
    assert!(
        out.contains("GITHUB_TOKEN=ghp_"),
        "the registry secret's stub is there: {out}"
    );

    // Connections: loopback only; the vault is the only way out, and not a way into the host.
    let out = run(
        &server,
        &sid,
        &format!(
            "cat /proc/net/dev | tail -n +3 | cut -d: -f1; \
             curl -sS --noproxy '*' -m 5 -o /dev/null https://127.0.0.1:{}/ 2>&1; echo direct-upstream=$?; \
             curl -sS --noproxy '*' -m 5 -o /dev/null http://127.0.0.1:{lap_port}/health 2>&1; echo direct-lap=$?; \
             curl -sS --noproxy '*' -m 5 -o /dev/null https://93.184.215.14/ 2>&1; echo direct-internet=$?; \
             curl -sS -m 5 -x http://127.0.0.1:14322 --noproxy '' -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{lap_port}/health; echo ' vault-plain-lap'; \
             curl -sS -m 5 -x http://127.0.0.1:14322 --noproxy '' -p -o /dev/null http://127.0.0.1:{lap_port}/health 2>&1; echo vault-connect-lap=$?; \
             curl -sS -m 5 -x http://127.0.0.1:14322 --noproxy '' -p -o /dev/null http://localhost:{lap_port}/health 2>&1; echo vault-connect-localhost=$?",
            standin.port
        ),
    )
    .await;
    seen += &out;
    let ifaces: Vec<&str> = out
        .lines()
        .take_while(|l| !l.contains("curl"))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains('='))
        .collect();
    assert_eq!(ifaces, ["lo"], "{out}");
    for direct in [
        "direct-upstream",
        "direct-lap",
        "direct-internet",
        "vault-connect-lap",
        "vault-connect-localhost",
    ] {
        assert!(!out.contains(&format!("{direct}=0")), "{direct} connected: {out}");
    }
    assert!(
        out.contains("403 vault-plain-lap"),
        "the vault forwarded to lap-server: {out}"
    );
    assert!(out.contains("CONNECT tunnel failed, response 403"), "{out}");

    // The same agent still works through the vault: the stand-in answers the real key only.
    let before = standin.authorized.load(std::sync::atomic::Ordering::SeqCst);
    let out = run(
        &server,
        &sid,
        "curl -sS -m 20 https://api.anthropic.com/v1/messages -H \"x-api-key: $ANTHROPIC_API_KEY\" \
         -H 'content-type: application/json' -d '{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'",
    )
    .await;
    seen += &out;
    assert!(out.contains("Hello from the local Anthropic stand-in"), "{out}");
    assert!(standin.authorized.load(std::sync::atomic::Ordering::SeqCst) > before);

    // Nothing it saw holds a real value or a platform key.
    for secret in [
        real.as_str(),
        other_real.as_str(),
        "ghp_REALREGISTRYVALUE0123456789",
        master_key.trim(),
        &server.key,
        "OTHER-SESSION-FILE",
    ] {
        assert!(!seen.contains(secret), "the agent saw {secret:?}:\n{seen}");
    }
    // And no file anywhere holds a real value: the sidecar got them over a pipe.
    for dir in [&server.data_dir, &server.sandbox_dir(&sid), &server.sandbox_dir(oid)] {
        for (path, bytes) in files_below(dir) {
            let text = String::from_utf8_lossy(&bytes);
            for secret in [real.as_str(), other_real.as_str(), "ghp_REALREGISTRYVALUE0123456789"] {
                assert!(!text.contains(secret), "{} holds a real value", path.display());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_vault_ends_the_session_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[
            ("PATH", obedient_path(tmp.path())),
            ("LAP_RECONCILE_INTERVAL", "1s".to_owned()),
        ],
    )
    .await;
    let s = session(&server, "stopped", json!({})).await;
    assert_eq!(s["status"], "ready", "{s}");
    let sid = s["id"].as_str().unwrap().to_owned();
    let pids = sandbox_pids(&server.private_dir(&sid));
    let sidecar = nix::unistd::Pid::from_raw(pids[2]);
    nix::sys::signal::kill(sidecar, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // Two failed probes in a row, a reconcile interval (1 s) apart, each up to the probe timeout.
    let v = eventually_ok(
        Duration::from_secs(12),
        "the session leaves ready after SIGSTOP",
        || async {
            let (_, v) = server.call("GET", &format!("{A}/sessions/{sid}"), None).await;
            if v["status"] != "ready" {
                Ok(v)
            } else {
                Err(v)
            }
        },
    )
    .await;
    assert_eq!(v["status"], "dead", "{v}");
    let reason = v["failure_reason"].as_str().unwrap();
    assert!(reason.contains("vault sidecar stopped answering"), "{reason}");
    assert!(reason.contains("SIGSTOP"), "{reason}");
    // The stopped sidecar and the sandbox are gone.
    let what = format!("the processes of the dead session end: {pids:?}");
    eventually_true(Duration::from_secs(15), &what, || {
        !pids
            .iter()
            .any(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_bubblewrap_a_session_fails_saying_what_to_install() {
    let tmp = tempfile::tempdir().unwrap();
    // PATH holds the agent CLI but no bwrap.
    let bin = tmp.path().join("only-claude");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("claude"), OBEDIENT_CLAUDE).unwrap();
    std::fs::set_permissions(bin.join("claude"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = LapServer::start(&tmp.path().join("data"), &[("PATH", bin.display().to_string())]).await;
    let v = session(&server, "nobwrap", json!({})).await;
    assert_eq!(v["status"], "failed", "{v}");
    let reason = v["failure_reason"].as_str().unwrap();
    assert!(
        reason.contains("bubblewrap") && reason.contains("apt-get install bubblewrap"),
        "{reason}"
    );
    assert!(reason.contains("LAP_LOCAL_ISOLATION=none"), "{reason}");
    assert!(!server.sandbox_dir(v["id"].as_str().unwrap()).exists());
}

/// lap-server where unprivileged user namespaces are off: it runs (as uid 1000) inside a
/// bubblewrap of its own whose nested user namespaces are disabled, as on a host with
/// `user.max_user_namespaces=0`.
#[tokio::test(flavor = "multi_thread")]
async fn without_user_namespaces_a_session_fails_saying_what_to_enable() {
    if !nix::unistd::geteuid().is_root() {
        panic!("this test builds a host without user namespaces, which needs root (CI runs as root)");
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::os::unix::fs::chown(tmp.path(), Some(1000), Some(1000)).unwrap();
    std::os::unix::fs::chown(&data, Some(1000), Some(1000)).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let bin = |name: &str| support::server::workspace_bin(name).display().to_string();
    let mut child = tokio::process::Command::new("setpriv")
        .args([
            "--reuid",
            "1000",
            "--regid",
            "1000",
            "--clear-groups",
            "bwrap",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
        ])
        .args([
            "--bind",
            "/",
            "/",
            "--dev-bind",
            "/dev",
            "/dev",
            "--proc",
            "/proc",
            "--uid",
            "1000",
            "--gid",
            "1000",
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_lap-server"))
        .env_clear()
        .env("PATH", obedient_path(tmp.path()))
        .env("LAP_LISTEN", format!("127.0.0.1:{port}"))
        .env("LAP_DATA_DIR", &data)
        .env("MASTER_KEY", "k")
        .env("LAP_SIDECAR_BIN", bin("vault-sidecar"))
        .env("LAP_HARNESS_BIN", bin("lap-harness"))
        .env("LAP_LOCAL_RO_PATHS", tmp.path().join("obedient-bin"))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    eventually(Duration::from_secs(30), "lap-server starts", || {
        // Sampled here: the probe's future cannot hold `child` mutably.
        let exited = child.try_wait().unwrap().is_some();
        let health = http.get(format!("{url}/health")).send();
        async move {
            if health.await.is_ok_and(|r| r.status().is_success()) {
                return Some(());
            }
            assert!(!exited, "lap-server exited");
            None
        }
    })
    .await;
    let call = |m: reqwest::Method, path: String, body: Value| {
        let req = http.request(m, format!("{url}{path}")).bearer_auth("k").json(&body);
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let agent = call(
        reqwest::Method::POST,
        format!("{A}/agents"),
        json!({"name": "n", "harness_id": "claude-code"}),
    )
    .await;
    let s = call(
        reqwest::Method::POST,
        format!("{A}/agents/{}/session", agent["id"].as_str().unwrap()),
        json!({}),
    )
    .await;
    let sid = s["id"].as_str().unwrap().to_owned();
    let v = eventually_ok(Duration::from_secs(30), "the session leaves creating", || async {
        let v = call(reqwest::Method::GET, format!("{A}/sessions/{sid}"), Value::Null).await;
        if v["status"] != "creating" {
            Ok(v)
        } else {
            Err(v)
        }
    })
    .await;
    assert_eq!(v["status"], "failed", "{v}");
    let reason = v["failure_reason"].as_str().unwrap();
    assert!(
        reason.contains("user namespaces") && reason.contains("sysctl"),
        "{reason}"
    );
    let _ = child.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn isolation_none_runs_unsandboxed_and_every_session_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[
            ("PATH", obedient_path(tmp.path())),
            ("LAP_LOCAL_ISOLATION", "none".to_owned()),
        ],
    )
    .await;
    let s = session(&server, "dev", json!({})).await;
    assert_eq!(s["status"], "ready", "{s}");
    assert_eq!(s["isolation"], "none");
    let sid = s["id"].as_str().unwrap();
    // Unsandboxed: the host's pid namespace and uid (that is what `none` means).
    let out = run(&server, sid, "id -u; cat /proc/1/comm").await;
    assert!(!out.contains("bwrap"), "{out}");
    let (_, list) = server.call("GET", &format!("{A}/sessions"), None).await;
    assert_eq!(list["data"][0]["isolation"], "none", "{list}");
}

/// The real Claude Code TUI, attached with `lap` over the session's `/tty` WebSocket (in tmux,
/// as a user would): its bash mode (`!cmd`) tries to read every place a key could be and to
/// connect past the vault. Each command writes what it got into the workspace, which the test
/// reads from the host; nothing holds a key, nothing connects. Then the same agent answers a
/// prompt through the vault (the stand-in accepts only the real key).
#[tokio::test(flavor = "multi_thread")]
async fn the_real_claude_tui_cannot_read_a_key_or_reach_past_the_vault() {
    use support::server::{on_path, workspace_bin};
    use support::tmux::Tmux;
    assert!(
        on_path("tmux") && on_path("claude"),
        "needs tmux and the `claude` CLI on PATH (bash .ci/run installs both)"
    );
    let real = real_key("T");
    let standin = StandIn::start(&real).await;
    let tmp = tempfile::tempdir().unwrap();
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[("LAP_SIDECAR_BASE_CONFIG", base_config(tmp.path(), &standin))],
    )
    .await;
    let (s, _) = server
        .call(
            "POST",
            &format!("{A}/agents"),
            Some(json!({"name": "coder", "harness_id": "claude-code"})),
        )
        .await;
    assert_eq!(s, 201);
    // A second session, whose files the first must not see.
    let other = session(&server, "other", json!({})).await;
    let oid = other["id"].as_str().unwrap().to_owned();

    let home = tmp.path().join("user-home");
    std::fs::create_dir_all(&home).unwrap();
    let env = [
        ("LAP_URL", server.url.clone()),
        ("MASTER_KEY", server.key.clone()),
        ("ANTHROPIC_API_KEY", real.clone()),
        ("HOME", home.display().to_string()),
        ("TERM", "xterm-256color".to_owned()),
    ];
    let tmux = Tmux {
        socket: format!("lap-sandbox-test-{}", std::process::id()),
    };
    tmux.start(
        "t",
        &format!(
            "{} coder -e ANTHROPIC_API_KEY; echo LAP-EXIT=$?; sleep 600",
            workspace_bin("lap").display()
        ),
        &env,
    );
    let screen = tmux
        .wait("t", "the Claude Code TUI", Duration::from_secs(120), |s| {
            s.contains("Claude Code") && s.contains('❯') || s.contains("LAP-EXIT")
        })
        .await;
    assert!(!screen.contains("LAP-EXIT"), "lap exited:\n{screen}");
    let (_, list) = server.call("GET", &format!("{A}/sessions"), None).await;
    let sid = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] != oid.as_str())
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let pids = sandbox_pids(&server.private_dir(&sid));
    let data = server.data_dir.display().to_string();
    let private = server.private_dir(&sid).display().to_string();
    let lap_port = server.url.rsplit(':').next().unwrap().to_owned();
    let attacks = [
        "cat /proc/[0-9]*/environ".to_owned(),
        format!("cat {data}/master_key {data}/encryption_key {data}/lap.db"),
        format!("cat {private}/admin_token {private}/sidecar.toml"),
        format!("ls -a {data} {} /root /home", server.sandbox_dir(&oid).display()),
        format!("cat /proc/{}/mem /proc/{}/environ", pids[2], pids[2]),
        format!(
            "curl -sS --noproxy '*' -m 5 https://127.0.0.1:{}/; echo rc=$?",
            standin.port
        ),
        format!("curl -sS --noproxy '*' -m 5 http://127.0.0.1:{lap_port}/health; echo rc=$?"),
    ];
    // Idle: no turn running, the input box empty with its hint line below.
    let idle = |s: &str| {
        !s.contains("esc to interrupt")
            && s.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .is_some_and(|l| l.contains("for shortcuts") || l.contains("for shell mode"))
    };
    for (i, attack) in attacks.iter().enumerate() {
        tmux.wait("t", "the prompt to be idle", Duration::from_secs(60), idle)
            .await;
        // Bash mode: `!` at the start of the prompt, then the command.
        tmux.keys("t", &["-l", &format!("!({attack}) > out{i}.txt 2>&1; echo DONE-{i}")]);
        tmux.wait("t", "the typed command", Duration::from_secs(10), |s| {
            s.contains(&format!("echo DONE-{i}"))
        })
        .await;
        // The TUI reads a burst of typed characters as a paste: an Enter inside the burst can be
        // taken as part of it. Enter again until the command has run.
        let ran = |s: &str| {
            s.lines().any(|l| {
                l.trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
                    .starts_with(&format!("DONE-{i}"))
            })
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            tmux.keys("t", &["Enter"]);
            let tried = Instant::now();
            while !ran(&tmux.capture("t")) && tried.elapsed() < Duration::from_secs(3) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if ran(&tmux.capture("t")) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "attack {i} never ran:\n{}",
                tmux.capture("t")
            );
        }
    }
    tmux.wait("t", "the prompt to be idle", Duration::from_secs(60), idle)
        .await;
    let workspace = server.sandbox_dir(&sid).join("home/workspace");
    let out = |i: usize| {
        std::fs::read_to_string(workspace.join(format!("out{i}.txt"))).unwrap_or_else(|e| panic!("out{i}.txt: {e}"))
    };
    let environ = out(0);
    assert!(
        environ.contains("ANTHROPIC_API_KEY=sk-ant-api03-"),
        "the environments were read: {environ}"
    );
    for (i, missing) in [(1, 3), (2, 2), (3, 3), (4, 2)] {
        let text = out(i);
        assert_eq!(
            text.matches("No such file or directory").count(),
            missing,
            "attack {i} ({}) saw something: {text}",
            attacks[i]
        );
    }
    let listing = out(3);
    let home: Vec<&str> = listing
        .lines()
        .skip_while(|l| *l != "/home:")
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(home, [".", "..", "agent"], "only its own home: {listing}");
    for i in [5, 6] {
        let text = out(i);
        assert!(
            text.contains("rc=7") || text.contains("rc=28"),
            "attack {i} ({}) connected: {text}",
            attacks[i]
        );
    }
    let master = std::fs::read_to_string(server.data_dir.join("master_key")).unwrap_or_default();
    for (path, bytes) in files_below(&server.sandbox_dir(&sid)) {
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(&real), "{} holds the real key", path.display());
        assert!(
            master.trim().is_empty() || !text.contains(master.trim()),
            "{} holds the master key",
            path.display()
        );
        assert!(!text.contains(&server.key), "{} holds the master key", path.display());
    }

    // The agent still talks to the model, through the vault.
    tmux.keys("t", &["-l", "Say hello"]);
    tmux.keys("t", &["Enter"]);
    let screen = tmux
        .wait("t", "the stand-in's reply", Duration::from_secs(90), |s| {
            s.contains(support::anthropic::REPLY)
        })
        .await;
    eprintln!("---- the attacked session, still working ----\n{screen}");
    assert!(standin.authorized.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    tmux.keys("t", &["C-d"]);
}
