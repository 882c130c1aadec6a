//! Streaming bodies: stub swapping / redaction on data frames, byte counting, and a hook that runs
//! once when the body ends or is dropped (audit, metrics). Nothing here buffers a whole body.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::decode::{DecodingScanner, ScanRefusal};
use crate::rewrite::{StreamRewriter, StubScanner};
use crate::secrets::SecretSet;
use crate::upstream::BoxError;

/// Called once with the rewriter's hits (by pattern id) when the body ends or is dropped.
pub(crate) type OnEnd = Box<dyn FnOnce(&[u64]) + Send>;

pin_project! {
    /// A body passed through an optional [`StreamRewriter`], counting the bytes it yields.
    pub struct StreamBody<B> {
        #[pin]
        inner: B,
        rewriter: Option<StreamRewriter>,
        counter: Arc<AtomicU64>,
        trailers: Option<HeaderMap>,
        // Trailer values with a real value get its stub (W03).
        redact_trailers: Option<Arc<SecretSet>>,
        // The stub tripwire over a request body that streams.
        tripwire: Option<Tripwire>,
        done: bool,
        on_end: Option<OnEnd>,
    }

    impl<B> PinnedDrop for StreamBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(f) = this.on_end.take() {
                let hits = this.rewriter.as_ref().map(|r| r.hits().to_vec()).unwrap_or_default();
                f(&hits);
            }
        }
    }
}

impl<B> StreamBody<B> {
    pub(crate) fn new(
        inner: B,
        rewriter: Option<StreamRewriter>,
        counter: Arc<AtomicU64>,
        on_end: Option<OnEnd>,
    ) -> Self {
        Self {
            inner,
            rewriter,
            counter,
            trailers: None,
            redact_trailers: None,
            tripwire: None,
            done: false,
            on_end,
        }
    }

    /// Redact real values in the trailers too (a response's trailers reach the client).
    pub(crate) fn redacting_trailers(mut self, secrets: Arc<SecretSet>) -> Self {
        self.redact_trailers = Some(secrets);
        self
    }

    /// Look at every data frame and trailer through `tripwire` before it goes on: the first stub
    /// it refuses ends the body with an error (the upstream request is reset) and goes to
    /// `tripwire.on_trip`.
    pub(crate) fn with_tripwire(mut self, tripwire: Tripwire) -> Self {
        self.tripwire = Some(tripwire);
        self
    }
}

/// Called with what a [`Tripwire`] refused (once: the body ends there).
pub(crate) type OnTrip = Box<dyn FnOnce(ScanRefusal) + Send>;

/// What a [`Tripwire`] reads a streaming request body with.
pub(crate) enum Scan {
    /// An identity body: the bytes as they are.
    Plain(StubScanner),
    /// A compressed body (`Content-Encoding`): the bytes decoded, forwarded as they came.
    Decoding(DecodingScanner),
}

/// A scanner over a streaming request body, and what to do with the stub it refuses.
pub(crate) struct Tripwire {
    pub(crate) scan: Scan,
    pub(crate) secrets: Arc<SecretSet>,
    pub(crate) on_trip: Option<OnTrip>,
}

impl Tripwire {
    /// Look at the next data frame.
    fn check_data(&mut self, bytes: &[u8]) -> Result<(), BoxError> {
        let found = match &mut self.scan {
            Scan::Plain(s) => s.push(&self.secrets, bytes).map_err(ScanRefusal::Stub),
            Scan::Decoding(d) => d.push(bytes),
        };
        found.map_err(|r| self.tripped(r))
    }

    /// Look at a trailer's name or value (never compressed).
    fn check_plain(&mut self, bytes: &[u8]) -> Result<(), BoxError> {
        let found = match &mut self.scan {
            Scan::Plain(s) => s.push(&self.secrets, bytes),
            Scan::Decoding(d) => d.push_plain(bytes),
        };
        found.map_err(|ex| self.tripped(ScanRefusal::Stub(ex)))
    }

    fn tripped(&mut self, refusal: ScanRefusal) -> BoxError {
        let msg = match &refusal {
            ScanRefusal::Stub(ex) => format!(
                "the request body carries the stub of {}, which is not bound to this host",
                ex.secret
            ),
            ScanRefusal::Corrupt(reason) => reason.clone(),
        };
        if let Some(on_trip) = self.on_trip.take() {
            on_trip(refusal);
        }
        BoxError::from(msg)
    }
}

impl<B> Body for StreamBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        loop {
            if *this.done {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            match ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        if let Some(Err(e)) = this.tripwire.as_mut().map(|t| t.check_data(&data)) {
                            *this.done = true;
                            return Poll::Ready(Some(Err(e)));
                        }
                        let out = match this.rewriter.as_mut() {
                            Some(rw) => rw.push(data),
                            None => data,
                        };
                        if out.is_empty() {
                            continue;
                        }
                        this.counter.fetch_add(out.len() as u64, Ordering::Relaxed);
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                    Err(frame) => {
                        // Trailers end the body: flush what the rewriter holds first.
                        *this.done = true;
                        *this.trailers = frame.into_trailers().ok();
                        if let (Some(t), Some(trailers)) = (this.tripwire.as_mut(), this.trailers.as_ref()) {
                            for (name, value) in trailers {
                                let checked = t
                                    .check_plain(name.as_str().as_bytes())
                                    .and_then(|()| t.check_plain(value.as_bytes()));
                                if let Err(e) = checked {
                                    *this.trailers = None;
                                    return Poll::Ready(Some(Err(e)));
                                }
                            }
                        }
                        if let (Some(secrets), Some(t)) = (this.redact_trailers.as_ref(), this.trailers.as_mut()) {
                            crate::rewrite::redact_headers(secrets, t);
                        }
                        if let Some(rest) = this.rewriter.as_mut().map(StreamRewriter::finish) {
                            if !rest.is_empty() {
                                this.counter.fetch_add(rest.len() as u64, Ordering::Relaxed);
                                return Poll::Ready(Some(Ok(Frame::data(rest))));
                            }
                        }
                    }
                },
                Some(Err(e)) => {
                    *this.done = true;
                    return Poll::Ready(Some(Err(e.into())));
                }
                None => {
                    *this.done = true;
                    if let Some(rest) = this.rewriter.as_mut().map(StreamRewriter::finish) {
                        if !rest.is_empty() {
                            this.counter.fetch_add(rest.len() as u64, Ordering::Relaxed);
                            return Poll::Ready(Some(Ok(Frame::data(rest))));
                        }
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rewriter.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        // A rewritten body's length is unknown until it has been read.
        if self.rewriter.is_none() {
            self.inner.size_hint()
        } else {
            SizeHint::default()
        }
    }
}

/// After an early final response (a `401` before the upload ended, RFC 9110 §15.5.2), the rest of
/// the client's request body is read and discarded for at most this long ...
pub(crate) const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// ... or this many bytes, so the client reads the response instead of a connection reset.
pub(crate) const DRAIN_LIMIT: u64 = 64 << 20;

/// A client request body that, when dropped unfinished (the upstream answered early), keeps
/// reading and discarding what the client still sends, within [`DRAIN_TIMEOUT`] and
/// [`DRAIN_LIMIT`]. Closing with unread bytes makes the kernel reset the connection, and clients
/// (curl with `Expect: 100-continue`) then lose the final status.
pub(crate) struct DrainOnDrop {
    inner: Option<hyper::body::Incoming>,
}

impl DrainOnDrop {
    pub(crate) fn new(inner: hyper::body::Incoming) -> Self {
        Self { inner: Some(inner) }
    }
}

impl Body for DrainOnDrop {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.inner.as_mut() {
            Some(inner) => Pin::new(inner).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.as_ref().map(Body::size_hint).unwrap_or_default()
    }
}

impl Drop for DrainOnDrop {
    fn drop(&mut self) {
        let Some(mut inner) = self.inner.take().filter(|b| !b.is_end_stream()) else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        handle.spawn(async move {
            use http_body_util::BodyExt;
            let drain = async {
                let mut seen = 0u64;
                while let Some(Ok(frame)) = inner.frame().await {
                    seen += frame.data_ref().map_or(0, |d| d.len() as u64);
                    if seen > DRAIN_LIMIT {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody as FrameStream};
    use std::convert::Infallible;
    use std::sync::Mutex;

    #[tokio::test]
    async fn rewrites_across_frames_counts_bytes_and_reports_hits_once() {
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = ["ab", "cSTU", "B-1234", "5678 tail"]
            .iter()
            .map(|s| Ok(Frame::data(Bytes::from(*s))))
            .collect();
        let inner = FrameStream::new(futures_util::stream::iter(frames));
        let ac = crate::secrets::Finder::new(["STUB-12345678"]).expect("finder");
        let rw = StreamRewriter::new(ac, vec![Bytes::from("STUB-12345678")], vec![Some(Bytes::from("REAL"))]);
        let counter = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        let body = StreamBody::new(
            inner,
            Some(rw),
            counter.clone(),
            Some(Box::new(move |h| seen2.lock().expect("lock").extend_from_slice(h))),
        );
        let out = body.collect().await.expect("collect").to_bytes();
        assert_eq!(&out[..], b"abcREAL tail");
        assert_eq!(counter.load(Ordering::Relaxed), 12);
        assert_eq!(*seen.lock().expect("lock"), vec![1]);
    }
}
