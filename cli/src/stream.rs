//! Reading a `message_stream` reply (pure): the text in each agent event (claude `stream-json`,
//! codex `--json`). The server-sent events themselves are read by `lap_sse::SseReader`.

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
