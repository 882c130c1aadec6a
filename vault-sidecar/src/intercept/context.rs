//! One request's context: what the audit event and the metrics need, gathered as the request moves
//! through its phases, and the single [`RequestContext::finish`] that records both — for a local
//! answer (a [`Refusal`]) at once, for a relayed response when its body ends (or the client goes
//! away), so `bytes_down` and body injections/redactions are counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Method, Request, Response};

use crate::audit::{audit_path, AuditEvent, Injected};
use crate::config::Location;
use crate::connect::Target;
use crate::metrics::InjectionLabels;
use crate::proxy::Proxy;
use crate::refusal::Refusal;
use crate::rewrite::Injections;
use crate::secrets::SecretSet;
use crate::upstream::ProxyBody;

/// How a request reached its upstream: the `mode` label of `vault_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Inside a TLS tunnel the sidecar terminated.
    Intercepted,
    /// An absolute-form `http://` request on the proxy port.
    Forwarded,
    /// A CONNECT (or redirected connection) relayed byte for byte.
    Tunnel,
}

impl Mode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Intercepted => "intercepted",
            Self::Forwarded => "forwarded",
            Self::Tunnel => "tunnel",
        }
    }
}

/// Byte counters and body-swap hits, shared with the bodies that stream after the head is answered.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) bytes_up: Arc<AtomicU64>,
    pub(crate) bytes_down: Arc<AtomicU64>,
    /// Stub swaps in the request body, by secret id (set when the request body ends).
    pub(crate) body_hits: Mutex<Vec<u64>>,
    /// Why the tripwire ended a request body that was streaming, or a WebSocket (its upstream
    /// request was reset): a stub it found, or a compressed body that did not decode.
    tripped: Mutex<Option<Refusal>>,
}

impl Counters {
    /// Keep what the request body's tripwire refused.
    pub(crate) fn trip(&self, refusal: Refusal) {
        *self.tripped.lock().unwrap_or_else(|p| p.into_inner()) = Some(refusal);
    }

    /// What the tripwire refused, if it did (taken: the request is finished once).
    pub(crate) fn take_tripped(&self) -> Option<Refusal> {
        self.tripped.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// How the request ended.
pub(crate) enum Outcome<'a> {
    /// The upstream's response was relayed; `redactions` are the response body's redaction hits,
    /// by pattern of [`SecretSet::value_automaton`].
    Relayed { redactions: &'a [u64] },
    /// The sidecar answered itself.
    Refused(&'a Refusal),
}

pub(crate) struct RequestContext {
    proxy: Arc<Proxy>,
    mode: Mode,
    target: Target,
    /// The secrets snapshot this request uses from its first byte to its last.
    pub(crate) secrets: Arc<SecretSet>,
    start: Instant,
    method: Method,
    /// Path with query values removed.
    path: String,
    /// Stub swaps in the request head.
    pub(crate) injections: Injections,
    pub(crate) counters: Arc<Counters>,
    /// Time from the request's head to its upstream send, and the upstream's time to answer.
    pub(crate) prepared: Duration,
    pub(crate) upstream_time: Duration,
}

impl RequestContext {
    pub(crate) fn new<B>(
        proxy: Arc<Proxy>,
        mode: Mode,
        target: Target,
        secrets: Arc<SecretSet>,
        req: &Request<B>,
    ) -> Self {
        let path = audit_path(req.uri().path_and_query().map_or("/", |pq| pq.as_str()), &secrets);
        Self {
            proxy,
            mode,
            target,
            secrets,
            start: Instant::now(),
            method: req.method().clone(),
            path,
            injections: Injections::default(),
            counters: Arc::new(Counters::default()),
            prepared: Duration::ZERO,
            upstream_time: Duration::ZERO,
        }
    }

    pub(crate) fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }

    pub(crate) fn target(&self) -> &Target {
        &self.target
    }

    pub(crate) fn method(&self) -> &Method {
        &self.method
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Answer locally and record it.
    pub(crate) fn refuse(self, refusal: Refusal) -> Response<ProxyBody> {
        self.finish(refusal.status().as_u16(), Outcome::Refused(&refusal));
        refusal.into_response()
    }

    /// Record the request's metrics and its audit event. Called exactly once per request.
    pub(crate) fn finish(self, status: u16, outcome: Outcome<'_>) {
        let m = &self.proxy.metrics;
        m.count_request(self.mode.as_str(), status);
        let secrets = self.secrets.secrets();
        let name = |id: usize| secrets[id].name.clone();
        let body_hits = self
            .counters
            .body_hits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut injected: Vec<Injected> = Vec::new();
        // A request refused before it left carried no real value anywhere: nothing was injected.
        let sent = !matches!(outcome, Outcome::Refused(r) if !r.reached_upstream());
        for (id, loc) in self.injections.0.iter().filter(|_| sent) {
            m.injections
                .get_or_create(&InjectionLabels {
                    secret: name(*id),
                    location: loc.as_str(),
                })
                .inc();
            injected.push(Injected {
                secret: name(*id),
                location: loc.as_str(),
            });
        }
        for (id, n) in body_hits.iter().enumerate().filter(|(_, n)| sent && **n > 0) {
            m.injections
                .get_or_create(&InjectionLabels {
                    secret: name(id),
                    location: Location::Body.as_str(),
                })
                .inc_by(*n);
            injected.push(Injected {
                secret: name(id),
                location: Location::Body.as_str(),
            });
        }
        let (blocked, error, blocked_secret) = match outcome {
            Outcome::Refused(r) => {
                m.count_refusal(r);
                (
                    r.audit_blocked(),
                    r.audit_error(),
                    r.blocked_secret().map(str::to_owned),
                )
            }
            Outcome::Relayed { redactions } => {
                let ids = self.secrets.value_automaton().map_or(&[][..], |(_, ids)| ids);
                for (j, n) in redactions.iter().enumerate().filter(|(_, n)| **n > 0) {
                    m.redactions
                        .get_or_create(&InjectionLabels {
                            secret: name(ids[j]),
                            location: "body",
                        })
                        .inc_by(*n);
                }
                // The tripwire ended a body or a WebSocket after the response head had come.
                match self.counters.take_tripped() {
                    Some(r) => (
                        r.audit_blocked(),
                        r.audit_error(),
                        r.blocked_secret().map(str::to_owned),
                    ),
                    None => (None, None, None),
                }
            }
        };
        self.proxy.audit.record(AuditEvent {
            run: Default::default(),
            seq: 0,
            time: humantime_now(),
            method: self.method.to_string(),
            host: self.target.host.to_string(),
            port: self.target.port,
            path: self.path,
            status,
            injected,
            blocked,
            blocked_secret,
            error,
            bytes_up: self.counters.bytes_up.load(Ordering::Relaxed),
            bytes_down: self.counters.bytes_down.load(Ordering::Relaxed),
            duration_us: u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX),
        });
    }
}

/// RFC 3339 UTC timestamp with milliseconds.
pub(crate) fn humantime_now() -> String {
    let now = time::OffsetDateTime::now_utc();
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}
