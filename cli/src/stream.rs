//! Reading a `message_stream` reply (pure): server-sent events, and the text in each agent
//! event (claude `stream-json`, codex `--json`).

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    pub(crate) event: String,
    pub(crate) data: String,
}

/// Incremental SSE parser: feed chunks as they arrive, get whole events.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    /// Bytes not yet part of a whole event (kept as bytes: a chunk may end inside a character).
    buf: Vec<u8>,
}

impl SseParser {
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
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

/// The reply text an agent event carries, if any: claude's `assistant` text blocks, codex's
/// `agent_message` items.
pub(crate) fn agent_text(event: &serde_json::Value) -> Option<String> {
    match event.get("type").and_then(|t| t.as_str())? {
        "assistant" => {
            let texts: Vec<&str> = event
                .pointer("/message/content")?
                .as_array()?
                .iter()
                .filter(|b| b["type"] == "text")
                .filter_map(|b| b["text"].as_str())
                .collect();
            (!texts.is_empty()).then(|| texts.join("\n"))
        }
        "item.completed" => {
            let item = &event["item"];
            (item["type"] == "agent_message")
                .then(|| item["text"].as_str().map(str::to_owned))
                .flatten()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sse_across_chunks() {
        let mut p = SseParser::default();
        assert!(p.feed(b"event: agent\ndata: {\"a\"").is_empty());
        let ev = p.feed(b":1}\n\nevent: message\r\ndata: x\r\n\r\n: comment\n\n");
        assert_eq!(
            ev,
            vec![
                SseEvent {
                    event: "agent".into(),
                    data: "{\"a\":1}".into()
                },
                SseEvent {
                    event: "message".into(),
                    data: "x".into()
                }
            ]
        );
    }

    #[test]
    fn a_character_split_across_chunks_survives() {
        let text = "event: agent\ndata: {\"text\":\"✓ done 😀\"}\n\n".as_bytes();
        for cut in 0..=text.len() {
            let mut p = SseParser::default();
            let mut got = p.feed(&text[..cut]);
            got.extend(p.feed(&text[cut..]));
            assert_eq!(got.len(), 1, "cut at {cut}");
            assert_eq!(got[0].data, "{\"text\":\"✓ done 😀\"}", "cut at {cut}");
        }
    }

    #[test]
    fn texts_of_agent_events() {
        let claude: serde_json::Value = serde_json::from_str(
            r#"{"type":"assistant","message":{"content":[{"type":"text","text":"Hi"},{"type":"tool_use"}]}}"#,
        )
        .unwrap();
        assert_eq!(agent_text(&claude).as_deref(), Some("Hi"));
        let codex: serde_json::Value =
            serde_json::from_str(r#"{"type":"item.completed","item":{"type":"agent_message","text":"Done"}}"#).unwrap();
        assert_eq!(agent_text(&codex).as_deref(), Some("Done"));
        let other: serde_json::Value = serde_json::from_str(r#"{"type":"system"}"#).unwrap();
        assert_eq!(agent_text(&other), None);
    }
}
