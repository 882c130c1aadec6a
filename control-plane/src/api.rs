//! The REST API (SPEC §3.2): routing, auth, and rendering. Handlers parse, call [`App`], render.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt};

use crate::app::App;
use crate::audit::{Actor, AuditQuery, AuditView};
use crate::error::ApiError;
use crate::model::{
    AgentView, CreateAgent, CreateSession, MessageInput, Page, PageQuery, PatchAgent, SecretInput, SecretView,
    SessionView, DEFAULT_LIMIT, MAX_LIMIT,
};
use crate::store::AuditFilter;

/// JSON body whose rejections are `{"error": …}` 400s.
#[derive(FromRequest)]
#[from_request(via(Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

impl<T: serde::Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        Json(self.0).into_response()
    }
}

type AppState = Arc<App>;
type ApiResult<T> = Result<T, ApiError>;

/// The whole router.
pub fn router(app: Arc<App>) -> Router {
    let agents = Router::new()
        .route("/agents", post(create_agent).get(list_agents))
        .route("/agents/{id}", get(get_agent).patch(patch_agent).delete(delete_agent))
        .route("/agents/{id}/session", post(create_session))
        .route("/sessions", get(list_sessions))
        .route("/sessions/{id}", get(get_session).delete(delete_session))
        .route("/sessions/{id}/message", post(send_message))
        .route("/sessions/{id}/message_stream", post(message_stream))
        .route("/sessions/{id}/abort", post(abort_turn))
        .route("/sessions/{id}/restart", post(restart_harness))
        .route("/sessions/{id}/events", get(session_events))
        .route("/sessions/{id}/interceptions", get(interceptions))
        .route("/sessions/{id}/logs", get(session_logs));
    let secrets = Router::new()
        .route("/", post(create_secret).get(list_secrets))
        .route("/{name}", get(get_secret).put(put_secret).delete(delete_secret));
    let authed = Router::new()
        .nest("/api/v1/managed_agents", agents)
        .nest("/api/v1/secrets", secrets)
        .route("/api/v1/audit", get(audit))
        .route_layer(middleware::from_fn_with_state(app.clone(), require_bearer));
    Router::new()
        .route("/health", get(health))
        // Authorised by the session's own tty_token, not the master key.
        .route("/api/v1/managed_agents/sessions/{id}/tty", get(crate::tty::tty))
        .route("/metrics", get(metrics))
        .merge(authed)
        .fallback(|| async { ApiError::NotFound("route".into()) })
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn_with_state(app.clone(), count_requests))
        .with_state(app)
}

/// Count and log every request: method, route (the matched pattern, never the ids in the
/// path), status and duration in whole microseconds. Never a body or a header.
async fn count_requests(State(app): State<AppState>, req: Request, next: Next) -> Response {
    app.metrics.http_requests.inc();
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "(no route)".to_owned(), |p| p.as_str().to_owned());
    let start = std::time::Instant::now();
    let resp = next.run(req).await;
    let duration_us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
    tracing::info!(
        target: "lap_server::http",
        method = %method,
        route = %route,
        status = resp.status().as_u16(),
        duration_us,
        "request"
    );
    resp
}

/// Every error answer under `/api/` is `{"error": "…"}` JSON with its own status: the
/// framework's own refusals (405, a body over the limit's 413, …) included.
async fn json_errors(req: Request, next: Next) -> Response {
    let api = req.uri().path().starts_with("/api/");
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !api || !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    let mut out = (status, Json(serde_json::json!({ "error": message }))).into_response();
    for (k, v) in parts.headers.iter() {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

/// `Authorization: Bearer <MASTER_KEY>`, compared in constant time; without one, a signed-in
/// web console's cookie (CSRF-checked for writes, [`crate::console::authorize`]).
async fn require_bearer(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(|v| v.trim().to_owned());
    let mut req = req;
    match presented {
        Some(key) if app.authorized(&key) => {
            req.extensions_mut().insert(Actor::API_KEY);
            next.run(req).await
        }
        Some(_) => ApiError::Unauthorized.into_response(),
        None => match crate::console::authorize(&app, req.method(), req.headers()).await {
            Ok(_) => {
                req.extensions_mut().insert(Actor::CONSOLE);
                next.run(req).await
            }
            Err(e) => e.into_response(),
        },
    }
}

fn page_bounds(q: &PageQuery) -> ApiResult<(i64, i64)> {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    let offset = q.offset.unwrap_or(0);
    if limit < 1 {
        return Err(ApiError::BadRequest("limit: must be at least 1".into()));
    }
    if offset < 0 {
        return Err(ApiError::BadRequest("offset: must not be negative".into()));
    }
    Ok((limit.min(MAX_LIMIT), offset))
}

async fn health(State(app): State<AppState>) -> Response {
    if app.store.ping().await {
        Json(serde_json::json!({"status": "ok"})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"status": "degraded", "error": "database unreachable"})),
        )
            .into_response()
    }
}

async fn metrics(State(app): State<AppState>) -> Response {
    let counts = app.session_counts().await;
    let counts: Vec<(&str, usize)> = counts.iter().map(|(s, n)| (s.as_str(), *n)).collect();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(&counts),
    )
        .into_response()
}

// ---- agents ----

type ActorExt = axum::Extension<Actor>;

/// The names of the fields a PATCH body sets, for the audit (never their values).
fn fields_of(body: &serde_json::Value) -> Vec<String> {
    body.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

async fn create_agent(
    State(app): State<AppState>,
    axum::Extension(actor): ActorExt,
    ApiJson(body): ApiJson<CreateAgent>,
) -> ApiResult<Response> {
    let agent = app.create_agent(body).await?;
    app.record(
        "agent.create",
        &actor,
        None,
        Some(&agent.id),
        &agent.spec.secrets,
        serde_json::json!({"name": agent.spec.name, "harness_id": agent.spec.harness_id}),
    )
    .await;
    Ok((StatusCode::CREATED, Json(agent.view())).into_response())
}

async fn list_agents(
    State(app): State<AppState>,
    q: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Page<AgentView>>> {
    let Query(q) = q?;
    let (limit, offset) = page_bounds(&q)?;
    let (agents, total) = app.list_agents(limit, offset).await?;
    Ok(Json(Page {
        data: agents.iter().map(|a| a.view()).collect(),
        total,
        limit,
        offset,
    }))
}

async fn get_agent(State(app): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<AgentView>> {
    Ok(Json(app.get_agent(&id).await?.view()))
}

async fn patch_agent(
    State(app): State<AppState>,
    axum::Extension(actor): ActorExt,
    Path(id): Path<String>,
    ApiJson(raw): ApiJson<serde_json::Value>,
) -> ApiResult<Json<AgentView>> {
    let fields = fields_of(&raw);
    let body: PatchAgent =
        serde_json::from_value(raw).map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))?;
    let agent = app.patch_agent(&id, body).await?;
    app.record(
        "agent.update",
        &actor,
        None,
        Some(&id),
        &agent.spec.secrets,
        serde_json::json!({ "fields": fields }),
    )
    .await;
    Ok(Json(agent.view()))
}

/// `DELETE /agents/{id}?stop_sessions=true`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteAgentQuery {
    #[serde(default)]
    stop_sessions: bool,
}

async fn delete_agent(
    State(app): State<AppState>,
    axum::Extension(actor): ActorExt,
    Path(id): Path<String>,
    q: Result<Query<DeleteAgentQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<StatusCode> {
    let Query(q) = q?;
    let stopped = app.delete_agent(&id, q.stop_sessions).await?;
    for sid in &stopped {
        app.record(
            "session.delete",
            &actor,
            Some(sid),
            Some(&id),
            &[],
            serde_json::json!({"reason": "agent deleted"}),
        )
        .await;
    }
    app.record(
        "agent.delete",
        &actor,
        None,
        Some(&id),
        &[],
        serde_json::json!({ "stopped_sessions": stopped }),
    )
    .await;
    Ok(StatusCode::NO_CONTENT)
}

// ---- sessions ----

async fn create_session(
    State(app): State<AppState>,
    axum::Extension(actor): ActorExt,
    Path(id): Path<String>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> ApiResult<Response> {
    let body = body?;
    // The body is optional: no body means no title, prompt or env_vars.
    let req: CreateSession = if body.iter().all(u8::is_ascii_whitespace) {
        CreateSession::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))?
    };
    let env_var_names: Vec<String> = req.env_vars.keys().cloned().collect();
    let session = app.create_session(&id, req).await?;
    app.record(
        "session.create",
        &actor,
        Some(&session.id),
        Some(&id),
        &env_var_names,
        serde_json::json!({ "env_vars": env_var_names }),
    )
    .await;
    Ok((StatusCode::CREATED, Json(app.session_view(&session))).into_response())
}

async fn list_sessions(
    State(app): State<AppState>,
    q: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Page<SessionView>>> {
    let Query(q) = q?;
    let (limit, offset) = page_bounds(&q)?;
    let (sessions, total) = app.store.list_sessions(q.agent_id.as_deref(), limit, offset).await?;
    Ok(Json(Page {
        data: sessions.iter().map(|s| app.session_view(s)).collect(),
        total,
        limit,
        offset,
    }))
}

async fn get_session(State(app): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<SessionView>> {
    Ok(Json(app.session_view(&app.get_session(&id).await?)))
}

async fn delete_session(
    State(app): State<AppState>,
    axum::Extension(actor): ActorExt,
    Path(id): Path<String>,
) -> ApiResult<Json<SessionView>> {
    let (s, ended) = app.stop_session_once(&id).await?;
    if ended {
        app.record(
            "session.delete",
            &actor,
            Some(&id),
            Some(&s.agent_id),
            &[],
            serde_json::json!({}),
        )
        .await;
    }
    Ok(Json(app.session_view(&s)))
}

/// The audit of a message: its length, never its text.
async fn record_message(app: &App, actor: &Actor, id: &str, text: &str, stream: bool) {
    let agent = app.get_session(id).await.map(|s| s.agent_id).ok();
    app.record(
        "session.message",
        actor,
        Some(id),
        agent.as_deref(),
        &[],
        serde_json::json!({ "chars": text.chars().count(), "stream": stream }),
    )
    .await;
}

async fn send_message(
    State(app): State<AppState>,
    axum::Extension(actor): ActorExt,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<MessageInput>,
) -> ApiResult<Json<serde_json::Value>> {
    let text = body.into_text().map_err(ApiError::BadRequest)?;
    record_message(&app, &actor, &id, &text, false).await;
    Ok(Json(app.send_message(&id, &text).await?))
}

/// `POST /sessions/{id}/abort` → `200 {"aborted": bool}`; `409` unless the session is ready.
async fn abort_turn(
    State(app): State<AppState>,
    axum::Extension(actor): ActorExt,
    Path(id): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let out = app.abort_turn(&id).await?;
    let agent = app.get_session(&id).await.map(|s| s.agent_id).ok();
    app.record(
        "session.abort",
        &actor,
        Some(&id),
        agent.as_deref(),
        &[],
        serde_json::json!(out),
    )
    .await;
    Ok(Json(out))
}

/// `POST /sessions/{id}/restart` → `200` the session, once its new harness serves; `409` unless
/// the session is ready, `502` if the harness does not come back within two minutes.
async fn restart_harness(
    State(app): State<AppState>,
    axum::Extension(actor): ActorExt,
    Path(id): Path<String>,
) -> ApiResult<Json<SessionView>> {
    let s = app.restart_harness(&id, std::time::Duration::from_secs(120)).await?;
    app.record(
        "session.restart",
        &actor,
        Some(&id),
        Some(&s.agent_id),
        &[],
        serde_json::json!({}),
    )
    .await;
    Ok(Json(app.session_view(&s)))
}

async fn message_stream(
    State(app): State<AppState>,
    axum::Extension(actor): ActorExt,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<MessageInput>,
) -> ApiResult<Response> {
    let text = body.into_text().map_err(ApiError::BadRequest)?;
    record_message(&app, &actor, &id, &text, true).await;
    let upstream = app.message_stream(&id, &text).await?;
    let stream = upstream.bytes_stream().map(|r| r.map_err(std::io::Error::other));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .map_err(|e| ApiError::Internal(e.to_string()))
}

/// SSE of this session: `session` events (the current state first, then every change) and,
/// once it is ready, `agent` events (the agent CLI's own event stream, from every message).
async fn session_events(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let rx = app.subscribe();
    let current = app.session_view(&app.get_session(&id).await?);
    let agent = crate::agent_events::stream(app.clone(), id.clone(), current.status == crate::model::Status::Ready)
        .map(|e| Ok(Event::default().event(e.event).data(e.data)));
    let first = stream::once(async move { current });
    let updates = stream::unfold(rx, move |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(v) => return Some((v, rx)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    let id2 = id.clone();
    let events = first
        .chain(updates.filter(move |v| std::future::ready(v.id == id2)))
        .map(|v| {
            Ok(Event::default()
                .event("session")
                .json_data(&v)
                .unwrap_or_else(|_| Event::default().data("{}")))
        });
    Ok(Sse::new(stream::select(events, agent)).keep_alive(KeepAlive::default()))
}

/// `?source=harness|vault&tail=N` of `GET /sessions/{id}/logs`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LogsQuery {
    source: Option<String>,
    tail: Option<i64>,
}

/// Most lines one `/logs` call returns.
const MAX_LOG_TAIL: i64 = 10_000;

/// `GET /sessions/{id}/logs?source=harness|vault&tail=200`: `{"session_id","source","lines":[…]}`,
/// the log's last `tail` lines (default 200), live or kept after the session stopped.
async fn session_logs(
    State(app): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<LogsQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    let Query(q) = q?;
    let source = match q.source.as_deref() {
        None => crate::backend::LogSource::Harness,
        Some(s) => crate::backend::LogSource::parse(s)
            .ok_or_else(|| ApiError::BadRequest(format!("source: `{s}` is not one of harness, vault")))?,
    };
    let tail = q.tail.unwrap_or(200);
    if !(1..=MAX_LOG_TAIL).contains(&tail) {
        return Err(ApiError::BadRequest(format!("tail: must be from 1 to {MAX_LOG_TAIL}")));
    }
    Ok(Json(app.logs(&id, source, usize::try_from(tail).unwrap_or(200)).await?))
}

async fn interceptions(State(app): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    Ok(Json(app.interceptions(&id).await?))
}

/// `GET /api/v1/audit?session_id=&agent_id=&secret=&kind=&limit=&offset=`: interceptions and
/// admin actions, oldest first.
async fn audit(
    State(app): State<AppState>,
    q: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Page<AuditView>>> {
    let Query(q) = q?;
    let (limit, offset) = page_bounds(&PageQuery {
        limit: q.limit,
        offset: q.offset,
        ..PageQuery::default()
    })?;
    let filter = AuditFilter {
        session_id: q.session_id,
        agent_id: q.agent_id,
        secret: q.secret,
        kind: q.kind,
    };
    let (rows, total) = app.audit(&filter, limit, offset).await?;
    Ok(Json(Page {
        data: rows.iter().map(|r| r.view()).collect(),
        total,
        limit,
        offset,
    }))
}

// ---- secrets registry ----

async fn create_secret(
    State(app): State<AppState>,
    axum::Extension(actor): ActorExt,
    ApiJson(body): ApiJson<SecretInput>,
) -> ApiResult<Response> {
    let name = body
        .name
        .clone()
        .ok_or_else(|| ApiError::BadRequest("name: required".into()))?;
    let s = app.put_secret(&name, body, false).await?;
    app.record(
        "secret.create",
        &actor,
        None,
        None,
        std::slice::from_ref(&name),
        serde_json::json!({"hosts": s.hosts}),
    )
    .await;
    Ok((StatusCode::CREATED, Json(s.view())).into_response())
}

async fn list_secrets(
    State(app): State<AppState>,
    q: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Page<SecretView>>> {
    let Query(q) = q?;
    let (limit, offset) = page_bounds(&q)?;
    let (secrets, total) = app.list_secrets(limit, offset).await?;
    Ok(Json(Page {
        data: secrets.iter().map(|s| s.view()).collect(),
        total,
        limit,
        offset,
    }))
}

async fn get_secret(State(app): State<AppState>, Path(name): Path<String>) -> ApiResult<Json<SecretView>> {
    Ok(Json(app.get_secret(&name).await?.view()))
}

async fn put_secret(
    State(app): State<AppState>,
    axum::Extension(actor): ActorExt,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<SecretInput>,
) -> ApiResult<Json<SecretView>> {
    if let Some(n) = &body.name {
        if n != &name {
            return Err(ApiError::BadRequest("name: must match the name in the path".into()));
        }
    }
    let s = app.put_secret(&name, body, true).await?;
    app.record(
        "secret.update",
        &actor,
        None,
        None,
        std::slice::from_ref(&name),
        serde_json::json!({"hosts": s.hosts}),
    )
    .await;
    Ok(Json(s.view()))
}

async fn delete_secret(
    State(app): State<AppState>,
    axum::Extension(actor): ActorExt,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    let revoked = app.delete_secret(&name).await?;
    app.record(
        "secret.delete",
        &actor,
        None,
        None,
        std::slice::from_ref(&name),
        serde_json::json!({ "revoked_from_sessions": revoked }),
    )
    .await;
    Ok(StatusCode::NO_CONTENT)
}
