//! The web console (docs/console.md): a single page served at `/` by `lap-server` itself, on
//! the API's own origin, calling only the REST API (`/api/v1/…`), its event streams and the
//! sessions' terminal WebSocket. Its files are in `control-plane/console/`, embedded at build
//! time.
//!
//! Start at [`router`]. [`assets`] serves the page and its files; [`signin`] turns the master
//! key into a cookie-named, server-side sign-in and answers the API's auth middleware
//! ([`authorize`]); [`policy`] holds the pure security decisions (CSP, cookie, CSRF, expiry).

mod assets;
mod policy;
mod signin;

use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use tower_http::compression::CompressionLayer;
use tower_http::set_header::SetResponseHeaderLayer;

use crate::app::App;
use crate::settings::{BackendKind, Settings};

pub use policy::{COOKIE_NAME, CSRF_HEADER};
pub use signin::{authorize, ConsoleError, SignedIn};

/// What the platform page shows about this server (never a key, a URL or a path).
#[derive(Debug, Clone, Serialize)]
pub struct Platform {
    pub version: &'static str,
    /// `local` or `kubernetes`.
    pub backend: &'static str,
    /// `sqlite` or `postgres`.
    pub database: &'static str,
}

impl Platform {
    pub fn from_settings(settings: &Settings) -> Self {
        let postgres = settings
            .database_url
            .as_deref()
            .is_some_and(|u| u.starts_with("postgres:") || u.starts_with("postgresql:"));
        Self {
            version: env!("CARGO_PKG_VERSION"),
            backend: match settings.backend {
                BackendKind::Local => "local",
                BackendKind::Kubernetes => "kubernetes",
            },
            database: if postgres { "postgres" } else { "sqlite" },
        }
    }
}

#[derive(Clone, FromRef)]
struct ConsoleState {
    app: Arc<App>,
    platform: Arc<Platform>,
}

/// The console's routes: `/` and `/assets/…` (compressed), `/console/session` (sign in, out,
/// and the current sign-in) and `/console/platform`. Merge it beside [`crate::api::router`],
/// whose Bearer check accepts a console sign-in too.
pub fn router(app: Arc<App>, platform: Platform) -> Router {
    let files = Router::new()
        .route("/", get(assets::index))
        .route("/assets/{*path}", get(assets::asset))
        // brotli and gzip: the encodings tower-http is built with here.
        .layer(CompressionLayer::new());
    let state = ConsoleState {
        app,
        platform: Arc::new(platform),
    };
    Router::new()
        .route(
            "/console/session",
            get(signin::current).post(signin::sign_in).delete(signin::sign_out),
        )
        .route("/console/platform", get(platform_info))
        .merge(files)
        .layer(SetResponseHeaderLayer::overriding(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::X_FRAME_OPTIONS,
            HeaderValue::from_static("DENY"),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::HeaderName::from_static("cross-origin-opener-policy"),
            HeaderValue::from_static("same-origin"),
        ))
        .with_state(state)
}

/// `GET /console/platform` (signed in): version, backend, database.
async fn platform_info(
    State(app): State<Arc<App>>,
    State(platform): State<Arc<Platform>>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    match authorize(&app, &method, &headers).await {
        Ok(_) => Json(platform.as_ref().clone()).into_response(),
        Err(ConsoleError::NoCredentials) => ConsoleError::SignedOut.into_response(),
        Err(e) => e.into_response(),
    }
}
