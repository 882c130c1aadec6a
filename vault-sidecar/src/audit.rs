//! Audit events: one per intercepted request, logged as a JSON line and kept (the last 1000) for
//! `GET /interceptions`. An event names secrets, never values or stubs; the path keeps query
//! *names* only, and a stub in it (as written or percent-encoded) becomes `<NAME>` of its secret
//! ([`audit_path`]).
//!
//! Each event carries `run` (random per process start) and `seq` (1, 2, … within the run), so a
//! reader that keeps the last `(run, seq)` it saw asks only for what is new
//! (`GET /interceptions?after=<seq>`) and notices a restarted sidecar (another `run`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

use serde::Serialize;

use crate::logwriter::BatchWriter;
use crate::rewrite::MAX_DECODES;
use crate::secrets::SecretSet;

/// How many events `GET /interceptions` keeps.
pub(crate) const AUDIT_CAPACITY: usize = 1000;

/// One injected secret.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct Injected {
    pub secret: String,
    pub location: &'static str,
}

/// One intercepted request (SPEC §2.2 "Audit event").
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AuditEvent {
    /// This process's run id; set by [`AuditLog::record`].
    pub run: Arc<str>,
    /// Position in this run, from 1; set by [`AuditLog::record`].
    pub seq: u64,
    /// RFC 3339, UTC.
    pub time: String,
    pub method: String,
    pub host: String,
    pub port: u16,
    /// Path with query values removed (`/v1/x?key=&page=`).
    pub path: String,
    pub status: u16,
    pub injected: Vec<Injected>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked: Option<&'static str>,
    /// Secret named by a block (stub exfiltration).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_secret: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'static str>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Whole microseconds from the request's head to its last byte.
    pub duration_us: u64,
}

/// A JSON string (RFC 8259 §7), escaped by serde_json.
fn json_str(buf: &mut Vec<u8>, s: &str) {
    // Writing to a Vec cannot fail, and a `str` always serializes.
    let _ = serde_json::to_writer(&mut *buf, s);
}

fn json_u64(buf: &mut Vec<u8>, n: u64) {
    buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

impl AuditEvent {
    /// The event's fields as its `Serialize` writes them (the same names, order and skipped
    /// `None`s), without the braces: the keys written as they are (they need no escaping) and
    /// the values through serde_json, instead of serde's struct machinery escaping every key
    /// (callgrind: about a fifth of the event's serialization).
    fn write_fields(&self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(b"\"run\":");
        json_str(buf, &self.run);
        buf.extend_from_slice(b",\"seq\":");
        json_u64(buf, self.seq);
        buf.extend_from_slice(b",\"time\":");
        json_str(buf, &self.time);
        buf.extend_from_slice(b",\"method\":");
        json_str(buf, &self.method);
        buf.extend_from_slice(b",\"host\":");
        json_str(buf, &self.host);
        buf.extend_from_slice(b",\"port\":");
        json_u64(buf, self.port.into());
        buf.extend_from_slice(b",\"path\":");
        json_str(buf, &self.path);
        buf.extend_from_slice(b",\"status\":");
        json_u64(buf, self.status.into());
        buf.extend_from_slice(b",\"injected\":[");
        for (i, inj) in self.injected.iter().enumerate() {
            if i > 0 {
                buf.push(b',');
            }
            buf.extend_from_slice(b"{\"secret\":");
            json_str(buf, &inj.secret);
            buf.extend_from_slice(b",\"location\":");
            json_str(buf, inj.location);
            buf.push(b'}');
        }
        buf.push(b']');
        if let Some(blocked) = self.blocked {
            buf.extend_from_slice(b",\"blocked\":");
            json_str(buf, blocked);
        }
        if let Some(secret) = &self.blocked_secret {
            buf.extend_from_slice(b",\"blocked_secret\":");
            json_str(buf, secret);
        }
        if let Some(error) = self.error {
            buf.extend_from_slice(b",\"error\":");
            json_str(buf, error);
        }
        buf.extend_from_slice(b",\"bytes_up\":");
        json_u64(buf, self.bytes_up);
        buf.extend_from_slice(b",\"bytes_down\":");
        json_u64(buf, self.bytes_down);
        buf.extend_from_slice(b",\"duration_us\":");
        json_u64(buf, self.duration_us);
    }
}

/// `path?a=1&b=2` → `path?a=&b=`.
pub(crate) fn path_without_query_values(pq: &str) -> String {
    match pq.split_once('?') {
        None => pq.to_owned(),
        Some((path, query)) => {
            let names: Vec<&str> = query
                .split('&')
                .map(|kv| kv.split_once('=').map_or(kv, |(k, _)| k))
                .collect();
            format!(
                "{path}?{}",
                names.iter().map(|n| format!("{n}=")).collect::<Vec<_>>().join("&")
            )
        }
    }
}

/// The path an audit event keeps: [`path_without_query_values`], and no stub. A stub in a path
/// segment or a query name, as written or percent-encoded (up to [`MAX_DECODES`] levels), is
/// replaced by `<NAME>` of its secret; such a path is shown decoded. Without a stub the path is
/// kept as the client wrote it.
pub(crate) fn audit_path(pq: &str, secrets: &SecretSet) -> String {
    let path = path_without_query_values(pq);
    let Some(stubs) = secrets.stub_automaton() else {
        return path;
    };
    // The common case, a path without a stub or an escape, is one scan and no copy.
    if !path.contains('%') && stubs.find_iter(path.as_bytes()).next().is_none() {
        return path;
    }
    let mut form = path.clone();
    for _ in 0..=MAX_DECODES {
        if stubs.find_iter(form.as_bytes()).next().is_some() {
            let mut out = String::with_capacity(form.len());
            let mut last = 0;
            for m in stubs.find_iter(form.as_bytes()) {
                out.push_str(&form[last..m.start()]);
                out.push('<');
                out.push_str(&secrets.secrets()[m.pattern().as_usize()].name);
                out.push('>');
                last = m.end();
            }
            out.push_str(&form[last..]);
            return out;
        }
        if !form.contains('%') {
            break;
        }
        let decoded = percent_encoding::percent_decode_str(&form)
            .decode_utf8_lossy()
            .into_owned();
        if decoded == form {
            break;
        }
        form = decoded;
    }
    path
}

/// Where audit lines go when the binary set it up ([`write_lines_to`]); otherwise through `tracing`.
static LINES: OnceLock<BatchWriter> = OnceLock::new();

/// Write audit lines straight to `writer` (the log's own writer), serialized from the event with
/// serde instead of through `tracing`'s field visitor: that path validated every JSON fragment as
/// UTF-8 on its way into the line (callgrind: ~10 % of a small request's instructions). The line keeps
/// the log's envelope (`timestamp`, `level`, `target`, `message`) and is filtered like any `audit`
/// event (`LAP_LOG=audit=off` silences it).
pub fn write_lines_to(writer: BatchWriter) {
    let _ = LINES.set(writer);
}

fn log(event: &AuditEvent) {
    if !tracing::enabled!(target: "audit", tracing::Level::INFO) {
        return;
    }
    if let Some(out) = LINES.get() {
        // The log's envelope, then the event's own fields.
        let mut buf = Vec::with_capacity(512);
        buf.extend_from_slice(b"{\"timestamp\":");
        json_str(&mut buf, &event.time);
        buf.extend_from_slice(br#","level":"INFO","target":"audit","message":"audit","#);
        event.write_fields(&mut buf);
        buf.extend_from_slice(b"}\n");
        out.append(&buf);
        return;
    }
    let injected = serde_json::to_string(&event.injected).unwrap_or_default();
    tracing::info!(
        target: "audit",
        time = %event.time,
        method = %event.method,
        host = %event.host,
        port = event.port,
        path = %event.path,
        status = event.status,
        injected = %injected,
        blocked = event.blocked,
        blocked_secret = event.blocked_secret.as_deref(),
        error = event.error,
        bytes_up = event.bytes_up,
        bytes_down = event.bytes_down,
        duration_us = event.duration_us,
        run = %event.run,
        seq = event.seq,
        "audit"
    );
}

/// The ring buffer behind `GET /interceptions`.
#[derive(Debug)]
pub(crate) struct AuditLog {
    run: Arc<str>,
    events: Mutex<(u64, VecDeque<AuditEvent>)>,
}

impl Default for AuditLog {
    fn default() -> Self {
        use rand::RngCore;
        let mut b = [0u8; 8];
        rand::thread_rng().fill_bytes(&mut b);
        let run: String = b.iter().map(|x| format!("{x:02x}")).collect();
        Self {
            run: run.into(),
            events: Mutex::new((0, VecDeque::new())),
        }
    }
}

impl AuditLog {
    /// Number the event, log it as a JSON line and keep it.
    pub(crate) fn record(&self, mut event: AuditEvent) {
        let mut guard = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let (last, events) = &mut *guard;
        *last += 1;
        event.seq = *last;
        event.run = self.run.clone();
        log(&event);
        if events.len() == AUDIT_CAPACITY {
            events.pop_front();
        }
        events.push_back(event);
    }

    /// This process's run id (`X-Audit-Run` on `GET /interceptions`).
    pub(crate) fn run(&self) -> &str {
        &self.run
    }

    /// The events kept whose `seq` is above `after`, oldest first.
    pub(crate) fn after(&self, after: u64) -> Vec<AuditEvent> {
        let guard = self.events.lock().unwrap_or_else(|p| p.into_inner());
        guard.1.iter().filter(|e| e.seq > after).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(blocked: bool) -> AuditEvent {
        AuditEvent {
            run: "0123abcd".into(),
            seq: 7,
            time: "2026-12-03T12:00:00.123456789Z".into(),
            method: "POST".into(),
            host: "api.anthropic.com".into(),
            port: 443,
            path: "/v1/\"odd\"\\path\u{1}\u{e9}?key=".into(),
            status: if blocked { 403 } else { 200 },
            injected: if blocked {
                vec![]
            } else {
                vec![
                    Injected {
                        secret: "ANTHROPIC_API_KEY".into(),
                        location: "header",
                    },
                    Injected {
                        secret: "B".into(),
                        location: "body",
                    },
                ]
            },
            blocked: blocked.then_some("stub-exfiltration"),
            blocked_secret: blocked.then(|| "GITHUB_TOKEN".to_owned()),
            error: blocked.then_some("bad-request"),
            bytes_up: 12,
            bytes_down: u64::MAX,
            duration_us: 0,
        }
    }

    #[test]
    fn the_log_lines_fields_are_what_serde_writes() {
        for blocked in [false, true] {
            let e = event(blocked);
            let mut fields = Vec::new();
            e.write_fields(&mut fields);
            let mut line = b"{".to_vec();
            line.extend_from_slice(&fields);
            line.push(b'}');
            assert_eq!(
                String::from_utf8(line).expect("utf-8"),
                serde_json::to_string(&e).expect("serde"),
                "blocked: {blocked}"
            );
        }
    }

    #[test]
    fn query_values_are_dropped() {
        assert_eq!(path_without_query_values("/a?key=SECRET&x=1&flag"), "/a?key=&x=&flag=");
        assert_eq!(path_without_query_values("/a"), "/a");
    }

    fn secrets() -> SecretSet {
        use crate::config::{BindingSet, Secret, Surfaces};
        SecretSet::new(vec![Secret {
            name: "BOT_TOKEN".into(),
            stub: "lapstub-bot-1234".into(),
            value: "real-bot-value-9876".into(),
            hosts: BindingSet(vec!["api.example.com".parse().expect("binding")]),
            surfaces: Surfaces::default(),
        }])
    }

    #[test]
    fn stubs_in_paths_and_query_names_become_the_secrets_name() {
        let s = secrets();
        for (pq, want) in [
            ("/botlapstub-bot-1234/send?x=1", "/bot<BOT_TOKEN>/send?x="),
            ("/v1?lapstub-bot-1234=1&y=2", "/v1?<BOT_TOKEN>=&y="),
            // Percent-encoded, and encoded twice (`%25` is `%`).
            ("/%6Capstub-bot-1234/x", "/<BOT_TOKEN>/x"),
            ("/%256Capstub%252Dbot-1234/x", "/<BOT_TOKEN>/x"),
            // A query value is dropped whatever it holds.
            ("/v1?key=lapstub-bot-1234", "/v1?key="),
            // No stub: the path as written.
            ("/a%20b/c?q=1", "/a%20b/c?q="),
        ] {
            let got = audit_path(pq, &s);
            assert_eq!(got, want, "{pq}");
            assert!(!got.contains("lapstub-bot-1234"), "{pq} → {got}");
        }
        assert_eq!(
            audit_path("/botlapstub-bot-1234", &SecretSet::empty()),
            "/botlapstub-bot-1234"
        );
    }

    #[test]
    fn ring_keeps_the_last_thousand() {
        let log = AuditLog::default();
        for i in 0..1005u16 {
            log.record(AuditEvent {
                run: "".into(),
                seq: 0,
                time: String::new(),
                method: "GET".into(),
                host: "h".into(),
                port: 443,
                path: "/".into(),
                status: i,
                injected: vec![],
                blocked: None,
                blocked_secret: None,
                error: None,
                bytes_up: 0,
                bytes_down: 0,
                duration_us: 0,
            });
        }
        let events = log.after(0);
        assert_eq!(events.len(), AUDIT_CAPACITY);
        assert_eq!(events[0].status, 5);
        assert_eq!(events[0].seq, 6);
        assert_eq!(log.after(1000).len(), 5);
        assert_eq!(log.after(1005).len(), 0);
        assert!(events.iter().all(|e| e.run == events[0].run) && events[0].run.len() == 16);
    }
}
