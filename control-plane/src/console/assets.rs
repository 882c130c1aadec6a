//! The console's files, embedded in the binary at build time from `control-plane/console/`
//! (no CDN, nothing fetched at run time). `GET /` is the page, with a fresh style nonce in its
//! Content-Security-Policy on every response; `GET /assets/{path}` the rest, revalidated by
//! ETag. Compression (brotli, gzip) is the router's `CompressionLayer`.

use std::collections::HashMap;
use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::policy;
use crate::error::ApiError;

/// The page; `{{nonce}}` is replaced per response.
const INDEX: &str = include_str!("../../console/index.html");

macro_rules! asset {
    ($path:literal, $type:literal) => {
        (
            $path,
            $type,
            include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/console/", $path)).as_slice(),
        )
    };
}

/// Every file under `/assets/`: path, `Content-Type`, bytes.
const FILES: &[(&str, &str, &[u8])] = &[
    asset!("app.js", "text/javascript; charset=utf-8"),
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("vendor/xterm/xterm.mjs", "text/javascript; charset=utf-8"),
    asset!("vendor/xterm/xterm.css", "text/css; charset=utf-8"),
    asset!("vendor/xterm/addon-fit.mjs", "text/javascript; charset=utf-8"),
    asset!("vendor/xterm/LICENSE", "text/plain; charset=utf-8"),
    asset!("vendor/xterm/LICENSE.addon-fit", "text/plain; charset=utf-8"),
];

struct File {
    content_type: &'static str,
    body: &'static [u8],
    /// Weak (`W/"…"`): the same entity goes out brotli-, gzip- or not encoded.
    etag: HeaderValue,
}

static BY_PATH: LazyLock<HashMap<&'static str, File>> = LazyLock::new(|| {
    FILES
        .iter()
        .map(|(path, content_type, body)| {
            let hash: String = Sha256::digest(body)[..12].iter().map(|b| format!("{b:02x}")).collect();
            let etag = HeaderValue::from_str(&format!("W/\"{hash}\"")).unwrap_or(HeaderValue::from_static("*"));
            (
                *path,
                File {
                    content_type,
                    body,
                    etag,
                },
            )
        })
        .collect()
});

/// Whether `If-None-Match` names `etag` (weak comparison, RFC 9110 §13.1.2).
fn not_modified(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let opaque = |t: &str| t.trim().trim_start_matches("W/").to_owned();
    let ours = etag.to_str().map(opaque).unwrap_or_default();
    headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|tags| tags.split(',').any(|t| t.trim() == "*" || opaque(t) == ours))
}

/// `GET /`: the page, never cached (its nonce is new each time).
pub(super) async fn index() -> Response {
    let nonce = policy::random_token();
    let csp = policy::content_security_policy(&nonce);
    let Ok(csp) = HeaderValue::from_str(&csp) else {
        return ApiError::Internal("content security policy is not a header value".into()).into_response();
    };
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (header::CONTENT_SECURITY_POLICY, csp),
        ],
        INDEX.replace("{{nonce}}", &nonce),
    )
        .into_response()
}

/// `GET /assets/{path}`.
pub(super) async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    let Some(file) = BY_PATH.get(path.as_str()) else {
        return ApiError::NotFound(format!("asset `{path}`")).into_response();
    };
    let mut resp = if not_modified(&headers, &file.etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, file.content_type)], file.body).into_response()
    };
    let h = resp.headers_mut();
    h.insert(header::ETAG, file.etag.clone());
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_embedded_and_the_page_names_only_embedded_files() {
        assert_eq!(BY_PATH.len(), FILES.len());
        for (path, _, body) in FILES {
            assert!(!body.is_empty(), "{path}");
        }
        for part in INDEX.split("/assets/").skip(1) {
            let path = &part[..part.find('"').unwrap_or(0)];
            assert!(
                BY_PATH.contains_key(path),
                "index.html names /assets/{path}, which is not embedded"
            );
        }
        assert!(INDEX.contains("{{nonce}}"));
    }
}
