//! The control plane under faults, with real processes (`lap-server`, `vault-sidecar`,
//! `lap-harness` in bubblewrap, a stand-in `claude` that still calls the model through the
//! vault): the platform cases of `shared/cases/platform-cases.md` as regression tests.
//!
//! - P01 two replicas on one database (SQLite, Postgres), 100 ms reconcile interval, 20
//!   concurrent creates: all ready, none failed by a reconciler, each ended exactly once.
//! - P02 kill -9 of `lap-server` in the middle of a pass: the restarted server's first pass
//!   runs within 5 s, the session the crash left `creating` is resolved within 30 s.
//! - P03 is `sandbox.rs::a_stopped_vault_ends_the_session_with_the_reason`.
//! - P04 DELETE of a session still `creating`: `dead`, its processes gone within 1 s.
//! - P05 DELETE of an agent with a `ready` session: 409 naming it, or stopped first on request.
//! - P06 the audit outlives the session and the server.

#![allow(clippy::unwrap_used)]

use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lap_test_support::{eventually_ok, eventually_true};
use serde_json::{json, Value};
use support::anthropic::StandIn;
use support::fake_cli::path_with_fake_claude;
use support::server::{sandbox_pids, LapServer};

const A: &str = "/api/v1/managed_agents";

fn base_config(dir: &Path, standin: &StandIn) -> String {
    standin.base_config(dir).display().to_string()
}

async fn agent(server: &LapServer, name: &str) -> String {
    let (s, v) = server
        .call(
            "POST",
            &format!("{A}/agents"),
            Some(json!({"name": name, "harness_id": "claude-code"})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    v["id"].as_str().unwrap().to_owned()
}

/// `POST /agents/{aid}/session`: 201 `creating`; the session's id.
async fn create(server: &LapServer, aid: &str, body: Value) -> String {
    let (s, v) = server
        .call("POST", &format!("{A}/agents/{aid}/session"), Some(body))
        .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["status"], "creating", "{v}");
    v["id"].as_str().unwrap().to_owned()
}

async fn status(server: &LapServer, sid: &str) -> Value {
    server.call("GET", &format!("{A}/sessions/{sid}"), None).await.1
}

async fn wait_status(server: &LapServer, sid: &str, want: &[&str], timeout: Duration) -> Value {
    let what = format!("session {sid} becomes {want:?}");
    eventually_ok(timeout, &what, || async {
        let v = status(server, sid).await;
        if want.iter().any(|w| v["status"] == *w) {
            Ok(v)
        } else {
            Err(v)
        }
    })
    .await
}

/// The audit events matching `query` (`GET /api/v1/audit?…`).
async fn audit(server: &LapServer, query: &str) -> Vec<Value> {
    let (s, v) = server
        .call("GET", &format!("/api/v1/audit?{query}&limit=500"), None)
        .await;
    assert_eq!(s, 200, "{v}");
    v["data"].as_array().unwrap().clone()
}

/// Whether `pid` is still a running process. A zombie is not: it has exited, and only waits to
/// be reaped by its parent (sandboxes are detached from `lap-server`, so that is init).
fn exists(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rfind(')').map(|i| stat[i + 1..].trim_start().starts_with('Z')))
        .is_some_and(|zombie| !zombie)
}

/// A counter's value in lap-server's `/metrics` (`None` before it answers).
async fn metric(url: &str, name: &str) -> Option<u64> {
    let text = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

/// Wait until `server` has finished `n` more reconcile passes than when called.
async fn passes(server: &LapServer, n: u64, within: Duration) {
    let name = "lap_reconcile_passes_total";
    let start = metric(&server.url, name).await.unwrap_or(0);
    eventually_ok(within, &format!("{n} more reconcile passes"), || async {
        let now = metric(&server.url, name).await.unwrap_or(0);
        if now >= start + n {
            Ok(())
        } else {
            Err(format!("{} of {n}", now - start.min(now)))
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// P01
// ---------------------------------------------------------------------------------------------

/// Two `lap-server` processes on one database and one data directory, reconciling every
/// 100 ms, 20 creates at once spread over both.
async fn two_replicas_twenty_creates(database_url: Option<String>) {
    let standin = StandIn::start("sk-ant-api03-REALP01KEY-0123456789").await;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut env = vec![
        ("PATH", path_with_fake_claude(tmp.path())),
        ("LAP_SIDECAR_BASE_CONFIG", base_config(tmp.path(), &standin)),
        ("LAP_RECONCILE_INTERVAL", "100ms".to_owned()),
        ("LAP_CREATE_TIMEOUT", "120s".to_owned()),
    ];
    if let Some(url) = database_url {
        env.push(("DATABASE_URL", url));
    }
    let a = LapServer::start(&data, &env).await;
    let b = LapServer::start(&data, &env).await;
    let aid = agent(&a, "p01").await;
    let body = json!({"env_vars": {"ANTHROPIC_API_KEY": "sk-ant-api03-REALP01KEY-0123456789"}});
    let ids: Vec<String> = futures_util::future::join_all((0..20).map(|i| {
        let server = if i % 2 == 0 { &a } else { &b };
        create(server, &aid, body.clone())
    }))
    .await;
    let settled = futures_util::future::join_all(ids.iter().enumerate().map(|(i, id)| {
        wait_status(
            if i % 3 == 0 { &a } else { &b },
            id,
            &["ready", "failed", "dead"],
            Duration::from_secs(180),
        )
    }))
    .await;
    for v in &settled {
        assert_eq!(v["status"], "ready", "a session was failed: {v}");
    }
    // Passes of both replicas later, still every one ready.
    passes(&a, 2, Duration::from_secs(30)).await;
    passes(&b, 2, Duration::from_secs(30)).await;
    for id in &ids {
        let v = status(&b, id).await;
        assert_eq!(v["status"], "ready", "{v}");
    }
    // Stopped through both replicas at once: each ends exactly once.
    let stopped = futures_util::future::join_all(ids.iter().flat_map(|id| {
        [&a, &b].map(|server| async move { server.call("DELETE", &format!("{A}/sessions/{id}"), None).await })
    }))
    .await;
    for (s, v) in &stopped {
        assert_eq!(*s, 200, "{v}");
        assert_eq!(v["status"], "dead", "{v}");
    }
    for id in &ids {
        let deletes = audit(&a, &format!("session_id={id}&kind=session.delete")).await;
        assert_eq!(deletes.len(), 1, "{id} ended {} times: {deletes:?}", deletes.len());
        let creates = audit(&b, &format!("session_id={id}&kind=session.create")).await;
        assert_eq!(creates.len(), 1, "{creates:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn p01_two_replicas_on_sqlite_fail_none_of_twenty_concurrent_creates() {
    two_replicas_twenty_creates(None).await;
}

/// A database of its own on the test server (`LAP_TEST_DATABASE_URL`), so no other test's
/// sessions are in the replicas' view.
fn fresh_postgres_database(tag: &str) -> String {
    let url = std::env::var("LAP_TEST_DATABASE_URL").expect(
        "LAP_TEST_DATABASE_URL is not set: `. control-plane/ci/postgres.sh` starts a throwaway \
         PostgreSQL and sets it (.ci/run does)",
    );
    let name = format!("lap_{tag}_{}", std::process::id());
    let out = std::process::Command::new("psql")
        .args([
            url.as_str(),
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            &format!("CREATE DATABASE {name}"),
        ])
        .output()
        .expect("psql (Debian's postgresql-client) is required");
    assert!(
        out.status.success(),
        "CREATE DATABASE: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (base, _) = url.rsplit_once('/').unwrap();
    format!("{base}/{name}")
}

#[tokio::test(flavor = "multi_thread")]
async fn p01_two_replicas_on_postgres_fail_none_of_twenty_concurrent_creates() {
    two_replicas_twenty_creates(Some(fresh_postgres_database("p01"))).await;
}

// ---------------------------------------------------------------------------------------------
// P02
// ---------------------------------------------------------------------------------------------

/// The `reconciler` lease's holder and expiry in the SQLite database, read with Python's
/// `sqlite3` module (the server is dead, the file is not).
fn reconciler_lease(db: &Path) -> Option<(String, i64)> {
    let script = "import sqlite3,sys\n\
                  r=sqlite3.connect(sys.argv[1]).execute(\"select holder, expires_at from leases where name='reconciler'\").fetchone()\n\
                  print('' if r is None else f'{r[0]} {r[1]}')";
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(db)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let (holder, expires) = text.trim().split_once(' ')?;
    Some((holder.to_owned(), expires.parse().unwrap()))
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn p02_kill_9_mid_pass_then_the_restarted_server_reconciles_within_5s() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let env = vec![
        ("PATH", path_with_fake_claude(tmp.path())),
        ("LAP_RECONCILE_INTERVAL", "100ms".to_owned()),
    ];
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = LapServer::start_on(port, &data, &env).await;
    let aid = agent(&server, "p02").await;
    let kept = create(&server, &aid, json!({})).await;
    let slow = create(&server, &aid, json!({})).await;
    for sid in [&kept, &slow] {
        assert_eq!(
            wait_status(&server, sid, &["ready", "failed"], Duration::from_secs(60)).await["status"],
            "ready"
        );
    }
    // A harness that stops answering makes every pass wait out its probe (2 s): passes are
    // long, so the kill lands inside one.
    let harness = support::server::sandbox_harness_pid(&server.private_dir(&slow));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(harness), nix::sys::signal::Signal::SIGSTOP).unwrap();
    let db = data.join("lap.db");
    eventually_ok(Duration::from_secs(10), "the reconciler lease held", || async {
        match reconciler_lease(&db) {
            Some((_, expires)) if expires > now_ms() + 500 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let creating = create(&server, &aid, json!({})).await;
    server.kill().await;
    let killed_at = now_ms();
    let (holder, expires) = reconciler_lease(&data.join("lap.db")).expect("a reconciler lease row");
    assert!(
        expires > killed_at,
        "the kill landed between passes (lease {holder} expired at {expires})"
    );
    // The harness goes on; what is left of the crash is the dead replica's lease.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(harness), nix::sys::signal::Signal::SIGCONT).unwrap();

    let restarted_at = Instant::now();
    let server = LapServer::start_on(port, &data, &env).await;
    eventually_ok(
        Duration::from_secs(5),
        "a reconcile pass within 5 s of the restart (the dead replica's lease must not hold it up)",
        || async {
            match metric(&server.url, "lap_reconcile_passes_total").await {
                Some(n) if n >= 1 => Ok(()),
                other => Err(format!("passes: {other:?}")),
            }
        },
    )
    .await;
    // The crash's `creating` session is resolved within 30 s of the restart, with a reason if
    // failed; the ready one was adopted.
    let left = Duration::from_secs(30).saturating_sub(restarted_at.elapsed());
    let v = wait_status(&server, &creating, &["ready", "failed"], left).await;
    if v["status"] == "failed" {
        assert!(!v["failure_reason"].as_str().unwrap_or("").is_empty(), "{v}");
    }
    assert_eq!(status(&server, &kept).await["status"], "ready");
}

// ---------------------------------------------------------------------------------------------
// P04
// ---------------------------------------------------------------------------------------------

/// A TCP port that accepts connections and never says a word: an upstream a clone hangs on.
async fn tarpit() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread")]
async fn p04_delete_of_a_creating_session_ends_its_processes_within_1s() {
    let tmp = tempfile::tempdir().unwrap();
    // The harness clones its repository through the vault from an upstream that never answers.
    let port = tarpit().await;
    let base = tmp.path().join("base.toml");
    std::fs::write(&base, format!("[resolve]\n\"github.com:443\" = \"127.0.0.1:{port}\"\n")).unwrap();
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[
            ("PATH", path_with_fake_claude(tmp.path())),
            ("LAP_SIDECAR_BASE_CONFIG", base.display().to_string()),
            ("LAP_CREATE_TIMEOUT", "300s".into()),
        ],
    )
    .await;
    let (s, v) = server
        .call(
            "POST",
            &format!("{A}/agents"),
            Some(
                json!({"name": "p04", "harness_id": "claude-code", "repo_url": "https://github.com/lap-test/slow.git"}),
            ),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let sid = create(&server, v["id"].as_str().unwrap(), json!({})).await;
    // Its sandbox is up (the outer bubblewrap, the sandbox's init, the sidecar) and the harness
    // is cloning.
    let private = server.private_dir(&sid);
    let pids = eventually_ok(Duration::from_secs(30), "the sandbox starts cloning", || async {
        let pids = sandbox_pids(&private);
        let v = status(&server, &sid).await;
        if pids.len() == 3 && pids.iter().all(|p| exists(*p)) && v["phase"] == "cloning_repo" {
            Ok(pids)
        } else {
            Err(format!("{pids:?} {v}"))
        }
    })
    .await;
    let harness = support::server::sandbox_harness_pid(&private);
    let all: Vec<i32> = pids.iter().copied().chain([harness]).collect();
    assert_eq!(status(&server, &sid).await["status"], "creating");

    let (s, v) = server.call("DELETE", &format!("{A}/sessions/{sid}"), None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["status"], "dead", "{v}");
    eventually_ok(
        Duration::from_secs(1),
        "the deleted session's processes end",
        || async {
            let remain: Vec<String> = all
                .iter()
                .filter(|p| exists(**p))
                .map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default())
                .collect();
            if remain.is_empty() {
                Ok(())
            } else {
                Err(format!("{remain:?}"))
            }
        },
    )
    .await;
    // And it stays dead (the cancelled bring-up never marks it ready or failed), passes later.
    passes(&server, 2, Duration::from_secs(30)).await;
    let v = status(&server, &sid).await;
    assert_eq!(v["status"], "dead", "{v}");
    assert!(v["failure_reason"].is_null(), "{v}");
}

// ---------------------------------------------------------------------------------------------
// P05
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn p05_delete_of_an_agent_with_a_ready_session_is_refused_or_stops_it() {
    let tmp = tempfile::tempdir().unwrap();
    let server = LapServer::start(&tmp.path().join("data"), &[("PATH", path_with_fake_claude(tmp.path()))]).await;
    let aid = agent(&server, "p05").await;
    let sid = create(&server, &aid, json!({})).await;
    assert_eq!(
        wait_status(&server, &sid, &["ready", "failed"], Duration::from_secs(60)).await["status"],
        "ready"
    );
    let pids = sandbox_pids(&server.private_dir(&sid));

    let (s, v) = server.call("DELETE", &format!("{A}/agents/{aid}"), None).await;
    assert_eq!(s, 409, "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(msg.contains(&sid) && msg.contains("stop_sessions=true"), "{msg}");
    assert_eq!(status(&server, &sid).await["status"], "ready");
    assert_eq!(server.call("GET", &format!("{A}/agents/{aid}"), None).await.0, 200);

    let (s, v) = server
        .call("DELETE", &format!("{A}/agents/{aid}?stop_sessions=true"), None)
        .await;
    assert_eq!(s, 204, "{v}");
    assert_eq!(status(&server, &sid).await["status"], "dead");
    assert_eq!(server.call("GET", &format!("{A}/agents/{aid}"), None).await.0, 404);
    let what = format!("the stopped session's processes end: {pids:?}");
    eventually_true(Duration::from_secs(15), &what, || !pids.iter().any(|p| exists(*p))).await;
    let deletes = audit(&server, &format!("session_id={sid}&kind=session.delete")).await;
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert_eq!(deletes[0]["detail"]["reason"], "agent deleted");
    assert_eq!(
        audit(&server, &format!("agent_id={aid}&kind=agent.delete")).await.len(),
        1
    );
}

// ---------------------------------------------------------------------------------------------
// P06
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn p06_interceptions_and_the_audit_outlive_the_session_and_a_restart() {
    let real = "sk-ant-api03-REALP06KEY-0123456789abcdef";
    let standin = StandIn::start(real).await;
    let tmp = tempfile::tempdir().unwrap();
    let data: PathBuf = tmp.path().join("data");
    let env = vec![
        ("PATH", path_with_fake_claude(tmp.path())),
        ("LAP_SIDECAR_BASE_CONFIG", base_config(tmp.path(), &standin)),
    ];
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = LapServer::start_on(port, &data, &env).await;
    let aid = agent(&server, "p06").await;
    let sid = create(&server, &aid, json!({"env_vars": {"ANTHROPIC_API_KEY": real}})).await;
    assert_eq!(
        wait_status(&server, &sid, &["ready", "failed"], Duration::from_secs(60)).await["status"],
        "ready"
    );
    let (s, v) = server
        .call(
            "POST",
            &format!("{A}/sessions/{sid}/message"),
            Some(json!({"text": "hello"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(
        v.to_string().contains("api:authorized"),
        "the request went through the vault: {v}"
    );
    let (s, v) = server.call("DELETE", &format!("{A}/sessions/{sid}"), None).await;
    assert_eq!((s, v["status"].clone()), (200, json!("dead")), "{v}");
    assert!(
        server.terminate().await.is_some_and(|e| e.success()),
        "SIGTERM: a clean exit"
    );
    drop(server);

    let server = LapServer::start_on(port, &data, &env).await;
    let (s, v) = server
        .call("GET", &format!("{A}/sessions/{sid}/interceptions"), None)
        .await;
    assert_eq!(s, 200, "{v}");
    let events = v["data"]
        .as_array()
        .or_else(|| v.as_array())
        .unwrap_or_else(|| panic!("{v}"));
    let injected: Vec<&Value> = events
        .iter()
        .filter(|e| {
            e["host"] == "api.anthropic.com"
                && e["injected"]
                    .as_array()
                    .is_some_and(|i| i.iter().any(|x| x["secret"] == "ANTHROPIC_API_KEY"))
        })
        .collect();
    assert_eq!(injected.len(), 1, "one injected request, kept: {v}");
    assert!(!v.to_string().contains(real), "the audit holds names, never values");

    let kinds: Vec<String> = audit(&server, &format!("session_id={sid}"))
        .await
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect();
    for kind in ["session.create", "session.message", "session.delete", "interception"] {
        assert_eq!(
            kinds.iter().filter(|k| *k == kind).count(),
            1,
            "{kind} once in {kinds:?}"
        );
    }
    for e in audit(&server, &format!("session_id={sid}")).await {
        assert!(!e["time"].as_str().unwrap().is_empty(), "{e}");
        assert!(!e["actor"].as_str().unwrap().is_empty(), "{e}");
    }
}
