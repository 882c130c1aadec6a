//! Server-sent events read incrementally (pure): feed chunks as they arrive, take whole events.
//!
//! The subset LAP's streams use, after the HTML Living Standard, §9.2.6 "Interpreting an event
//! stream": an event ends at a blank line (`\n`, `\r\n`); `event:` names it (default `message`);
//! its `data:` lines are joined by `\n`, one leading space after the colon dropped; lines starting
//! with `:` (comments, keep-alives) and other fields (`id:`, `retry:`) are ignored; a block
//! without `data:` dispatches nothing. Bytes are buffered until an event is whole, so a chunk may
//! end anywhere, inside a character too; invalid UTF-8 becomes U+FFFD.
#![warn(unreachable_pub)]

/// One server-sent event: its `event:` name and `data:` lines joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

/// An incremental SSE reader.
#[derive(Debug, Default)]
pub struct SseReader {
    /// Bytes not yet part of a whole event.
    buf: Vec<u8>,
    /// Where the search for the blank line ending the next event resumes.
    scanned: usize,
}

impl SseReader {
    /// Add `chunk` and return the events it completes, in order.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(end) = self.event_end() {
            let block: Vec<u8> = self.buf.drain(..end).collect();
            self.scanned = 0;
            if let Some(event) = parse_block(&String::from_utf8_lossy(&block)) {
                out.push(event);
            }
        }
        out
    }

    /// The end of the first whole event (just past its blank line), if the buffer holds one.
    fn event_end(&mut self) -> Option<usize> {
        // A blank line is a line ending right after another: "\n\n", "\r\n\r\n" or a mix.
        let from = self.scanned.saturating_sub(3);
        let found = (from..self.buf.len()).find_map(|i| {
            let rest = &self.buf[i..];
            [&b"\n\n"[..], b"\r\n\r\n", b"\n\r\n", b"\r\n\n"]
                .iter()
                .find(|sep| rest.starts_with(sep))
                .map(|sep| i + sep.len())
        });
        if found.is_none() {
            self.scanned = self.buf.len();
        }
        found
    }
}

fn parse_block(block: &str) -> Option<SseEvent> {
    let mut event = String::from("message");
    let mut data: Vec<&str> = Vec::new();
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            event = v.strip_prefix(' ').unwrap_or(v).to_owned();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    (!data.is_empty()).then(|| SseEvent {
        event,
        data: data.join("\n"),
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
    fn events_across_chunks_comments_and_line_endings() {
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

    #[test]
    fn a_character_split_across_chunks_survives() {
        let text = "event: agent\ndata: {\"text\":\"✓ done 😀\"}\n\n".as_bytes();
        for cut in 0..=text.len() {
            let mut r = SseReader::default();
            let mut got = r.feed(&text[..cut]);
            got.extend(r.feed(&text[cut..]));
            assert_eq!(got.len(), 1, "cut at {cut}");
            assert_eq!(got[0].data, "{\"text\":\"✓ done 😀\"}", "cut at {cut}");
        }
    }

    #[test]
    fn multi_line_data_is_joined_and_other_fields_ignored() {
        let mut r = SseReader::default();
        assert_eq!(
            r.feed(b"id: 7\nretry: 10\ndata: a\ndata:b\n\nevent: only-a-name\n\n"),
            vec![SseEvent {
                event: "message".into(),
                data: "a\nb".into()
            }]
        );
    }

    #[test]
    fn a_blank_line_split_across_chunks_is_found() {
        let mut r = SseReader::default();
        assert!(r.feed(b"data: x\r\n\r").is_empty());
        assert_eq!(r.feed(b"\n").len(), 1);
    }
}
