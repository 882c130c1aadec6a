//! The web console at the HTTP level, with `tower::ServiceExt::oneshot` over the real router and
//! a real SQLite store: the page and its policy headers, compressed and revalidated assets,
//! sign-in with the master key (cookie flags), cookie-authorised API calls with CSRF on
//! writes, sign-out, and Bearer auth unchanged. The browser flows are `console_browser.rs`.

#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use lap_control_plane::app::{App, AppConfig};
use lap_control_plane::backend::local::{LocalBackend, LocalConfig};
use lap_control_plane::console::{self, Platform};
use lap_control_plane::crypto::Cipher;
use lap_control_plane::store::Store;
use serde_json::{json, Value};
use tower::ServiceExt;

const KEY: &str = "console-test-master-key";
const A: &str = "/api/v1/managed_agents";

struct Harness {
    router: Router,
    dir: tempfile::TempDir,
}

async fn setup() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::connect(&format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display()))
        .await
        .unwrap();
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
    let platform = Platform {
        version: "0.0.0-test",
        backend: "local",
        database: "sqlite",
    };
    Harness {
        router: lap_control_plane::api::router(app.clone()).merge(console::router(app, platform)),
        dir,
    }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", |v| v.to_str().unwrap())
    }
}

async fn send(router: &Router, method: &str, path: &str, headers: &[(&str, &str)], body: Option<Value>) -> Answer {
    let mut req = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
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
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes().to_vec();
    Answer { status, headers, body }
}

/// Sign in; returns (the `Cookie` request header value, the CSRF token).
async fn sign_in(router: &Router) -> (String, String) {
    let a = send(router, "POST", "/console/session", &[], Some(json!({"key": KEY}))).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.json());
    let cookie = a.header("set-cookie").split(';').next().unwrap().to_owned();
    (cookie, a.json()["csrf_token"].as_str().unwrap().to_owned())
}

fn directive<'a>(csp: &'a str, name: &str) -> &'a str {
    csp.split(';')
        .map(str::trim)
        .find(|d| d.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} in {csp}"))
}

#[tokio::test]
async fn the_page_has_a_strict_policy_and_a_new_style_nonce_each_time() {
    let h = setup().await;
    let a = send(&h.router, "GET", "/", &[], None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.header("content-type").starts_with("text/html"));
    assert_eq!(a.header("cache-control"), "no-store");
    assert_eq!(a.header("x-content-type-options"), "nosniff");
    assert_eq!(a.header("x-frame-options"), "DENY");
    assert_eq!(a.header("referrer-policy"), "no-referrer");
    let csp = a.header("content-security-policy").to_owned();
    assert_eq!(directive(&csp, "default-src"), "default-src 'none'");
    assert_eq!(
        directive(&csp, "script-src"),
        "script-src 'self'",
        "no inline script, no eval"
    );
    assert_eq!(directive(&csp, "connect-src"), "connect-src 'self'");
    assert_eq!(directive(&csp, "frame-ancestors"), "frame-ancestors 'none'");
    assert_eq!(directive(&csp, "base-uri"), "base-uri 'none'");
    let html = String::from_utf8(a.body.clone()).unwrap();
    assert!(!html.contains("{{nonce}}"));
    let nonce = html.split("nonce=\"").nth(1).unwrap().split('"').next().unwrap();
    assert!(nonce.len() >= 22, "{nonce}");
    assert_eq!(
        directive(&csp, "style-src-elem"),
        format!("style-src-elem 'self' 'nonce-{nonce}'")
    );
    // No inline script in the page itself.
    for tag in html.split("<script").skip(1) {
        let open = &tag[..tag.find('>').unwrap()];
        assert!(open.contains("src=\"/assets/"), "inline script: <script{tag}");
    }
    let again = send(&h.router, "GET", "/", &[], None).await;
    assert_ne!(again.header("content-security-policy"), csp, "the nonce must change");
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b).read_to_end(&mut out).unwrap();
    out
}

#[tokio::test]
async fn assets_are_embedded_compressed_and_revalidated() {
    let h = setup().await;
    let original = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/console/vendor/xterm/xterm.mjs")).unwrap();
    let path = "/assets/vendor/xterm/xterm.mjs";
    let plain = send(&h.router, "GET", path, &[], None).await;
    assert_eq!(plain.status, StatusCode::OK);
    assert!(plain.header("content-type").starts_with("text/javascript"));
    assert_eq!(plain.body, original);
    let gz = send(&h.router, "GET", path, &[("accept-encoding", "gzip")], None).await;
    assert_eq!(gz.header("content-encoding"), "gzip");
    assert_eq!(gunzip(&gz.body), original);
    let br = send(&h.router, "GET", path, &[("accept-encoding", "br, gzip")], None).await;
    assert_eq!(br.header("content-encoding"), "br");
    assert!(
        br.body.len() * 3 < original.len(),
        "{} of {}",
        br.body.len(),
        original.len()
    );
    assert!(br.header("vary").to_ascii_lowercase().contains("accept-encoding"));
    let page = send(&h.router, "GET", "/", &[("accept-encoding", "gzip")], None).await;
    assert_eq!(page.header("content-encoding"), "gzip");

    let etag = plain.header("etag").to_owned();
    assert!(etag.starts_with("W/\""), "{etag}");
    assert_eq!(plain.header("cache-control"), "no-cache");
    let again = send(&h.router, "GET", path, &[("if-none-match", etag.as_str())], None).await;
    assert_eq!(again.status, StatusCode::NOT_MODIFIED);
    assert!(again.body.is_empty());
    let stale = send(&h.router, "GET", path, &[("if-none-match", "W/\"other\"")], None).await;
    assert_eq!(stale.status, StatusCode::OK);

    let missing = send(&h.router, "GET", "/assets/nope.js", &[], None).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.json()["error"].as_str().unwrap().contains("nope.js"));
    let licence = send(&h.router, "GET", "/assets/vendor/xterm/LICENSE", &[], None).await;
    assert!(String::from_utf8_lossy(&licence.body).contains("The xterm.js authors"));
}

#[tokio::test]
async fn sign_in_takes_the_master_key_once_and_sets_a_strict_cookie() {
    let h = setup().await;
    let wrong = send(&h.router, "POST", "/console/session", &[], Some(json!({"key": "nope"}))).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.headers.get("set-cookie").is_none());
    let msg = wrong.json()["error"].as_str().unwrap().to_owned();
    assert!(msg.starts_with("key: "), "names the field: {msg}");
    let bad = send(&h.router, "POST", "/console/session", &[], Some(json!({"kee": KEY}))).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let none = send(&h.router, "GET", "/console/session", &[], None).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);

    let a = send(&h.router, "POST", "/console/session", &[], Some(json!({"key": KEY}))).await;
    assert_eq!(a.status, StatusCode::OK);
    let set = a.header("set-cookie").to_owned();
    assert!(set.starts_with(&format!("{}=", console::COOKIE_NAME)), "{set}");
    let attrs: Vec<&str> = set.split(';').map(str::trim).collect();
    for want in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(attrs.contains(&want), "{want} missing: {set}");
    }
    assert!(!attrs.contains(&"Secure"), "plain HTTP: no Secure ({set})");
    assert_eq!(a.header("cache-control"), "no-store");
    let body = a.json();
    assert!(body["csrf_token"].as_str().unwrap().len() >= 40);
    assert!(!a.body.windows(KEY.len()).any(|w| w == KEY.as_bytes()));

    // Behind TLS (the browser's Origin, or a proxy's X-Forwarded-Proto), the cookie is Secure.
    for hdr in [("origin", "https://lap.example"), ("x-forwarded-proto", "https")] {
        let tls = send(&h.router, "POST", "/console/session", &[hdr], Some(json!({"key": KEY}))).await;
        assert!(
            tls.header("set-cookie").split(';').any(|a| a.trim() == "Secure"),
            "{hdr:?}"
        );
    }

    // Neither the key nor the cookie value is in the database (only the value's hash).
    let value = set.split(';').next().unwrap().split_once('=').unwrap().1.to_owned();
    let db = std::fs::read(h.dir.path().join("t.db")).unwrap();
    let db = String::from_utf8_lossy(&db);
    assert!(!db.contains(&value) && !db.contains(KEY));
}

#[tokio::test]
async fn the_cookie_authorises_the_api_and_writes_need_the_csrf_token() {
    let h = setup().await;
    let (cookie, csrf) = sign_in(&h.router).await;
    let r = &h.router;
    let list = send(r, "GET", &format!("{A}/agents"), &[("cookie", cookie.as_str())], None).await;
    assert_eq!(list.status, StatusCode::OK);
    assert_eq!(list.json()["total"], 0);
    let current = send(r, "GET", "/console/session", &[("cookie", cookie.as_str())], None).await;
    assert_eq!(current.json()["csrf_token"], csrf.as_str());
    let platform = send(r, "GET", "/console/platform", &[("cookie", cookie.as_str())], None).await;
    assert_eq!(
        platform.json(),
        json!({"version": "0.0.0-test", "backend": "local", "database": "sqlite"})
    );

    let agent = json!({"name": "web", "harness_id": "claude-code"});
    let no_token = send(
        r,
        "POST",
        &format!("{A}/agents"),
        &[("cookie", cookie.as_str())],
        Some(agent.clone()),
    )
    .await;
    assert_eq!(no_token.status, StatusCode::FORBIDDEN);
    assert!(no_token.json()["error"].as_str().unwrap().contains("X-CSRF-Token"));
    let other = send(
        r,
        "POST",
        &format!("{A}/agents"),
        &[("cookie", cookie.as_str()), (console::CSRF_HEADER, "forged")],
        Some(agent.clone()),
    )
    .await;
    assert_eq!(other.status, StatusCode::FORBIDDEN);
    let cross = send(
        r,
        "POST",
        &format!("{A}/agents"),
        &[
            ("cookie", cookie.as_str()),
            (console::CSRF_HEADER, csrf.as_str()),
            ("sec-fetch-site", "cross-site"),
        ],
        Some(agent.clone()),
    )
    .await;
    assert_eq!(cross.status, StatusCode::FORBIDDEN);
    let ok = send(
        r,
        "POST",
        &format!("{A}/agents"),
        &[
            ("cookie", cookie.as_str()),
            (console::CSRF_HEADER, csrf.as_str()),
            ("sec-fetch-site", "same-origin"),
        ],
        Some(agent),
    )
    .await;
    assert_eq!(ok.status, StatusCode::CREATED, "{:?}", ok.json());
    // A 4xx keeps the API's own message, which names the field.
    let bad = send(
        r,
        "POST",
        &format!("{A}/agents"),
        &[("cookie", cookie.as_str()), (console::CSRF_HEADER, csrf.as_str())],
        Some(json!({"name": "x", "harness_id": "emacs"})),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.json()["error"].as_str().unwrap().starts_with("harness_id: "));
    // Another sign-in's token does not fit this cookie.
    let (_, other_csrf) = sign_in(r).await;
    let mixed = send(
        r,
        "DELETE",
        &format!("{A}/agents/{}", ok.json()["id"].as_str().unwrap()),
        &[("cookie", cookie.as_str()), (console::CSRF_HEADER, other_csrf.as_str())],
        None,
    )
    .await;
    assert_eq!(mixed.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn bearer_auth_is_unchanged() {
    let h = setup().await;
    let r = &h.router;
    let (cookie, _) = sign_in(r).await;
    let none = send(r, "GET", &format!("{A}/agents"), &[], None).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        none.json()["error"],
        "missing or wrong API key: send Authorization: Bearer <MASTER_KEY>"
    );
    // A wrong Bearer is refused even beside a valid cookie.
    let wrong = send(
        r,
        "GET",
        &format!("{A}/agents"),
        &[("authorization", "Bearer nope"), ("cookie", cookie.as_str())],
        None,
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    // Bearer writes need no CSRF token (no cookie, no ambient authority).
    let bearer = format!("Bearer {KEY}");
    let ok = send(
        r,
        "POST",
        &format!("{A}/agents"),
        &[("authorization", bearer.as_str())],
        Some(json!({"name": "cli", "harness_id": "codex"})),
    )
    .await;
    assert_eq!(ok.status, StatusCode::CREATED);
    // An unknown cookie is not a sign-in.
    let forged = format!("{}=made-up", console::COOKIE_NAME);
    let f = send(r, "GET", &format!("{A}/agents"), &[("cookie", forged.as_str())], None).await;
    assert_eq!(f.status, StatusCode::UNAUTHORIZED);
    assert!(f.json()["error"].as_str().unwrap().contains("sign in again"));
}

#[tokio::test]
async fn sign_out_ends_the_sign_in_on_the_server() {
    let h = setup().await;
    let r = &h.router;
    let (cookie, csrf) = sign_in(r).await;
    let no_token = send(r, "DELETE", "/console/session", &[("cookie", cookie.as_str())], None).await;
    assert_eq!(no_token.status, StatusCode::FORBIDDEN, "signing out is a write too");
    let out = send(
        r,
        "DELETE",
        "/console/session",
        &[("cookie", cookie.as_str()), (console::CSRF_HEADER, csrf.as_str())],
        None,
    )
    .await;
    assert_eq!(out.status, StatusCode::NO_CONTENT);
    let removal = out.header("set-cookie");
    assert!(removal.contains("Max-Age=0"), "{removal}");
    // The old cookie, replayed, no longer works.
    let after = send(r, "GET", &format!("{A}/agents"), &[("cookie", cookie.as_str())], None).await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);
    let current = send(r, "GET", "/console/session", &[("cookie", cookie.as_str())], None).await;
    assert_eq!(current.status, StatusCode::UNAUTHORIZED);
}
