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
    /// An extractor's rejection, with its own status (a body over the limit stays 413).
    #[error("{message}")]
    Rejected { status: StatusCode, message: String },
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
            Self::Rejected { status, .. } => *status,
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

/// Every extractor's rejection keeps its status (413 for a body over the limit, 415 for a wrong
/// content type, …), with its message, except axum's 422 for a body that parses but does not
/// fit the shape: that is a validation error, 400 naming the field like every other (SPEC §3.2).
macro_rules! rejections {
    ($($t:ty),*) => {$(
        impl From<$t> for ApiError {
            fn from(e: $t) -> Self {
                let status = match e.status() {
                    StatusCode::UNPROCESSABLE_ENTITY => StatusCode::BAD_REQUEST,
                    other => other,
                };
                Self::Rejected { status, message: e.body_text() }
            }
        }
    )*};
}

rejections!(
    axum::extract::rejection::JsonRejection,
    axum::extract::rejection::QueryRejection,
    axum::extract::rejection::PathRejection,
    axum::extract::rejection::BytesRejection
);
