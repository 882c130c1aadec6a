//! The explicit proxy port: HTTP/1.1 `CONNECT host:port` (RFC 9110 §9.3.6) and absolute-form
//! `http://` requests (RFC 9112 §3.2.2). Anything else is a `400`.
//!
//! A CONNECT is checked ([`crate::connect`]: target, loop, egress) and answered with a bare `200`;
//! then the tunnel is either intercepted ([`crate::intercept::serve_tunnel`]) or relayed byte for
//! byte to the target.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::header::HeaderValue;
use http::{header, Method, Request, Response, StatusCode, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::answer::{self, BlockReason};
use crate::audit::{path_without_query_values, AuditEvent};
use crate::body::StreamBody;
use crate::connect::{is_self, parse_target, should_intercept, Target};
use crate::egress::EgressDecision;
use crate::headers::strip_hop_by_hop;
use crate::intercept::{humantime_now, serve_tunnel, HEADER_READ_TIMEOUT, MAX_REQUEST_HEAD};
use crate::metrics::{status_class, BlockLabels, ErrorLabels, RequestLabels};
use crate::proxy::Proxy;
use crate::upstream::{find_upstream_error, ProxyBody};

/// Accept connections on the explicit proxy port until the process ends.
pub async fn serve(proxy: Arc<Proxy>, listener: TcpListener) {
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
                .header_read_timeout(HEADER_READ_TIMEOUT)
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
        return connect(proxy, peer, req).await;
    }
    if req.uri().scheme_str() == Some("http") {
        return forward_plain(proxy, req).await;
    }
    answer::bad_request(
        "this is an HTTP proxy: send CONNECT host:port, or an absolute-form http:// request (RFC 9112 §3.2.2)",
    )
}

/// Check a target against loops and egress policy; `Some(response)` when refused.
fn refuse(proxy: &Proxy, target: &Target, mode: &'static str) -> Option<Response<ProxyBody>> {
    let host = target.host.to_string();
    let reason = if is_self(target, &proxy.own_addrs()) {
        BlockReason::Loop
    } else {
        match proxy.egress().decide(&target.host) {
            EgressDecision::Allow => return None,
            EgressDecision::Denied | EgressDecision::NotAllowed => BlockReason::EgressPolicy,
        }
    };
    tracing::warn!(connect_target = %target, reason = reason.as_str(), "request refused");
    proxy
        .metrics
        .blocked
        .get_or_create(&BlockLabels {
            reason: reason.as_str(),
        })
        .inc();
    proxy
        .metrics
        .requests
        .get_or_create(&RequestLabels { mode, class: "4xx" })
        .inc();
    let detail = match reason {
        BlockReason::Loop => {
            serde_json::json!({ "detail": "the target is this sidecar's own port" })
        }
        _ => serde_json::json!({ "detail": "the target is not allowed by the [egress] policy" }),
    };
    Some(answer::blocked(reason, &host, detail))
}

async fn connect(proxy: Arc<Proxy>, peer: SocketAddr, req: Request<Incoming>) -> Response<ProxyBody> {
    let target = match parse_target(req.uri().host(), req.uri().port_u16(), 443) {
        Ok(t) => t,
        Err(e) => return answer::bad_request(&e.to_string()),
    };
    if let Some(resp) = refuse(&proxy, &target, "tunnel") {
        return resp;
    }
    let secrets = proxy.secrets();
    if should_intercept(proxy.settings.intercept, &secrets, &target) {
        tokio::spawn(async move {
            match hyper::upgrade::on(req).await {
                Ok(upgraded) => serve_tunnel(proxy, TokioIo::new(upgraded), target).await,
                Err(e) => tracing::debug!(peer = %peer, error = %e, "CONNECT upgrade failed"),
            }
        });
        return Response::new(answer::empty());
    }
    // Not intercepted: connect first, so a failure is still an HTTP answer.
    let mut upstream = match proxy.upstreams.resolver.connect(&target.host, target.port).await {
        Ok(s) => s,
        Err(e) => {
            proxy
                .metrics
                .errors
                .get_or_create(&ErrorLabels { kind: e.kind() })
                .inc();
            proxy
                .metrics
                .requests
                .get_or_create(&RequestLabels {
                    mode: "tunnel",
                    class: "5xx",
                })
                .inc();
            tracing::warn!(connect_target = %target, error = %e, "tunnel upstream unreachable");
            return answer::upstream_failure(e.status(), e.kind(), &target.host.to_string(), &e.to_string());
        }
    };
    if upstream.peer_addr().is_ok_and(|a| proxy.own_addrs().contains(&a)) {
        return refuse_loop(&proxy, &target);
    }
    proxy.metrics.upstream_connects.inc();
    proxy
        .metrics
        .requests
        .get_or_create(&RequestLabels {
            mode: "tunnel",
            class: "2xx",
        })
        .inc();
    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(upgraded), &mut upstream).await;
            }
            Err(e) => tracing::debug!(peer = %peer, error = %e, "CONNECT upgrade failed"),
        }
    });
    Response::new(answer::empty())
}

fn refuse_loop(proxy: &Proxy, target: &Target) -> Response<ProxyBody> {
    proxy
        .metrics
        .blocked
        .get_or_create(&BlockLabels {
            reason: BlockReason::Loop.as_str(),
        })
        .inc();
    answer::blocked(
        BlockReason::Loop,
        &target.host.to_string(),
        serde_json::json!({ "detail": "the target is this sidecar's own port" }),
    )
}

/// Absolute-form `http://`: forwarded as is. Stubs are never swapped over cleartext.
async fn forward_plain(proxy: Arc<Proxy>, req: Request<Incoming>) -> Response<ProxyBody> {
    let start = Instant::now();
    let target = match parse_target(req.uri().host(), req.uri().port_u16(), 80) {
        Ok(t) => t,
        Err(e) => return answer::bad_request(&e.to_string()),
    };
    if let Some(resp) = refuse(&proxy, &target, "forwarded") {
        return resp;
    }
    let method = req.method().to_string();
    let path = path_without_query_values(req.uri().path_and_query().map_or("/", |pq| pq.as_str()));
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    if let Ok(host) = HeaderValue::from_str(&target.uri_authority(80)) {
        parts.headers.insert(header::HOST, host);
    }
    parts.version = Version::HTTP_11;
    let up = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let down = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let body = StreamBody::new(body, None, up.clone(), None).boxed_unsync();
    let result = proxy.upstreams.h1_only.request(Request::from_parts(parts, body)).await;
    let host = target.host.to_string();
    let resp = match result {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers, false);
            Response::from_parts(parts, StreamBody::new(body, None, down.clone(), None).boxed_unsync())
        }
        Err(e) => {
            let (status, kind, reason) = match find_upstream_error(&e) {
                Some(u) => (u.status(), u.kind(), u.to_string()),
                None => (StatusCode::BAD_GATEWAY, "upstream-protocol", e.to_string()),
            };
            proxy.metrics.errors.get_or_create(&ErrorLabels { kind }).inc();
            answer::upstream_failure(status, kind, &host, &reason)
        }
    };
    let status = resp.status().as_u16();
    proxy
        .metrics
        .requests
        .get_or_create(&RequestLabels {
            mode: "forwarded",
            class: status_class(status),
        })
        .inc();
    proxy.audit.record(AuditEvent {
        run: Default::default(),
        seq: 0,
        time: humantime_now(),
        method,
        host,
        port: target.port,
        path,
        status,
        injected: Vec::new(),
        blocked: None,
        blocked_secret: None,
        error: None,
        bytes_up: up.load(std::sync::atomic::Ordering::Relaxed),
        bytes_down: 0,
        duration_us: u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX),
    });
    resp
}
