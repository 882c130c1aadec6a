//! `GET /tty` with a real WebSocket client (tokio-tungstenite) against a running `lap-harness`.
//! The terminal runs a real interactive shell (the `claude` on PATH is a script that `exec`s
//! `/bin/sh`), and, where it is installed, the real Claude Code TUI.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use lap_test_support::eventually;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// `claude` without `-p` is the TUI: here, an interactive shell with a known prompt.
const SHELL_CLAUDE: &str = "#!/bin/sh\nPS1='lap$ ' exec /bin/sh -i\n";

struct Harness {
    port: u16,
    _child: tokio::process::Child,
    dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Harness {
    /// `claude` (and `lap-agent-sdk`) on PATH is `script` (or the real one when `None`).
    async fn start(harness_id: &str, script: Option<&str>, extra_env: &[(&str, &str)]) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        let home = dir.path().join("home");
        let work = dir.path().join("work");
        for d in [&bin, &home, &work] {
            std::fs::create_dir_all(d).unwrap();
        }
        if let Some(s) = script {
            // Under both names a harness may look for (claude-code's and claude-agent-sdk's).
            for name in ["claude", "lap-agent-sdk"] {
                std::fs::write(bin.join(name), s).unwrap();
                std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let port = free_port();
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_lap-harness"));
        cmd.env_clear()
            .env("PATH", path)
            .env("HOME", &home)
            .env("PORT", port.to_string())
            .env("HARNESS_AUTH_TOKEN", "tok")
            .env("LAP_HARNESS_ID", harness_id)
            .current_dir(&work)
            .stdout(Stdio::null())
            .kill_on_drop(true);
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        eventually(Duration::from_secs(20), "the harness starts", || async {
            http.get(format!("http://127.0.0.1:{port}/healthz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
                .then_some(())
        })
        .await;
        Harness {
            port,
            _child: child,
            dir,
        }
    }

    async fn connect(&self, query: &str, token: Option<&str>) -> Result<Ws, tokio_tungstenite::tungstenite::Error> {
        let mut req = format!("ws://127.0.0.1:{}/tty{query}", self.port)
            .into_client_request()
            .unwrap();
        if let Some(t) = token {
            req.headers_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        tokio_tungstenite::connect_async(req).await.map(|(ws, _)| ws)
    }
}

/// A viewer: its own model of the screen, fed by every binary frame.
struct Viewer {
    ws: Ws,
    screen: vt100::Parser,
    controls: Vec<serde_json::Value>,
    frames: usize,
    /// How long [`Viewer::until`] waits.
    patience: Duration,
}

impl Viewer {
    async fn new(ws: Ws, rows: u16, cols: u16) -> Viewer {
        Viewer {
            ws,
            screen: vt100::Parser::new(rows.try_into().unwrap(), cols.try_into().unwrap(), 0),
            controls: Vec::new(),
            frames: 0,
            patience: Duration::from_secs(20),
        }
    }

    async fn send(&mut self, bytes: &str) {
        self.ws
            .send(Message::Binary(bytes.as_bytes().to_vec().into()))
            .await
            .unwrap();
    }

    async fn control(&mut self, v: serde_json::Value) {
        self.ws.send(Message::Text(v.to_string().into())).await.unwrap();
    }

    /// Read frames until `done(screen text, controls)` or panic after `patience`.
    async fn until(&mut self, what: &str, done: impl Fn(&str, &[serde_json::Value]) -> bool) {
        if done(&self.screen.screen().contents(), &self.controls) {
            return;
        }
        let mut read = (&mut self.screen, &mut self.controls, &mut self.frames);
        lap_test_support::ws_read_until(
            &mut self.ws,
            self.patience,
            what,
            &mut read,
            |(screen, controls, frames), m| {
                match m {
                    Message::Binary(b) => {
                        **frames += 1;
                        screen.process(&b);
                    }
                    Message::Text(t) => controls.push(serde_json::from_str(t.as_str()).unwrap()),
                    _ => {}
                }
                done(&screen.screen().contents(), controls.as_slice())
            },
            |(screen, controls, _)| format!("\nscreen:\n{}\ncontrols: {:?}", screen.screen().contents(), controls),
        )
        .await;
    }

    async fn until_text(&mut self, text: &str) {
        self.until(text, |s, _| s.contains(text)).await;
    }

    /// Wait for the output of `echo pid=$$` (not the typed command) and return the pid.
    async fn pid(&mut self) -> String {
        fn printed(s: &str) -> Option<String> {
            let at = s.rfind("pid=")?;
            let digits: String = s[at + 4..].chars().take_while(char::is_ascii_digit).collect();
            (!digits.is_empty()).then_some(digits)
        }
        self.until("the printed pid", |s, _| printed(s).is_some()).await;
        printed(&self.screen.screen().contents()).unwrap()
    }
}

#[tokio::test]
async fn detaching_leaves_the_agent_running_and_a_reattach_repaints_the_screen() {
    let h = Harness::start("claude-code", Some(SHELL_CLAUDE), &[]).await;
    let mut a = Viewer::new(h.connect("?cols=100&rows=30", Some("tok")).await.unwrap(), 30, 100).await;
    a.until_text("lap$").await;
    a.send("echo marker-$((6*7)); echo pid=$$\r").await;
    a.until("the echo", |s, _| s.lines().any(|l| l == "marker-42")).await;
    let pid = a.pid().await;
    assert!(!pid.is_empty());
    a.ws.close(None).await.unwrap();
    drop(a);

    // Still running after the viewer left.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the shell died on detach"
    );

    // A new viewer's first frame is the current screen, not a replay.
    let mut b = Viewer::new(h.connect("", Some("tok")).await.unwrap(), 30, 100).await;
    let first = tokio::time::timeout(Duration::from_secs(10), b.ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let Message::Binary(first) = first else {
        panic!("first frame is not the repaint: {first:?}")
    };
    b.screen.process(&first);
    let painted = b.screen.screen().contents();
    assert!(painted.contains("marker-42"), "repaint lacks the screen: {painted}");
    assert!(first.starts_with(b"\x1b["), "repaint is escape codes");
    b.send("echo again; echo pid=$$\r").await;
    b.until("the second echo", |s, _| s.lines().any(|l| l == "again")).await;
    assert_eq!(b.pid().await, pid, "reattach reached another process");
}

#[tokio::test]
async fn several_viewers_share_one_terminal_and_the_last_resize_wins() {
    let h = Harness::start("claude-code", Some(SHELL_CLAUDE), &[]).await;
    let mut a = Viewer::new(h.connect("?cols=80&rows=24", Some("tok")).await.unwrap(), 24, 80).await;
    a.until_text("lap$").await;
    let mut b = Viewer::new(h.connect("?cols=120&rows=50", Some("tok")).await.unwrap(), 24, 80).await;
    b.until_text("lap$").await;
    // Typed by A, seen by both.
    a.send("echo from-a\r").await;
    b.until("A's output", |s, _| s.lines().any(|l| l == "from-a")).await;
    // The running terminal kept its size (B's query did not resize it); B resizes it now.
    b.control(serde_json::json!({"type": "resize", "cols": 60, "rows": 20}))
        .await;
    b.control(serde_json::json!({"type": "ping"})).await;
    b.until("pong", |_, c| c.iter().any(|v| v["type"] == "pong")).await;
    b.send("stty size\r").await;
    a.until("stty size seen by A", |s, _| s.lines().any(|l| l.trim() == "20 60"))
        .await;
    b.until("stty size seen by B", |s, _| s.lines().any(|l| l.trim() == "20 60"))
        .await;
    // A bad control message is answered, not fatal.
    a.control(serde_json::json!({"type": "resize", "cols": 0, "rows": 5}))
        .await;
    a.until("error", |_, c| c.iter().any(|v| v["type"] == "error")).await;
    a.send("echo still-here\r").await;
    a.until("still connected", |s, _| s.lines().any(|l| l == "still-here"))
        .await;
}

#[tokio::test]
async fn the_agent_exiting_is_reported_and_the_next_attach_starts_it_again() {
    let h = Harness::start("claude-code", Some(SHELL_CLAUDE), &[]).await;
    let mut a = Viewer::new(h.connect("", Some("tok")).await.unwrap(), 24, 80).await;
    a.until_text("lap$").await;
    a.send("echo pid=$$\r").await;
    let first = a.pid().await;
    a.send("exit 7\r").await;
    a.until("exit", |_, c| c.iter().any(|v| v["type"] == "exit" && v["code"] == 7))
        .await;
    let mut b = Viewer::new(h.connect("", Some("tok")).await.unwrap(), 24, 80).await;
    b.until_text("lap$").await;
    b.send("echo pid=$$\r").await;
    assert_ne!(b.pid().await, first);
}

#[tokio::test]
async fn tty_needs_the_token_and_a_terminal_harness() {
    let h = Harness::start("claude-code", Some(SHELL_CLAUDE), &[]).await;
    for token in [None, Some("nope")] {
        match h.connect("", token).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
            other => panic!("expected 401, got {other:?}"),
        }
    }
    match h.connect("?cols=0&rows=10", Some("tok")).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 400),
        other => panic!("expected 400, got {other:?}"),
    }
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let r = http
        .get(format!("http://127.0.0.1:{}/tty", h.port))
        .bearer_auth("tok")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "a plain GET is not a WebSocket");
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().contains("WebSocket"), "{v}");

    let sdk = Harness::start("claude-agent-sdk", Some(SHELL_CLAUDE), &[]).await;
    match sdk.connect("", Some("tok")).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 409),
        other => panic!("expected 409, got {other:?}"),
    }
}

/// The real Claude Code TUI in the terminal: the harness prepared `~/.claude.json` from the
/// stub it holds, so the TUI opens at its prompt (no onboarding, no key or trust questions).
#[tokio::test]
async fn the_real_claude_tui_opens_at_its_prompt() {
    assert!(
        which("claude").is_some(),
        "the `claude` CLI is not on PATH: npm install -g @anthropic-ai/claude-code (.ci/run does)"
    );
    let key = "sk-ant-api03-lapstub-0123456789abcdefghijklmnopqrstuv";
    let h = Harness::start(
        "claude-code",
        None,
        &[("ANTHROPIC_API_KEY", key), ("HTTPS_PROXY", "http://127.0.0.1:9")],
    )
    .await;
    let mut a = Viewer::new(h.connect("?cols=100&rows=30", Some("tok")).await.unwrap(), 30, 100).await;
    a.until("the Claude Code prompt", |s, _| {
        s.contains("Claude Code") && s.contains("❯")
    })
    .await;
    let screen = a.screen.screen().contents();
    assert!(!screen.contains("Do you want to use this API key"), "{screen}");
    assert!(!screen.contains("trust"), "{screen}");
    // Typed text reaches the TUI's input line.
    a.send("hello from lap").await;
    a.until_text("hello from lap").await;
}

/// The real Codex TUI (after the harness's `codex login --with-api-key` with the stub).
#[tokio::test]
async fn the_real_codex_tui_opens() {
    assert!(
        which("codex").is_some(),
        "the `codex` CLI is not on PATH: npm install -g @openai/codex (.ci/run does)"
    );
    let h = Harness::start(
        "codex",
        None,
        &[
            ("OPENAI_API_KEY", "sk-proj-lapstub0123456789abcdef"),
            ("HTTPS_PROXY", "http://127.0.0.1:9"),
        ],
    )
    .await;
    let mut a = Viewer::new(h.connect("?cols=100&rows=30", Some("tok")).await.unwrap(), 30, 100).await;
    a.patience = Duration::from_secs(60);
    a.until("the Codex TUI", |s, _| s.contains("OpenAI Codex")).await;
}

/// The real opencode TUI (full screen: a reattach repaints it from the alternate screen).
#[tokio::test]
async fn the_real_opencode_tui_opens_and_repaints_on_reattach() {
    assert!(
        which("opencode").is_some(),
        "the `opencode` CLI is not on PATH: npm install -g opencode-ai (.ci/run does)"
    );
    let h = Harness::start(
        "opencode",
        None,
        &[
            ("ANTHROPIC_API_KEY", "sk-ant-api03-lapstub0123456789"),
            ("HTTPS_PROXY", "http://127.0.0.1:9"),
        ],
    )
    .await;
    let mut a = Viewer::new(h.connect("?cols=100&rows=30", Some("tok")).await.unwrap(), 30, 100).await;
    // Its first start takes a while on a busy machine.
    a.patience = Duration::from_secs(120);
    a.until("the opencode TUI", |s, _| s.contains("Ask anything")).await;
    drop(a);
    let mut b = Viewer::new(h.connect("", Some("tok")).await.unwrap(), 30, 100).await;
    b.until("the repainted opencode TUI", |s, _| s.contains("Ask anything"))
        .await;
}

fn which(bin: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(bin)).find(|p| p.is_file())
}

/// A Basic-auth git server (smart HTTP: `git http-backend` behind python3) that only serves
/// `x-access-token:<token>`.
const GIT_SERVER: &str = r#"
import base64, http.server, os, subprocess, sys
root, port_file, expected = sys.argv[1], sys.argv[2], sys.argv[3]
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
        status = 200
        headers = []
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
open(port_file + ".tmp", "w").write(str(srv.server_address[1]))
os.rename(port_file + ".tmp", port_file)
srv.serve_forever()
"#;

fn git(args: &[&str], cwd: &std::path::Path) {
    let out = std::process::Command::new("git")
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
}

/// `GIT_TOKEN` authenticates the clone (as HTTP Basic `x-access-token:<token>`, through a
/// credential helper) and then is gone: not in `.git/config`, not in the agent's terminal.
#[tokio::test]
async fn git_token_is_used_for_the_clone_only() {
    let srv = tempfile::tempdir().unwrap();
    let src = srv.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    git(&["init", "-q", "-b", "main"], &src);
    std::fs::write(src.join("README"), "private\n").unwrap();
    git(&["add", "README"], &src);
    git(&["commit", "-q", "-m", "one"], &src);
    git(&["clone", "-q", "--bare", "src", "repo.git"], srv.path());
    let port_file = srv.path().join("port");
    let token = "ghp_lapstubTOKEN0123456789";
    let _server = tokio::process::Command::new("python3")
        .args(["-c", GIT_SERVER])
        .arg(srv.path())
        .arg(&port_file)
        .arg(format!("x-access-token:{token}"))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let port = eventually(Duration::from_secs(20), "the git server starts", || async {
        std::fs::read_to_string(&port_file).ok()
    })
    .await;
    let url = format!("http://127.0.0.1:{port}/repo.git");
    let h = Harness::start(
        "claude-code",
        Some(SHELL_CLAUDE),
        &[("REPO_URL", &url), ("GIT_TOKEN", token)],
    )
    .await;
    let work = h.dir.path().join("work");
    assert_eq!(std::fs::read_to_string(work.join("README")).unwrap(), "private\n");
    let config = std::fs::read_to_string(work.join(".git/config")).unwrap();
    assert!(!config.contains(token), "{config}");
    let mut a = Viewer::new(h.connect("", Some("tok")).await.unwrap(), 24, 80).await;
    a.until_text("lap$").await;
    a.send("echo \"gt=[$GIT_TOKEN] ht=[$HARNESS_AUTH_TOKEN]\"\r").await;
    a.until("the echo", |s, _| s.contains("gt=[] ht=[]")).await;
}
