//! Router tests over a real store (SQLite always; Postgres when `LAP_TEST_DATABASE_URL` is set)
//! with `tower::ServiceExt::oneshot`. The local backend is real, pointed at binaries that do
//! not exist, so sessions exercise the failure path without any process.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use lap_control_plane::app::{App, AppConfig};
use lap_control_plane::backend::local::{LocalBackend, LocalConfig};
use lap_control_plane::crypto::Cipher;
use lap_control_plane::store::Store;
use lap_test_support::eventually_ok;
use serde_json::{json, Value};
use tower::ServiceExt;

const KEY: &str = "test-master-key";

struct Harness {
    router: Router,
    app: Arc<App>,
    dir: tempfile::TempDir,
}

async fn setup(url: Option<String>) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let url = url.unwrap_or_else(|| format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display()));
    let store = Store::connect(&url).await.unwrap();
    let backend = LocalBackend::new(LocalConfig {
        root: dir.path().join("sandboxes"),
        sandbox_root: dir.path().join("sandbox-homes"),
        sidecar_bin: dir.path().join("no-such-vault-sidecar"),
        harness_bin: dir.path().join("no-such-lap-harness"),
        base: Default::default(),
        isolation: lap_control_plane::backend::local::Isolation::Bubblewrap,
        ro_paths: vec![],
        sandbox_uid: 10001,
    })
    .unwrap();
    let app = App::new(
        store,
        Cipher::from_setting("test encryption key"),
        Arc::new(backend),
        AppConfig {
            master_key: KEY.into(),
            idle_timeout: Duration::from_secs(3600),
            create_timeout: Duration::from_secs(60),
            audit_retention: Duration::from_secs(30 * 86_400),
            model_gateway: None,
        },
    );
    Harness {
        router: lap_control_plane::api::router(app.clone()),
        app,
        dir,
    }
}

async fn call(router: &Router, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    call_with(router, method, path, body, Some(KEY)).await
}

async fn call_with(
    router: &Router,
    method: &str,
    path: &str,
    body: Option<Value>,
    key: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let req = match body {
        Some(b) => req
            .header("content-type", "application/json")
            .body(Body::from(b.to_string())),
        None => req.body(Body::empty()),
    }
    .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, v)
}

const A: &str = "/api/v1/managed_agents";

fn unique(name: &str) -> String {
    format!("{name}-{}", lap_control_plane::app::new_id("t"))
}

#[tokio::test]
async fn health_is_open_and_api_needs_the_key() {
    let h = setup(None).await;
    let (s, v) = call_with(&h.router, "GET", "/health", None, None).await;
    assert_eq!((s, v["status"].as_str()), (StatusCode::OK, Some("ok")));
    let (s, v) = call_with(&h.router, "GET", &format!("{A}/agents"), None, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(v["error"].as_str().unwrap().contains("Bearer"));
    let (s, _) = call_with(&h.router, "GET", &format!("{A}/agents"), None, Some("wrong")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = call_with(&h.router, "GET", &format!("{A}/agents"), None, Some("test-master-kez")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = call_with(&h.router, "GET", "/api/v1/secrets", None, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, v) = call(&h.router, "GET", "/nope", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(v["error"].is_string());
    let (s, v) = call_with(&h.router, "GET", "/metrics", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(v.as_str().unwrap().contains("lap_sessions_created_total"));
}

async fn agents_crud(h: &Harness) {
    let r = &h.router;
    let name = unique("coder");
    let (s, v) = call(
        r,
        "POST",
        &format!("{A}/agents"),
        Some(
            json!({"name": name, "harness_id": "claude-code", "model": "claude-sonnet-4-5",
                    "env_vars": {"GITHUB_TOKEN": "ghp_REALVALUE123"}}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().unwrap().to_owned();
    assert_eq!(v["env_vars"]["GITHUB_TOKEN"], "<redacted>");
    assert!(!v.to_string().contains("REALVALUE"));

    let (s, v) = call(r, "GET", &format!("{A}/agents/{id}"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["name"], name.as_str());
    assert_eq!(v["env_vars"]["GITHUB_TOKEN"], "<redacted>");

    // Duplicate name.
    let (s, v) = call(
        r,
        "POST",
        &format!("{A}/agents"),
        Some(json!({"name": name, "harness_id": "codex"})),
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");

    // Validation names the field.
    let (s, v) = call(
        r,
        "POST",
        &format!("{A}/agents"),
        Some(json!({"name": "x", "harness_id": "vim"})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("harness_id"), "{v}");
    let (s, v) = call(
        r,
        "POST",
        &format!("{A}/agents"),
        Some(json!({"name": "x", "harness_id": "codex", "bogus": 1})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("bogus"), "{v}");
    let (s, v) = call(
        r,
        "POST",
        &format!("{A}/agents"),
        Some(json!({"name": "y", "harness_id": "codex", "env_vars": {"PORT": "1"}})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("env_vars.PORT"), "{v}");
    let (s, v) = call(
        r,
        "POST",
        &format!("{A}/agents"),
        Some(json!({"name": "z", "harness_id": "codex", "secrets": ["NOPE"]})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("secrets[0]"), "{v}");

    // PATCH keeps a redacted value and changes others.
    let (s, v) = call(
        r,
        "PATCH",
        &format!("{A}/agents/{id}"),
        Some(json!({"model": "other", "env_vars": {"GITHUB_TOKEN": "<redacted>", "GH_TOKEN": "ghp_NEW_value"}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["model"], "other");
    let agent = h.app.get_agent(&id).await.unwrap();
    assert_eq!(agent.env_vars["GITHUB_TOKEN"], "ghp_REALVALUE123");
    assert_eq!(agent.env_vars["GH_TOKEN"], "ghp_NEW_value");

    // Pagination.
    for i in 0..3 {
        let (s, _) = call(
            r,
            "POST",
            &format!("{A}/agents"),
            Some(json!({"name": unique(&format!("p{i}")), "harness_id": "opencode"})),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED);
    }
    let (s, v) = call(r, "GET", &format!("{A}/agents?limit=2&offset=1"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["limit"], 2);
    assert_eq!(v["offset"], 1);
    assert!(v["total"].as_i64().unwrap() >= 4);
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    let (_, v) = call(r, "GET", &format!("{A}/agents?limit=1000"), None).await;
    assert_eq!(v["limit"], 200);
    let (s, v) = call(r, "GET", &format!("{A}/agents?limit=0"), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("limit"));
    let (s, _) = call(r, "GET", &format!("{A}/agents?limit=abc"), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    // Delete.
    let (s, _) = call(r, "DELETE", &format!("{A}/agents/{id}"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, v) = call(r, "GET", &format!("{A}/agents/{id}"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(v["error"].as_str().unwrap().contains(&id));
}

async fn secrets_registry(h: &Harness) {
    let r = &h.router;
    let name = format!("REG_{}", lap_control_plane::app::new_id("s").replace('-', "_"));
    let (s, v) = call(
        r,
        "POST",
        "/api/v1/secrets",
        Some(json!({"name": name, "value": "sk-REGISTRYVALUE", "hosts": ["api.example.com"]})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["value"], "<redacted>");
    let (s, _) = call(
        r,
        "POST",
        "/api/v1/secrets",
        Some(json!({"name": name, "value": "x-value-1", "hosts": ["api.example.com"]})),
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, v) = call(
        r,
        "POST",
        "/api/v1/secrets",
        Some(json!({"name": "B", "value": "x-value-1", "hosts": ["bad host"]})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("hosts[0]"), "{v}");
    // A value too short to redact from responses is refused, and not echoed.
    let (s, v) = call(
        r,
        "POST",
        "/api/v1/secrets",
        Some(json!({"name": "SHORT", "value": "1234567", "hosts": ["api.example.com"]})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(e.starts_with("value: the value is 7 bytes; at least 8"), "{v}");
    assert!(!e.contains("1234567"), "{v}");
    let (s, v) = call(
        r,
        "PUT",
        &format!("/api/v1/secrets/{name}"),
        Some(json!({"value": "sk-ROTATED", "hosts": ["api.example.com"], "locations": ["header", "cookie"]})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .starts_with("locations[1]: `cookie` is not one of"),
        "{v}"
    );
    let surfaces = json!(["header:x-api-key", "query:key", "body:POST /oauth/token"]);
    let (s, v) = call(
        r,
        "PUT",
        &format!("/api/v1/secrets/{name}"),
        Some(json!({"value": "sk-ROTATED", "hosts": ["api.example.com"], "locations": surfaces})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["locations"], surfaces);
    assert_eq!(h.app.get_secret(&name).await.unwrap().value, "sk-ROTATED");
    let (s, v) = call(r, "GET", "/api/v1/secrets?limit=200", None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(v["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["name"] == name.as_str() && s["value"] == "<redacted>"));
    assert!(!v.to_string().contains("ROTATED"));
    let (s, _) = call(r, "DELETE", &format!("/api/v1/secrets/{name}"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = call(r, "GET", &format!("/api/v1/secrets/{name}"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

async fn wait_status(r: &Router, id: &str, want: &str) -> Value {
    let what = format!("session {id} reaches {want}");
    eventually_ok(Duration::from_secs(30), &what, || async {
        let (_, v) = call(r, "GET", &format!("{A}/sessions/{id}"), None).await;
        if v["status"] == want {
            Ok(v)
        } else {
            Err(v)
        }
    })
    .await
}

async fn sessions(h: &Harness) {
    let r = &h.router;
    let (_, agent) = call(
        r,
        "POST",
        &format!("{A}/agents"),
        Some(json!({"name": unique("s"), "harness_id": "claude-code"})),
    )
    .await;
    let aid = agent["id"].as_str().unwrap().to_owned();

    // env_vars violations: each a 400 naming the key.
    for (vars, hosts, needle) in [
        (json!({"HTTPS_PROXY": "x-value-1"}), json!({}), "env_vars.HTTPS_PROXY"),
        (json!({"LAP_X": "x-value-1"}), json!({}), "env_vars.LAP_X"),
        (json!({"1BAD": "x-value-1"}), json!({}), "env_vars.1BAD"),
        (json!({"MY_TOKEN": "x-value-1"}), json!({}), "env_vars.MY_TOKEN"),
        // Too short to redact from responses.
        (
            json!({"MY_TOKEN": "1234567"}),
            json!({"MY_TOKEN": ["api.example.com"]}),
            "env_vars.MY_TOKEN: the value is 7 bytes",
        ),
        (
            json!({"MY_TOKEN": "x-value-1"}),
            json!({"MY_TOKEN": ["not a host"]}),
            "env_var_hosts.MY_TOKEN[0]",
        ),
    ] {
        let (s, v) = call(
            r,
            "POST",
            &format!("{A}/agents/{aid}/session"),
            Some(json!({"env_vars": vars, "env_var_hosts": hosts})),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        assert!(v["error"].as_str().unwrap().contains(needle), "{needle}: {v}");
    }
    let many: serde_json::Map<String, Value> = (0..51).map(|i| (format!("K{i}"), json!("v-value-1"))).collect();
    let (s, v) = call(
        r,
        "POST",
        &format!("{A}/agents/{aid}/session"),
        Some(json!({"env_vars": many})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().starts_with("env_vars:"), "{v}");
    let (s, _) = call(r, "POST", &format!("{A}/agents/nope/session"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // Create: 201 creating at once; the backend cannot start the sidecar, so it fails with why.
    let real = "sk-ant-api03-PERSESSIONREALVALUE";
    let (s, v) = call(
        r,
        "POST",
        &format!("{A}/agents/{aid}/session"),
        Some(json!({"title": "t", "env_vars": {"ANTHROPIC_API_KEY": real}})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["status"], "creating");
    assert_eq!(v["agent_id"], aid.as_str());
    assert!(v["tty_token"].as_str().unwrap().len() >= 32);
    let sid = v["id"].as_str().unwrap().to_owned();
    let v = wait_status(r, &sid, "failed").await;
    assert!(v["failure_reason"].as_str().unwrap().contains("vault-sidecar"), "{v}");

    let (s, v) = call(
        r,
        "POST",
        &format!("{A}/sessions/{sid}/message"),
        Some(json!({"text": "hi"})),
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");

    let (s, v) = call(r, "GET", &format!("{A}/sessions?agent_id={aid}"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["total"], 1);
    assert_eq!(v["data"][0]["id"], sid.as_str());

    // DELETE is idempotent and ends dead.
    for _ in 0..2 {
        let (s, v) = call(r, "DELETE", &format!("{A}/sessions/{sid}"), None).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(v["status"], "dead");
        assert!(v["stopped_at"].is_string());
    }
    let (s, _) = call(r, "DELETE", &format!("{A}/sessions/nope"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn sqlite_agents_crud() {
    agents_crud(&setup(None).await).await;
}

#[tokio::test]
async fn sqlite_secrets_registry() {
    secrets_registry(&setup(None).await).await;
}

#[tokio::test]
async fn sqlite_sessions() {
    let h = setup(None).await;
    sessions(&h).await;
    let (_, m) = call(&h.router, "GET", "/metrics", None).await;
    let m = m.as_str().unwrap();
    assert!(
        m.contains("lap_sessions{status=\"dead\"} 1") && m.contains("lap_sessions{status=\"ready\"} 0"),
        "{m}"
    );
    assert!(
        m.contains("lap_sessions_created_total 1") && m.contains("lap_sessions_failed_total 1"),
        "{m}"
    );
    // Neither per-session values nor agent secrets are stored in clear.
    let db = std::fs::read(h.dir.path().join("t.db")).unwrap();
    let text = String::from_utf8_lossy(&db);
    assert!(!text.contains("PERSESSIONREALVALUE"));
    assert!(!text.contains("sk-ant-api03"));
}

#[tokio::test]
async fn sqlite_encrypted_at_rest() {
    let h = setup(None).await;
    let (s, _) = call(
        &h.router,
        "POST",
        &format!("{A}/agents"),
        Some(json!({"name": "enc", "harness_id": "codex", "env_vars": {"OPENAI_API_KEY": "sk-AGENTLEVELREAL"}})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = call(
        &h.router,
        "POST",
        "/api/v1/secrets",
        Some(json!({"name": "REG", "value": "REGISTRYREALVALUE", "hosts": ["x.example"]})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let db = std::fs::read(h.dir.path().join("t.db")).unwrap();
    let text = String::from_utf8_lossy(&db);
    assert!(!text.contains("AGENTLEVELREAL") && !text.contains("REGISTRYREALVALUE"));
}

/// The same checks on a real Postgres (`.ci/run` sets `LAP_TEST_DATABASE_URL`).
#[tokio::test]
async fn postgres_all() {
    let url = std::env::var("LAP_TEST_DATABASE_URL").expect(
        "LAP_TEST_DATABASE_URL is not set: `. control-plane/ci/postgres.sh` starts a throwaway \
         PostgreSQL and sets it (.ci/run does)",
    );
    let h = setup(Some(url)).await;
    agents_crud(&h).await;
    secrets_registry(&h).await;
    sessions(&h).await;
}

/// What the vault cannot send is refused at create, naming the key; an oversized body keeps its
/// 413 and, like every error, is JSON.
#[tokio::test]
async fn bad_values_and_oversized_bodies_get_json_errors() {
    let h = setup(None).await;
    let r = &h.router;
    let (s, agent) = call(
        r,
        "POST",
        &format!("{A}/agents"),
        Some(json!({"name": unique("v"), "harness_id": "claude-code"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{agent}");
    let aid = agent["id"].as_str().unwrap();
    for bad in [
        "sk-ant-api03-REAL\r\nX-Injected: 1",
        "sk-ant-api03-REAL\n",
        "sk-ant\0api03",
        "sk-ant-api03-ünicode",
    ] {
        let (s, v) = call(
            r,
            "POST",
            &format!("{A}/agents/{aid}/session"),
            Some(json!({"env_vars": {"ANTHROPIC_API_KEY": bad}})),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad:?}: {v}");
        let msg = v["error"].as_str().unwrap_or_else(|| panic!("JSON error: {v}"));
        assert!(
            msg.contains("ANTHROPIC_API_KEY") && msg.contains("printable ASCII"),
            "{msg}"
        );
    }
    let (s, v) = call(
        r,
        "POST",
        "/api/v1/secrets",
        Some(json!({"name": "GITHUB_TOKEN", "value": "ghp_x\r\n", "hosts": ["github.com"]})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("printable ASCII"), "{v}");
    let (s, v) = call(
        r,
        "PATCH",
        &format!("{A}/agents/{aid}"),
        Some(json!({"env_vars": {"ANTHROPIC_API_KEY": "a\tb"}})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    // Nothing was half-applied: no session, the agent unchanged.
    let (_, list) = call(r, "GET", &format!("{A}/sessions"), None).await;
    assert_eq!(list["total"], 0, "{list}");

    let huge = "x".repeat(10 * 1024 * 1024);
    let (s, v) = call(
        r,
        "POST",
        &format!("{A}/agents/{aid}/session"),
        Some(json!({"env_vars": {"ANTHROPIC_API_KEY": huge}})),
    )
    .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(v["error"].is_string(), "a JSON error body: {v}");
    let (s, v) = call(r, "GET", &format!("{A}/no-such-route"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(v["error"].is_string(), "a JSON error body: {v}");
}

/// `tools[]` and `env`: stored and shown as given, patched, and each bad value a 400 naming
/// the field; `message` takes `parts` as well as `text` and names what is wrong in them.
#[tokio::test]
async fn agent_tools_env_and_message_parts() {
    let h = setup(None).await;
    let r = &h.router;
    let (s, a) = call(
        r,
        "POST",
        &format!("{A}/agents"),
        Some(json!({"name": unique("t"), "harness_id": "claude-code",
            "tools": ["bash", "edit"], "env": {"API_BASE": "https://api.example.com/v1", "FEATURE_X": "1"}})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    assert_eq!(a["tools"], json!(["bash", "edit"]));
    assert_eq!(a["env"]["API_BASE"], "https://api.example.com/v1");
    let id = a["id"].as_str().unwrap();
    // Absent tools: every tool (null).
    let (_, b) = call(
        r,
        "POST",
        &format!("{A}/agents"),
        Some(json!({"name": unique("t"), "harness_id": "codex"})),
    )
    .await;
    assert_eq!(b["tools"], Value::Null);
    assert_eq!(b["env"], json!({}));

    let (s, p) = call(
        r,
        "PATCH",
        &format!("{A}/agents/{id}"),
        Some(json!({"tools": null, "env": {"FEATURE_X": "2"}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{p}");
    assert_eq!(p["tools"], Value::Null);
    assert_eq!(p["env"], json!({"FEATURE_X": "2"}));
    assert!(p.get("mcp_servers").is_none(), "none listed: {p}");
    let servers = json!([{"name": "docs", "url": "https://mcp.example.com/mcp"}]);
    let (s, p) = call(
        r,
        "PATCH",
        &format!("{A}/agents/{id}"),
        Some(json!({"mcp_servers": servers})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{p}");
    assert_eq!(p["mcp_servers"], servers);

    for (body, field) in [
        (json!({"tools": ["bash", "rm"]}), "tools[1]"),
        (json!({"env": {"PATH": "/x"}}), "env.PATH"),
        (json!({"env": {"LD_PRELOAD": "/x.so"}}), "env.LD_PRELOAD"),
        (json!({"env": {"HTTPS_PROXY": "http://x"}}), "env.HTTPS_PROXY"),
        (json!({"env": {"LAP_MODEL": "x"}}), "env.LAP_MODEL"),
        (
            json!({"env": {"ANTHROPIC_API_KEY": "sk-ant-x"}}),
            "env.ANTHROPIC_API_KEY",
        ),
        (json!({"env": {"1BAD": "x"}}), "env.1BAD"),
        (
            json!({"mcp_servers": [{"name": "docs", "url": "ftp://mcp.example.com/x"}]}),
            "mcp_servers[0].url",
        ),
        (
            json!({"mcp_servers": [{"name": "docs", "url": "not a url"}]}),
            "mcp_servers[0].url",
        ),
        (
            json!({"mcp_servers": [{"name": "my docs", "url": "https://mcp.example.com/mcp"}]}),
            "mcp_servers[0].name",
        ),
        (
            json!({"mcp_servers": [{"name": "a", "url": "https://x.example.com/"}, {"name": "a", "url": "https://y.example.com/"}]}),
            "mcp_servers[1].name",
        ),
    ] {
        let mut create = json!({"name": unique("bad"), "harness_id": "opencode"});
        for (k, v) in body.as_object().unwrap() {
            create[k] = v.clone();
        }
        let (s, v) = call(r, "POST", &format!("{A}/agents"), Some(create)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(field), "{body}: {v}");
        let (s, v) = call(r, "PATCH", &format!("{A}/agents/{id}"), Some(body.clone())).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "patch {body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(field), "patch {body}: {v}");
    }
    // A name in both env and env_vars.
    let (s, v) = call(
        r,
        "POST",
        &format!("{A}/agents"),
        Some(
            json!({"name": unique("dup"), "harness_id": "opencode", "env": {"TOKEN_X": "a"},
            "env_vars": {"TOKEN_X": "b-value-1"}, "env_var_hosts": {"TOKEN_X": ["x.example.com"]}}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("env.TOKEN_X"), "{v}");

    // Message bodies are checked before the session is: a bad body is a 400 naming the field.
    for (body, field) in [
        (json!({"parts": [{"type": "image", "url": "x"}]}), "parts[0].type"),
        (json!({"parts": [{"type": "text"}]}), "parts[0].text"),
        (json!({"parts": []}), "parts"),
        (
            json!({"text": "a", "parts": [{"type": "text", "text": "b"}]}),
            "not both",
        ),
        (json!({}), "text"),
    ] {
        let (s, v) = call(r, "POST", &format!("{A}/sessions/ses_nope/message"), Some(body.clone())).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(field), "{body}: {v}");
    }
    let (s, _) = call(
        r,
        "POST",
        &format!("{A}/sessions/ses_nope/message"),
        Some(json!({"parts": [{"type": "text", "text": "hi"}]})),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    for ep in ["abort", "restart"] {
        let (s, v) = call(r, "POST", &format!("{A}/sessions/ses_nope/{ep}"), None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{ep}: {v}");
    }
}
