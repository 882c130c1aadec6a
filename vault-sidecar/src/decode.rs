//! Compressed responses, decoded so they can be redacted (issue 14, W02).
//!
//! A real value a bound host reflects must not reach the client in any representation, and a
//! compressed body hides it from the redactor. So on an intercepted request the sidecar offers
//! the upstream only the content codings it can decode ([`offer`]: `gzip`, `deflate` (the zlib
//! format, RFC 9110 §8.4.1.2), `br`, `zstd`), decodes what comes back ([`decoded`]) and hands the
//! client the identity body, redacted. A coding it cannot decode fails closed: the caller answers
//! 502 `undecodable-encoding` ([`codings`] names it).

use std::io;

use async_compression::tokio::bufread::{BrotliDecoder, GzipDecoder, ZlibDecoder, ZstdDecoder};
use http::HeaderValue;
use http_body_util::BodyExt;
use tokio::io::{AsyncBufRead, BufReader};
use tokio_util::io::{ReaderStream, StreamReader};

use crate::upstream::{BoxError, ProxyBody};

/// A content coding the sidecar decodes (RFC 9110 §8.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coding {
    Gzip,
    Deflate,
    Br,
    Zstd,
}

impl Coding {
    fn parse(name: &str) -> Option<Option<Self>> {
        match name.to_ascii_lowercase().as_str() {
            "identity" | "" => Some(None),
            "gzip" | "x-gzip" => Some(Some(Self::Gzip)),
            "deflate" => Some(Some(Self::Deflate)),
            "br" => Some(Some(Self::Br)),
            "zstd" => Some(Some(Self::Zstd)),
            _ => None,
        }
    }
}

/// The codings of a `Content-Encoding` value, in the order they were applied; `Err` names the
/// first one the sidecar cannot decode.
pub(crate) fn codings(value: &HeaderValue) -> Result<Vec<Coding>, String> {
    let text = value
        .to_str()
        .map_err(|_| "a Content-Encoding that is not ASCII".to_owned())?;
    let mut out = Vec::new();
    for name in text.split(',').map(str::trim) {
        match Coding::parse(name) {
            Some(Some(c)) => out.push(c),
            Some(None) => {}
            None => return Err(format!("the content coding `{name}`")),
        }
    }
    Ok(out)
}

/// What to offer the upstream for a client's `Accept-Encoding`: its codings the sidecar can
/// decode, with their weights (RFC 9110 §12.5.3); `None` when none is left (then no header: the
/// upstream answers identity).
pub(crate) fn offer(accept: &HeaderValue) -> Option<HeaderValue> {
    let text = accept.to_str().ok()?;
    let kept: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|item| {
            let name = item.split(';').next().unwrap_or("").trim();
            matches!(Coding::parse(name), Some(Some(_)))
        })
        .collect();
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_str(&kept.join(", ")).ok()
}

/// `body`, decoded from `codings` (applied in that order, so undone last to first), as a stream
/// of identity bytes. Trailers are dropped; a corrupt encoding ends the body with an error.
pub(crate) fn decoded(body: ProxyBody, codings: &[Coding]) -> ProxyBody {
    let frames = body.into_data_stream();
    let bytes = futures_util::StreamExt::map(frames, |r| r.map_err(io::Error::other));
    let mut reader: Box<dyn AsyncBufRead + Send + Unpin> = Box::new(StreamReader::new(bytes));
    for coding in codings.iter().rev() {
        reader = match coding {
            Coding::Gzip => {
                let mut d = GzipDecoder::new(reader);
                d.multiple_members(true);
                Box::new(BufReader::new(d))
            }
            Coding::Deflate => Box::new(BufReader::new(ZlibDecoder::new(reader))),
            Coding::Br => Box::new(BufReader::new(BrotliDecoder::new(reader))),
            Coding::Zstd => Box::new(BufReader::new(ZstdDecoder::new(reader))),
        };
    }
    let stream = futures_util::StreamExt::map(ReaderStream::new(reader), |r| {
        r.map(hyper::body::Frame::data).map_err(BoxError::from)
    });
    http_body_util::StreamBody::new(stream).boxed_unsync()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use bytes::Bytes;

    #[test]
    fn content_encoding_lists_are_read_in_order_and_unknown_codings_named() {
        let v = HeaderValue::from_static("gzip, identity, br");
        assert_eq!(codings(&v).unwrap(), vec![Coding::Gzip, Coding::Br]);
        assert_eq!(codings(&HeaderValue::from_static("ZSTD")).unwrap(), vec![Coding::Zstd]);
        assert_eq!(
            codings(&HeaderValue::from_static("compress")).unwrap_err(),
            "the content coding `compress`"
        );
    }

    #[test]
    fn only_decodable_codings_are_offered() {
        let v = HeaderValue::from_static("gzip;q=1.0, compress, br;q=0.5, *;q=0.1, exi");
        assert_eq!(offer(&v).unwrap(), "gzip;q=1.0, br;q=0.5");
        assert_eq!(offer(&HeaderValue::from_static("compress, exi")), None);
    }

    #[tokio::test]
    async fn stacked_codings_decode_to_the_original() {
        use std::io::Write;
        let original = b"hello sk-ant-REAL ".repeat(1000);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&original).unwrap();
        let once = gz.finish().unwrap();
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&once).unwrap();
        let twice = z.finish().unwrap();
        // Split into small chunks, as a network delivers it.
        let chunks: Vec<Result<hyper::body::Frame<Bytes>, BoxError>> = twice
            .chunks(7)
            .map(|c| Ok(hyper::body::Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(chunks)).boxed_unsync();
        let out = decoded(body, &[Coding::Gzip, Coding::Deflate])
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(&out[..], &original[..]);
    }
}
