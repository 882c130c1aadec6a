//! A model gateway for the tests and the `gateway` bench: a real LiteLLM proxy
//! (`litellm[proxy]` from PyPI) serving TLS for `gateway.example.com` in front of the model
//! stand-in ([`super::anthropic`]).

use std::path::PathBuf;
use std::time::Duration;

use lap_test_support::{eventually, TestPki};

use super::anthropic::StandIn;
use super::server::{on_path, LapServer};

/// The LiteLLM proxy CLI: `LAP_TEST_LITELLM`, else `litellm` on PATH (.ci/run installs it).
pub fn litellm() -> PathBuf {
    if let Ok(p) = std::env::var("LAP_TEST_LITELLM") {
        return PathBuf::from(p);
    }
    assert!(
        on_path("litellm"),
        "the LiteLLM proxy is not installed: pip install 'litellm[proxy]' (.ci/run installs it and sets LAP_TEST_LITELLM)"
    );
    PathBuf::from("litellm")
}

/// The API the gateway's model is served with behind it, as LiteLLM names it.
#[derive(Clone, Copy)]
pub enum Upstream {
    /// The Anthropic Messages API: the stand-in's model `claude-standin`.
    Anthropic,
    /// The OpenAI Responses API: the stand-in's model `gpt-standin`.
    OpenAi,
}

impl Upstream {
    /// The model name the stand-in sees when the gateway calls it.
    pub fn model(self) -> &'static str {
        match self {
            Upstream::Anthropic => "claude-standin",
            Upstream::OpenAi => "gpt-standin",
        }
    }
}

/// A LiteLLM proxy on a free port, serving TLS for gateway.example.com, with `master_key` and one
/// model, `lap-gateway-model`, backed by the stand-in's `upstream` API under the name
/// [`Upstream::model`] with the model's real key.
pub struct Gateway {
    pub port: u16,
    pub ca: PathBuf,
    _child: tokio::process::Child,
}

impl Gateway {
    pub async fn start(
        dir: &std::path::Path,
        standin: &StandIn,
        upstream: Upstream,
        model_key: &str,
        master_key: &str,
    ) -> Gateway {
        let pki = TestPki::new("LAP gateway test CA", &["gateway.example.com"]);
        let ca = pki.write_ca(dir, "gateway-ca.pem");
        pki.write_leaf(dir, "gateway.pem", "gateway-key.pem");
        // The hop from the gateway to the model is outside LAP: the stand-in's certificate names
        // the model hosts, not 127.0.0.1, so LiteLLM does not verify it.
        let (model, api_base) = match upstream {
            Upstream::Anthropic => (
                "anthropic/claude-standin",
                format!("https://127.0.0.1:{}", standin.port),
            ),
            Upstream::OpenAi => ("openai/gpt-standin", format!("https://127.0.0.1:{}/v1", standin.port)),
        };
        let config = format!(
            "model_list:\n  - model_name: lap-gateway-model\n    litellm_params:\n      model: {model}\n      \
             api_base: {api_base}\n      api_key: {model_key}\n\
             litellm_settings:\n  ssl_verify: false\n  telemetry: false\n\
             general_settings:\n  master_key: {master_key}\n"
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
        Gateway {
            port,
            ca,
            _child: child,
        }
    }

    /// A `lap-server` with its data in `dir` whose sessions send their model calls to this
    /// gateway (`LAP_MODEL_GATEWAY_URL`), their vaults reaching it and `standin`.
    pub async fn lap_server(&self, standin: &StandIn, dir: &std::path::Path) -> LapServer {
        let base = standin.base_config(dir);
        self.add_to_base_config(&base);
        LapServer::start(
            &dir.join("data"),
            &[
                ("LAP_SIDECAR_BASE_CONFIG", base.display().to_string()),
                ("LAP_MODEL_GATEWAY_URL", "https://gateway.example.com".to_owned()),
            ],
        )
        .await
    }

    /// Register `key` as the gateway's key (`LAP_MODEL_GATEWAY_KEY`) with `server`.
    pub async fn register_key(server: &LapServer, key: &str) {
        let (s, v) = server
            .call(
                "POST",
                "/api/v1/secrets",
                Some(serde_json::json!({"name": "LAP_MODEL_GATEWAY_KEY", "value": key, "hosts": ["gateway.example.com"]})),
            )
            .await;
        assert_eq!(s, 201, "{v}");
    }

    /// Make a `LAP_SIDECAR_BASE_CONFIG` file (the stand-in's [`StandIn::base_config`]) trust
    /// the gateway's CA toward upstreams and resolve `gateway.example.com:443` to it.
    fn add_to_base_config(&self, base: &std::path::Path) {
        let text = std::fs::read_to_string(base).unwrap();
        let text = text.replacen(
            "upstream_ca_files = [",
            &format!("upstream_ca_files = [{:?}, ", self.ca.display().to_string()),
            1,
        );
        let text = format!("{text}\"gateway.example.com:443\" = \"127.0.0.1:{}\"\n", self.port);
        std::fs::write(base, text).unwrap();
    }
}
