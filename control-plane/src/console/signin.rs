//! Signing in to the console: the master key, once, for a server-side sign-in kept in the
//! database (`console_sessions`, so every replica knows it) and named by an `HttpOnly`,
//! `SameSite=Strict` cookie; the key itself never reaches the page's storage.
//!
//! - `POST /console/session` `{"key"}` → `200 {csrf_token, idle_timeout_s, max_lifetime_s}` and the
//!   cookie; a wrong key is `401` naming the field.
//! - `GET /console/session` → the same answer while the sign-in lasts (after a reload the page
//!   gets its CSRF token back here), else `401`.
//! - `DELETE /console/session` (CSRF-checked) → `204`, the row and the cookie gone.
//!
//! [`authorize`] is what the API's auth middleware asks when a request has no Bearer key.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::policy::{self, Freshness};
use crate::api::ApiJson;
use crate::app::App;
use crate::error::ApiError;
use crate::model::now_ms;
use crate::store::StoreError;

/// Why a console request is refused.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// Neither a Bearer key nor a sign-in cookie: the API's own 401.
    #[error("no credentials")]
    NoCredentials,
    #[error("key: this is not the master key")]
    WrongKey,
    #[error("your console sign-in has ended (signed out, idle or too old): sign in again")]
    SignedOut,
    #[error(
        "missing or wrong X-CSRF-Token: changes made with the console's cookie must carry the token it got at sign-in"
    )]
    Csrf,
    #[error("refused: the browser says this request comes from another site")]
    OtherSite,
    #[error("database: {0}")]
    Store(#[from] StoreError),
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let status = match &self {
            Self::NoCredentials => return ApiError::Unauthorized.into_response(),
            Self::WrongKey | Self::SignedOut => StatusCode::UNAUTHORIZED,
            Self::Csrf | Self::OtherSite => StatusCode::FORBIDDEN,
            Self::Store(e) => return ApiError::Internal(e.to_string()).into_response(),
        };
        (status, Json(serde_json::json!({ "error": self.to_string() }))).into_response()
    }
}

/// A signed-in request's sign-in.
#[derive(Debug)]
pub struct SignedIn {
    cookie_value: String,
}

/// Whether a request without a Bearer key is a signed-in console's: a live sign-in cookie, not
/// from another site, and — unless `method` is safe (GET, HEAD, OPTIONS, TRACE) — the sign-in's
/// CSRF token in [`policy::CSRF_HEADER`].
pub async fn authorize(app: &App, method: &Method, headers: &HeaderMap) -> Result<SignedIn, ConsoleError> {
    let value = policy::cookie_value(headers).ok_or(ConsoleError::NoCredentials)?;
    if policy::from_another_site(headers) {
        return Err(ConsoleError::OtherSite);
    }
    let key = policy::session_key(&value);
    let (created, last_seen) = app
        .store
        .get_console_session(&key)
        .await?
        .ok_or(ConsoleError::SignedOut)?;
    let now = now_ms();
    match policy::freshness(created, last_seen, now) {
        Freshness::Expired => {
            app.store.delete_console_session(&key).await?;
            return Err(ConsoleError::SignedOut);
        }
        Freshness::Touch => app.store.touch_console_session(&key, now).await?,
        Freshness::Fresh => {}
    }
    if !method.is_safe() {
        let presented = headers
            .get(policy::CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !policy::csrf_matches(&value, presented) {
            return Err(ConsoleError::Csrf);
        }
    }
    Ok(SignedIn { cookie_value: value })
}

/// `POST /console/session` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SignInBody {
    key: String,
}

fn signed_in_body(cookie_value: &str) -> serde_json::Value {
    serde_json::json!({
        "csrf_token": policy::csrf_token(cookie_value),
        "idle_timeout_s": policy::IDLE_TIMEOUT.as_secs(),
        "max_lifetime_s": policy::MAX_LIFETIME.as_secs(),
    })
}

fn set_cookie(c: &cookie::Cookie<'_>) -> Result<HeaderValue, ApiError> {
    HeaderValue::from_str(&c.to_string()).map_err(|e| ApiError::Internal(format!("cookie: {e}")))
}

/// `POST /console/session`.
pub(super) async fn sign_in(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<SignInBody>,
) -> Result<Response, Response> {
    if policy::from_another_site(&headers) {
        return Err(ConsoleError::OtherSite.into_response());
    }
    if !app.authorized(&body.key) {
        tracing::warn!("console sign-in refused: not the master key");
        return Err(ConsoleError::WrongKey.into_response());
    }
    let now = now_ms();
    let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let prune = app
        .store
        .prune_console_sessions(now - ms(policy::IDLE_TIMEOUT), now - ms(policy::MAX_LIFETIME))
        .await;
    if let Err(e) = prune {
        tracing::warn!(error = %e, "cannot prune ended console sign-ins");
    }
    let value = policy::random_token();
    app.store
        .insert_console_session(&policy::session_key(&value), now)
        .await
        .map_err(|e| ConsoleError::from(e).into_response())?;
    tracing::info!("console sign-in");
    let cookie = set_cookie(&policy::signin_cookie(&value, policy::browser_uses_tls(&headers)))
        .map_err(IntoResponse::into_response)?;
    Ok((
        [
            (header::SET_COOKIE, cookie),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        Json(signed_in_body(&value)),
    )
        .into_response())
}

/// `GET /console/session`.
pub(super) async fn current(State(app): State<Arc<App>>, method: Method, headers: HeaderMap) -> Response {
    match authorize(&app, &method, &headers).await {
        Ok(s) => (
            [(header::CACHE_CONTROL, "no-store")],
            Json(signed_in_body(&s.cookie_value)),
        )
            .into_response(),
        Err(ConsoleError::NoCredentials) => ConsoleError::SignedOut.into_response(),
        Err(e) => e.into_response(),
    }
}

/// `DELETE /console/session`.
pub(super) async fn sign_out(State(app): State<Arc<App>>, method: Method, headers: HeaderMap) -> Response {
    match authorize(&app, &method, &headers).await {
        Ok(signed_in) => {
            let key = policy::session_key(&signed_in.cookie_value);
            if let Err(e) = app.store.delete_console_session(&key).await {
                return ConsoleError::from(e).into_response();
            }
            tracing::info!("console sign-out");
        }
        // Already ended: only the cookie is left to remove.
        Err(ConsoleError::SignedOut) => {}
        Err(e) => return e.into_response(),
    }
    match set_cookie(&policy::removal_cookie(policy::browser_uses_tls(&headers))) {
        Ok(c) => (StatusCode::NO_CONTENT, [(header::SET_COOKIE, c)]).into_response(),
        Err(e) => e.into_response(),
    }
}
