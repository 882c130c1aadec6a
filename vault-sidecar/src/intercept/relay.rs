//! The body phases of an intercepted request: the request body (stubs swapped, exact
//! `Content-Length` kept for small bodies), the response (head redacted, body decoded and
//! redacted), and the relay that streams it to the client and finishes the request when it ends.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{request, response, Response, StatusCode, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::context::{Outcome, RequestContext};
use super::{head, EXACT_LENGTH_LIMIT};
use crate::body::{DrainOnDrop, Scan, StreamBody, Tripwire};
use crate::config::{BodyTripwire, Location};
use crate::decode::{self, DecodingScanner, ScanRefusal};
use crate::refusal::{self, ErrorKind, Refusal};
use crate::rewrite::{self, HostRules, StreamRewriter, StubScanner};
use crate::secrets::SecretSet;
use crate::upstream::{BoxError, ProxyBody};

/// The budget for buffering a body of `len` bytes whole: a body up to [`EXACT_LENGTH_LIMIT`]
/// gets it while the process-wide [`super::BODY_BUFFER_BUDGET`] lasts; otherwise it streams.
fn buffer_permit(ctx: &RequestContext, len: Option<u64>) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let len = u32::try_from(len.filter(|l| *l <= EXACT_LENGTH_LIMIT)?).ok()?;
    match ctx.proxy().body_budget.clone().try_acquire_many_owned(len) {
        Ok(permit) => Some(permit),
        Err(_) => {
            tracing::debug!(len, "body buffer budget spent; streaming the body instead");
            None
        }
    }
}

/// What follows the response head.
pub(crate) enum Relay {
    /// A body, redacted when a redactor is given.
    Body(ProxyBody, Option<StreamRewriter>),
    /// A protocol switch (WebSocket): client and upstream upgrades to join.
    Upgrade(hyper::upgrade::OnUpgrade, hyper::upgrade::OnUpgrade),
    Empty,
}

/// The request body for the upstream: stubs swapped when the host's rules swap body stubs and the
/// body is identity-coded (a compressed upload passes untouched), and the stub tripwire over it
/// ([`tripwire_applies`]), over its decoded bytes when it is compressed (`415` for a coding the
/// sidecar cannot decode). A body up to [`EXACT_LENGTH_LIMIT`] is read whole (while the buffer
/// budget lasts): a stub the tripwire finds is a `403` before anything goes upstream, and a
/// rewritten body keeps an exact `Content-Length`. A larger one streams (chunked when rewritten);
/// the tripwire ends it with an error at the first stub, which resets the upstream request.
pub(crate) async fn request_body(
    body: DrainOnDrop,
    parts: &mut request::Parts,
    rules: &HostRules<'_>,
    ctx: &RequestContext,
) -> Result<ProxyBody, Refusal> {
    let counters = &ctx.counters;
    let empty = http_body::Body::is_end_stream(&body);
    let identity = head::identity_body(parts);
    let rewriter = if empty {
        None
    } else {
        rules.body_rewriter(
            parts.method.as_str(),
            parts.uri.path(),
            parts.headers.get(header::CONTENT_TYPE).map(HeaderValue::as_bytes),
        )
    };
    let rewriter = match rewriter {
        Some(_) if !identity => {
            tracing::info!(host = %ctx.target().host, "request body is compressed; body stubs are not swapped");
            None
        }
        rw => rw,
    };
    let tripwire = if empty || !tripwire_applies(ctx, rules) {
        None
    } else {
        rules
            .stub_scanner(Location::Body)
            .map(|scanner| body_scan(parts, scanner, ctx))
            .transpose()?
    };
    if rewriter.is_none() && tripwire.is_none() {
        return Ok(StreamBody::new(body, None, counters.bytes_up.clone(), None).boxed_unsync());
    }
    match buffer_permit(ctx, head::content_length(&parts.headers)) {
        Some(permit) => {
            let whole = body.collect().await.map_err(|e| {
                tracing::debug!(error = %e, "client request body ended early");
                Refusal::bad_request("the request body ended before Content-Length")
            })?;
            let whole = whole.to_bytes();
            match tripwire {
                Some(Scan::Plain(_)) => rules.body(&whole).map_err(|ex| head::exfiltration(ex, ctx.target()))?,
                Some(Scan::Decoding(mut d)) => d.push(&whole).map_err(|r| scan_refusal(r, ctx.target()))?,
                None => {}
            }
            let out = match rewriter {
                Some(mut rw) => {
                    let mut out = rw.push(whole).to_vec();
                    out.extend_from_slice(&rw.finish());
                    *counters.body_hits.lock().unwrap_or_else(|p| p.into_inner()) = rw.hits().to_vec();
                    parts
                        .headers
                        .insert(header::CONTENT_LENGTH, HeaderValue::from(out.len()));
                    Bytes::from(out)
                }
                None => whole,
            };
            counters.bytes_up.fetch_add(out.len() as u64, Ordering::Relaxed);
            Ok(refusal::full_budgeted(out, permit))
        }
        None => {
            let on_end: Option<crate::body::OnEnd> = rewriter.is_some().then(|| {
                parts.headers.remove(header::CONTENT_LENGTH);
                let c = counters.clone();
                Box::new(move |hits: &[u64]| {
                    *c.body_hits.lock().unwrap_or_else(|p| p.into_inner()) = hits.to_vec();
                }) as crate::body::OnEnd
            });
            let mut streamed = StreamBody::new(body, rewriter, counters.bytes_up.clone(), on_end);
            if let Some(scan) = tripwire {
                let (c, target) = (counters.clone(), ctx.target().clone());
                streamed = streamed.with_tripwire(Tripwire {
                    scan,
                    secrets: ctx.secrets.clone(),
                    on_trip: Some(Box::new(move |r| c.trip(scan_refusal(r, &target)))),
                });
            }
            Ok(streamed.boxed_unsync())
        }
    }
}

/// How the tripwire reads this body: as it is, or decoded from its `Content-Encoding`.
fn body_scan(parts: &request::Parts, scanner: StubScanner, ctx: &RequestContext) -> Result<Scan, Refusal> {
    if !parts.headers.contains_key(header::CONTENT_ENCODING) {
        return Ok(Scan::Plain(scanner));
    }
    let unsupported = |what: String| {
        Refusal::failed(
            ErrorKind::UnsupportedRequestEncoding,
            &ctx.target().host,
            format!("{what} of the request body cannot be decoded for the stub tripwire"),
        )
    };
    let codings = decode::content_codings(&parts.headers).map_err(unsupported)?;
    if codings.is_empty() {
        return Ok(Scan::Plain(scanner));
    }
    DecodingScanner::new(&codings, scanner, ctx.secrets.clone())
        .map(Scan::Decoding)
        .map_err(|e| unsupported(format!("the decoder ({e})")))
}

/// What a tripwire refused, as the answer to the request.
fn scan_refusal(r: ScanRefusal, target: &crate::connect::Target) -> Refusal {
    match r {
        ScanRefusal::Stub(ex) => head::exfiltration(ex, target),
        ScanRefusal::Corrupt(reason) => Refusal::failed(ErrorKind::BadRequest, &target.host, reason),
    }
}

/// Whether the stub tripwire reads this request's body (and its WebSocket messages): some secret
/// is not bound to the target, and `body_tripwire` covers the target (`every-host`, or
/// `hosts-without-secrets` and no secret is bound to it).
pub(crate) fn tripwire_applies(ctx: &RequestContext, rules: &HostRules<'_>) -> bool {
    let covered = match ctx.proxy().settings.body_tripwire {
        BodyTripwire::EveryHost => true,
        BodyTripwire::HostsWithoutSecrets => !rules.has_bound(),
    };
    covered && rules.has_unbound()
}

/// The upstream's response made safe for the client: an upgrade joined, else the head redacted
/// and the body decoded (when compressed) and redacted. Small bodies whose redaction may change
/// their length are redacted whole, keeping an exact `Content-Length`.
pub(crate) async fn respond(
    mut resp: Response<Incoming>,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    ctx: &mut RequestContext,
) -> Result<(response::Parts, Relay), Refusal> {
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let relay = client_upgrade.map(|c| Relay::Upgrade(c, hyper::upgrade::on(&mut resp)));
        let (parts, _) = resp.into_parts();
        return Ok((parts, relay.unwrap_or(Relay::Empty)));
    }
    let secrets = ctx.secrets.clone();
    let (mut parts, body) = resp.into_parts();
    head::redact_response(&mut parts, &secrets);
    let mut redactor = if head::bodyless(ctx.method(), parts.status) {
        None
    } else {
        rewrite::redactor(&secrets)
    };
    let mut body: ProxyBody = body.map_err(BoxError::from).boxed_unsync();
    if redactor.is_some() {
        let codings = head::take_codings(&mut parts, &ctx.target().host)?;
        if !codings.is_empty() {
            body = crate::decode::decoded(body, &codings);
        }
    }
    if let Some(rw) = redactor.as_mut().filter(|_| !same_lengths(&secrets)) {
        match buffer_permit(ctx, head::content_length(&parts.headers)) {
            Some(permit) => {
                let whole = body
                    .collect()
                    .await
                    .map_err(|e| Refusal::failed(ErrorKind::UpstreamProtocol, &ctx.target().host, e.to_string()))?;
                let mut out = rw.push(whole.to_bytes()).to_vec();
                out.extend_from_slice(&rw.finish());
                parts
                    .headers
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(out.len()));
                body = refusal::full_budgeted(Bytes::from(out), permit);
            }
            None => {
                parts.headers.remove(header::CONTENT_LENGTH);
            }
        }
    }
    Ok((parts, Relay::Body(body, redactor)))
}

/// Relay the response to the client; the request finishes when its body ends (or the upgraded
/// connection closes, or the client goes away).
pub(crate) fn finish(ctx: RequestContext, mut parts: response::Parts, relay: Relay) -> Response<ProxyBody> {
    let m = &ctx.proxy().metrics;
    m.request_duration
        .observe((ctx.prepared + ctx.upstream_time).as_secs_f64());
    m.added_latency
        .observe(ctx.elapsed().saturating_sub(ctx.upstream_time).as_secs_f64());
    let status = parts.status.as_u16();
    let counters = ctx.counters.clone();
    let secrets = ctx.secrets.clone();
    let target = ctx.target().clone();
    let tripwire = match &relay {
        Relay::Upgrade(..) => {
            let rules = HostRules::new(&secrets, &ctx.target().host, ctx.target().port);
            tripwire_applies(&ctx, &rules)
                .then(|| rules.stub_scanner(Location::Body))
                .flatten()
        }
        _ => None,
    };
    let on_end: crate::body::OnEnd = Box::new(move |redactions: &[u64]| {
        ctx.finish(status, Outcome::Relayed { redactions });
    });
    let body = match relay {
        Relay::Body(body, redactor) => StreamBody::new(body, redactor, counters.bytes_down.clone(), Some(on_end))
            .redacting_trailers(secrets)
            .boxed_unsync(),
        Relay::Upgrade(client, upstream) => {
            // Raw bytes both ways once both sides have switched; finished when the relay ends.
            // WebSocket messages are redacted frame by frame (W04); any other protocol the sidecar
            // cannot read is relayed as is.
            let websocket = is_websocket(&parts.headers);
            let secrets = secrets.clone();
            tokio::spawn(async move {
                let mut hits = Vec::new();
                if let (Ok(c), Ok(u)) = (client.await, upstream.await) {
                    let (c, u) = (TokioIo::new(c), TokioIo::new(u));
                    let (up, down) = if websocket && (secrets.value_automaton().is_some() || tripwire.is_some()) {
                        let (up, down, h, refused) = crate::ws::relay(c, u, secrets, tripwire).await;
                        hits = h;
                        if let Some(ex) = refused {
                            counters.trip(head::exfiltration(ex, &target));
                        }
                        (up, down)
                    } else {
                        let (mut c, mut u) = (c, u);
                        tokio::io::copy_bidirectional(&mut c, &mut u).await.unwrap_or((0, 0))
                    };
                    counters.bytes_up.fetch_add(up, Ordering::Relaxed);
                    counters.bytes_down.fetch_add(down, Ordering::Relaxed);
                }
                on_end(&hits);
            });
            refusal::empty()
        }
        Relay::Empty => {
            on_end(&[]);
            refusal::empty()
        }
    };
    parts.version = Version::HTTP_11;
    Response::from_parts(parts, body)
}

/// `Upgrade: websocket` (RFC 6455 §4.2.2).
fn is_websocket(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|p| p.trim().eq_ignore_ascii_case("websocket")))
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
