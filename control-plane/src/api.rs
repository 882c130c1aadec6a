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
use crate::error::ApiError;
use crate::model::{
    AgentView, CreateAgent, CreateSession, MessageInput, Page, PageQuery, PatchAgent, SecretInput, SecretView,
    SessionView, DEFAULT_LIMIT, MAX_LIMIT,
};

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
        .route("/sessions/{id}/events", get(session_events))
        .route("/sessions/{id}/interceptions", get(interceptions));
    let secrets = Router::new()
        .route("/", post(create_secret).get(list_secrets))
        .route("/{name}", get(get_secret).put(put_secret).delete(delete_secret));
    let authed = Router::new()
        .nest("/api/v1/managed_agents", agents)
        .nest("/api/v1/secrets", secrets)
        .route_layer(middleware::from_fn_with_state(app.clone(), require_bearer));
    Router::new()
        .route("/health", get(health))
        // Authorised by the session's own tty_token, not the master key.
        .route("/api/v1/managed_agents/sessions/{id}/tty", get(crate::tty::tty))
        .route("/metrics", get(metrics))
        .merge(authed)
        .fallback(|| async { ApiError::NotFound("route".into()) })
        .layer(middleware::from_fn_with_state(app.clone(), count_requests))
        .with_state(app)
}

async fn count_requests(State(app): State<AppState>, req: Request, next: Next) -> Response {
    app.metrics.http_requests.inc();
    next.run(req).await
}

/// `Authorization: Bearer <MASTER_KEY>`, compared in constant time; without one, a signed-in
/// web console's cookie (CSRF-checked for writes, [`crate::console::authorize`]).
async fn require_bearer(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    match presented {
        Some(key) if app.authorized(key) => next.run(req).await,
        Some(_) => ApiError::Unauthorized.into_response(),
        None => match crate::console::authorize(&app, req.method(), req.headers()).await {
            Ok(_) => next.run(req).await,
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

async fn create_agent(State(app): State<AppState>, ApiJson(body): ApiJson<CreateAgent>) -> ApiResult<Response> {
    let agent = app.create_agent(body).await?;
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
    Path(id): Path<String>,
    ApiJson(body): ApiJson<PatchAgent>,
) -> ApiResult<Json<AgentView>> {
    Ok(Json(app.patch_agent(&id, body).await?.view()))
}

async fn delete_agent(State(app): State<AppState>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    app.delete_agent(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

// ---- sessions ----

async fn create_session(
    State(app): State<AppState>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    // The body is optional: no body means no title, prompt or env_vars.
    let req: CreateSession = if body.iter().all(u8::is_ascii_whitespace) {
        CreateSession::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))?
    };
    let session = app.create_session(&id, req).await?;
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

async fn delete_session(State(app): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<SessionView>> {
    Ok(Json(app.session_view(&app.stop_session(&id).await?)))
}

async fn send_message(
    State(app): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<MessageInput>,
) -> ApiResult<Json<serde_json::Value>> {
    Ok(Json(app.send_message(&id, &body.text).await?))
}

async fn message_stream(
    State(app): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<MessageInput>,
) -> ApiResult<Response> {
    let upstream = app.message_stream(&id, &body.text).await?;
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

async fn interceptions(State(app): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    Ok(Json(app.interceptions(&id).await?))
}

// ---- secrets registry ----

async fn create_secret(State(app): State<AppState>, ApiJson(body): ApiJson<SecretInput>) -> ApiResult<Response> {
    let name = body
        .name
        .clone()
        .ok_or_else(|| ApiError::BadRequest("name: required".into()))?;
    let s = app.put_secret(&name, body, false).await?;
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
    Path(name): Path<String>,
    ApiJson(body): ApiJson<SecretInput>,
) -> ApiResult<Json<SecretView>> {
    if let Some(n) = &body.name {
        if n != &name {
            return Err(ApiError::BadRequest("name: must match the name in the path".into()));
        }
    }
    Ok(Json(app.put_secret(&name, body, true).await?.view()))
}

async fn delete_secret(State(app): State<AppState>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    app.delete_secret(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
