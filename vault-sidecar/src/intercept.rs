//! Inside an intercepted tunnel: TLS toward the client, then each request's life —
//! authority check (`421`) → stub swapping ([`crate::rewrite`]) → upstream → redaction → audit.
//!
//! [`serve_tunnel`] terminates TLS with the target's leaf (ALPN from the client's own offer) and
//! serves HTTP/1.1 (with upgrades) or h2; [`Exchange::handle`] is one request.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::LazyConfigAcceptor;

use crate::answer::{self, BlockReason};
use crate::audit::{path_without_query_values, AuditEvent, Injected};
use crate::body::StreamBody;
use crate::connect::Target;
use crate::headers::{is_upgrade, strip_hop_by_hop};
use crate::hosts::TargetHost;
use crate::metrics::{status_class, BlockLabels, ErrorLabels, InjectionLabels, RequestLabels};
use crate::proxy::Proxy;
use crate::rewrite::{self, HostRules, Injections};
use crate::secrets::{Location, SecretSet};
use crate::tls::{sni_matches, CacheOutcome, ALPN_H2, ALPN_HTTP11};
use crate::upstream::{find_upstream_error, BoxError, ProxyBody, EGRESS_POLICY};

/// Client-side TLS handshake deadline (a CONNECT that never sends a ClientHello is closed).
pub const CLIENT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/1.1 request-head read deadline inside a tunnel; long, so idle keep-alive tunnels survive.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(600);
/// Largest HTTP/1.1 request head (request line + headers) accepted from a client, on the proxy port
/// and inside tunnels; larger heads get `431` (hyper's default would buffer ~400 KiB and forward it).
pub const MAX_REQUEST_HEAD: usize = 64 * 1024;
/// Request bodies up to this size that need rewriting are rewritten whole, keeping an exact
/// `Content-Length`; larger ones are streamed with chunked framing.
pub const EXACT_LENGTH_LIMIT: u64 = 1 << 20;

/// Terminate TLS for `target` on `io` and serve the requests inside.
pub async fn serve_tunnel<I>(proxy: Arc<Proxy>, io: I, target: Target)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let acceptor = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io);
    let start = match tokio::time::timeout(CLIENT_HANDSHAKE_TIMEOUT, acceptor).await {
        Ok(Ok(start)) => start,
        Ok(Err(e)) => {
            tracing::debug!(connect_target = %target, error = %e, "client TLS: no valid ClientHello");
            return;
        }
        Err(_) => {
            tracing::debug!(connect_target = %target, "client TLS: no ClientHello before the deadline");
            return;
        }
    };
    let sni = start.client_hello().server_name().map(str::to_owned);
    let misdirected = !sni_matches(sni.as_deref(), &target.host);
    let offers_known_alpn = start
        .client_hello()
        .alpn()
        .map(|mut offer| offer.any(|p| p == ALPN_H2 || p == ALPN_HTTP11));
    let config = match proxy.leaves.get(&target.host).await {
        Ok((leaf, outcome)) => {
            match outcome {
                CacheOutcome::Minted => proxy.metrics.cert_mints.inc(),
                CacheOutcome::Hit => proxy.metrics.cert_cache_hits.inc(),
            };
            if offers_known_alpn == Some(false) {
                leaf.server_config_no_alpn.clone()
            } else {
                leaf.server_config.clone()
            }
        }
        Err(e) => {
            tracing::error!(connect_target = %target, error = %e, "cannot mint a leaf certificate");
            return;
        }
    };
    let tls = match tokio::time::timeout(CLIENT_HANDSHAKE_TIMEOUT, start.into_stream(config)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(connect_target = %target, error = %e, "client TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let authority = target.uri_authority(443).parse().ok();
    let tunnel = Arc::new(Tunnel {
        proxy,
        target,
        authority,
        misdirected,
    });
    // Boxed: the request's future is ~3 KB, and hyper moves it (into the h1 dispatcher's slot, into a
    // task per h2 stream) — by value that is a memcpy of all of it each time.
    let service = service_fn(move |req| {
        let tunnel = tunnel.clone();
        Box::pin(async move { Ok::<_, Infallible>(tunnel.handle(req).await) })
    });
    let io = TokioIo::new(tls);
    let result = if h2 {
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .serve_connection(io, service)
            .await
    } else {
        hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            // One flat buffer per flush: a small response goes out as one TLS record, not one per
            // queued slice (head, body).
            .writev(false)
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .max_header_size(MAX_REQUEST_HEAD)
            .half_close(true)
            .serve_connection(io, service)
            .with_upgrades()
            .await
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "intercepted connection ended with an error");
    }
}

/// One intercepted tunnel: the CONNECT target its requests must name.
struct Tunnel {
    proxy: Arc<Proxy>,
    target: Target,
    /// The target as an `https` URI authority (port omitted when 443), parsed once per tunnel.
    authority: Option<http::uri::Authority>,
    /// The ClientHello's SNI named another host: every request gets `421`.
    misdirected: bool,
}

/// Whether a request's authority (h2 `:authority`, else `Host`) names the CONNECT target.
fn authority_matches(req: &Request<Incoming>, target: &Target) -> bool {
    let from_host;
    let authority = match req.uri().authority() {
        Some(a) => a,
        None => match req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.parse::<http::uri::Authority>().ok())
        {
            Some(a) => {
                from_host = a;
                &from_host
            }
            // HTTP/1.0 clients may omit Host; the CONNECT target then stands.
            None => return req.version() < Version::HTTP_11,
        },
    };
    authority.port_u16().is_none_or(|p| p == target.port) && host_matches(authority.host(), &target.host)
}

/// `host` (as written in a request) names `target`. The common case, the name exactly as the
/// CONNECT target had it, is a case-insensitive comparison; anything else is parsed and normalized.
fn host_matches(host: &str, target: &TargetHost) -> bool {
    match target {
        TargetHost::Name(name) if host.eq_ignore_ascii_case(name) => true,
        _ => TargetHost::parse(host) == *target,
    }
}

/// What follows the response head.
enum Relay {
    /// A body, redacted when a redactor is given.
    Body(ProxyBody, Option<rewrite::StreamRewriter>),
    /// A protocol switch (WebSocket): client and upstream upgrades to join.
    Upgrade(hyper::upgrade::OnUpgrade, hyper::upgrade::OnUpgrade),
    Empty,
}

/// Per-request counters shared by the request body, the response body and the audit event.
#[derive(Default)]
struct Exchange {
    bytes_up: Arc<AtomicU64>,
    bytes_down: Arc<AtomicU64>,
    body_hits: Mutex<Vec<u64>>,
}

/// What the audit event needs, gathered while handling the request.
struct Record {
    start: Instant,
    method: Method,
    path: String,
    injections: Injections,
    /// The secret named by a stub-exfiltration block.
    blocked_secret: Option<String>,
}

impl Tunnel {
    async fn handle(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        let record = Record {
            start: Instant::now(),
            method: req.method().clone(),
            path: path_without_query_values(req.uri().path_and_query().map_or("/", |pq| pq.as_str())),
            injections: Injections::default(),
            blocked_secret: None,
        };
        let secrets = self.proxy.secrets();
        let exchange = Arc::new(Exchange::default());

        if self.misdirected || !authority_matches(&req, &self.target) {
            let resp = answer::error(
                StatusCode::MISDIRECTED_REQUEST,
                "misdirected-request",
                &self.target.host.to_string(),
                "the request names a host other than the CONNECT target",
            );
            return self.finish_local(resp, record, &secrets, &exchange, None, Some("misdirected-request"));
        }
        self.forward(req, record, secrets, exchange).await
    }

    async fn forward(
        &self,
        mut req: Request<Incoming>,
        mut record: Record,
        secrets: Arc<SecretSet>,
        exchange: Arc<Exchange>,
    ) -> Response<ProxyBody> {
        let host = self.target.host.to_string();
        let rules = HostRules::new(&secrets, &self.target.host);
        let upgrade = is_upgrade(req.headers());
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        let body = crate::body::DrainOnDrop::new(body);

        // Request target: swap the query, refuse foreign stubs in the path.
        let pq = parts.uri.path_and_query().map_or("/", |pq| pq.as_str()).to_owned();
        let pq = match rules.path_and_query(&pq, &mut record.injections) {
            Ok(swapped) => swapped.unwrap_or(pq),
            Err(ex) => return self.exfiltration(ex, record, &secrets, &exchange),
        };
        let uri = match (&self.authority, http::uri::PathAndQuery::try_from(pq)) {
            (Some(authority), Ok(pq)) => {
                let mut uri = http::uri::Parts::default();
                uri.scheme = Some(http::uri::Scheme::HTTPS);
                uri.authority = Some(authority.clone());
                uri.path_and_query = Some(pq);
                Uri::from_parts(uri).ok()
            }
            _ => None,
        };
        let Some(uri) = uri else {
            return answer::bad_request("the request target is not a valid URI");
        };

        // Headers: hop-by-hop out, then every value swapped (before any body byte moves).
        strip_hop_by_hop(&mut parts.headers, upgrade);
        parts.headers.remove(header::HOST);
        parts.headers.remove(header::EXPECT); // answered by our own server side (RFC 9110 §10.1.1)
        for (name, value) in parts.headers.iter_mut() {
            match rules.header_value(value.as_bytes(), &mut record.injections) {
                Ok(None) => {}
                Ok(Some(swapped)) => match HeaderValue::from_bytes(&swapped) {
                    Ok(v) => *value = v,
                    Err(_) => {
                        tracing::error!(header = %name, "a secret value is not a valid header value");
                        let resp = answer::error(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "invalid-secret-value",
                            &host,
                            "a secret's value cannot be sent in a header",
                        );
                        return self.finish_local(resp, record, &secrets, &exchange, None, None);
                    }
                },
                Err(ex) => return self.exfiltration(ex, record, &secrets, &exchange),
            }
        }

        // What comes back must be redactable: offer only codings the sidecar decodes (W02). A
        // request that carried a real value gets the whole representation, never two `Range`
        // halves that each hold part of a reflected value.
        if secrets.value_automaton().is_some() {
            match parts.headers.get(header::ACCEPT_ENCODING).map(crate::decode::offer) {
                Some(Some(offered)) => {
                    parts.headers.insert(header::ACCEPT_ENCODING, offered);
                }
                Some(None) => {
                    parts.headers.remove(header::ACCEPT_ENCODING);
                }
                None => {}
            }
        }
        if !record.injections.is_empty() {
            parts.headers.remove(header::RANGE);
            parts.headers.remove(header::IF_RANGE);
        }

        // Body: rewritten only for identity encoding; compressed bodies pass untouched.
        let identity = parts
            .headers
            .get(header::CONTENT_ENCODING)
            .is_none_or(|v| v.as_bytes().eq_ignore_ascii_case(b"identity"));
        let rewriter = if http_body::Body::is_end_stream(&body) {
            None
        } else {
            rules.body_rewriter()
        };
        let rewriter = match (rewriter, identity) {
            (Some(_), false) => {
                tracing::info!(host = %host, "request body is compressed; body stubs are not swapped");
                None
            }
            (rw, _) => rw,
        };
        let body: ProxyBody = match rewriter {
            None => StreamBody::new(body, None, exchange.bytes_up.clone(), None).boxed_unsync(),
            Some(mut rw) => {
                let length = parts
                    .headers
                    .get(header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                match length {
                    Some(len) if len <= EXACT_LENGTH_LIMIT => {
                        let whole = match body.collect().await {
                            Ok(c) => c.to_bytes(),
                            Err(e) => {
                                tracing::debug!(error = %e, "client request body ended early");
                                return answer::bad_request("the request body ended before Content-Length");
                            }
                        };
                        let mut out = rw.push(whole).to_vec();
                        out.extend_from_slice(&rw.finish());
                        *exchange.body_hits.lock().unwrap_or_else(|p| p.into_inner()) = rw.hits().to_vec();
                        exchange.bytes_up.fetch_add(out.len() as u64, Ordering::Relaxed);
                        parts
                            .headers
                            .insert(header::CONTENT_LENGTH, HeaderValue::from(out.len()));
                        answer::full(Bytes::from(out))
                    }
                    _ => {
                        parts.headers.remove(header::CONTENT_LENGTH);
                        let ex = exchange.clone();
                        let on_end = Box::new(move |hits: &[u64]| {
                            *ex.body_hits.lock().unwrap_or_else(|p| p.into_inner()) = hits.to_vec();
                        });
                        StreamBody::new(body, Some(rw), exchange.bytes_up.clone(), Some(on_end)).boxed_unsync()
                    }
                }
            }
        };

        parts.uri = uri;
        parts.version = Version::HTTP_11;
        let upstream_req = Request::from_parts(parts, body);
        let client = if upgrade {
            &self.proxy.upstreams.h1_only
        } else {
            &self.proxy.upstreams.h2_or_h1
        };
        let prepared = record.start.elapsed();
        let sent_at = Instant::now();
        let result = client.request(upstream_req).await;
        let upstream_time = sent_at.elapsed();
        let mut resp = match result {
            Ok(r) => r,
            Err(e) => {
                let (status, kind, reason) = match find_upstream_error(&e) {
                    Some(u) => (u.status(), u.kind(), u.to_string()),
                    None => (
                        StatusCode::BAD_GATEWAY,
                        "upstream-protocol",
                        format!("{e}: {}", source_chain(&e)),
                    ),
                };
                tracing::warn!(host = %host, kind, reason = %reason, "upstream request failed");
                let resp = answer::upstream_failure(status, kind, &host, &reason);
                let (error, blocked) = if kind == EGRESS_POLICY {
                    (None, Some(kind))
                } else {
                    (Some(kind), None)
                };
                return self.finish_local(resp, record, &secrets, &exchange, error, blocked);
            }
        };
        let post_start = Instant::now();

        // WebSocket (or other) upgrade: relay raw bytes both ways once both sides have switched.
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            let relay = client_upgrade.map(|c| Relay::Upgrade(c, hyper::upgrade::on(&mut resp)));
            let (parts, _) = resp.into_parts();
            return self.finish_response(
                parts,
                relay.unwrap_or(Relay::Empty),
                record,
                &secrets,
                &exchange,
                prepared,
                upstream_time,
                post_start,
            );
        }

        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers, false);
        for (_, value) in parts.headers.iter_mut() {
            if let Some(redacted) = rewrite::redact_value(&secrets, value.as_bytes()) {
                if let Ok(v) = HeaderValue::from_bytes(&redacted) {
                    *value = v;
                }
            }
        }
        let bodyless = record.method == Method::HEAD
            || parts.status == StatusCode::NO_CONTENT
            || parts.status == StatusCode::NOT_MODIFIED;
        let redactor = if bodyless { None } else { rewrite::redactor(&secrets) };
        let mut body: ProxyBody = body.map_err(BoxError::from).boxed_unsync();
        // A compressed body is decoded so the redactor sees what the client will; the client
        // gets identity. What the sidecar cannot decode, it does not relay.
        if let (Some(_), Some(encoding)) = (&redactor, parts.headers.get(header::CONTENT_ENCODING)) {
            match crate::decode::codings(encoding) {
                Ok(codings) if codings.is_empty() => {
                    parts.headers.remove(header::CONTENT_ENCODING);
                }
                Ok(codings) => {
                    body = crate::decode::decoded(body, &codings);
                    parts.headers.remove(header::CONTENT_ENCODING);
                    parts.headers.remove(header::CONTENT_LENGTH);
                }
                Err(what) => {
                    let resp = answer::error(
                        StatusCode::BAD_GATEWAY,
                        "undecodable-encoding",
                        &host,
                        &format!("the upstream answered with {what}, which the vault cannot decode to redact"),
                    );
                    return self.finish_local(resp, record, &secrets, &exchange, Some("undecodable-encoding"), None);
                }
            }
        }
        let mut redactor = redactor;
        if let Some(rw) = redactor.as_mut().filter(|_| !same_lengths(&secrets)) {
            // Redaction may change the length: small bodies are redacted whole to keep an exact
            // Content-Length; larger ones stream with chunked (or close-delimited) framing.
            match content_length(&parts.headers) {
                Some(len) if len <= EXACT_LENGTH_LIMIT => {
                    let whole = match body.collect().await {
                        Ok(c) => c.to_bytes(),
                        Err(e) => {
                            let resp =
                                answer::error(StatusCode::BAD_GATEWAY, "upstream-protocol", &host, &e.to_string());
                            return self.finish_local(
                                resp,
                                record,
                                &secrets,
                                &exchange,
                                Some("upstream-protocol"),
                                None,
                            );
                        }
                    };
                    let mut out = rw.push(whole).to_vec();
                    out.extend_from_slice(&rw.finish());
                    parts
                        .headers
                        .insert(header::CONTENT_LENGTH, HeaderValue::from(out.len()));
                    body = answer::full(Bytes::from(out));
                }
                _ => {
                    parts.headers.remove(header::CONTENT_LENGTH);
                }
            }
        }
        self.finish_response(
            parts,
            Relay::Body(body, redactor),
            record,
            &secrets,
            &exchange,
            prepared,
            upstream_time,
            post_start,
        )
    }

    fn exfiltration(
        &self,
        ex: rewrite::Exfiltration,
        mut record: Record,
        secrets: &Arc<SecretSet>,
        exchange: &Arc<Exchange>,
    ) -> Response<ProxyBody> {
        tracing::warn!(host = %self.target.host, secret = %ex.secret, location = ex.location.as_str(), "stub sent to a host its secret is not bound to; refused");
        let resp = answer::blocked(
            BlockReason::StubExfiltration,
            &self.target.host.to_string(),
            serde_json::json!({ "secret": ex.secret, "location": ex.location.as_str() }),
        );
        record.blocked_secret = Some(ex.secret.clone());
        self.finish_local(
            resp,
            record,
            secrets,
            exchange,
            None,
            Some(BlockReason::StubExfiltration.as_str()),
        )
    }

    /// Answer locally (no upstream response) and record it.
    fn finish_local(
        &self,
        resp: Response<ProxyBody>,
        record: Record,
        secrets: &Arc<SecretSet>,
        exchange: &Arc<Exchange>,
        error: Option<&'static str>,
        blocked: Option<&'static str>,
    ) -> Response<ProxyBody> {
        let m = &self.proxy.metrics;
        if let Some(kind) = error {
            m.errors.get_or_create(&ErrorLabels { kind }).inc();
        }
        if let Some(reason) = blocked {
            let reason = match reason {
                "stub-exfiltration" => "stub-exfiltration",
                EGRESS_POLICY => EGRESS_POLICY,
                _ => "misdirected-request",
            };
            m.blocked.get_or_create(&BlockLabels { reason }).inc();
        }
        let status = resp.status().as_u16();
        m.requests
            .get_or_create(&RequestLabels {
                mode: "intercepted",
                class: status_class(status),
            })
            .inc();
        let event = Self::event(&self.target, &record, secrets, exchange, status, blocked, error, None);
        self.proxy.audit.record(event);
        resp
    }

    #[allow(clippy::too_many_arguments)]
    fn finish_response(
        &self,
        parts: http::response::Parts,
        relay: Relay,
        record: Record,
        secrets: &Arc<SecretSet>,
        exchange: &Arc<Exchange>,
        prepared: Duration,
        upstream_time: Duration,
        post_start: Instant,
    ) -> Response<ProxyBody> {
        let m = &self.proxy.metrics;
        let status = parts.status.as_u16();
        m.requests
            .get_or_create(&RequestLabels {
                mode: "intercepted",
                class: status_class(status),
            })
            .inc();
        for (id, loc) in &record.injections.0 {
            let secret = secrets.secrets()[*id].name.clone();
            m.injections
                .get_or_create(&InjectionLabels {
                    secret,
                    location: loc.as_str(),
                })
                .inc();
        }
        m.request_duration.observe((prepared + upstream_time).as_secs_f64());
        m.added_latency.observe((prepared + post_start.elapsed()).as_secs_f64());

        // The audit event is written when the response body ends (or the client goes away).
        let proxy = self.proxy.clone();
        let target = self.target.clone();
        let secrets_for_end = secrets.clone();
        let exchange_for_end = exchange.clone();
        let on_end: crate::body::OnEnd = Box::new(move |redaction_hits: &[u64]| {
            let redact_ids = secrets_for_end.value_automaton().map_or(&[][..], |(_, ids)| ids);
            for (j, n) in redaction_hits.iter().enumerate().filter(|(_, n)| **n > 0) {
                let secret = secrets_for_end.secrets()[redact_ids[j]].name.clone();
                proxy
                    .metrics
                    .redactions
                    .get_or_create(&InjectionLabels {
                        secret,
                        location: "body",
                    })
                    .inc_by(*n);
            }
            let body_hits = exchange_for_end
                .body_hits
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            for (id, n) in body_hits.iter().enumerate().filter(|(_, n)| **n > 0) {
                let secret = secrets_for_end.secrets()[id].name.clone();
                proxy
                    .metrics
                    .injections
                    .get_or_create(&InjectionLabels {
                        secret,
                        location: "body",
                    })
                    .inc_by(*n);
            }
            let event = Self::event(
                &target,
                &record,
                &secrets_for_end,
                &exchange_for_end,
                status,
                None,
                None,
                Some(&body_hits),
            );
            proxy.audit.record(event);
        });
        let body = match relay {
            Relay::Body(body, redactor) => {
                StreamBody::new(body, redactor, exchange.bytes_down.clone(), Some(on_end)).boxed_unsync()
            }
            Relay::Upgrade(client, upstream) => {
                // Raw bytes both ways once both sides have switched; audited when the relay ends.
                let exchange = exchange.clone();
                tokio::spawn(async move {
                    if let (Ok(c), Ok(u)) = (client.await, upstream.await) {
                        let copied = tokio::io::copy_bidirectional(&mut TokioIo::new(c), &mut TokioIo::new(u)).await;
                        if let Ok((up, down)) = copied {
                            exchange.bytes_up.fetch_add(up, Ordering::Relaxed);
                            exchange.bytes_down.fetch_add(down, Ordering::Relaxed);
                        }
                    }
                    on_end(&[]);
                });
                answer::empty()
            }
            Relay::Empty => {
                on_end(&[]);
                answer::empty()
            }
        };
        let mut parts = parts;
        parts.version = Version::HTTP_11;
        Response::from_parts(parts, body)
    }

    #[allow(clippy::too_many_arguments)]
    fn event(
        target: &Target,
        record: &Record,
        secrets: &SecretSet,
        exchange: &Exchange,
        status: u16,
        blocked: Option<&'static str>,
        error: Option<&'static str>,
        body_hits: Option<&[u64]>,
    ) -> AuditEvent {
        let mut injected: Vec<Injected> = record
            .injections
            .0
            .iter()
            .map(|(id, loc)| Injected {
                secret: secrets.secrets()[*id].name.clone(),
                location: loc.as_str(),
            })
            .collect();
        for (id, _) in body_hits.unwrap_or(&[]).iter().enumerate().filter(|(_, n)| **n > 0) {
            injected.push(Injected {
                secret: secrets.secrets()[id].name.clone(),
                location: Location::Body.as_str(),
            });
        }
        AuditEvent {
            run: Default::default(),
            seq: 0,
            time: humantime_now(),
            method: record.method.to_string(),
            host: target.host.to_string(),
            port: target.port,
            path: record.path.clone(),
            status,
            injected,
            blocked,
            blocked_secret: record.blocked_secret.clone(),
            error,
            bytes_up: exchange.bytes_up.load(Ordering::Relaxed),
            bytes_down: exchange.bytes_down.load(Ordering::Relaxed),
            duration_us: u64::try_from(record.start.elapsed().as_micros()).unwrap_or(u64::MAX),
        }
    }
}

fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Whether every redaction pattern has the same length as its replacement (then
/// `Content-Length` holds).
fn same_lengths(secrets: &SecretSet) -> bool {
    let (patterns, replacements) = secrets.redaction();
    patterns
        .iter()
        .zip(replacements.iter())
        .all(|(p, r)| r.as_ref().is_none_or(|r| r.len() == p.len()))
}

fn source_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = Vec::new();
    let mut cur = e.source();
    while let Some(s) = cur {
        parts.push(s.to_string());
        cur = s.source();
    }
    parts.join(": ")
}

/// RFC 3339 UTC timestamp with milliseconds.
pub fn humantime_now() -> String {
    let now = time::OffsetDateTime::now_utc();
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_matches_the_target_as_written_or_normalized() {
        let name = TargetHost::parse("api.anthropic.com");
        for same in ["api.anthropic.com", "API.Anthropic.COM", "api.anthropic.com."] {
            assert!(host_matches(same, &name), "{same}");
        }
        for other in ["api.anthropic.co", "evil.example", "api.anthropic.com.evil.example", ""] {
            assert!(!host_matches(other, &name), "{other}");
        }
        let ip = TargetHost::parse("127.0.0.1");
        for same in ["127.0.0.1", "0x7f.0.0.1", "2130706433"] {
            assert!(host_matches(same, &ip), "{same}");
        }
        assert!(!host_matches("127.0.0.2", &ip));
        assert!(host_matches("[::1]", &TargetHost::parse("::1")));
    }
}
