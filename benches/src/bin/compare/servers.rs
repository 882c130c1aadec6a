//! The processes under test: nginx (the upstream), the vault sidecar (P) and mitmproxy (M).
//! Each is a child process killed when its guard drops.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

/// The key the upstream accepts, and the stub the harness holds.
pub(crate) const REAL_KEY: &str = "sk-ant-api03-REAL-benchmark-0123456789abcdef";
pub(crate) const STUB_KEY: &str = "sk-ant-api03-lapstub-bench-fedcba9876543210";
/// Bytes served by `/v1/download` and sent to `/v1/upload`.
pub(crate) const GIB: u64 = 1 << 30;

/// A child process, killed (and reaped) on drop.
pub(crate) struct Server {
    pub(crate) name: &'static str,
    child: Child,
}

impl Server {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port (bound, then released; good enough for a benchmark run).
pub(crate) fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn spawn(name: &'static str, cmd: &mut Command, log: &Path) -> Result<Server> {
    let out = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
    let err = out.try_clone()?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("start {name} ({:?})", cmd.get_program()))?;
    Ok(Server { name, child })
}

/// Wait until `addr` accepts TCP connections, or fail with the process's log.
fn wait_listening(server: &mut Server, addr: SocketAddr, log: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Some(status) = server.child.try_wait()? {
            bail!(
                "{} exited ({status}) before listening on {addr}:\n{}",
                server.name,
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if Instant::now() > deadline {
            bail!("{} not listening on {addr} after 60 s", server.name);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// nginx on 127.0.0.1 and [::1], h2 and http/1.1, with the echo module for the SSE route.
/// Every route answers 401 unless `x-api-key` is the real key, so each measured request proves the swap.
pub(crate) fn nginx(dir: &Path, port: u16) -> Result<Server> {
    let echo = [
        "/usr/lib/nginx/modules/ngx_http_echo_module.so",
        "/usr/share/nginx/modules/ngx_http_echo_module.so",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .context("nginx's echo module is missing (Debian: libnginx-mod-http-echo)")?;
    let blob = dir.join("download.bin");
    // A sparse file: reading it costs no disk.
    std::fs::File::create(&blob)?.set_len(GIB)?;
    for sub in ["body", "proxy", "fastcgi", "uwsgi", "scgi"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    let d = dir.display();
    let conf = format!(
        r#"load_module {echo};
daemon off;
master_process off;
worker_processes 1;
worker_rlimit_nofile 20000;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;
events {{ worker_connections 16000; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  sendfile on;
  tcp_nodelay on;
  keepalive_requests 10000000;
  keepalive_timeout 600s;
  server {{
    listen 127.0.0.1:{port} ssl http2;
    listen [::1]:{port} ssl http2;
    server_name localhost;
    ssl_certificate {d}/upstream-leaf.pem;
    ssl_certificate_key {d}/upstream-leaf.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    if ($http_x_api_key != "{REAL_KEY}") {{ return 401 '{{"error":"bad x-api-key"}}'; }}
    location = /v1/small {{
      default_type application/json;
      return 200 '{{"id":"msg_bench","type":"message","content":[{{"type":"text","text":"ok"}}]}}';
    }}
    location = /v1/download {{
      default_type application/octet-stream;
      alias {d}/download.bin;
    }}
    location = /v1/upload {{
      client_max_body_size 0;
      client_body_buffer_size 1m;
      echo_read_request_body;
      echo "ok";
    }}
    location = /v1/sse {{
      default_type text/event-stream;
      echo "event: message_start";
      echo "data: {{\"type\":\"message_start\"}}";
      echo "";
      echo_flush;
      echo_sleep 0.01;
      echo "event: message_stop";
      echo "data: {{\"type\":\"message_stop\"}}";
      echo "";
    }}
  }}
}}
"#
    );
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf)?;
    let log = dir.join("nginx.log");
    let mut server = spawn(
        "nginx",
        Command::new("nginx").arg("-p").arg(dir).arg("-c").arg(&conf_path),
        &log,
    )?;
    wait_listening(&mut server, SocketAddr::from(([127, 0, 0, 1], port)), &log)?;
    Ok(server)
}

/// Addresses of a running sidecar.
pub(crate) struct Sidecar {
    pub(crate) server: Server,
    pub(crate) proxy: SocketAddr,
    pub(crate) admin: SocketAddr,
    pub(crate) ca_pem: String,
}

/// The vault sidecar from this build, holding one secret bound to the upstream (by name and by
/// 127.0.0.1, the latter used only by the concurrent-mint check).
pub(crate) fn sidecar(bin: &Path, dir: &Path, upstream_port: u16) -> Result<Sidecar> {
    // Both held while picked, so the two ports differ (the sidecar refuses admin_listen == listen).
    let (proxy_l, admin_l) = (TcpListener::bind("127.0.0.1:0")?, TcpListener::bind("127.0.0.1:0")?);
    let (proxy, admin) = (proxy_l.local_addr()?, admin_l.local_addr()?);
    drop((proxy_l, admin_l));
    let d = dir.display();
    let conf = format!(
        r#"listen = "{proxy}"
admin_listen = "{admin}"
ca_cert_path = "{d}/sidecar-ca.pem"
upstream_ca_files = ["{d}/upstream-ca.pem"]
intercept = "bound-hosts"

[resolve]
"localhost:{upstream_port}" = "127.0.0.1:{upstream_port}"

[[secrets]]
name = "ANTHROPIC_API_KEY"
stub = "{STUB_KEY}"
value = "{REAL_KEY}"
hosts = ["localhost:{upstream_port}", "127.0.0.1:{upstream_port}"]
"#
    );
    let conf_path = dir.join("sidecar.toml");
    std::fs::write(&conf_path, conf)?;
    let log = dir.join("sidecar.log");
    let mut server = spawn("vault-sidecar", Command::new(bin).arg("--config").arg(&conf_path), &log)?;
    wait_listening(&mut server, admin, &log)?;
    wait_listening(&mut server, proxy, &log)?;
    // The ports are bound before the CA file is written (then /readyz turns 200): wait for the file.
    let ca_path = dir.join("sidecar-ca.pem");
    let deadline = Instant::now() + Duration::from_secs(60);
    let ca_pem = loop {
        match std::fs::read_to_string(&ca_path) {
            Ok(pem) if pem.contains("END CERTIFICATE") => break pem,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            r => {
                r.with_context(|| format!("sidecar CA {}", ca_path.display()))?;
                bail!("sidecar CA {}: no certificate after 60 s", ca_path.display());
            }
        }
    };
    Ok(Sidecar {
        server,
        proxy,
        admin,
        ca_pem,
    })
}

/// mitmdump with a swap addon equivalent to the sidecar's header swap, streaming bodies over
/// 64 KiB (its default would hold a whole 1 GiB body in memory).
pub(crate) fn mitmproxy(mitmdump: &Path, dir: &Path) -> Result<(Server, SocketAddr, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let addon = dir.join("swap.py");
    std::fs::write(
        &addon,
        format!(
            r#"# Swap the stub for the real key in request headers bound for the upstream, like the sidecar.
STUB = "{STUB_KEY}"
REAL = "{REAL_KEY}"
HOSTS = {{"localhost", "127.0.0.1"}}


# `requestheaders` runs before the body, so streamed (large) request bodies are covered too.
def requestheaders(flow):
    if flow.request.pretty_host not in HOSTS:
        return
    for name, value in flow.request.headers.items():
        if STUB in value:
            flow.request.headers[name] = value.replace(STUB, REAL)
"#
        ),
    )?;
    let confdir = dir.join("mitmproxy");
    std::fs::create_dir_all(&confdir)?;
    let log = dir.join("mitmproxy.log");
    let mut server = spawn(
        "mitmdump",
        Command::new(mitmdump)
            .arg("--quiet")
            .arg("--listen-host")
            .arg("127.0.0.1")
            .arg("--listen-port")
            .arg(addr.port().to_string())
            .arg("--set")
            .arg(format!("confdir={}", confdir.display()))
            .arg("--set")
            .arg(format!(
                "ssl_verify_upstream_trusted_ca={}/upstream-ca.pem",
                dir.display()
            ))
            .arg("--set")
            .arg("stream_large_bodies=64k")
            .arg("-s")
            .arg(&addon),
        &log,
    )?;
    wait_listening(&mut server, addr, &log)?;
    let ca_pem =
        std::fs::read_to_string(confdir.join("mitmproxy-ca-cert.pem")).context("mitmproxy's CA certificate")?;
    Ok((server, addr, ca_pem))
}

/// `VmHWM` (peak) and `VmRSS` (now) of a process, in KiB.
pub(crate) fn rss_kib(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{name} in /proc/{pid}/status"))
    };
    Ok((field("VmHWM:")?, field("VmRSS:")?))
}

/// CPU time `pid` has run so far, summed over its threads (`/proc/PID/task/*/schedstat`, first field:
/// nanoseconds on a CPU; see the kernel's Documentation/scheduler/sched-stats.rst).
pub(crate) fn cpu_ns(pid: u32) -> Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("schedstat");
        // A thread may end between the listing and the read.
        let Ok(stat) = std::fs::read_to_string(&path) else {
            continue;
        };
        total += stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .with_context(|| format!("{}: no run time", path.display()))?;
    }
    Ok(total)
}

/// The first of `candidates` that exists, else `name` on PATH.
pub(crate) fn find_program(candidates: &[PathBuf], name: &str) -> Option<PathBuf> {
    if let Some(p) = candidates.iter().find(|p| p.is_file()) {
        return Some(p.clone());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}
