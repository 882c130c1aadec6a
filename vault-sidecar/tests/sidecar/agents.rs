//! Real agent CLIs through the vault sidecar (SPEC §2.2, §2.3): `claude -p`, `codex exec` and `opencode run` run
//! with exactly the environment a harness is given (proxy variables, the pod CA, each secret's name holding its stub)
//! and talk to `https://api.anthropic.com` / `https://api.openai.com` as they would in production. The sidecar's `[resolve]`
//! table sends both hosts to local stand-ins ([`standin::StandIn`]) that only accept the *real* keys, so a CLI can
//! only get its reply if the sidecar swapped the stub on the way out.
//!
//! Each test asserts on what the stand-in itself recorded (the sidecar redacts real values back to stubs in
//! responses, so echoes prove nothing): the real key arrived, the stub never did, and `/interceptions` names the
//! secret as injected.
//!
//! The CLIs are required: a missing one fails the test with the install command (.ci/run installs them).

use crate::support;

mod standin;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use standin::{StandIn, ANTHROPIC_HOST, ANTHROPIC_REPLY, OPENAI_HOST, OPENAI_REPLY};
use support::{SecretSpec, Sidecar, SidecarConfig, ANTHROPIC_REAL, ANTHROPIC_STUB};

/// Secret bound to api.openai.com, swapped in headers.
const OPENAI_STUB: &str = "sk-proj-lapstub-3e5a7c9b1d2f4a6c8e0b";
const OPENAI_REAL: &str = "sk-proj-REALKEY-6b4d2f0a8c1e3b5d7f9a-secret";

/// How long one CLI invocation may take (they start slowly on a loaded 2-core machine).
const CLI_DEADLINE: Duration = Duration::from_secs(180);

// ---------------------------------------------------------------------------------------------------------------
// Finding the CLIs
// ---------------------------------------------------------------------------------------------------------------

/// The CLI's path on `PATH`; a missing CLI fails the test with the install command (never a silent pass).
fn require_cli(name: &str, npm_package: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(found) = std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()) {
        return Some(found);
    }
    panic!(
        "`{name}` is not on PATH: this test drives the real CLI through the sidecar. Install it with \
         `npm install -g {npm_package}` (.ci/run does)"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Setup
// ---------------------------------------------------------------------------------------------------------------

/// Stand-in plus a sidecar that resolves both model API hosts to it, trusts its CA, binds ANTHROPIC_API_KEY and
/// OPENAI_API_KEY to their hosts, and lets nothing else out (so a CLI's stray traffic never reaches the internet).
async fn setup(websocket: bool) -> (StandIn, Sidecar) {
    let standin = StandIn::start(ANTHROPIC_REAL, OPENAI_REAL, websocket).await;
    let cfg = SidecarConfig {
        resolve: vec![
            (format!("{ANTHROPIC_HOST}:443"), standin.addr.to_string()),
            (format!("{OPENAI_HOST}:443"), standin.addr.to_string()),
        ],
        upstream_ca_files: vec![standin.ca_pem_path.clone()],
        egress_allow: vec![ANTHROPIC_HOST.to_string(), OPENAI_HOST.to_string()],
        secrets: vec![
            SecretSpec::new(
                "ANTHROPIC_API_KEY",
                ANTHROPIC_STUB,
                ANTHROPIC_REAL,
                &[ANTHROPIC_HOST],
                &["header"],
            ),
            SecretSpec::new("OPENAI_API_KEY", OPENAI_STUB, OPENAI_REAL, &[OPENAI_HOST], &["header"]),
        ],
        ..SidecarConfig::default()
    };
    let sidecar = Sidecar::start(cfg).await;
    (standin, sidecar)
}

/// The environment a harness is given (SPEC §2.3), for a CLI whose home is `home`. Nothing is inherited from the
/// test's own environment except `PATH`, so an ambient key or proxy can never make a test pass.
fn harness_env(sidecar: &Sidecar, home: &Path) -> Vec<(String, String)> {
    let proxy = sidecar.proxy_url();
    let no_proxy = "localhost,127.0.0.1,::1".to_string();
    let bundle = home.join("ca-bundle.pem");
    let mut pem = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    if !pem.is_empty() && !pem.ends_with('\n') {
        pem.push('\n');
    }
    pem.push_str(&sidecar.ca_pem());
    std::fs::write(&bundle, pem).expect("write CA bundle");
    let bundle = bundle.to_string_lossy().to_string();
    let ca = sidecar.ca_path.to_string_lossy().to_string();
    let mut env = vec![
        ("PATH".to_string(), std::env::var("PATH").unwrap_or_default()),
        ("HOME".to_string(), home.to_string_lossy().to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
        ("TERM".to_string(), "dumb".to_string()),
        ("NODE_EXTRA_CA_CERTS".to_string(), ca),
    ];
    for k in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
        env.push((k.to_string(), proxy.clone()));
    }
    for k in ["NO_PROXY", "no_proxy"] {
        env.push((k.to_string(), no_proxy.clone()));
    }
    for k in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
        "CARGO_HTTP_CAINFO",
    ] {
        env.push((k.to_string(), bundle.clone()));
    }
    env
}

/// Output of a CLI run.
struct CliOut {
    /// Exit code; -1 when killed by a signal or by the deadline.
    exit: i32,
    /// Whether [`CLI_DEADLINE`] passed and the CLI was killed.
    timed_out: bool,
    stdout: String,
    stderr: String,
}

impl CliOut {
    fn describe(&self) -> String {
        let how = if self.timed_out {
            format!("KILLED after {CLI_DEADLINE:?} (output so far below)")
        } else {
            format!("exit {}", self.exit)
        };
        format!(
            "{how}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.stdout, self.stderr
        )
    }
}

/// Copies `r` into `buf` as it arrives, so a hung CLI's output up to the hang is still available.
fn collect(
    mut r: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    buf: Arc<Mutex<Vec<u8>>>,
) -> tokio::task::JoinHandle<()> {
    use tokio::io::AsyncReadExt as _;
    tokio::spawn(async move {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = r.read(&mut chunk).await {
            if n == 0 {
                break;
            }
            buf.lock().expect("output buffer").extend_from_slice(&chunk[..n]);
        }
    })
}

/// Runs `program args` in `cwd` with exactly `env`, `stdin` written to its standard input. A CLI still running
/// after [`CLI_DEADLINE`] is killed and reported as timed out, with whatever it printed until then.
async fn run_cli(program: &Path, args: &[&str], env: &[(String, String)], cwd: &Path, stdin: &str) -> CliOut {
    use tokio::io::AsyncWriteExt as _;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
    let mut input = child.stdin.take().expect("child stdin");
    let stdin = stdin.to_string();
    tokio::spawn(async move {
        let _ = input.write_all(stdin.as_bytes()).await;
        let _ = input.shutdown().await;
    });
    let out_buf = Arc::new(Mutex::new(Vec::new()));
    let err_buf = Arc::new(Mutex::new(Vec::new()));
    let readers = [
        collect(child.stdout.take().expect("child stdout"), out_buf.clone()),
        collect(child.stderr.take().expect("child stderr"), err_buf.clone()),
    ];
    let (exit, timed_out) = match tokio::time::timeout(CLI_DEADLINE, child.wait()).await {
        Ok(Ok(status)) => (status.code().unwrap_or(-1), false),
        Ok(Err(e)) => panic!("waiting for {}: {e}", program.display()),
        Err(_) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            (-1, true)
        }
    };
    // A helper process the CLI left behind may hold the pipes open: read what is there, briefly.
    for r in readers {
        let _ = tokio::time::timeout(Duration::from_secs(5), r).await;
    }
    let text = |b: &Arc<Mutex<Vec<u8>>>| String::from_utf8_lossy(&b.lock().expect("output buffer")).to_string();
    CliOut {
        exit,
        timed_out,
        stdout: text(&out_buf),
        stderr: text(&err_buf),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Shared assertions
// ---------------------------------------------------------------------------------------------------------------

/// What the stand-in recorded for `host`: the model endpoint `model_path` was called, every call carried `real`,
/// and `stub` never arrived anywhere (headers, paths, bodies, WebSocket messages) on any host.
fn assert_upstream_saw_real_only(
    standin: &StandIn,
    sidecar: &Sidecar,
    host: &str,
    model_path: &str,
    real: &str,
    stub: &str,
    cli: &CliOut,
) {
    let seen = standin.seen();
    let context = || {
        format!(
            "stand-in saw:\n{}\nCLI: {}\nsidecar logs:\n{}",
            standin.summary(),
            cli.describe(),
            sidecar.logs()
        )
    };
    let model_calls: Vec<_> = seen
        .iter()
        .filter(|s| s.host == host && s.path.split('?').next() == Some(model_path) && s.method != "WS")
        .collect();
    assert!(
        !model_calls.is_empty(),
        "no call to {host}{model_path} reached the stand-in\n{}",
        context()
    );
    for s in &model_calls {
        assert!(
            s.contains(real),
            "{} reached the stand-in without the real key\n{}",
            s.summary(),
            context()
        );
    }
    for s in &seen {
        assert!(
            !s.contains(stub),
            "the stub reached the stand-in in {} (headers {:?})\n{}",
            s.summary(),
            s.headers,
            context()
        );
    }
}

/// `/interceptions` has an event for `host` naming `secret` as injected into a header.
async fn assert_interception(sidecar: &Sidecar, host: &str, secret: &str) -> Vec<Value> {
    let r = sidecar.admin_get("/interceptions").await;
    assert_eq!(r.status, 200, "GET /interceptions: {}", r.body_text());
    let events: Vec<Value> = serde_json::from_slice(&r.body).expect("/interceptions is a JSON array");
    let hits: Vec<Value> = events
        .iter()
        .filter(|e| e["host"] == host)
        .filter(|e| {
            e["injected"]
                .as_array()
                .is_some_and(|inj| inj.iter().any(|i| i["secret"] == secret && i["location"] == "header"))
        })
        .cloned()
        .collect();
    assert!(
        !hits.is_empty(),
        "/interceptions shows no {secret} injected toward {host}:\n{}",
        serde_json::to_string_pretty(&events).unwrap_or_default()
    );
    hits
}

// ---------------------------------------------------------------------------------------------------------------
// Claude Code
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_print_reaches_the_messages_api_with_the_real_key() {
    let Some(claude) = require_cli("claude", "@anthropic-ai/claude-code") else {
        return;
    };
    let (standin, sidecar) = setup(false).await;
    let home = tempfile::tempdir().expect("claude home");
    let work = tempfile::tempdir().expect("claude workdir");
    let mut env = harness_env(&sidecar, home.path());
    env.extend(
        [
            ("ANTHROPIC_API_KEY", ANTHROPIC_STUB),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
            ("DISABLE_TELEMETRY", "1"),
            ("DISABLE_AUTOUPDATER", "1"),
            ("DISABLE_ERROR_REPORTING", "1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );

    let out = run_cli(
        &claude,
        &["-p", "say hi", "--output-format", "json"],
        &env,
        work.path(),
        "",
    )
    .await;
    let context = || {
        format!(
            "{}\nstand-in saw:\n{}\nsidecar logs:\n{}",
            out.describe(),
            standin.summary(),
            sidecar.logs()
        )
    };
    assert_eq!(out.exit, 0, "claude -p failed\n{}", context());
    let result: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("claude --output-format json printed no JSON ({e})\n{}", context()));
    assert_eq!(result["is_error"], false, "claude reported an error\n{}", context());
    assert!(
        result["result"].as_str().is_some_and(|r| r.contains(ANTHROPIC_REPLY)),
        "claude's result is not the stand-in's reply\n{}",
        context()
    );

    assert_upstream_saw_real_only(
        &standin,
        &sidecar,
        ANTHROPIC_HOST,
        "/v1/messages",
        ANTHROPIC_REAL,
        ANTHROPIC_STUB,
        &out,
    );
    let calls = standin
        .seen()
        .into_iter()
        .filter(|s| s.path.split('?').next() == Some("/v1/messages"))
        .collect::<Vec<_>>();
    assert!(
        calls.iter().all(|s| s.header("x-api-key") == Some(ANTHROPIC_REAL)),
        "every Messages call should carry the real key in x-api-key\n{}",
        context()
    );
    assert!(
        calls.iter().any(|s| {
            let body: Value = serde_json::from_slice(&s.body).unwrap_or(Value::Null);
            body["stream"] == true && s.status == 200
        }),
        "claude never streamed a Messages response (SSE) through the sidecar\n{}",
        context()
    );
    let events = assert_interception(&sidecar, ANTHROPIC_HOST, "ANTHROPIC_API_KEY").await;
    assert!(
        events.iter().any(|e| e["method"] == "POST"
            && e["path"].as_str().is_some_and(|p| p.starts_with("/v1/messages"))
            && e["status"] == 200),
        "/interceptions has no POST /v1/messages with ANTHROPIC_API_KEY injected: {events:?}"
    );
    sidecar.assert_logs_clean();
}

/// Control for the test above: when the sidecar intercepts but holds no ANTHROPIC_API_KEY secret, the stub
/// reaches the stand-in unchanged, the stand-in refuses it and `claude -p` fails. So the passing run really
/// depends on the sidecar's swap, not on a stand-in that accepts anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_with_only_the_stub_is_refused_by_the_stand_in() {
    let Some(claude) = require_cli("claude", "@anthropic-ai/claude-code") else {
        return;
    };
    let standin = StandIn::start(ANTHROPIC_REAL, OPENAI_REAL, false).await;
    let sidecar = Sidecar::start(SidecarConfig {
        intercept: Some("all".into()),
        resolve: vec![(format!("{ANTHROPIC_HOST}:443"), standin.addr.to_string())],
        upstream_ca_files: vec![standin.ca_pem_path.clone()],
        egress_allow: vec![ANTHROPIC_HOST.to_string()],
        ..SidecarConfig::default()
    })
    .await;
    let home = tempfile::tempdir().expect("claude home");
    let work = tempfile::tempdir().expect("claude workdir");
    let mut env = harness_env(&sidecar, home.path());
    env.extend(
        [
            ("ANTHROPIC_API_KEY", ANTHROPIC_STUB),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
            ("DISABLE_TELEMETRY", "1"),
            ("DISABLE_AUTOUPDATER", "1"),
            ("DISABLE_ERROR_REPORTING", "1"),
            ("CLAUDE_CODE_MAX_RETRIES", "0"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let out = run_cli(
        &claude,
        &["-p", "say hi", "--output-format", "json"],
        &env,
        work.path(),
        "",
    )
    .await;
    let context = || format!("{}\nstand-in saw:\n{}", out.describe(), standin.summary());
    assert!(!out.timed_out, "claude -p hung\n{}", context());
    assert_ne!(out.exit, 0, "claude -p succeeded with only the stub\n{}", context());
    assert!(
        !out.stdout.contains(ANTHROPIC_REPLY),
        "claude printed the stand-in's reply without the real key\n{}",
        context()
    );
    let calls: Vec<_> = standin
        .seen()
        .into_iter()
        .filter(|s| s.path.split('?').next() == Some("/v1/messages"))
        .collect();
    assert!(!calls.is_empty(), "claude never reached the stand-in\n{}", context());
    assert!(
        calls
            .iter()
            .all(|s| s.status == 401 && s.header("x-api-key") == Some(ANTHROPIC_STUB)),
        "the stand-in should have refused the stub on every call\n{}",
        context()
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Codex
// ---------------------------------------------------------------------------------------------------------------

/// `codex login --with-api-key` (the stub on stdin, as a harness would do with `$OPENAI_API_KEY`), then
/// `codex exec --json "say hi"`, against a stand-in that does (`websocket`) or does not accept the Responses API
/// WebSocket. Asserts the CLI succeeded and printed the stand-in's reply.
async fn codex_exec(websocket: bool) -> Option<(StandIn, Sidecar, CliOut)> {
    let codex = require_cli("codex", "@openai/codex")?;
    let (standin, sidecar) = setup(websocket).await;
    let home = tempfile::tempdir().expect("codex home");
    let work = tempfile::tempdir().expect("codex workdir");
    let codex_home = home.path().join(".codex");
    std::fs::create_dir_all(&codex_home).expect("mkdir CODEX_HOME");
    let mut env = harness_env(&sidecar, home.path());
    let bundle = home.path().join("ca-bundle.pem").to_string_lossy().to_string();
    env.extend([
        ("CODEX_HOME".to_string(), codex_home.to_string_lossy().to_string()),
        ("CODEX_CA_CERTIFICATE".to_string(), bundle),
        ("OPENAI_API_KEY".to_string(), OPENAI_STUB.to_string()),
        (
            "RUST_LOG".to_string(),
            "codex_api=debug,codex_core=info,codex_client=debug".to_string(),
        ),
    ]);

    let login = run_cli(
        &codex,
        &["login", "--with-api-key"],
        &env,
        work.path(),
        &format!("{OPENAI_STUB}\n"),
    )
    .await;
    assert_eq!(
        login.exit,
        0,
        "codex login --with-api-key failed\n{}\nstand-in saw:\n{}",
        login.describe(),
        standin.summary()
    );
    let auth = std::fs::read_to_string(codex_home.join("auth.json")).unwrap_or_default();
    assert!(
        auth.contains(OPENAI_STUB) && !auth.contains(OPENAI_REAL),
        "codex login should have stored the stub: {auth}"
    );

    let out = run_cli(
        &codex,
        &["exec", "--skip-git-repo-check", "--json", "say hi"],
        &env,
        work.path(),
        "",
    )
    .await;
    let context = format!(
        "{}\nstand-in saw:\n{}\nsidecar logs:\n{}",
        out.describe(),
        standin.summary(),
        sidecar.logs()
    );
    assert_eq!(out.exit, 0, "codex exec failed\n{context}");
    let said = out
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .any(|v| v["type"] == "item.completed" && v["item"]["text"].as_str().is_some_and(|t| t.contains(OPENAI_REPLY)));
    assert!(
        said,
        "codex exec --json did not report the stand-in's reply as an item\n{context}"
    );
    Some((standin, sidecar, out))
}

/// Recorded requests to `api.openai.com/v1/responses` with `method` (`WS` for WebSocket messages).
fn responses_calls(standin: &StandIn, method: &str) -> Vec<standin::Seen> {
    standin
        .seen()
        .into_iter()
        .filter(|s| s.host == OPENAI_HOST && s.path.split('?').next() == Some("/v1/responses") && s.method == method)
        .collect()
}

/// codex 0.171 opens the Responses API as a WebSocket (`GET /v1/responses`, HTTP/1.1 Upgrade, `Authorization:
/// Bearer` in the handshake), prewarms with `response.create` + `generate: false`, then sends the turn's
/// `response.create` and reads the events as text frames. The sidecar must swap the stub in the handshake and relay
/// frames both ways: codex falls back to `POST` + SSE if the WebSocket fails, so the reply arriving with no `POST`
/// proves the relay carried it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_exec_over_the_responses_websocket_gets_the_real_key() {
    let Some((standin, sidecar, out)) = codex_exec(true).await else {
        return;
    };
    let context = || format!("stand-in saw:\n{}\n{}", standin.summary(), out.describe());
    let upgrades = responses_calls(&standin, "GET");
    assert!(
        upgrades.iter().any(|s| s.status == 101),
        "codex never completed a WebSocket upgrade on /v1/responses\n{}",
        context()
    );
    for s in &upgrades {
        assert_eq!(
            s.header("authorization"),
            Some(format!("Bearer {OPENAI_REAL}").as_str()),
            "WebSocket handshake without the real key\n{}",
            context()
        );
    }
    let creates: Vec<Value> = responses_calls(&standin, "WS")
        .iter()
        .filter_map(|s| serde_json::from_slice::<Value>(&s.body).ok())
        .filter(|v| v["type"] == "response.create")
        .collect();
    assert!(
        creates.iter().any(|v| v["generate"] != false),
        "no generating response.create arrived over the WebSocket\n{}",
        context()
    );
    assert!(
        responses_calls(&standin, "POST").is_empty(),
        "codex fell back to POST /v1/responses: the WebSocket relay did not carry the reply\n{}",
        context()
    );
    assert_upstream_saw_real_only(
        &standin,
        &sidecar,
        OPENAI_HOST,
        "/v1/responses",
        OPENAI_REAL,
        OPENAI_STUB,
        &out,
    );
    let events = assert_interception(&sidecar, OPENAI_HOST, "OPENAI_API_KEY").await;
    assert!(
        events
            .iter()
            .any(|e| e["method"] == "GET" && e["path"] == "/v1/responses" && e["status"] == 101),
        "/interceptions has no 101 upgrade of /v1/responses with OPENAI_API_KEY injected: {events:?}"
    );
    sidecar.assert_logs_clean();
}

/// Against a server that refuses the WebSocket (`426`), codex 0.171 falls back to `POST /v1/responses` with
/// `stream: true` and reads Server-Sent Events: both the refused handshake and the POST must carry the real key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_exec_over_responses_sse_gets_the_real_key() {
    let Some((standin, sidecar, out)) = codex_exec(false).await else {
        return;
    };
    let context = || format!("stand-in saw:\n{}\n{}", standin.summary(), out.describe());
    let posts = responses_calls(&standin, "POST");
    assert!(!posts.is_empty(), "codex never POSTed /v1/responses\n{}", context());
    for s in &posts {
        assert_eq!(s.status, 200, "{}\n{}", s.summary(), context());
        assert_eq!(
            s.header("authorization"),
            Some(format!("Bearer {OPENAI_REAL}").as_str()),
            "POST /v1/responses without the real key\n{}",
            context()
        );
        let body: Value = serde_json::from_slice(&s.body).unwrap_or(Value::Null);
        assert_eq!(
            body["stream"],
            true,
            "codex asked for a non-streaming response\n{}",
            context()
        );
    }
    assert!(
        responses_calls(&standin, "WS").is_empty(),
        "messages arrived over a WebSocket the stand-in refused\n{}",
        context()
    );
    assert_upstream_saw_real_only(
        &standin,
        &sidecar,
        OPENAI_HOST,
        "/v1/responses",
        OPENAI_REAL,
        OPENAI_STUB,
        &out,
    );
    let events = assert_interception(&sidecar, OPENAI_HOST, "OPENAI_API_KEY").await;
    assert!(
        events
            .iter()
            .any(|e| e["method"] == "POST" && e["path"] == "/v1/responses" && e["status"] == 200),
        "/interceptions has no POST /v1/responses with OPENAI_API_KEY injected: {events:?}"
    );
    sidecar.assert_logs_clean();
}

// ---------------------------------------------------------------------------------------------------------------
// opencode
// ---------------------------------------------------------------------------------------------------------------

/// `opencode run -m anthropic/claude-sonnet-4-5 -- "say hi"` (as lap-harness runs it) with its home and XDG
/// directories in a temp dir. opencode 1.18 (a Bun binary) honours the proxy variables and trusts the pod CA through
/// either `NODE_EXTRA_CA_CERTS` or `SSL_CERT_FILE` (without both it fails with "self signed certificate in
/// certificate chain"). It calls the Messages API with `x-api-key`, streaming, and makes a second Messages call with
/// its small model (claude-haiku-4-5) to title the session; every call must carry the real key.
///
/// `OPENCODE_DISABLE_MODELS_FETCH` stops its model catalogue fetch (`models.opencode.ai`) and
/// `OPENCODE_DISABLE_AUTOUPDATE` its update check. It still tries, in the background and unconditionally, to
/// `npm install @opencode-ai/plugin` into its config directory: the sidecar refuses `registry.npmjs.org` (not in the
/// egress allow-list), opencode logs a warning and carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_run_reaches_the_messages_api_with_the_real_key() {
    let Some(opencode) = require_cli("opencode", "opencode-ai") else {
        return;
    };
    let (standin, sidecar) = setup(false).await;
    let home = tempfile::tempdir().expect("opencode home");
    let work = tempfile::tempdir().expect("opencode workdir");
    let mut env = harness_env(&sidecar, home.path());
    for (k, sub) in [
        ("XDG_CONFIG_HOME", ".config"),
        ("XDG_DATA_HOME", ".local/share"),
        ("XDG_STATE_HOME", ".local/state"),
        ("XDG_CACHE_HOME", ".cache"),
    ] {
        env.push((k.to_string(), home.path().join(sub).to_string_lossy().to_string()));
    }
    env.extend(
        [
            ("ANTHROPIC_API_KEY", ANTHROPIC_STUB),
            ("OPENCODE_DISABLE_MODELS_FETCH", "1"),
            ("OPENCODE_DISABLE_AUTOUPDATE", "1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );

    let out = run_cli(
        &opencode,
        &["run", "-m", "anthropic/claude-sonnet-4-5", "--", "say hi"],
        &env,
        work.path(),
        "",
    )
    .await;
    let context = || {
        format!(
            "{}\nstand-in saw:\n{}\nsidecar logs:\n{}",
            out.describe(),
            standin.summary(),
            sidecar.logs()
        )
    };
    assert_eq!(out.exit, 0, "opencode run failed\n{}", context());
    assert!(
        out.stdout.contains(ANTHROPIC_REPLY),
        "opencode run did not print the stand-in's reply\n{}",
        context()
    );

    assert_upstream_saw_real_only(
        &standin,
        &sidecar,
        ANTHROPIC_HOST,
        "/v1/messages",
        ANTHROPIC_REAL,
        ANTHROPIC_STUB,
        &out,
    );
    let calls = standin
        .seen()
        .into_iter()
        .filter(|s| s.path.split('?').next() == Some("/v1/messages"))
        .collect::<Vec<_>>();
    assert!(
        calls.iter().all(|s| s.header("x-api-key") == Some(ANTHROPIC_REAL)),
        "every Messages call should carry the real key in x-api-key\n{}",
        context()
    );
    assert!(
        calls.iter().any(|s| {
            let body: Value = serde_json::from_slice(&s.body).unwrap_or(Value::Null);
            body["stream"] == true && body["model"] == "claude-sonnet-4-5" && s.status == 200
        }),
        "opencode never streamed a claude-sonnet-4-5 Messages response (SSE) through the sidecar\n{}",
        context()
    );
    let events = assert_interception(&sidecar, ANTHROPIC_HOST, "ANTHROPIC_API_KEY").await;
    assert!(
        events.iter().any(|e| e["method"] == "POST"
            && e["path"].as_str().is_some_and(|p| p.starts_with("/v1/messages"))
            && e["status"] == 200),
        "/interceptions has no POST /v1/messages with ANTHROPIC_API_KEY injected: {events:?}"
    );
    sidecar.assert_logs_clean();
}
