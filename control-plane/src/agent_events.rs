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

pub use lap_sse::{SseEvent, SseReader};

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
