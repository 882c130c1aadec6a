//! Inside an intercepted tunnel: TLS toward the client, then each request's life as phases —
//! admit (the authority names the CONNECT target, else `421`) → rewrite the head
//! ([`head::rewrite_request`], pure) → request body ([`relay::request_body`]) → send (the upstream
//! pool) → redact the head ([`head::redact_response`], pure) → response body
//! ([`relay::response_body`]: decoded, redacted) → finish ([`context::RequestContext::finish`]:
//! metrics and the audit event, once, when the body ends). Any phase may end the request with a
//! [`Refusal`], which is answered and recorded the same way.
//!
//! [`serve_tunnel`] terminates TLS with the target's leaf (ALPN from the client's own offer) and
//! serves HTTP/1.1 (with upgrades) or h2.

pub(crate) mod context;
pub(crate) mod head;
pub(crate) mod relay;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::LazyConfigAcceptor;

use crate::connect::Target;
use crate::headers::is_upgrade;
use crate::proxy::Proxy;
use crate::refusal::{ErrorKind, Refusal};
use crate::rewrite::HostRules;
use crate::tls::{sni_matches, CacheOutcome, ALPN_H2, ALPN_HTTP11};
use crate::upstream::{find_upstream_error, ProxyBody};
use context::{Counters, Mode, RequestContext};

/// Client-side TLS handshake deadline (a CONNECT that never sends a ClientHello is closed).
pub(crate) const CLIENT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/1.1 request-head read deadline inside a tunnel; long, so idle keep-alive tunnels survive.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(600);
/// Largest HTTP/1.1 request head (request line + headers) accepted from a client, on the proxy port
/// and inside tunnels; larger heads get `431` (hyper's default would buffer ~400 KiB and forward it).
pub(crate) const MAX_REQUEST_HEAD: usize = 64 * 1024;
/// Request bodies up to this size that need rewriting are rewritten whole, keeping an exact
/// `Content-Length`; larger ones are streamed with chunked framing.
pub(crate) const EXACT_LENGTH_LIMIT: u64 = 1 << 20;
/// The bytes all requests together may hold buffered for a whole-body rewrite (W11): a body that
/// would exceed it streams instead, so many streams declaring 1 MiB each cannot grow the
/// process past it.
pub(crate) const BODY_BUFFER_BUDGET: usize = 64 << 20;

/// Terminate TLS for `target` on `io` and serve the requests inside.
pub(crate) async fn serve_tunnel<I>(proxy: Arc<Proxy>, io: I, target: Target)
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
            // A client's EOF inside TLS means it is gone: the request in flight is dropped, and
            // with it the upstream request (a stalled upstream is not held for a client that
            // left). On the proxy port, cleartext clients may half-close and still get their
            // answer (listener.rs).
            .half_close(false)
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

impl Tunnel {
    /// One request, phase by phase.
    async fn handle(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        let secrets = self.proxy.secrets();
        let mut ctx = RequestContext::new(
            self.proxy.clone(),
            Mode::Intercepted,
            self.target.clone(),
            secrets,
            &req,
        );
        let (resp, client_upgrade) = match self.send(req, &mut ctx).await {
            Ok(sent) => sent,
            Err(refusal) => return ctx.refuse(refusal),
        };
        match relay::respond(resp, client_upgrade, &mut ctx).await {
            Ok((parts, relay)) => relay::finish(ctx, parts, relay),
            Err(refusal) => ctx.refuse(refusal),
        }
    }

    /// Admit, rewrite the head, prepare the body, and send: the upstream's response head (or why
    /// there is none), with the client's side of an upgrade.
    async fn send(
        &self,
        mut req: Request<Incoming>,
        ctx: &mut RequestContext,
    ) -> Result<(Response<Incoming>, Option<hyper::upgrade::OnUpgrade>), Refusal> {
        let upgrade = is_upgrade(req.headers());
        // An HTTP/1.x request without a body goes to the upstream as HTTP/1.1 where it speaks it;
        // one with a body goes over h2 where it can: an upstream that answers early (a 401 before
        // reading an upload) and closes an HTTP/1.1 connection can lose that answer to the reset
        // its unread body causes, where h2 resets the stream only (K08, RFC 9113 §8.1).
        let bodiless_h1 =
            req.version() <= http::Version::HTTP_11 && hyper::body::Body::size_hint(req.body()).exact() == Some(0);
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        let body = crate::body::DrainOnDrop::new(body);

        // Admit: the request names the CONNECT target.
        if self.misdirected || !head::authority_matches(&parts, &self.target) {
            return Err(Refusal::failed(
                ErrorKind::Misdirected,
                &self.target.host,
                "the request names a host other than the CONNECT target",
            ));
        }
        // Rewrite the head (before any body byte moves).
        let secrets = ctx.secrets.clone();
        let rules = HostRules::new(&secrets, &self.target.host, self.target.port);
        head::rewrite_request(
            &mut parts,
            &rules,
            &self.target,
            self.authority.as_ref(),
            upgrade,
            &mut ctx.injections,
        )?;
        // The request body.
        let body = relay::request_body(body, &mut parts, &rules, ctx).await?;

        // Send.
        let upstreams = &self.proxy.upstreams;
        let client = if upgrade {
            &upstreams.h1_only
        } else if bodiless_h1 {
            &upstreams.h1_first
        } else {
            &upstreams.h2_or_h1
        };
        ctx.prepared = ctx.elapsed();
        let sent_at = Instant::now();
        let limit = self.proxy.settings.upstream_response_timeout;
        let result = tokio::time::timeout(limit, client.request(Request::from_parts(parts, body))).await;
        ctx.upstream_time = sent_at.elapsed();
        let resp = match result {
            Ok(r) => r.map_err(|e| failed_exchange(&ctx.counters, &e, &self.target))?,
            Err(_) => return Err(response_timeout(&self.target, limit)),
        };
        Ok((resp, client_upgrade))
    }
}

/// The refusal for a request whose upstream exchange failed: the tripwire's when it ended the
/// streaming request body (that reset is what failed), else the upstream's.
pub(crate) fn failed_exchange(counters: &Counters, e: &hyper_util::client::legacy::Error, target: &Target) -> Refusal {
    counters.take_tripped().unwrap_or_else(|| upstream_refusal(e, target))
}

/// The refusal for an upstream that sent no response head within `limit`
/// (`upstream_response_timeout_secs`).
pub(crate) fn response_timeout(target: &Target, limit: std::time::Duration) -> Refusal {
    tracing::warn!(host = %target.host, timeout_s = limit.as_secs(), "the upstream sent no response head in time");
    Refusal::failed(
        ErrorKind::UpstreamResponseTimeout,
        &target.host,
        format!("the upstream sent no response head within {} s", limit.as_secs()),
    )
}

/// The refusal for a failed upstream exchange (connect, TLS, or the upstream's own protocol).
pub(crate) fn upstream_refusal(e: &hyper_util::client::legacy::Error, target: &Target) -> Refusal {
    let refusal = match find_upstream_error(e) {
        Some(u) => Refusal::upstream(u, &target.host),
        None => Refusal::failed(
            ErrorKind::UpstreamProtocol,
            &target.host,
            format!("{e}: {}", source_chain(e)),
        ),
    };
    tracing::warn!(host = %target.host, kind = refusal.audit_error().or(refusal.audit_blocked()).unwrap_or(""), status = refusal.status().as_u16(), "upstream request failed");
    refusal
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
