//! The sandbox pod's netfilter init script (`sandbox::netfilter_script`), run for real in a
//! network namespace made for the test: the harness user's outbound TCP lands on the vault's
//! transparent port with its original destination intact, the vault user's does not, and the
//! harness user can send no other packet out but DNS.
//!
//! Needs root, `ip` and `iptables` (.ci/run installs them); where the kernel refuses a namespace
//! the test says so and returns.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use lap_control_plane::backend::sandbox::{netfilter_script, HARNESS_UID, VAULT_TRANSPARENT_PORT, VAULT_UID};

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

impl Netns {
    fn sh(&self, script: &str) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.0, "sh", "-c", script])
            .output()
            .unwrap()
    }
}

/// As `uid`, connect (TCP) or send (UDP) to `dst:port`; prints what happened.
const CLIENT: &str = r#"
import os, socket, sys
uid, dst, port, proto = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
# Everything imported before dropping root (the interpreter's files may be root-only).
os.setgroups([]); os.setgid(uid); os.setuid(uid)
try:
    if proto == "tcp":
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect((dst, port))
        s.sendall(b"hello")
        print("connected")
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.sendto(b"x", (dst, port))
        print("sent")
except OSError as e:
    print("blocked", e.errno)
"#;

/// Accept one connection on the transparent port; print its SO_ORIGINAL_DST.
const LISTENER: &str = r#"
import socket, struct, sys
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen(8); l.settimeout(8)
print("listening", flush=True)
c, _ = l.accept()
raw = c.getsockopt(socket.SOL_IP, 80, 16)
port, ip = struct.unpack("!2xH4s8x", raw)
print("original", socket.inet_ntoa(ip), port, flush=True)
"#;

#[test]
fn harness_traffic_goes_to_the_vault_and_nowhere_else() {
    for tool in ["ip", "iptables", "python3"] {
        assert!(
            have(tool),
            "`{tool}` is required for the netfilter test (.ci/run installs it)"
        );
    }
    let name = format!("lap-nf-{}", std::process::id());
    let made = Command::new("ip").args(["netns", "add", &name]).output().unwrap();
    assert!(
        made.status.success(),
        "the netfilter test needs a network namespace (run as root, as .ci/run does): {}",
        String::from_utf8_lossy(&made.stderr).trim()
    );
    let ns = Netns(name);
    // Loopback plus a silent "pod network" (a veth pair, nobody behind it) with a default route,
    // so outbound connects are routable.
    let net = ns.sh(
        "ip link set lo up && ip link add v0 type veth peer name v1 && ip addr add 10.99.0.1/24 dev v0 \
         && ip link set v0 up && ip link set v1 up && ip route add default dev v0",
    );
    assert!(net.status.success(), "{}", String::from_utf8_lossy(&net.stderr));
    let rules = ns.sh(&netfilter_script());
    assert!(
        rules.status.success(),
        "the netfilter script failed: {}",
        String::from_utf8_lossy(&rules.stderr)
    );

    let dir = tempfile::tempdir().unwrap();
    let client = dir.path().join("client.py");
    let listener = dir.path().join("listener.py");
    std::fs::write(&client, CLIENT).unwrap();
    std::fs::write(&listener, LISTENER).unwrap();
    let run = |uid: i64, dst: &str, port: u16, proto: &str| -> String {
        let out = ns.sh(&format!("python3 {} {uid} {dst} {port} {proto}", client.display()));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };

    // The harness user's TCP to anywhere reaches the transparent port, original target intact.
    let mut l = Command::new("ip")
        .args(["netns", "exec", &ns.0, "python3"])
        .arg(&listener)
        .arg(VAULT_TRANSPARENT_PORT.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    {
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(l.stdout.take().unwrap());
        lines.read_line(&mut ready).unwrap();
        assert_eq!(ready.trim(), "listening");
        assert_eq!(run(HARNESS_UID, "10.99.0.77", 443, "tcp"), "connected");
        let mut original = String::new();
        lines.read_line(&mut original).unwrap();
        assert_eq!(original.trim(), "original 10.99.0.77 443");
    }
    let _ = l.wait();

    // The vault user's TCP is not redirected: it goes out on the silent network and
    // times out (errno None), where a redirect to the now closed port would be refused (111).
    assert_eq!(run(VAULT_UID, "10.99.0.77", 443, "tcp"), "blocked None");
    // The harness user may send DNS, nothing else.
    assert_eq!(run(HARNESS_UID, "10.99.0.53", 53, "udp"), "sent");
    let udp = run(HARNESS_UID, "10.99.0.77", 443, "udp");
    assert!(udp.starts_with("blocked"), "{udp}");
    // The vault user may.
    assert_eq!(run(VAULT_UID, "10.99.0.77", 443, "udp"), "sent");
}
