//! The explicit proxy port: HTTP/1.1 `CONNECT host:port` (RFC 9110 §9.3.6) and absolute-form
//! `http://` requests (RFC 9112 §3.2.2). Anything else is a `400`.
//!
//! A CONNECT is checked ([`crate::connect`]: target, loop, egress) and answered with a bare `200`;
//! then the tunnel is either intercepted ([`crate::intercept::serve_tunnel`]) or relayed byte for
//! byte to the target.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::header::HeaderValue;
use http::{header, Method, Request, Response, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::admission::Destination;
use crate::body::{DrainOnDrop, StreamBody};
use crate::connect::{parse_target, should_intercept};
use crate::headers::strip_hop_by_hop;
use crate::intercept::context::{Mode, Outcome, RequestContext};
use crate::intercept::{failed_exchange, head, relay, response_timeout, serve_tunnel, MAX_REQUEST_HEAD};
use crate::proxy::Proxy;
use crate::refusal::{self, BlockReason, Refusal};
use crate::rewrite::HostRules;
use crate::upstream::ProxyBody;

/// Deadline for a whole request head on the proxy port (a CONNECT or an absolute-form request,
/// and between keep-alive requests): a client trickling its head (slowloris, W12) is closed.
/// Inside an intercepted tunnel the longer `HEADER_READ_TIMEOUT` applies.
pub(crate) const PROXY_HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Accept connections on the explicit proxy port until the process ends.
pub(crate) async fn serve(proxy: Arc<Proxy>, listener: TcpListener) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(handle(proxy, peer, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(PROXY_HEAD_TIMEOUT)
                .max_header_size(MAX_REQUEST_HEAD)
                .half_close(true)
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            if let Err(e) = conn.await {
                tracing::debug!(peer = %peer, error = %e, "proxy connection ended with an error");
            }
        });
    }
}

async fn handle(proxy: Arc<Proxy>, peer: SocketAddr, req: Request<Incoming>) -> Response<ProxyBody> {
    if req.method() == Method::CONNECT {
        return connect(proxy, peer, req).await.unwrap_or_else(Refusal::into_response);
    }
    if req.uri().scheme_str() == Some("http") {
        return forward_plain(proxy, req).await;
    }
    Refusal::bad_request(
        "this is an HTTP proxy: send CONNECT host:port, or an absolute-form http:// request (RFC 9112 §3.2.2)",
    )
    .into_response()
}

async fn connect(proxy: Arc<Proxy>, peer: SocketAddr, req: Request<Incoming>) -> Result<Response<ProxyBody>, Refusal> {
    let target =
        parse_target(req.uri().host(), req.uri().port_u16(), 443).map_err(|e| Refusal::bad_request(e.to_string()))?;
    let snapshot = proxy.snapshot();
    proxy.admit(
        Destination {
            target: &target,
            original: None,
        },
        &snapshot.egress,
        Mode::Tunnel,
        "CONNECT",
    )?;
    if should_intercept(
        proxy.settings.intercept,
        &proxy.settings.passthrough,
        &snapshot.secrets,
        &target,
    ) {
        // The upstream is connected per request inside the tunnel, and checked there; a target
        // whose addresses are refused already is a 403 to the CONNECT itself, as for a tunnel. A
        // name that does not resolve yet is answered inside (a `502 dns` the client can read).
        if let Ok(addrs) = proxy.upstreams.resolver.resolve(&target.host, target.port).await {
            let own = proxy.own_addrs();
            let refusal = if addrs.iter().any(|a| own.contains(a)) {
                Some(Refusal::blocked(BlockReason::Loop, &target.host))
            } else {
                let checked = proxy.upstreams.resolver.check(&target.host, &addrs);
                checked.err().map(|e| Refusal::upstream(&e, &target.host))
            };
            if let Some(r) = refusal {
                proxy.metrics.count_refusal(&r);
                proxy.metrics.count_request(Mode::Tunnel.as_str(), r.status().as_u16());
                proxy.audit_connection("CONNECT", &target, Err(&r), (0, 0), std::time::Duration::ZERO);
                return Err(r);
            }
        }
        tokio::spawn(async move {
            match hyper::upgrade::on(req).await {
                Ok(upgraded) => serve_tunnel(proxy, TokioIo::new(upgraded), target).await,
                Err(e) => tracing::debug!(peer = %peer, error = %e, "CONNECT upgrade failed"),
            }
        });
        return Ok(Response::new(refusal::empty()));
    }
    // Not intercepted: connect first, so a failure is still an HTTP answer.
    let start = std::time::Instant::now();
    let refused = |r: Refusal| {
        proxy.metrics.count_refusal(&r);
        proxy.metrics.count_request(Mode::Tunnel.as_str(), r.status().as_u16());
        proxy.audit_connection("CONNECT", &target, Err(&r), (0, 0), start.elapsed());
        r
    };
    let mut upstream = proxy
        .upstreams
        .resolver
        .connect(&target.host, target.port)
        .await
        .map_err(|e| {
            tracing::warn!(connect_target = %target, error = %e, "tunnel upstream unreachable");
            refused(Refusal::upstream(&e, &target.host))
        })?;
    if upstream.peer_addr().is_ok_and(|a| proxy.own_addrs().contains(&a)) {
        return Err(refused(Refusal::blocked(BlockReason::Loop, &target.host)));
    }
    proxy.metrics.upstream_connects.inc();
    proxy.metrics.count_request(Mode::Tunnel.as_str(), 200);
    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                let bytes = tokio::io::copy_bidirectional(&mut TokioIo::new(upgraded), &mut upstream)
                    .await
                    .unwrap_or((0, 0));
                proxy.audit_connection("CONNECT", &target, Ok(()), bytes, start.elapsed());
            }
            Err(e) => tracing::debug!(peer = %peer, error = %e, "CONNECT upgrade failed"),
        }
    });
    Ok(Response::new(refusal::empty()))
}

/// Absolute-form `http://`: forwarded as is, and finished (audited) when the response body ends.
/// Stubs are never swapped over cleartext; one anywhere in the request is refused (the tripwire).
async fn forward_plain(proxy: Arc<Proxy>, req: Request<Incoming>) -> Response<ProxyBody> {
    let target = match parse_target(req.uri().host(), req.uri().port_u16(), 80) {
        Ok(t) => t,
        Err(e) => return Refusal::bad_request(e.to_string()).into_response(),
    };
    let snapshot = proxy.snapshot();
    if let Err(r) = proxy.admit(
        Destination {
            target: &target,
            original: None,
        },
        &snapshot.egress,
        Mode::Forwarded,
        req.method().as_str(),
    ) {
        return r.into_response();
    }
    let secrets = snapshot.secrets.clone();
    let ctx = RequestContext::new(proxy.clone(), Mode::Forwarded, target.clone(), snapshot.secrets, &req);
    let (mut parts, body) = req.into_parts();
    if let Err(r) = head::check_transfer_codings(&parts.headers, &target) {
        return ctx.refuse(r);
    }
    strip_hop_by_hop(&mut parts.headers, false);
    // No secret is bound over cleartext: any stub in the head or the body is refused.
    let rules = HostRules::cleartext(&secrets);
    if let Err(r) = head::tripwire_cleartext(&parts, &rules, &target) {
        return ctx.refuse(r);
    }
    let body = match relay::request_body(DrainOnDrop::new(body), &mut parts, &rules, &ctx).await {
        Ok(body) => body,
        Err(r) => return ctx.refuse(r),
    };
    if let Ok(host) = HeaderValue::from_str(&target.uri_authority(80)) {
        parts.headers.insert(header::HOST, host);
    }
    parts.version = Version::HTTP_11;
    let limit = proxy.settings.upstream_response_timeout;
    let resp =
        match tokio::time::timeout(limit, proxy.upstreams.h1_only.request(Request::from_parts(parts, body))).await {
            Ok(Ok(resp)) => resp,
            Ok(Err(e)) => {
                let refusal = failed_exchange(&ctx.counters, &e, &target);
                return ctx.refuse(refusal);
            }
            Err(_) => return ctx.refuse(response_timeout(&target, limit)),
        };
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    let status = parts.status.as_u16();
    let bytes_down = ctx.counters.bytes_down.clone();
    let on_end: crate::body::OnEnd = Box::new(move |_| ctx.finish(status, Outcome::Relayed { redactions: &[] }));
    Response::from_parts(
        parts,
        StreamBody::new(body, None, bytes_down, Some(on_end)).boxed_unsync(),
    )
}
