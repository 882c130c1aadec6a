//! A message's round trip through a model gateway against the same message sent to the model
//! directly, in one run (issue 16). Not a test: it prints figures (docs/performance.md, "The
//! model gateway").
//!
//!     bash benches/gateway.sh          # builds the release binaries, then runs this
//!
//! Two `lap-server`s side by side, each with one ready `claude-code` session on the local backend
//! (bubblewrap), the real `claude` CLI, and the scripted model stand-in on loopback
//! (`tests/integration/support/anthropic.rs`):
//! - **direct**: the agent's `ANTHROPIC_API_KEY` stub is swapped by the vault toward
//!   `api.anthropic.com` (the stand-in);
//! - **gateway**: `LAP_MODEL_GATEWAY_URL` points at a real LiteLLM proxy
//!   (`tests/integration/support/gateway.rs`), the vault swaps the gateway's key in toward it,
//!   and LiteLLM calls the stand-in with the model's key.
//!
//! Each `POST /sessions/{id}/message` is timed from the request to its `200` (the CLI's start,
//! its model calls, its exit), alternating the two sessions so both see the same machine load;
//! the first message of each is a warm-up and left out. `BENCH_MESSAGES` sets the count per
//! session (default 20).

#![allow(clippy::unwrap_used, clippy::print_stdout)]

// The tests' support modules, at the crate root as they refer to each other (`super::…`).
#[allow(dead_code, unreachable_pub)]
#[path = "../tests/integration/support/anthropic.rs"]
mod anthropic;
#[allow(dead_code, unreachable_pub)]
#[path = "../tests/integration/support/gateway.rs"]
mod gateway;
// (its unit tests' `use super::*` is unused here: a bench without the test harness runs none)
#[allow(dead_code, unreachable_pub, unused_imports)]
#[path = "../tests/integration/support/model_script.rs"]
mod model_script;
#[allow(dead_code, unreachable_pub)]
#[path = "../tests/integration/support/server.rs"]
mod server;

use std::time::{Duration, Instant};

use anthropic::{StandIn, REPLY};
use gateway::{Gateway, Upstream};
use serde_json::json;
use server::LapServer;

const A: &str = "/api/v1/managed_agents";

/// A ready `claude-code` session of a new agent with `model`, started with `env_vars`.
async fn ready_session(server: &LapServer, model: &str, env_vars: serde_json::Value) -> String {
    let (s, agent) = server
        .call(
            "POST",
            &format!("{A}/agents"),
            Some(json!({"name": "bench", "harness_id": "claude-code", "model": model})),
        )
        .await;
    assert_eq!(s, 201, "{agent}");
    let path = format!("{A}/agents/{}/session", agent["id"].as_str().unwrap());
    let (s, session) = server.call("POST", &path, Some(json!({ "env_vars": env_vars }))).await;
    assert_eq!(s, 201, "{session}");
    let sid = session["id"].as_str().unwrap().to_owned();
    let session = server.wait_settled(&sid, Duration::from_secs(120)).await;
    assert_eq!(session["status"], "ready", "{session}");
    sid
}

/// One message's round trip, in milliseconds; the reply must be the model's.
async fn message_ms(server: &LapServer, sid: &str) -> f64 {
    let t = Instant::now();
    let (s, reply) = server
        .call(
            "POST",
            &format!("{A}/sessions/{sid}/message"),
            Some(json!({"text": "hello"})),
        )
        .await;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(s, 200, "{reply}");
    assert!(
        reply["parts"][0]["text"].as_str().unwrap_or_default().contains(REPLY),
        "{reply}"
    );
    ms
}

fn summary(samples: &mut [f64]) -> (f64, f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    (at(0.5), at(0.9), mean)
}

#[tokio::main]
async fn main() {
    let messages: usize = std::env::var("BENCH_MESSAGES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20);
    let tmp = tempfile::tempdir().unwrap();
    let model_key = format!(
        "sk-ant-api03-REALbench{}",
        lap_control_plane::app::new_id("k").replace('_', "")
    );
    let gateway_key = format!("sk-REALgateway{}", lap_control_plane::app::new_id("k").replace('_', ""));
    let standin = StandIn::start(&model_key).await;
    let gateway = Gateway::start(tmp.path(), &standin, Upstream::Anthropic, &model_key, &gateway_key).await;

    let direct_dir = tmp.path().join("direct");
    std::fs::create_dir_all(&direct_dir).unwrap();
    let direct_base = standin.base_config(&direct_dir);
    let direct = LapServer::start(
        &direct_dir.join("data"),
        &[("LAP_SIDECAR_BASE_CONFIG", direct_base.display().to_string())],
    )
    .await;
    let direct_sid = ready_session(&direct, "claude-direct", json!({"ANTHROPIC_API_KEY": model_key})).await;

    let gw_dir = tmp.path().join("gateway");
    std::fs::create_dir_all(&gw_dir).unwrap();
    let via = gateway.lap_server(&standin, &gw_dir).await;
    Gateway::register_key(&via, &gateway_key).await;
    let via_sid = ready_session(&via, "lap-gateway-model", json!({})).await;

    // Warm-up: the CLI's first start, the vault's first leaf and upstream connection, LiteLLM's
    // first request.
    message_ms(&direct, &direct_sid).await;
    message_ms(&via, &via_sid).await;
    let (mut d, mut g) = (Vec::new(), Vec::new());
    for _ in 0..messages {
        d.push(message_ms(&direct, &direct_sid).await);
        g.push(message_ms(&via, &via_sid).await);
    }
    let seen_via_gateway = standin
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|b| b["model"] == Upstream::Anthropic.model())
        .count();
    assert!(
        seen_via_gateway >= messages,
        "the gateway's messages reached the model through it"
    );

    let (dp50, dp90, dmean) = summary(&mut d);
    let (gp50, gp90, gmean) = summary(&mut g);
    println!(
        "Message round trip (POST /sessions/{{id}}/message → 200, real claude CLI, {messages} messages per session, \
         alternating; the first of each left out)\n"
    );
    println!("| measure | direct | through LiteLLM | unit | gateway / direct | gateway − direct |");
    println!("|---|---:|---:|---|---:|---:|");
    for (name, a, b) in [("p50", dp50, gp50), ("p90", dp90, gp90), ("mean", dmean, gmean)] {
        println!("| {name} | {a:.0} | {b:.0} | ms | {:.2} | {:.0} ms |", b / a, b - a);
    }
}
