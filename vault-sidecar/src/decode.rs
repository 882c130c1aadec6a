//! Compressed responses, decoded so they can be redacted (issue 14, W02).
//!
//! A real value a bound host reflects must not reach the client in any representation, and a
//! compressed body hides it from the redactor. So on an intercepted request the sidecar offers
//! the upstream only the content codings it can decode ([`offer`]: `gzip`, `deflate` (the zlib
//! format, RFC 9110 §8.4.1.2), `br`, `zstd`), decodes what comes back ([`decoded`]) and hands the
//! client the identity body, redacted. A coding it cannot decode fails closed: the caller answers
//! 502 `undecodable-encoding` ([`codings`] names it).
//!
//! A compressed request body is forwarded as the client sent it, but the stub tripwire reads it
//! decoded ([`DecodingScanner`]): the same codings, decoded as the chunks go by, so a body toward
//! a host some stub is not bound to cannot hide that stub in gzip; the bytes as sent are scanned
//! too (a gzip file name is not part of what the body decodes to, but the host receives it). A coding the sidecar cannot
//! decode is refused (`415`), as is a body that does not decode.

use std::io::{self, Write};
use std::sync::{Arc, Mutex, PoisonError};

use async_compression::tokio::bufread::{BrotliDecoder, GzipDecoder, ZlibDecoder, ZstdDecoder};
use http::HeaderValue;
use http_body_util::BodyExt;
use tokio::io::{AsyncBufRead, BufReader};
use tokio_util::io::{ReaderStream, StreamReader};

use crate::rewrite::{Exfiltration, StubScanner};
use crate::secrets::SecretSet;
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
    fn name(self) -> &'static str {
        match self {
            Self::Gzip => "gzip",
            Self::Deflate => "deflate",
            Self::Br => "br",
            Self::Zstd => "zstd",
        }
    }

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

/// The codings of every `Content-Encoding` field in `headers`, combined in order as one list
/// (RFC 9110 §5.3: a field sent twice is the list of both); `Err` as [`codings`].
pub(crate) fn content_codings(headers: &http::HeaderMap) -> Result<Vec<Coding>, String> {
    let mut out = Vec::new();
    for value in headers.get_all(http::header::CONTENT_ENCODING) {
        out.extend(codings(value)?);
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

/// Why a [`DecodingScanner`] refused a chunk.
#[derive(Debug)]
pub(crate) enum ScanRefusal {
    /// The decoded bytes carry a stub the scanner refuses.
    Stub(Exfiltration),
    /// The bytes are not valid for their coding (a sentence for people).
    Corrupt(String),
}

/// The [`StubScanner`] at the end of a chain of write-side decoders, and what it found.
struct ScanState {
    scanner: StubScanner,
    secrets: Arc<SecretSet>,
    found: Option<Exfiltration>,
}

/// The innermost writer: decoded bytes go through the scanner; a stub ends the write with an error.
struct ScanSink(Arc<Mutex<ScanState>>);

impl Write for ScanSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let ScanState {
            scanner,
            secrets,
            found,
        } = &mut *state;
        match scanner.push(secrets, buf) {
            Ok(()) => Ok(buf.len()),
            Err(ex) => {
                *found = Some(ex);
                Err(io::Error::other("stub"))
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The stub tripwire over a compressed body: compressed chunks in ([`DecodingScanner::push`]),
/// decoded by the codings in turn (flate2, brotli, zstd), and the decoded bytes through a
/// [`StubScanner`]. Each chunk is decoded as far as it goes before `push` returns, so a stub is
/// found before the chunk that completes it is forwarded. Memory stays bounded by the decoders'
/// windows: the decoded bytes are scanned, not kept.
pub(crate) struct DecodingScanner {
    /// The bytes as they are on the wire: a container's own fields (a gzip file name or comment,
    /// a zstd skippable frame, brotli metadata) reach the host without decoding to anything.
    raw: StubScanner,
    secrets: Arc<SecretSet>,
    input: Box<dyn Write + Send>,
    state: Arc<Mutex<ScanState>>,
    codings: String,
    failed: bool,
}

impl DecodingScanner {
    /// `codings` as [`codings`] returns them (in the order they were applied).
    pub(crate) fn new(codings: &[Coding], scanner: StubScanner, secrets: Arc<SecretSet>) -> io::Result<Self> {
        let raw = scanner.clone();
        let state = Arc::new(Mutex::new(ScanState {
            scanner,
            secrets: secrets.clone(),
            found: None,
        }));
        // The first coding applied is undone last: it wraps the sink; the last applied takes the input.
        let mut w: Box<dyn Write + Send> = Box::new(ScanSink(state.clone()));
        for coding in codings {
            w = match coding {
                Coding::Gzip => Box::new(flate2::write::MultiGzDecoder::new(w)),
                Coding::Deflate => Box::new(flate2::write::ZlibDecoder::new(w)),
                Coding::Br => Box::new(brotli::DecompressorWriter::new(w, 4096)),
                Coding::Zstd => Box::new(zstd::stream::write::Decoder::new(w)?),
            };
        }
        let names: Vec<&str> = codings.iter().map(|c| c.name()).collect();
        Ok(Self {
            raw,
            secrets,
            input: w,
            state,
            codings: names.join(", "),
            failed: false,
        })
    }

    /// Scan the next compressed chunk as it is, then decoded.
    pub(crate) fn push(&mut self, compressed: &[u8]) -> Result<(), ScanRefusal> {
        self.raw.push(&self.secrets, compressed).map_err(ScanRefusal::Stub)?;
        if self.failed {
            return Err(ScanRefusal::Corrupt(format!(
                "the request body is not valid {}",
                self.codings
            )));
        }
        let wrote = self.input.write_all(compressed).and_then(|()| self.input.flush());
        wrote.map_err(|e| {
            self.failed = true;
            let found = self.state.lock().unwrap_or_else(PoisonError::into_inner).found.take();
            match found {
                Some(ex) => ScanRefusal::Stub(ex),
                None => {
                    tracing::debug!(error = %e, codings = %self.codings, "request body does not decode");
                    ScanRefusal::Corrupt(format!("the request body is not valid {}", self.codings))
                }
            }
        })
    }

    /// Scan bytes that are not compressed (trailers) with the same scanner.
    pub(crate) fn push_plain(&mut self, bytes: &[u8]) -> Result<(), Exfiltration> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let ScanState { scanner, secrets, .. } = &mut *state;
        scanner.push(secrets, bytes)
    }
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
