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
    buf: String,
}

impl SseReader {
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        self.buf.push_str(&String::from_utf8_lossy(chunk));
        if self.buf.contains('\r') {
            self.buf = self.buf.replace("\r\n", "\n");
        }
        let mut out = Vec::new();
        while let Some(end) = self.buf.find("\n\n") {
            let block: String = self.buf.drain(..end + 2).collect();
            let mut event = "message".to_owned();
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim_start().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
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
