//! The terminal through the control plane: `GET /sessions/{id}/tty` relayed to the harness and
//! authorised by the session's own `tty_token`; bring-up phases in the session's `phase`; and
//! the whole user flow with the `lap` CLI in tmux against the real `claude` TUI.

#![allow(clippy::unwrap_used)]

use crate::support;

use std::cell::RefCell;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use lap_test_support::{eventually, eventually_ok};
use serde_json::json;
use support::anthropic::{StandIn, REPLY};
use support::server::{on_path, workspace_bin, LapServer};
use support::tmux::Tmux;
use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};

const A: &str = "/api/v1/managed_agents";

/// A `claude` whose TUI (no `-p`) is an interactive shell; `-p` answers in stream-json.
const SHELL_CLAUDE: &str = r#"#!/bin/sh
if [ "$1" = "-p" ]; then
  echo '{"type":"result","subtype":"success","is_error":false,"result":"ok","session_id":"c"}'
  exit 0
fi
PS1='lap$ ' exec /bin/sh -i
"#;

fn write_script(dir: &std::path::Path, name: &str, text: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), text).unwrap();
    std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn path_with(dir: &std::path::Path) -> String {
    format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default())
}

async fn ready_session(server: &LapServer, agent: serde_json::Value) -> serde_json::Value {
    let (s, agent) = server.call("POST", &format!("{A}/agents"), Some(agent)).await;
    assert_eq!(s, 201, "{agent}");
    let aid = agent["id"].as_str().unwrap();
    let (s, session) = server.call("POST", &format!("{A}/agents/{aid}/session"), None).await;
    assert_eq!(s, 201, "{session}");
    let v = server
        .wait_settled(session["id"].as_str().unwrap(), Duration::from_secs(60))
        .await;
    assert_eq!(v["status"], "ready", "{v}");
    v
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(server: &LapServer, path: &str, bearer: Option<&str>) -> Result<Ws, u16> {
    let url = format!("{}{path}", server.url.replacen("http://", "ws://", 1));
    let mut req = url.into_client_request().unwrap();
    if let Some(t) = bearer {
        req.headers_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("{e}"),
    }
}

/// Read binary frames until their text contains `needle`; returns all text read.
async fn read_until(ws: &mut Ws, needle: &str) -> String {
    let mut seen = String::new();
    lap_test_support::ws_read_until(
        ws,
        Duration::from_secs(20),
        &format!("{needle:?}"),
        &mut seen,
        |seen, m| {
            if let Message::Binary(b) = m {
                seen.push_str(&String::from_utf8_lossy(&b));
            }
            seen.contains(needle)
        },
        |seen| format!("{seen:?}"),
    )
    .await;
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn tty_is_relayed_and_authorised_by_the_sessions_own_token() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("fake-bin");
    write_script(&bin, "claude", SHELL_CLAUDE);
    let server = LapServer::start(&tmp.path().join("data"), &[("PATH", path_with(&bin))]).await;
    let one = ready_session(&server, json!({"name": "one", "harness_id": "claude-code"})).await;
    let two = ready_session(&server, json!({"name": "two", "harness_id": "claude-code"})).await;
    let path = one["tty_url"].as_str().unwrap().to_owned();
    assert_eq!(path, format!("{A}/sessions/{}/tty", one["id"].as_str().unwrap()));
    let token = one["tty_token"].as_str().unwrap();
    let other = two["tty_token"].as_str().unwrap();

    // Only this session's own token opens its terminal.
    assert_eq!(connect(&server, &path, None).await.err(), Some(401));
    assert_eq!(connect(&server, &path, Some("wrong")).await.err(), Some(401));
    assert_eq!(connect(&server, &path, Some(other)).await.err(), Some(401));
    assert_eq!(
        connect(&server, &format!("{path}?token={other}"), None).await.err(),
        Some(401)
    );
    assert_eq!(
        connect(&server, &path, Some(&server.key)).await.err(),
        Some(401),
        "the master key is not a tty token"
    );
    assert_eq!(
        connect(&server, &format!("{A}/sessions/ses_nope/tty"), Some(token))
            .await
            .err(),
        Some(404)
    );
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let r = http
        .get(format!("{}{path}?token={token}", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "not a WebSocket");
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().contains("WebSocket"), "{v}");

    // A bad size is the harness's 400, passed on.
    assert_eq!(
        connect(&server, &format!("{path}?token={token}&cols=0&rows=30"), None)
            .await
            .err(),
        Some(400)
    );
    assert_eq!(
        connect(&server, &format!("{path}?token={token}&cols=x&rows=30"), None)
            .await
            .err(),
        Some(400)
    );

    // ?token= works; bytes go both ways.
    let mut ws = connect(&server, &format!("{path}?token={token}&cols=100&rows=30"), None)
        .await
        .unwrap();
    read_until(&mut ws, "lap$").await;
    let before = server
        .call("GET", &format!("{A}/sessions/{}", one["id"].as_str().unwrap()), None)
        .await
        .1;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    ws.send(Message::Binary(b"echo relayed-$((2+3))\r".to_vec().into()))
        .await
        .unwrap();
    read_until(&mut ws, "relayed-5").await;
    ws.send(Message::Text(r#"{"type":"ping"}"#.into())).await.unwrap();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await.unwrap() {
            Some(Ok(Message::Text(t))) if t.as_str().contains("pong") => break,
            Some(Ok(_)) => {}
            other => panic!("no pong: {other:?}"),
        }
    }
    // Terminal traffic is activity: last_seen_at moved.
    eventually_ok(Duration::from_secs(10), "last_seen_at moves", || async {
        let after = server
            .call("GET", &format!("{A}/sessions/{}", one["id"].as_str().unwrap()), None)
            .await
            .1;
        if after["last_seen_at"].as_str() > before["last_seen_at"].as_str() {
            Ok(())
        } else {
            Err(format!("{before} {after}"))
        }
    })
    .await;
    ws.close(None).await.unwrap();
    drop(ws);

    // Bearer works too, and reaches the same terminal: its repaint shows the earlier output.
    let mut ws = connect(&server, &path, Some(token)).await.unwrap();
    read_until(&mut ws, "relayed-5").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_timeout_counts_terminal_bytes_as_activity() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("fake-bin");
    write_script(&bin, "claude", SHELL_CLAUDE);
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[("PATH", path_with(&bin)), ("LAP_IDLE_TIMEOUT", "4s".to_owned())],
    )
    .await;
    let s = ready_session(&server, json!({"name": "idle", "harness_id": "claude-code"})).await;
    let id = s["id"].as_str().unwrap();
    let mut ws = connect(
        &server,
        s["tty_url"].as_str().unwrap(),
        Some(s["tty_token"].as_str().unwrap()),
    )
    .await
    .unwrap();
    read_until(&mut ws, "lap$").await;
    // Type for twice the idle timeout: the session stays.
    for i in 0..16 {
        ws.send(Message::Binary(format!("echo tick-{i}\r").into_bytes().into()))
            .await
            .unwrap();
        read_until(&mut ws, &format!("tick-{i}\r\n")).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (_, v) = server.call("GET", &format!("{A}/sessions/{id}"), None).await;
    assert_eq!(v["status"], "ready", "reaped while typing: {v}");
    // Silence: reaped.
    drop(ws);
    eventually_ok(Duration::from_secs(30), "reaped after going quiet", || async {
        let (_, v) = server.call("GET", &format!("{A}/sessions/{id}"), None).await;
        if v["status"] == "dead" {
            Ok(())
        } else {
            Err(v)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bring_up_phases_show_in_the_session() {
    let tmp = tempfile::tempdir().unwrap();
    // A repository to clone, and a git that takes its time, so each phase is seen.
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let git = |args: &[&str]| {
        let ok = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .current_dir(&repo)
            .output()
            .unwrap()
            .status
            .success();
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("README"), "hi\n").unwrap();
    git(&["add", "README"]);
    git(&["commit", "-q", "-m", "one"]);
    let real_git = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join("git"))
        .find(|p| p.is_file())
        .unwrap();
    let bin = tmp.path().join("fake-bin");
    write_script(&bin, "claude", SHELL_CLAUDE);
    write_script(
        &bin,
        "git",
        &format!("#!/bin/sh\nsleep 2\nexec {} \"$@\"\n", real_git.display()),
    );
    // The repository is on the host: visible, read-only, in the sandbox. git clones only from
    // a repository its user owns (safe.directory): a server running as root runs sandboxes as
    // uid 10001, so that is who owns it here.
    if nix::unistd::geteuid().is_root() {
        let st = std::process::Command::new("chown")
            .args(["-R", "10001:10001"])
            .arg(&repo)
            .status()
            .unwrap();
        assert!(st.success());
    }
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[
            ("PATH", path_with(&bin)),
            ("LAP_LOCAL_RO_PATHS", format!("{}:{}", bin.display(), repo.display())),
        ],
    )
    .await;
    let (_, agent) = server
        .call(
            "POST",
            &format!("{A}/agents"),
            Some(json!({"name": "cloner", "harness_id": "claude-code",
                        "repo_url": format!("file://{}", repo.display()), "branch": "main"})),
        )
        .await;
    let (_, session) = server
        .call(
            "POST",
            &format!("{A}/agents/{}/session", agent["id"].as_str().unwrap()),
            None,
        )
        .await;
    let id = session["id"].as_str().unwrap();
    // Every phase seen on the way, in order (the probe records them).
    let seen = RefCell::new(Vec::<String>::new());
    eventually_ok(Duration::from_secs(60), "the session leaves creating", || async {
        let (_, v) = server.call("GET", &format!("{A}/sessions/{id}"), None).await;
        let p = v["phase"].as_str().unwrap().to_owned();
        let mut phases = seen.borrow_mut();
        if phases.last() != Some(&p) {
            phases.push(p);
        }
        if v["status"] != "creating" {
            assert_eq!(v["status"], "ready", "{v}");
            Ok(())
        } else {
            Err(format!("still creating: {phases:?}"))
        }
    })
    .await;
    let phases = seen.into_inner();
    let at = |p: &str| phases.iter().position(|x| x == p);
    assert!(at("cloning_repo").is_some(), "{phases:?}");
    assert!(at("starting-harness") < at("cloning_repo"), "{phases:?}");
    assert_eq!(phases.last().map(String::as_str), Some("ready"), "{phases:?}");
    assert!(
        server.sandbox_dir(id).join("home/workspace/README").is_file(),
        "not cloned"
    );
}

/// A git server over HTTPS (smart HTTP: `git http-backend` behind python3's `ssl`) that only
/// serves HTTP Basic `x-access-token:<REAL>`.
const HTTPS_GIT_SERVER: &str = r#"
import base64, http.server, os, ssl, subprocess, sys
root, port_file, expected, cert, key = sys.argv[1:6]
want = "Basic " + base64.b64encode(expected.encode()).decode()
class H(http.server.BaseHTTPRequestHandler):
    def handle_one(self):
        if self.headers.get("Authorization") != want:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path, _, query = self.path.partition("?")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        env = dict(os.environ, GIT_PROJECT_ROOT=root, GIT_HTTP_EXPORT_ALL="1", PATH_INFO=path,
                   QUERY_STRING=query, REQUEST_METHOD=self.command, REMOTE_USER="x-access-token",
                   CONTENT_TYPE=self.headers.get("Content-Type", ""), CONTENT_LENGTH=str(len(body)))
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.decode().split("\r\n"):
            k, _, v = line.partition(":")
            if k.lower() == "status":
                status = int(v.split()[0])
            elif k:
                headers.append((k, v.strip()))
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
    do_GET = do_POST = handle_one
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
open(port_file + ".tmp", "w").write(str(srv.server_address[1]))
os.rename(port_file + ".tmp", port_file)
srv.serve_forever()
"#;

/// A test CA and a leaf for `host`, as PEM files in `dir`: (ca, cert chain, key).
fn test_pki(dir: &std::path::Path, host: &str) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let pki = lap_test_support::TestPki::new("LAP git test CA", &[host]);
    pki.write_leaf(dir, "leaf.pem", "leaf.key");
    (pki.write_ca(dir, "ca.pem"), dir.join("leaf.pem"), dir.join("leaf.key"))
}

/// `cloning_repo` through the vault: the harness holds a `GIT_TOKEN` stub, git offers it as
/// HTTP Basic credentials, the sidecar swaps in the registry secret's real value on the way to
/// the git host only; the clone lands in the workspace, and the agent's terminal has no
/// `GIT_TOKEN`.
#[tokio::test(flavor = "multi_thread")]
async fn clone_through_the_vault_with_git_token_for_the_clone_only() {
    let tmp = tempfile::tempdir().unwrap();
    let host = "git.lap.test";
    let (ca, cert, key) = test_pki(tmp.path(), host);
    let srv = tmp.path().join("git");
    let src = srv.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let git = |args: &[&str], cwd: &std::path::Path| {
        let out = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .current_dir(cwd)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    git(&["init", "-q", "-b", "main"], &src);
    std::fs::write(src.join("SECRET_README"), "private\n").unwrap();
    git(&["add", "SECRET_README"], &src);
    git(&["commit", "-q", "-m", "one"], &src);
    git(&["clone", "-q", "--bare", "src", "repo.git"], &srv);
    let real = format!("ghp_REAL{}", lap_control_plane::app::new_id("t").replace('_', ""));
    let port_file = tmp.path().join("git-port");
    let _git_server = tokio::process::Command::new("python3")
        .args(["-c", HTTPS_GIT_SERVER])
        .arg(&srv)
        .arg(&port_file)
        .arg(format!("x-access-token:{real}"))
        .arg(&cert)
        .arg(&key)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let port = eventually(Duration::from_secs(20), "the git server starts", || async {
        std::fs::read_to_string(&port_file).ok()
    })
    .await;
    let base = tmp.path().join("base.toml");
    std::fs::write(
        &base,
        format!(
            "upstream_ca_files = [{:?}]\n\n[resolve]\n\"{host}:443\" = \"127.0.0.1:{port}\"\n",
            ca.display().to_string()
        ),
    )
    .unwrap();
    let bin = tmp.path().join("fake-bin");
    write_script(&bin, "claude", SHELL_CLAUDE);
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[
            ("PATH", path_with(&bin)),
            ("LAP_SIDECAR_BASE_CONFIG", base.display().to_string()),
        ],
    )
    .await;
    let (s, v) = server
        .call(
            "POST",
            "/api/v1/secrets",
            Some(json!({"name": "GIT_TOKEN", "value": real, "hosts": [host]})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let s = ready_session(
        &server,
        json!({"name": "private", "harness_id": "claude-code", "secrets": ["GIT_TOKEN"],
               "repo_url": format!("https://{host}/repo.git"), "branch": "main"}),
    )
    .await;
    let id = s["id"].as_str().unwrap();
    let workspace = server.sandbox_dir(id).join("home/workspace");
    assert_eq!(
        std::fs::read_to_string(workspace.join("SECRET_README")).unwrap(),
        "private\n"
    );
    let git_config = std::fs::read_to_string(workspace.join(".git/config")).unwrap();
    assert!(
        !git_config.contains("lapstub") && !git_config.contains(&real),
        "{git_config}"
    );
    let (_, events) = server
        .call("GET", &format!("{A}/sessions/{id}/interceptions"), None)
        .await;
    let injected = events.as_array().unwrap().iter().any(|e| {
        e["host"] == host
            && e["injected"]
                .as_array()
                .is_some_and(|i| i.iter().any(|x| x["secret"] == "GIT_TOKEN"))
    });
    assert!(injected, "no GIT_TOKEN injection toward {host}: {events}");
    // The agent never sees the token.
    let mut ws = connect(
        &server,
        s["tty_url"].as_str().unwrap(),
        Some(s["tty_token"].as_str().unwrap()),
    )
    .await
    .unwrap();
    read_until(&mut ws, "lap$").await;
    ws.send(Message::Binary(b"echo \"gt=[$GIT_TOKEN]\"\r".to_vec().into()))
        .await
        .unwrap();
    read_until(&mut ws, "gt=[]").await;
}

/// `/events` carries the agent's own events (here the stand-in CLI's stream-json lines) from a
/// message sent by another client, after the session's state.
#[tokio::test(flavor = "multi_thread")]
async fn events_carry_the_agents_own_event_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("fake-bin");
    write_script(&bin, "claude", SHELL_CLAUDE);
    let server = LapServer::start(&tmp.path().join("data"), &[("PATH", path_with(&bin))]).await;
    let s = ready_session(&server, json!({"name": "ev", "harness_id": "claude-code"})).await;
    let id = s["id"].as_str().unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let resp = http
        .get(format!("{}{A}/sessions/{id}/events", server.url))
        .bearer_auth(&server.key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    // The agent stream opens once the session is ready, asynchronously: send messages until
    // one's events arrive (each message's events go to every subscriber from then on).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !text.contains("event: agent") || !text.contains("\"type\":\"result\"") {
        assert!(Instant::now() < deadline, "no agent events; read: {text}");
        if text.contains("event: session") {
            let (st, r) = server
                .call(
                    "POST",
                    &format!("{A}/sessions/{id}/message"),
                    Some(json!({"text": "hi"})),
                )
                .await;
            assert_eq!(st, 200, "{r}");
        }
        let window = Instant::now() + Duration::from_secs(2);
        while let Ok(Some(Ok(chunk))) =
            tokio::time::timeout(window.saturating_duration_since(Instant::now()), body.next()).await
        {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if text.contains("\"type\":\"result\"") {
                break;
            }
        }
    }
    assert!(text.find("event: session") < text.find("event: agent"), "{text}");
}

/// `lap` without a terminal: login (0600 file, checked key), agents, secrets set (value from
/// stdin), `<agent> --no-attach`, sessions, send (the reply streamed), and clear errors.
#[tokio::test(flavor = "multi_thread")]
async fn lap_commands_against_a_running_server() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("fake-bin");
    write_script(&bin, "claude", SHELL_CLAUDE);
    let server = LapServer::start(&tmp.path().join("data"), &[("PATH", path_with(&bin))]).await;
    let (s, _) = server
        .call(
            "POST",
            &format!("{A}/agents"),
            Some(json!({"name": "coder", "harness_id": "claude-code"})),
        )
        .await;
    assert_eq!(s, 201);
    let cfg = tmp.path().join("cfg").join("lap.toml");
    let lap = |args: &[&str], env: &[(&str, &str)], stdin: &str| {
        use std::io::Write;
        let mut c = Command::new(workspace_bin("lap"));
        c.args(args)
            .env_remove("LAP_URL")
            .env_remove("MASTER_KEY")
            .env("LAP_CONFIG", &cfg)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let url = server.url.as_str();
    let key = server.key.as_str();

    // Not logged in: says how to.
    let (code, _, err) = lap(&["agents"], &[], "");
    assert_eq!(code, Some(1));
    assert!(err.contains("lap login"), "{err}");
    // A wrong key is refused and nothing is saved.
    let (code, _, err) = lap(&["login", "--url", url], &[("MASTER_KEY", "wrong")], "");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("refused the key") && err.contains("nothing saved"),
        "{err}"
    );
    assert!(!cfg.exists());
    // The right key (from stdin here) is saved 0600.
    let (code, _, err) = lap(&["login", "--url", url], &[], &format!("{key}\n"));
    assert_eq!(code, Some(0), "{err}");
    let mode = std::fs::metadata(&cfg).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let (code, out, err) = lap(&["agents"], &[], "");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.lines().next().unwrap().starts_with("NAME") && out.contains("coder"),
        "{out}"
    );

    let (code, _, err) = lap(
        &["secrets", "set", "GIT_TOKEN", "--host", "github.com"],
        &[],
        "ghp_secretvalue\n",
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("ghp_secretvalue"), "{err}");
    let (_, v) = server.call("GET", "/api/v1/secrets/GIT_TOKEN", None).await;
    assert_eq!(v["hosts"], json!(["github.com"]), "{v}");
    let (code, _, err) = lap(&["secrets", "set", "EMPTY", "--host", "github.com"], &[], "");
    assert_eq!(code, Some(1));
    assert!(err.contains("no value on stdin"), "{err}");

    let (code, out, err) = lap(&["coder", "--no-attach", "-e", "ANTHROPIC_API_KEY=sk-ant-x"], &[], "");
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("starting-harness"), "phases shown: {err}");
    let id = out.trim().to_owned();
    assert!(id.starts_with("ses_"), "{out}");
    let (code, out, _) = lap(&["sessions", "--agent", "coder"], &[], "");
    assert_eq!(code, Some(0));
    assert!(out.lines().any(|l| l.contains(&id) && l.contains("ready")), "{out}");

    let (code, out, err) = lap(&["send", &id, "hello", "there"], &[], "");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.trim(), "ok");

    let (code, _, err) = lap(&["nosuchagent"], &[], "");
    assert_eq!(code, Some(1));
    assert!(err.contains("no agent named `nosuchagent`"), "{err}");
    let (code, _, err) = lap(&["attach", "ses_nope"], &[], "");
    assert_eq!(code, Some(1));
    assert!(err.contains("not found"), "{err}");
    // The environment wins over the file.
    let (code, _, err) = lap(&["agents"], &[("MASTER_KEY", "wrong")], "");
    assert_eq!(code, Some(1));
    assert!(err.contains("refused the key") && err.contains("lap login"), "{err}");
}

// ---- the user's flow: `lap` in tmux ----

/// `lap <agent>` in tmux against a running `lap-server`, the real `claude` TUI talking through
/// the vault to a local stand-in: the TUI shows, a prompt gets the stand-in's reply, Ctrl-D
/// detaches saying how to reattach, and `lap attach` shows the same session's screen.
#[tokio::test(flavor = "multi_thread")]
async fn lap_agent_in_tmux_detaches_and_reattaches_to_the_same_session() {
    for tool in ["tmux", "claude"] {
        assert!(
            on_path(tool),
            "`{tool}` is not on PATH: this test runs the real `claude` TUI in tmux (bash .ci/run installs both)"
        );
    }
    let real = format!(
        "sk-ant-api03-REAL{}",
        lap_control_plane::app::new_id("k").replace('_', "")
    );
    let standin = StandIn::start(&real).await;
    let tmp = tempfile::tempdir().unwrap();
    let base = standin.base_config(tmp.path());
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[("LAP_SIDECAR_BASE_CONFIG", base.display().to_string())],
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

    let home = tmp.path().join("user-home");
    std::fs::create_dir_all(&home).unwrap();
    let lap = workspace_bin("lap");
    let env = [
        ("LAP_URL", server.url.clone()),
        ("MASTER_KEY", server.key.clone()),
        ("ANTHROPIC_API_KEY", real.clone()),
        ("HOME", home.display().to_string()),
        ("TERM", "xterm-256color".to_owned()),
    ];
    let tmux = Tmux {
        socket: format!("lap-test-{}", std::process::id()),
    };
    tmux.start(
        "first",
        &format!(
            "{} coder -e ANTHROPIC_API_KEY; echo LAP-EXIT=$?; sleep 600",
            lap.display()
        ),
        &env,
    );
    let screen = tmux
        .wait("first", "the Claude Code TUI", Duration::from_secs(120), |s| {
            s.contains("Claude Code") && s.contains('❯') || s.contains("LAP-EXIT")
        })
        .await;
    assert!(!screen.contains("LAP-EXIT"), "lap exited:\n{screen}");

    // The TUI talks to the model through the vault: the stand-in only answers the real key.
    tmux.keys("first", &["-l", "Say hello"]);
    tmux.wait("first", "the typed prompt", Duration::from_secs(20), |s| {
        s.contains("Say hello")
    })
    .await;
    tmux.keys("first", &["Enter"]);
    let screen = tmux
        .wait("first", "the stand-in's reply", Duration::from_secs(90), |s| {
            s.contains(REPLY)
        })
        .await;
    eprintln!("---- lap coder, after a prompt ----\n{screen}");
    assert!(standin.authorized.load(std::sync::atomic::Ordering::SeqCst) >= 1);

    // Ctrl-D detaches and says how to come back.
    tmux.keys("first", &["C-d"]);
    let screen = tmux
        .wait("first", "the detach message", Duration::from_secs(20), |s| {
            s.contains("LAP-EXIT")
        })
        .await;
    assert!(screen.contains("LAP-EXIT=0"), "{screen}");
    eprintln!("---- after Ctrl-D ----\n{screen}");
    let line = screen
        .lines()
        .find(|l| l.contains("lap attach ses_"))
        .unwrap_or_else(|| panic!("{screen}"));
    let id: String = line[line.find("ses_").unwrap()..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();

    // Still running.
    let (_, v) = server.call("GET", &format!("{A}/sessions/{id}"), None).await;
    assert_eq!(v["status"], "ready", "{v}");

    // `lap attach` shows the same session: the conversation is on the repainted screen.
    tmux.start(
        "second",
        &format!("{} attach {id}; echo LAP-EXIT=$?; sleep 600", lap.display()),
        &env,
    );
    let screen = tmux
        .wait("second", "the same session's screen", Duration::from_secs(30), |s| {
            s.contains(REPLY) && s.contains("Say hello") || s.contains("LAP-EXIT")
        })
        .await;
    assert!(!screen.contains("LAP-EXIT"), "lap attach exited:\n{screen}");
    eprintln!("---- lap attach {id} ----\n{screen}");
    tmux.keys("second", &["C-d"]);
    tmux.wait("second", "the second detach", Duration::from_secs(20), |s| {
        s.contains("LAP-EXIT=0")
    })
    .await;
    let (s, v) = server.call("DELETE", &format!("{A}/sessions/{id}"), None).await;
    assert_eq!((s, v["status"].as_str()), (200, Some("dead")));
}

/// A lap-server whose `claude` is the stand-in `script`, with the claude-code agent `agent`,
/// and the environment `lap` needs to reach it from tmux. The server lives until `tmp` goes.
async fn server_with_fake_claude(
    tmp: &std::path::Path,
    script: &str,
    agent: &str,
) -> (LapServer, [(&'static str, String); 3]) {
    let bin = tmp.join("fake-bin");
    write_script(&bin, "claude", script);
    let server = LapServer::start(&tmp.join("data"), &[("PATH", path_with(&bin))]).await;
    let (s, _) = server
        .call(
            "POST",
            &format!("{A}/agents"),
            Some(json!({"name": agent, "harness_id": "claude-code"})),
        )
        .await;
    assert_eq!(s, 201);
    let env = [
        ("LAP_URL", server.url.clone()),
        ("MASTER_KEY", server.key.clone()),
        ("HOME", tmp.display().to_string()),
    ];
    (server, env)
}

/// The terminal is restored when the attach ends badly: the session is stopped while `lap` is
/// attached; `lap` says so, exits 1, and the tty is back in cooked mode (`icanon`, `echo`).
#[tokio::test(flavor = "multi_thread")]
async fn lap_restores_the_terminal_when_the_session_goes_away() {
    assert!(
        on_path("tmux"),
        "`tmux` is not on PATH: this test drives `lap` in it (bash .ci/run installs it)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let (server, env) = server_with_fake_claude(tmp.path(), SHELL_CLAUDE, "shell").await;
    let tmux = Tmux {
        socket: format!("lap-test-restore-{}", std::process::id()),
    };
    tmux.start(
        "t",
        &format!(
            "{} shell; echo LAP-EXIT=$?; stty -a | tr ' ;' '\\n\\n' | grep -x -e -icanon -e icanon -e -echo -e echo; sleep 600",
            workspace_bin("lap").display()
        ),
        &env,
    );
    tmux.wait("t", "the shell in the session", Duration::from_secs(60), |s| {
        s.contains("lap$")
    })
    .await;
    tmux.keys("t", &["-l", "echo attached-$((40+2))"]);
    tmux.keys("t", &["Enter"]);
    tmux.wait("t", "typed output", Duration::from_secs(20), |s| {
        s.contains("attached-42")
    })
    .await;
    let (_, sessions) = server.call("GET", &format!("{A}/sessions"), None).await;
    let id = sessions["data"][0]["id"].as_str().unwrap().to_owned();
    let (s, _) = server.call("DELETE", &format!("{A}/sessions/{id}"), None).await;
    assert_eq!(s, 200);
    let screen = tmux
        .wait("t", "lap to exit", Duration::from_secs(30), |s| {
            s.lines().any(|l| l.trim() == "icanon" || l.trim() == "-icanon")
        })
        .await;
    eprintln!("---- after the session was stopped ----\n{screen}");
    assert!(screen.contains("LAP-EXIT=1"), "{screen}");
    assert!(
        screen.contains(&format!("The connection to {id} closed (session dead)")),
        "{screen}"
    );
    let modes: Vec<&str> = screen.lines().map(str::trim).collect();
    assert!(
        modes.contains(&"icanon") && modes.contains(&"echo"),
        "raw mode left on:\n{screen}"
    );
}

/// A TUI that takes seconds to paint (here a stand-in CLI that clears the screen, then sleeps
/// before its first text, as a cold `claude` does): `lap` says the agent is starting instead of
/// showing the harness's repaint of a blank screen, and the line goes once the agent paints.
#[tokio::test(flavor = "multi_thread")]
async fn lap_says_the_agent_is_starting_until_it_paints() {
    assert!(
        on_path("tmux"),
        "`tmux` is not on PATH: this test drives `lap` in it (bash .ci/run installs it)"
    );
    const SLOW_TUI: &str = "#!/bin/sh\nprintf '\\033[?1049h\\033[H\\033[2J'\nsleep 4\necho slow-tui-painted\nPS1='lap$ ' exec /bin/sh -i\n";
    let tmp = tempfile::tempdir().unwrap();
    let (_server, env) = server_with_fake_claude(tmp.path(), SLOW_TUI, "slow").await;
    let tmux = Tmux {
        socket: format!("lap-test-slow-{}", std::process::id()),
    };
    tmux.start(
        "t",
        &format!("{} slow; echo LAP-EXIT=$?; sleep 600", workspace_bin("lap").display()),
        &env,
    );
    let screen = tmux
        .wait("t", "the starting line", Duration::from_secs(60), |s| {
            s.contains("The agent is starting") || s.contains("slow-tui-painted") || s.contains("LAP-EXIT")
        })
        .await;
    assert!(
        screen.contains("The agent is starting") && screen.contains("Ctrl-D detaches"),
        "a blank screen before the agent's first text:\n{screen}"
    );
    let screen = tmux
        .wait("t", "the agent's first text", Duration::from_secs(30), |s| {
            s.contains("slow-tui-painted") || s.contains("LAP-EXIT")
        })
        .await;
    assert!(!screen.contains("LAP-EXIT"), "{screen}");
    assert!(
        !screen.contains("The agent is starting"),
        "the line is gone once the agent paints:\n{screen}"
    );
}
