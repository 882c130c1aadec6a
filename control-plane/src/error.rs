//! The HTTP edge's error: one status per variant, `{"error": "<message>"}` bodies, internals
//! logged and not sent.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::crypto::CryptoError;
use crate::env_vars::EnvVarError;
use crate::store::StoreError;

/// An API failure.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the message names the field.
    #[error("{0}")]
    BadRequest(String),
    #[error("missing or wrong API key: send Authorization: Bearer <MASTER_KEY>")]
    Unauthorized,
    #[error("missing or wrong terminal token: send this session's tty_token as ?token= or Authorization: Bearer")]
    TtyUnauthorized,
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// 502: the harness or sidecar did not answer.
    #[error("{0}")]
    BadGateway(String),
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized | Self::TtyUnauthorized => StatusCode::UNAUTHORIZED,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::BadGateway(_) => StatusCode::BAD_GATEWAY,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Self::Internal(detail) = &self {
            tracing::error!(error = %detail, "internal error");
        }
        (self.status(), Json(serde_json::json!({ "error": self.to_string() }))).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict => Self::Conflict("a resource with this name already exists".into()),
            other => Self::Internal(other.to_string()),
        }
    }
}

impl From<CryptoError> for ApiError {
    fn from(e: CryptoError) -> Self {
        Self::Internal(e.to_string())
    }
}

impl From<EnvVarError> for ApiError {
    fn from(e: EnvVarError) -> Self {
        Self::BadRequest(e.to_string())
    }
}

/// JSON body rejections become 400s with serde's message (which names the field).
impl From<axum::extract::rejection::JsonRejection> for ApiError {
    fn from(e: axum::extract::rejection::JsonRejection) -> Self {
        Self::BadRequest(e.body_text())
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(e: axum::extract::rejection::QueryRejection) -> Self {
        Self::BadRequest(e.body_text())
    }
}
