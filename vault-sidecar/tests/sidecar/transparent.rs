//! Transparent mode end to end: inside a network namespace made for the test, iptables redirects a
//! client's outbound TCP (to 127.0.0.77:443) to the sidecar's `transparent_listen`. The client (curl)
//! ignores proxies entirely; the sidecar learns the target from SO_ORIGINAL_DST + SNI, swaps the stub,
//! and the upstream (examples/upstream.py, inside the namespace) receives the real key.
//!
//! Needs root, `ip netns` and `iptables`: it fails, saying which, if a tool is missing or the kernel
//! refuses the namespace (.ci/run runs as root and installs them).

use std::path::{Path, PathBuf};
use std::process::Command;

use lap_test_support::TestPki;

const STUB: &str = "sk-ant-api03-lapstub-transparent-0001";
const REAL: &str = "sk-ant-api03-REAL-transparent-9999";

fn write_upstream_pki(dir: &Path) {
    let pki = TestPki::new("transparent test upstream CA", &["api.anthropic.com"]);
    pki.write_ca(dir, "upca.pem");
    pki.write_leaf(dir, "up.pem", "up.key");
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn redirected_traffic_is_intercepted_and_swapped() {
    for tool in ["ip", "iptables", "curl", "python3"] {
        assert!(
            have(tool),
            "`{tool}` is required for the transparent-mode test (.ci/run installs it)"
        );
    }
    let ns = format!("lap-tp-{}", std::process::id());
    let made = Command::new("ip")
        .args(["netns", "add", &ns])
        .output()
        .expect("ip netns add");
    assert!(
        made.status.success(),
        "the transparent-mode test needs a network namespace (run as root, as .ci/run does): {}",
        String::from_utf8_lossy(&made.stderr).trim()
    );
    struct Netns(String);
    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _ns = Netns(ns.clone());

    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    write_upstream_pki(d);
    let config = format!(
        r#"
listen = "127.0.0.1:14322"
admin_listen = "127.0.0.1:14323"
transparent_listen = "127.0.0.1:14324"
admin_token_file = "{token}"
ca_cert_path = "{ca}"
upstream_ca_files = ["{upca}"]
[resolve]
"api.anthropic.com:443" = "127.0.0.1:18443"
[[secrets]]
name = "ANTHROPIC_API_KEY"
stub = "{STUB}"
value = "{REAL}"
hosts = ["api.anthropic.com"]
"#,
        ca = d.join("ca.pem").display(),
        upca = d.join("upca.pem").display(),
        token = d.join("admin_token").display(),
    );
    std::fs::write(d.join("admin_token"), "transparent-test-admin-token\n").expect("admin token");
    std::fs::write(d.join("sidecar.toml"), config).expect("config");
    let sidecar = env!("CARGO_BIN_EXE_vault-sidecar");
    let upstream_py: PathBuf = [env!("CARGO_MANIFEST_DIR"), "..", "examples", "upstream.py"]
        .iter()
        .collect();
    // Everything below runs inside the namespace; polling loops have deadlines.
    let script = format!(
        r#"
set -eu
cd "{dir}"
ip link set lo up
iptables -t nat -A OUTPUT -p tcp -d 127.0.0.77 --dport 443 -j REDIRECT --to-ports 14324
python3 "{upstream}" up.pem up.key 18443 > upstream.log 2>&1 &
UP=$!
"{sidecar}" --config sidecar.toml > sidecar.log 2>&1 &
SC=$!
trap 'kill $UP $SC 2>/dev/null || true' EXIT
for i in $(seq 200); do curl -sf http://127.0.0.1:14323/readyz >/dev/null && break; sleep 0.05; done
for i in $(seq 200); do (echo > /dev/tcp/127.0.0.1/18443) 2>/dev/null && break; sleep 0.05; done
curl -sS --noproxy '*' --cacert ca.pem --resolve api.anthropic.com:443:127.0.0.77 \
     -H "x-api-key: {STUB}" https://api.anthropic.com/v1/messages > client.out
curl -sSf -H "authorization: Bearer transparent-test-admin-token" http://127.0.0.1:14323/interceptions > interceptions.json
"#,
        dir = d.display(),
        upstream = upstream_py.display(),
    );
    let out = Command::new("ip")
        .args(["netns", "exec", &ns, "bash", "-c", &script])
        .output()
        .expect("netns exec");
    let read = |name: &str| std::fs::read_to_string(d.join(name)).unwrap_or_default();
    assert!(
        out.status.success(),
        "script failed: {}\nsidecar log:\n{}\nupstream log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        read("sidecar.log"),
        read("upstream.log")
    );
    assert_eq!(read("client.out"), "ok\n", "the client got the upstream's answer");
    let upstream_log = read("upstream.log");
    assert!(
        upstream_log.contains(&format!("x-api-key: {REAL}")),
        "upstream saw the real key:\n{upstream_log}"
    );
    assert!(!upstream_log.contains(STUB), "the stub never reaches the upstream");
    let events: serde_json::Value = serde_json::from_str(&read("interceptions.json")).expect("interceptions JSON");
    let event = &events.as_array().expect("array")[0];
    assert_eq!(event["host"], "api.anthropic.com");
    assert_eq!(event["injected"][0]["secret"], "ANTHROPIC_API_KEY");
    assert_eq!(event["injected"][0]["location"], "header");
}
