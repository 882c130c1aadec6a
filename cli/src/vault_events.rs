//! The vault's interceptions in people's words (pure): one line per request the sidecar saw
//! (`GET api.anthropic.com/v1/messages → 200`), and, for `lap send`, what went wrong
//! (`the vault could not resolve api.anthropic.com`). The events are the sidecar's audit
//! events as the durable audit (`GET /api/v1/audit`) keeps them in `detail`.

use serde_json::Value;

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

/// `METHOD host/path → status`, with what was injected or blocked.
pub(crate) fn summary(d: &Value) -> String {
    let mut line = format!(
        "{} {}{} → {}",
        s(d, "method"),
        s(d, "host"),
        s(d, "path"),
        d["status"].as_u64().unwrap_or(0)
    );
    let injected: Vec<String> = d["injected"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| format!("{} ({})", s(i, "secret"), s(i, "location")))
                .collect()
        })
        .unwrap_or_default();
    if !injected.is_empty() {
        line.push_str(&format!(", injected {}", injected.join(", ")));
    }
    if let Some(p) = problem(d) {
        line.push_str(&format!(": {p}"));
    }
    line
}

/// What went wrong with one request, if anything: the sidecar's `error` or `blocked` kind
/// (docs/sidecar.md, "What it does on the wire", Errors) in words.
pub(crate) fn problem(d: &Value) -> Option<String> {
    let host = s(d, "host");
    let port = d["port"].as_u64().unwrap_or(443);
    if let Some(b) = d["blocked"].as_str() {
        return Some(match b {
            "egress-policy" => format!("the vault blocked {host}: the agent's egress policy does not allow it"),
            "stub-exfiltration" => format!(
                "the vault blocked a request to {host} carrying the stub of {}, which is not bound to that host",
                s(d, "blocked_secret")
            ),
            "proxy-loop" => format!("the vault refused a request to itself ({host})"),
            other => format!("the vault blocked {host} ({other})"),
        });
    }
    let e = d["error"].as_str()?;
    Some(match e {
        "dns" => format!("the vault could not resolve {host}"),
        "connect" => format!("the vault could not connect to {host}:{port}"),
        "connect-timeout" => format!("the vault's connection to {host}:{port} timed out"),
        "upstream-cert-untrusted" => format!("{host}'s certificate is not trusted by the vault"),
        "tls-handshake" | "tls-handshake-timeout" => format!("the TLS handshake with {host} failed ({e})"),
        other => format!("the vault's request to {host} failed ({other})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn interceptions_read_as_sentences() {
        let ok = json!({"method": "POST", "host": "api.anthropic.com", "port": 443, "path": "/v1/messages",
                        "status": 200, "injected": [{"secret": "ANTHROPIC_API_KEY", "location": "header"}]});
        assert_eq!(
            summary(&ok),
            "POST api.anthropic.com/v1/messages → 200, injected ANTHROPIC_API_KEY (header)"
        );
        assert_eq!(problem(&ok), None);
        let dns = json!({"method": "POST", "host": "api.anthropic.com", "path": "/", "status": 502, "error": "dns"});
        assert_eq!(
            problem(&dns).as_deref(),
            Some("the vault could not resolve api.anthropic.com")
        );
        assert!(summary(&dns).ends_with("→ 502: the vault could not resolve api.anthropic.com"));
        let blocked = json!({"host": "evil.example", "status": 403, "blocked": "stub-exfiltration",
                             "blocked_secret": "GIT_TOKEN"});
        assert!(problem(&blocked).unwrap_or_default().contains("stub of GIT_TOKEN"));
        let egress = json!({"host": "x.example", "blocked": "egress-policy"});
        assert!(problem(&egress).unwrap_or_default().contains("egress policy"));
    }
}
