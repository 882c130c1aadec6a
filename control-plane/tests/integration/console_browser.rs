//! The web console in a real browser: headless Chromium over WebDriver against a real
//! `lap-server` with the local backend, a real Claude Code session talking through the vault to
//! a local TLS stand-in of the Anthropic API that only answers the real key. Each page's
//! screenshot is kept in `target/console-screenshots/`. Needs `chromium`, `chromedriver` and the
//! `claude` CLI (`bash .ci/run` installs them); without them these tests fail.

#![allow(clippy::unwrap_used)]

use crate::support;

use std::time::Duration;

use fantoccini::key::Key;
use fantoccini::Locator;
use serde_json::{json, Value};
use support::anthropic::{StandIn, REPLY};
use support::browser::Browser;
use support::server::{on_path, LapServer};

const MINUTE: Duration = Duration::from_secs(60);

fn base_config(dir: &std::path::Path, standin: &StandIn) -> String {
    standin.base_config(dir).display().to_string()
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

/// Record the page's CSP violations from now on (until the next full load).
async fn watch_csp(b: &Browser) {
    b.js(
        "window.__csp = []; document.addEventListener('securitypolicyviolation', \
         e => window.__csp.push(`${e.violatedDirective} ${e.blockedURI} ${e.sample}`)); return null;",
        vec![],
    )
    .await;
}

async fn csp_violations(b: &Browser) -> Vec<Value> {
    b.js("return window.__csp ?? ['the CSP watch was not installed'];", vec![])
        .await
        .as_array()
        .unwrap()
        .clone()
}

async fn sign_in(b: &Browser, key: &str) {
    b.fill("#sign-in [data-input=key]", key).await;
    b.click("#sign-in button[type=submit]").await;
}

const TERM: &str = "#terminal .xterm-rows";
const TERM_STATUS: &str = ".term-bar .live";

#[tokio::test(flavor = "multi_thread")]
async fn an_admin_runs_claude_code_from_the_console() {
    assert!(
        on_path("claude"),
        "the `claude` CLI is not on PATH: npm install -g @anthropic-ai/claude-code (bash .ci/run does)"
    );
    let real = format!(
        "sk-ant-api03-REAL{}",
        lap_control_plane::app::new_id("k").replace('_', "")
    );
    let standin = StandIn::start(&real).await;
    let tmp = tempfile::tempdir().unwrap();
    let env = [("LAP_SIDECAR_BASE_CONFIG", base_config(tmp.path(), &standin))];
    let data = tmp.path().join("data");
    let server = LapServer::start(&data, &env).await;
    let url = server.url.clone();
    let b = Browser::start().await;

    // ---- sign in: a wrong key is refused next to the field; the right one sets the cookie ----
    b.goto(&format!("{url}/")).await;
    b.wait_text("#sign-in", "the sign-in form", MINUTE, |t| t.contains("Master key"))
        .await;
    b.screenshot("sign-in").await;
    sign_in(&b, "not-the-key").await;
    let err = b
        .wait_text("[data-error-for=key]", "the refusal", MINUTE, |t| !t.is_empty())
        .await;
    assert!(err.contains("not the master key"), "{err}");
    assert!(
        b.client.get_all_cookies().await.unwrap().is_empty(),
        "a refused sign-in set a cookie"
    );
    sign_in(&b, &server.key).await;
    b.wait_text("main h1", "the sessions page", MINUTE, |t| t == "Sessions")
        .await;
    let cookies = b.client.get_all_cookies().await.unwrap();
    let c = cookies
        .iter()
        .find(|c| c.name() == "lap_console")
        .unwrap_or_else(|| panic!("no sign-in cookie in {cookies:?}"));
    assert_eq!(c.http_only(), Some(true), "{c:?}");
    assert_eq!(c.same_site(), Some(cookie::SameSite::Strict), "{c:?}");
    assert_ne!(c.secure(), Some(true), "plain HTTP: not Secure ({c:?})");
    let js_view = b
        .js(
            "return [document.cookie, localStorage.length, sessionStorage.length, \
             document.documentElement.outerHTML.includes(arguments[0])];",
            vec![json!(server.key)],
        )
        .await;
    assert_eq!(
        js_view,
        json!(["", 0, 0, false]),
        "the key or cookie is visible to script"
    );
    watch_csp(&b).await;

    // ---- agents: a bad value is shown next to its field, then the agent is created ----
    b.click("#nav a[data-page=agents]").await;
    b.wait_text("main h1", "the agents page", MINUTE, |t| t == "Agents")
        .await;
    b.click("a[href='#/agents/new']").await;
    b.wait_text("main h1", "the agent form", MINUTE, |t| t == "New agent")
        .await;
    b.fill("form [data-input=name]", "coder").await;
    b.fill("form [data-input=model]", "claude-sonnet-4-5").await;
    b.fill("form [data-input=allow_out]", "api.anthropic.com\n*.github.com")
        .await;
    b.click("[data-field=env_vars] .add-row").await;
    b.fill("[data-field=env_vars] .kv [data-role=key]", "LAP_TOKEN").await;
    b.fill("[data-field=env_vars] .kv [data-role=value]", "x").await;
    b.click("form button[type=submit]").await;
    let err = b
        .wait_text("[data-error-for=env_vars]", "the env_vars error", MINUTE, |t| {
            !t.is_empty()
        })
        .await;
    assert!(err.starts_with("env_vars.LAP_TOKEN: "), "{err}");
    b.screenshot("agent-form-error").await;
    b.click("[data-field=env_vars] .kv button").await; // Remove
    b.click("form button[type=submit]").await;
    b.wait_text("main h1", "the agents list", MINUTE, |t| t == "Agents")
        .await;
    let row = b
        .wait_text("tr[data-agent=coder]", "the new agent", MINUTE, |t| t.contains("coder"))
        .await;
    assert!(
        row.contains("claude-code") && row.contains("claude-sonnet-4-5"),
        "{row}"
    );
    b.screenshot("agents").await;

    // ---- secrets: set one (hosts missing first), its value never shown ----
    let value = "ghp_valueNeverShown0123456789";
    b.click("#nav a[data-page=secrets]").await;
    b.wait_text("main h1", "the secrets page", MINUTE, |t| t == "Secrets")
        .await;
    b.fill("#new-secret [data-input=name]", "GIT_TOKEN").await;
    b.fill("#new-secret [data-input=value]", value).await;
    b.click("#new-secret button[type=submit]").await;
    let err = b
        .wait_text("#new-secret [data-error-for=hosts]", "the hosts error", MINUTE, |t| {
            !t.is_empty()
        })
        .await;
    assert!(err.starts_with("hosts: "), "{err}");
    b.fill("#new-secret [data-input=hosts]", "github.com").await;
    // A credential surface that does not exist is an error under its field, naming the entry.
    b.fill("#new-secret [data-input=locations]", "header, cookie").await;
    b.click("#new-secret button[type=submit]").await;
    let err = b
        .wait_text(
            "#new-secret [data-error-for=locations]",
            "the surfaces error",
            MINUTE,
            |t| !t.is_empty(),
        )
        .await;
    assert!(err.starts_with("locations[1]: `cookie` is not one of"), "{err}");
    b.fill("#new-secret [data-input=locations]", "header, header:x-git-token")
        .await;
    b.click("#new-secret button[type=submit]").await;
    let row = b
        .wait_text("tr[data-secret=GIT_TOKEN]", "the new secret", MINUTE, |t| {
            t.contains("github.com")
        })
        .await;
    assert!(row.contains("header, header:x-git-token"), "{row}");
    assert!(row.contains("write-only"), "{row}");
    let html = b.js("return document.documentElement.outerHTML;", vec![]).await;
    assert!(!html.as_str().unwrap().contains(value), "a secret value is in the page");
    b.screenshot("secrets").await;

    // ---- start a session of the real Claude Code with a per-session key ----
    b.click("#nav a[data-page=sessions]").await;
    b.wait_text("main h1", "the sessions page", MINUTE, |t| t == "Sessions")
        .await;
    b.click("#start-session .add-row").await;
    b.fill("#start-session .kv [data-role=key]", "ANTHROPIC_API_KEY").await;
    b.fill("#start-session .kv [data-role=value]", &real).await;
    b.fill("#start-session [data-input=title]", "from the console").await;
    b.click("#start-session button[type=submit]").await;
    b.wait_text("main h1", "the session page", MINUTE, |t| {
        t.starts_with("from the console")
    })
    .await;
    let sid = b
        .js("return location.hash.split('/')[2];", vec![])
        .await
        .as_str()
        .unwrap()
        .to_owned();
    assert!(sid.starts_with("ses_"), "{sid}");
    b.wait_text("[data-fact=status]", "ready", 2 * MINUTE, |t| {
        t == "ready" || t == "failed"
    })
    .await;
    assert_eq!(b.text("[data-fact=status]").await, "ready", "{}", b.text("main").await);

    // ---- its TUI in the page's terminal; type into it ----
    b.wait_text(TERM, "the Claude Code TUI", 2 * MINUTE, |t| {
        t.contains("Claude Code") && t.contains('❯')
    })
    .await;
    assert_eq!(b.text(TERM_STATUS).await, "connected");
    let input = b.client.find(Locator::Css(".xterm-helper-textarea")).await.unwrap();
    input.send_keys("Say hello").await.unwrap();
    b.wait_text(TERM, "the typed prompt", MINUTE, |t| t.contains("Say hello"))
        .await;
    input.send_keys(&char::from(Key::Enter).to_string()).await.unwrap();
    b.wait_text(TERM, "the stand-in's reply", 2 * MINUTE, |t| t.contains(REPLY))
        .await;
    assert!(
        csp_violations(&b).await.is_empty(),
        "CSP violations: {:?}",
        csp_violations(&b).await
    );
    let styles = b
        .js(
            "return [...document.querySelectorAll('style')].map(s => s.nonce.length > 0);",
            vec![],
        )
        .await;
    assert!(
        styles
            .as_array()
            .is_some_and(|s| !s.is_empty() && s.iter().all(|x| x == true)),
        "xterm.js's style elements must carry the nonce: {styles}"
    );

    // ---- the vault's audit shows the injection ----
    let audit = b
        .wait_text(".audit", "the injection in the audit", MINUTE, |t| {
            t.contains("ANTHROPIC_API_KEY (header)")
        })
        .await;
    assert!(audit.contains("api.anthropic.com"), "{audit}");
    assert!(!b.text("body").await.contains(&real), "the real key is on the page");
    b.screenshot("session").await;
    b.js(
        "document.querySelector('.audit').scrollIntoView(); return null;",
        vec![],
    )
    .await;
    b.screenshot("session-audit").await;
    b.js("window.scrollTo(0, 0); return null;", vec![]).await;

    // ---- a message from the message box streams its reply ----
    b.fill("#message [data-input=text]", "Say hello again").await;
    b.click("#message button[type=submit]").await;
    b.wait_text("#reply", "the streamed reply", 2 * MINUTE, |t| t.contains(REPLY))
        .await;

    // ---- reload: signed in still, the same screen repainted ----
    b.client.refresh().await.unwrap();
    b.wait_text(TERM, "the same screen after a reload", MINUTE, |t| {
        t.contains("Say hello") && t.contains(REPLY)
    })
    .await;
    assert!(b.text("#sign-in").await.is_empty());

    // ---- the server goes away: the page says so, and reconnects when it is back ----
    let port = port_of(&url);
    server.kill().await;
    b.wait_text(TERM_STATUS, "the terminal's lost connection", MINUTE, |t| {
        t.contains("connection lost")
    })
    .await;
    b.wait_text(".live[data-live]", "the event stream's lost connection", MINUTE, |t| {
        t.contains("connection lost")
    })
    .await;
    b.screenshot("session-connection-lost").await;
    let server = LapServer::start_on(port, &data, &env).await;
    b.wait_text(TERM_STATUS, "the terminal reconnected", MINUTE, |t| t == "connected")
        .await;
    b.wait_text(TERM, "the screen after reconnecting", MINUTE, |t| t.contains(REPLY))
        .await;
    b.wait_text(".live[data-live]", "the event stream back", MINUTE, |t| t == "live")
        .await;

    // ---- sessions and platform pages ----
    b.click("#nav a[data-page=sessions]").await;
    b.wait_text(
        &format!("tr[data-session={sid}]"),
        "the session listed as ready",
        MINUTE,
        |t| t.contains("ready") && t.contains("coder"),
    )
    .await;
    b.screenshot("sessions").await;
    b.click("#nav a[data-page=platform]").await;
    b.wait_text("[data-fact=backend]", "the platform facts", MINUTE, |t| t == "local")
        .await;
    assert_eq!(b.text("[data-fact=health]").await, "ok");
    assert_eq!(b.text("[data-fact=version]").await, env!("CARGO_PKG_VERSION"));
    let page = b.text("main").await;
    assert!(page.contains("Terminal attaches"), "{page}");
    b.screenshot("platform").await;

    // ---- stop it from its page ----
    b.goto(&format!("{url}/#/sessions/{sid}")).await;
    b.wait_text("[data-fact=status]", "the session page", MINUTE, |t| t == "ready")
        .await;
    b.click("#stop").await;
    b.wait_text("[data-fact=status]", "dead", MINUTE, |t| t == "dead").await;
    let (_, v) = server
        .call("GET", &format!("/api/v1/managed_agents/sessions/{sid}"), None)
        .await;
    assert_eq!(v["status"], "dead");
    b.close().await;
}

/// The first load of the console, measured by the browser (Resource Timing): bytes on the wire
/// and request round trips before the first paint. Prints the figures docs/console.md quotes.
#[tokio::test(flavor = "multi_thread")]
async fn the_first_load_is_small_and_paints_after_two_request_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let server = LapServer::start(&tmp.path().join("data"), &[]).await;
    let b = Browser::start().await;
    b.goto(&format!("{}/", server.url)).await;
    b.wait_text("#sign-in", "the sign-in form", MINUTE, |t| t.contains("Master key"))
        .await;
    let m = b
        .js(
            r#"
            const nav = performance.getEntriesByType('navigation')[0];
            const paint = performance.getEntriesByType('paint').find(p => p.name === 'first-contentful-paint')
                ?? performance.getEntriesByType('paint')[0];
            const all = [nav, ...performance.getEntriesByType('resource')];
            // A request's round trip: one more than the deepest request whose answer had begun
            // arriving before this one started (the page's own request is the first).
            const depth = new Map([[nav, 1]]);
            for (const r of all.slice(1).sort((a, b) => a.startTime - b.startTime)) {
                let d = 1;
                for (const [x, dx] of depth) if (x.responseStart > 0 && x.responseStart <= r.startTime) d = Math.max(d, dx + 1);
                depth.set(r, d);
            }
            return {
                fcp: paint ? paint.startTime : null,
                entries: all.map(r => ({
                    url: new URL(r.name).pathname, type: r.initiatorType || 'navigation',
                    transfer: r.transferSize, encoded: r.encodedBodySize, decoded: r.decodedBodySize,
                    end: r.responseEnd, depth: depth.get(r),
                })),
            };
            "#,
            vec![],
        )
        .await;
    let fcp = m["fcp"].as_f64().expect("a first paint");
    let entries = m["entries"].as_array().unwrap();
    let mut before_paint = 0u64;
    let mut total = 0u64;
    let mut trips_before_paint = 0u64;
    eprintln!(
        "{:<36} {:>8} {:>9} {:>6} before first paint",
        "request", "bytes", "unpacked", "trip"
    );
    for e in entries {
        let (transfer, decoded) = (e["transfer"].as_u64().unwrap(), e["decoded"].as_u64().unwrap());
        let early = e["end"].as_f64().unwrap() <= fcp;
        let depth = e["depth"].as_u64().unwrap();
        eprintln!(
            "{:<36} {transfer:>8} {decoded:>9} {depth:>6} {early}",
            e["url"].as_str().unwrap()
        );
        total += transfer;
        if early {
            before_paint += transfer;
            trips_before_paint = trips_before_paint.max(depth);
        }
    }
    eprintln!(
        "first load: {total} bytes on the wire in {} requests; {before_paint} bytes and {trips_before_paint} request round trips before the first paint ({fcp:.0} ms)",
        entries.len()
    );
    b.screenshot("first-load").await;
    assert!(total <= 300 * 1024, "first load {total} bytes: over the 300 KB budget");
    assert!(
        trips_before_paint <= 2,
        "{trips_before_paint} request round trips before the first paint: {entries:?}"
    );
    // Everything was compressed (the page and its scripts and styles).
    for e in entries {
        let url = e["url"].as_str().unwrap();
        if url == "/" || url.ends_with(".js") || url.ends_with(".mjs") || url.ends_with(".css") {
            assert!(
                e["encoded"].as_u64() < e["decoded"].as_u64(),
                "{url} was not compressed: {e}"
            );
        }
    }
    b.close().await;
}
