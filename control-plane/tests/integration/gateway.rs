//! A model gateway: a real LiteLLM proxy (`litellm[proxy]` from PyPI) in front of the model
//! stand-in. With `LAP_MODEL_GATEWAY_URL` and the gateway's key in the registry, a session's
//! agent CLI sends its model calls to the gateway, the vault swapping the gateway's key in toward
//! the gateway's host only; the gateway maps the agent's model name to its own and calls the model
//! with its own key, which LAP never sees.

use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use lap_test_support::{eventually, TestPki};
use serde_json::json;
use support::anthropic::{StandIn, REPLY};
use support::server::{on_path, LapServer};

const A: &str = "/api/v1/managed_agents";

/// The LiteLLM proxy CLI: `LAP_TEST_LITELLM`, else `litellm` on PATH (.ci/run installs it).
fn litellm() -> PathBuf {
    if let Ok(p) = std::env::var("LAP_TEST_LITELLM") {
        return PathBuf::from(p);
    }
    assert!(
        on_path("litellm"),
        "the LiteLLM proxy is not installed: pip install 'litellm[proxy]' (.ci/run installs it and sets LAP_TEST_LITELLM)"
    );
    PathBuf::from("litellm")
}

/// A LiteLLM proxy on a free port, serving TLS for gateway.example.com, with `master_key` and one
/// model, `lap-gateway-model`, backed by the stand-in's Anthropic API under the name
/// `claude-standin` with the model's real key.
struct Gateway {
    port: u16,
    ca: PathBuf,
    child: tokio::process::Child,
}

impl Gateway {
    async fn start(dir: &std::path::Path, standin: &StandIn, model_key: &str, master_key: &str) -> Gateway {
        let pki = TestPki::new("LAP gateway test CA", &["gateway.example.com"]);
        let ca = pki.write_ca(dir, "gateway-ca.pem");
        pki.write_leaf(dir, "gateway.pem", "gateway-key.pem");
        // The hop from the gateway to the model is outside LAP: the stand-in's certificate names
        // the model hosts, not 127.0.0.1, so LiteLLM does not verify it.
        let config = format!(
            "model_list:\n  - model_name: lap-gateway-model\n    litellm_params:\n      model: anthropic/claude-standin\n      \
             api_base: https://127.0.0.1:{port}\n      api_key: {model_key}\n\
             litellm_settings:\n  ssl_verify: false\n  telemetry: false\n\
             general_settings:\n  master_key: {master_key}\n",
            port = standin.port
        );
        std::fs::write(dir.join("litellm.yaml"), config).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.join("litellm.log")).unwrap();
        let child = tokio::process::Command::new(litellm())
            .arg("--config")
            .arg(dir.join("litellm.yaml"))
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--ssl_keyfile_path")
            .arg(dir.join("gateway-key.pem"))
            .arg("--ssl_certfile_path")
            .arg(dir.join("gateway.pem"))
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .env("LITELLM_TELEMETRY", "False")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("start litellm");
        let client = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).unwrap())
            .resolve("gateway.example.com", ([127, 0, 0, 1], port).into())
            .build()
            .unwrap();
        let url = format!("https://gateway.example.com:{port}/health/liveliness");
        eventually(Duration::from_secs(120), "the LiteLLM proxy answers", || {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let up = client.get(&url).send().await.is_ok_and(|r| r.status().is_success());
                up.then_some(())
            }
        })
        .await;
        Gateway { port, ca, child }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_talks_to_its_model_through_a_litellm_gateway() {
    assert!(
        on_path("claude"),
        "the claude-code agent is not installed: npm install -g @anthropic-ai/claude-code"
    );
    through_a_litellm_gateway("claude-code", "lap-gateway-model").await;
}

/// An agent of `harness` with `model` (the gateway's model name, as the CLI spells it) answers
/// through the gateway.
async fn through_a_litellm_gateway(harness: &str, model: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let suffix = lap_control_plane::app::new_id("k").replace('_', "");
    let model_key = format!("sk-ant-api03-REALmodel{suffix}");
    let gateway_key = format!("sk-REALgateway{suffix}");
    let standin = StandIn::start(&model_key).await;
    let mut gw = Gateway::start(tmp.path(), &standin, &model_key, &gateway_key).await;

    // The session's vault trusts the gateway's CA and finds it at gateway.example.com.
    let base = standin.base_config(tmp.path());
    let text = std::fs::read_to_string(&base).unwrap();
    let text = text.replacen(
        "upstream_ca_files = [",
        &format!("upstream_ca_files = [{:?}, ", gw.ca.display().to_string()),
        1,
    );
    let text = format!("{text}\"gateway.example.com:443\" = \"127.0.0.1:{}\"\n", gw.port);
    std::fs::write(&base, text).unwrap();
    let server = LapServer::start(
        &tmp.path().join("data"),
        &[
            ("LAP_SIDECAR_BASE_CONFIG", base.display().to_string()),
            ("LAP_MODEL_GATEWAY_URL", "https://gateway.example.com".to_owned()),
        ],
    )
    .await;
    let (s, agent) = server
        .call(
            "POST",
            &format!("{A}/agents"),
            Some(json!({"name": "through-gateway", "harness_id": harness, "model": model})),
        )
        .await;
    assert_eq!(s, 201, "{agent}");
    let aid = agent["id"].as_str().unwrap();

    // Without the gateway's key in the registry, no session starts.
    let (s, v) = server
        .call("POST", &format!("{A}/agents/{aid}/session"), Some(json!({})))
        .await;
    assert_eq!(s, 409, "{v}");
    assert!(v["error"].as_str().unwrap().contains("LAP_MODEL_GATEWAY_KEY"), "{v}");

    let (s, v) = server
        .call(
            "POST",
            "/api/v1/secrets",
            Some(json!({"name": "LAP_MODEL_GATEWAY_KEY", "value": gateway_key, "hosts": ["gateway.example.com"]})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let (s, session) = server
        .call("POST", &format!("{A}/agents/{aid}/session"), Some(json!({})))
        .await;
    assert_eq!(s, 201, "{session}");
    let sid = session["id"].as_str().unwrap().to_owned();
    let session = server.wait_settled(&sid, Duration::from_secs(120)).await;
    assert_eq!(session["status"], "ready", "{session}");

    let (s, reply) = server
        .call(
            "POST",
            &format!("{A}/sessions/{sid}/message"),
            Some(json!({"text": "hello"})),
        )
        .await;
    let litellm_log = std::fs::read_to_string(tmp.path().join("litellm.log")).unwrap_or_default();
    assert_eq!(s, 200, "{reply}\nlitellm log:\n{litellm_log}");
    let text = reply["parts"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains(REPLY), "{reply}");

    // The model saw the gateway's call: its own key, the gateway's model name; never a stub.
    let seen = standin.requests.lock().unwrap().clone();
    assert!(
        seen.iter().any(|b| b["model"] == "claude-standin"),
        "the model was called under the gateway's name: {seen:?}"
    );
    assert_eq!(standin.rejected.load(std::sync::atomic::Ordering::SeqCst), 0);
    // The vault swapped the gateway's key in toward the gateway only; it is in no log of LAP's.
    let audit = std::fs::read_to_string(server.private_dir(&sid).join("sidecar.log")).unwrap_or_default();
    assert!(audit.contains("gateway.example.com"), "{audit}");
    assert!(
        audit.contains("ANTHROPIC_API_KEY"),
        "the audit names the injected secret: {audit}"
    );
    for log in ["sidecar.log", "harness.log"] {
        let t = std::fs::read_to_string(server.private_dir(&sid).join(log)).unwrap_or_default();
        assert!(
            !t.contains(&gateway_key) && !t.contains(&model_key),
            "{log} holds a real key"
        );
    }
    let _ = gw.child.kill().await;
}
