//! The agent's own event stream for `GET /sessions/{id}/events`: the harness's `GET /events`
//! (SSE, one `agent` event per JSON line the CLI prints: claude `stream-json`, codex `--json`),
//! read as soon as the session is ready and re-emitted event by event, so it interleaves cleanly
//! with the session's state events.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::{self, Stream, StreamExt};
use tokio::sync::broadcast;

use crate::app::App;
use crate::model::{SessionView, Status};

/// One server-sent event: its `event:` name and `data:` lines joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

/// An incremental SSE reader (pure): feed chunks as they come, take whole events.
#[derive(Debug, Default)]
pub struct SseReader {
    /// Bytes not yet part of a whole event (kept as bytes: a chunk may end inside a character).
    buf: Vec<u8>,
}

impl SseReader {
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        loop {
            // An event ends at a blank line: "\n\n", "\r\n\r\n" (or a mix).
            let end = (0..self.buf.len()).find_map(|i| {
                let rest = &self.buf[i..];
                [&b"\n\n"[..], b"\r\n\r\n", b"\n\r\n", b"\r\n\n"]
                    .iter()
                    .find(|sep| rest.starts_with(sep))
                    .map(|sep| i + sep.len())
            });
            let Some(end) = end else { break };
            let block: Vec<u8> = self.buf.drain(..end).collect();
            let block = String::from_utf8_lossy(&block);
            let mut event = String::from("message");
            let mut data: Vec<&str> = Vec::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim_start().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            if !data.is_empty() {
                out.push(SseEvent {
                    event,
                    data: data.join("\n"),
                });
            }
        }
        out
    }
}

type Body = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

enum State {
    /// Until the session is ready.
    Waiting(broadcast::Receiver<SessionView>),
    Streaming(Body, SseReader, VecDeque<SseEvent>),
}

/// The agent events of session `id`: empty until it is ready (then from the harness), ending
/// when the harness's stream ends or the session ends before becoming ready.
pub fn stream(app: Arc<App>, id: String, ready_now: bool) -> impl Stream<Item = SseEvent> + Send {
    let rx = app.subscribe();
    let start = (app, id, ready_now, State::Waiting(rx));
    stream::unfold(start, |(app, id, mut ready, mut state)| async move {
        loop {
            state = match state {
                State::Waiting(mut rx) => {
                    if !ready {
                        match rx.recv().await {
                            Ok(v) if v.id == id && v.status == Status::Ready => {}
                            Ok(v) if v.id == id && v.status.is_terminal() => return None,
                            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                                ready = app.get_session(&id).await.is_ok_and(|s| s.status == Status::Ready);
                                state = State::Waiting(rx);
                                continue;
                            }
                            Err(broadcast::error::RecvError::Closed) => return None,
                        }
                    }
                    match app.harness_events(&id).await {
                        Ok(resp) => {
                            State::Streaming(Box::pin(resp.bytes_stream()), SseReader::default(), VecDeque::new())
                        }
                        Err(e) => {
                            tracing::debug!(session = %id, error = %e, "no agent events");
                            return None;
                        }
                    }
                }
                State::Streaming(mut body, mut reader, mut pending) => {
                    if let Some(ev) = pending.pop_front() {
                        return Some((ev, (app, id, ready, State::Streaming(body, reader, pending))));
                    }
                    match body.next().await {
                        Some(Ok(chunk)) => pending.extend(reader.feed(&chunk)),
                        _ => return None,
                    }
                    State::Streaming(body, reader, pending)
                }
            };
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any split of a stream into chunks gives the same events.
        #[test]
        fn any_chunking_gives_the_same_events(
            datas in proptest::collection::vec("[a-z{}\":, ✓é😀]{0,20}", 1..6),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
            crlf in any::<bool>(),
        ) {
            let nl = if crlf { "\r\n" } else { "\n" };
            let text: String = datas
                .iter()
                .map(|d| format!("event: agent{nl}data: {d}{nl}{nl}"))
                .collect();
            let bytes = text.as_bytes();
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
            points.sort_unstable();
            let mut r = SseReader::default();
            let mut got = Vec::new();
            let mut from = 0;
            for p in points.into_iter().chain([bytes.len()]) {
                got.extend(r.feed(&bytes[from..p]));
                from = p;
            }
            let want: Vec<SseEvent> = datas
                .iter()
                .map(|d| SseEvent { event: "agent".into(), data: d.clone() })
                .collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn sse_events_across_chunks() {
        let mut r = SseReader::default();
        assert!(r.feed(b"event: agent\ndata: {\"type\"").is_empty());
        assert_eq!(
            r.feed(b":\"system\"}\n\n:keep-alive\n\nevent: agent\r\ndata: 2\r\n\r\n"),
            vec![
                SseEvent {
                    event: "agent".into(),
                    data: "{\"type\":\"system\"}".into()
                },
                SseEvent {
                    event: "agent".into(),
                    data: "2".into()
                }
            ]
        );
    }
}
