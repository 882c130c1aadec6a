//! The scripted model behind the stand-in ([`super::anthropic`]): what a model would answer to a
//! request of the Anthropic Messages API or the OpenAI Responses API, decided from the request
//! alone (pure), so a real agent CLI can be driven through a tool-using turn.
//!
//! The script, read from the latest user text of the conversation:
//! - `LAP-RUN: <command>` (to the end of the line) → one call of the CLI's shell tool
//!   (`Bash`/`bash` on Anthropic, `shell`/`exec_command`/`shell_command` on OpenAI) running it;
//! - `LAP-WRITE: <absolute path> = <content>` → one call of its file tool (`Write`/`write`; on
//!   OpenAI `apply_patch` adding the file);
//! - once the tool's result is the latest input: text quoting it, `Tool result: <result>`;
//! - otherwise the plain reply, followed by `(earlier tool results: …)` quoting every tool
//!   result still in the conversation, so a follow-up message shows continuity.
//!
//! A tool is only called when the request offers it (a title or summary request without tools
//! gets text).

use serde_json::{json, Value};

/// What the script does for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Turn {
    /// Call `tool` (the request's own name for it) with `input`.
    Call { tool: String, input: Value },
    /// Answer with text.
    Text(String),
}

/// A directive in the latest user text.
#[derive(Debug, Clone, PartialEq)]
enum Directive {
    Run(String),
    Write { path: String, content: String },
}

/// Ends a directive (a CLI may wrap the prompt, e.g. in quotes, after it).
pub const END: &str = ":LAP-END";

fn directive(text: &str) -> Option<Directive> {
    for line in text.lines() {
        let line = line.split_once(END).map_or(line, |(l, _)| l);
        if let Some(cmd) = line.split_once("LAP-RUN:").map(|(_, c)| c.trim()) {
            return Some(Directive::Run(cmd.to_owned()));
        }
        if let Some(rest) = line.split_once("LAP-WRITE:").map(|(_, c)| c.trim()) {
            let (path, content) = rest.split_once(" = ")?;
            return Some(Directive::Write {
                path: path.trim().to_owned(),
                content: content.to_owned(),
            });
        }
    }
    None
}

/// One line per request: its tools' names and the latest message, for a failing test's message.
pub fn summary(requests: &[Value]) -> String {
    requests
        .iter()
        .map(|b| {
            let tools: Vec<&str> = b["tools"]
                .as_array()
                .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
                .unwrap_or_default();
            let all = b["messages"].as_array().or_else(|| b["input"].as_array());
            let last = all
                .map(|m| {
                    m.iter()
                        .map(|m| {
                            let t = m["content"].to_string();
                            let t: String = t
                                .chars()
                                .rev()
                                .take(200)
                                .collect::<Vec<_>>()
                                .into_iter()
                                .rev()
                                .collect();
                            format!("[{} …{t}]", m["role"])
                        })
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            format!("tools {tools:?} last {last}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text of a tool result block's `content` (a string or text blocks).
fn result_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn plain_reply(reply: &str, results: &[String]) -> String {
    if results.is_empty() {
        reply.to_owned()
    } else {
        format!("{reply} (earlier tool results: {})", results.join(" | "))
    }
}

/// Anthropic Messages API (`POST /v1/messages`): the turn for `body`.
pub fn anthropic_turn(body: &Value, reply: &str) -> Turn {
    // Claude Code 2.1 appends `system`-role messages after the user's; the conversation is the rest.
    let messages: Vec<Value> = body["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m["role"] != "system")
        .collect();
    let mut results = Vec::new();
    for m in &messages {
        if let Some(blocks) = m["content"].as_array() {
            for b in blocks {
                if b["type"] == "tool_result" {
                    results.push(result_text(&b["content"]));
                }
            }
        }
    }
    let Some(last) = messages.last() else {
        return Turn::Text(reply.to_owned());
    };
    let blocks = match &last["content"] {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(b) => b.clone(),
        _ => Vec::new(),
    };
    // The latest prompt: the last text block the user sent since the model's last turn. Claude
    // Code merges a resumed prompt into the message holding the last turn's tool results, and
    // hoists each new tool result before that prompt, so block order alone can't tell whether
    // the prompt's directive was answered: a call made for it, with its result, answers it.
    let prompt: Option<String> = messages
        .iter()
        .rev()
        .take_while(|m| m["role"] == "user")
        .flat_map(|m| match &m["content"] {
            Value::String(s) => vec![s.clone()],
            Value::Array(b) => b
                .iter()
                .rev()
                .filter(|b| b["type"] == "text")
                .filter_map(|b| b["text"].as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        })
        .next();
    let quote = |r: &Value| {
        let refused = if r["is_error"] == true {
            " (the tool failed)"
        } else {
            ""
        };
        Turn::Text(format!("Tool result{refused}: {}", result_text(&r["content"])))
    };
    let wanted = prompt.as_deref().and_then(directive);
    if let Some(d) = &wanted {
        if let Some(r) = answered(&messages, d) {
            return quote(r);
        }
    } else if let Some(r) = blocks.last().filter(|b| b["type"] == "tool_result") {
        // No directive in the prompt (a CLI that sends the result alone): the result answers.
        return quote(r);
    }
    let text = prompt.unwrap_or_default();
    let tools: Vec<&Value> = body["tools"].as_array().map(|t| t.iter().collect()).unwrap_or_default();
    let find = |names: &[&str]| {
        tools
            .iter()
            .find(|t| names.contains(&t["name"].as_str().unwrap_or_default()))
            .copied()
    };
    let props = |t: &Value, key: &str| t["input_schema"]["properties"].get(key).is_some();
    match directive(&text) {
        Some(Directive::Run(cmd)) => match find(&["Bash", "bash"]) {
            Some(t) => {
                let mut input = json!({"command": cmd});
                if props(t, "description") {
                    input["description"] = "Run the command the user asked for".into();
                }
                Turn::Call {
                    tool: t["name"].as_str().unwrap_or_default().to_owned(),
                    input,
                }
            }
            None => Turn::Text("no shell tool was offered".to_owned()),
        },
        Some(Directive::Write { path, content }) => match find(&["Write", "write"]) {
            Some(t) => {
                let key = if props(t, "filePath") { "filePath" } else { "file_path" };
                Turn::Call {
                    tool: t["name"].as_str().unwrap_or_default().to_owned(),
                    input: json!({ key: path, "content": content }),
                }
            }
            None => Turn::Text("no file tool was offered".to_owned()),
        },
        None => Turn::Text(plain_reply(reply, &results)),
    }
}

/// A `tool_use` id for one call, the same for the same call and distinct across the calls of a
/// conversation (a CLI matches each tool result to its call by id: one id for every call made
/// claude take a later call for one already answered).
fn tool_use_id(tool: &str, input: &Value) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (tool, input.to_string()).hash(&mut h);
    format!("toolu_standin{:016x}", h.finish())
}

/// The result of the call made for directive `d`, when the conversation holds both: an assistant
/// `tool_use` doing what `d` asks and the `tool_result` with its id.
fn answered<'a>(messages: &'a [Value], d: &Directive) -> Option<&'a Value> {
    let blocks = || messages.iter().filter_map(|m| m["content"].as_array()).flatten();
    let call = blocks().find(|b| {
        let (name, input) = (b["name"].as_str().unwrap_or_default(), &b["input"]);
        b["type"] == "tool_use"
            && match d {
                Directive::Run(cmd) => matches!(name, "Bash" | "bash") && input["command"] == cmd.as_str(),
                Directive::Write { path, content } => {
                    let at = input.get("file_path").or_else(|| input.get("filePath"));
                    matches!(name, "Write" | "write")
                        && at.and_then(Value::as_str) == Some(path.as_str())
                        && input["content"] == content.as_str()
                }
            }
    })?;
    blocks().find(|b| b["type"] == "tool_result" && b["tool_use_id"] == call["id"])
}

/// The streamed (SSE) Anthropic answer for `turn`.
pub fn anthropic_sse(turn: &Turn, model: &str) -> String {
    let (block, delta, stop) = match turn {
        Turn::Text(t) => (
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": t}),
            "end_turn",
        ),
        Turn::Call { tool, input } => (
            json!({"type": "tool_use", "id": tool_use_id(tool, input), "name": tool, "input": {}}),
            json!({"type": "input_json_delta", "partial_json": input.to_string()}),
            "tool_use",
        ),
    };
    let events = [
        (
            "message_start",
            json!({"type":"message_start","message":{"id":"msg_standin","type":"message","role":"assistant",
                "model":model,"content":[],"stop_reason":null,"stop_sequence":null,
                "usage":{"input_tokens":10,"output_tokens":1}}}),
        ),
        (
            "content_block_start",
            json!({"type":"content_block_start","index":0,"content_block":block}),
        ),
        ("ping", json!({"type":"ping"})),
        (
            "content_block_delta",
            json!({"type":"content_block_delta","index":0,"delta":delta}),
        ),
        ("content_block_stop", json!({"type":"content_block_stop","index":0})),
        (
            "message_delta",
            json!({"type":"message_delta","delta":{"stop_reason":stop,"stop_sequence":null},
                "usage":{"output_tokens":9}}),
        ),
        ("message_stop", json!({"type":"message_stop"})),
    ];
    events
        .iter()
        .map(|(e, d)| format!("event: {e}\ndata: {d}\n\n"))
        .collect()
}

/// The non-streamed Anthropic answer for `turn`.
pub fn anthropic_json(turn: &Turn, model: &str) -> String {
    let (content, stop) = match turn {
        Turn::Text(t) => (json!([{"type": "text", "text": t}]), "end_turn"),
        Turn::Call { tool, input } => (
            json!([{"type": "tool_use", "id": tool_use_id(tool, input), "name": tool, "input": input}]),
            "tool_use",
        ),
    };
    json!({"id":"msg_standin","type":"message","role":"assistant","model":model,"content":content,
        "stop_reason":stop,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":9}})
    .to_string()
}

/// What a Responses API tool call looks like on the wire.
#[derive(Debug, Clone, PartialEq)]
pub enum OpenAiCall {
    /// `function_call` with JSON `arguments`.
    Function { name: String, arguments: String },
    /// `custom_tool_call` (a freeform tool such as codex's `apply_patch`) with raw `input`.
    Custom { name: String, input: String },
}

/// OpenAI Responses API (`POST /v1/responses`): text, or one tool call.
pub fn openai_turn(body: &Value, reply: &str) -> Result<OpenAiCall, String> {
    let input = body["input"].as_array().cloned().unwrap_or_default();
    let mut results = Vec::new();
    for item in &input {
        if matches!(
            item["type"].as_str(),
            Some("function_call_output" | "custom_tool_call_output")
        ) {
            results.push(openai_output_text(&item["output"]));
        }
    }
    if let Some(last) = input.last() {
        if matches!(
            last["type"].as_str(),
            Some("function_call_output" | "custom_tool_call_output")
        ) {
            let out = openai_output_text(&last["output"]);
            let refused = if exited_non_zero(&out) {
                " (the tool failed)"
            } else {
                ""
            };
            return Err(format!("Tool result{refused}: {out}"));
        }
    }
    let text = input
        .iter()
        .rev()
        .find(|i| i["role"] == "user")
        .and_then(|i| i["content"].as_array())
        .map(|c| {
            c.iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default();
    let tools: Vec<&Value> = body["tools"].as_array().map(|t| t.iter().collect()).unwrap_or_default();
    let named = |n: &str| tools.iter().find(|t| t["name"] == n).copied();
    match directive(&text) {
        Some(Directive::Run(cmd)) => {
            if named("shell_command").is_some() {
                return Ok(OpenAiCall::Function {
                    name: "shell_command".into(),
                    arguments: json!({"command": cmd}).to_string(),
                });
            }
            if let Some(t) = named("exec_command") {
                let key = if t["parameters"]["properties"].get("cmd").is_some() {
                    "cmd"
                } else {
                    "command"
                };
                return Ok(OpenAiCall::Function {
                    name: "exec_command".into(),
                    arguments: json!({ key: cmd }).to_string(),
                });
            }
            if named("shell").is_some() {
                return Ok(OpenAiCall::Function {
                    name: "shell".into(),
                    arguments: json!({"command": ["bash", "-lc", cmd]}).to_string(),
                });
            }
            Err("no shell tool was offered".into())
        }
        Some(Directive::Write { path, content }) => {
            let patch = format!("*** Begin Patch\n*** Add File: {path}\n+{content}\n*** End Patch\n");
            let shell_edit = format!("printf '%s\\n' '{content}' > '{path}'");
            if named("apply_patch").is_none() {
                // No patch tool (codex with exec_command only): the edit is a shell write.
                if let Some(t) = named("exec_command") {
                    let key = if t["parameters"]["properties"].get("cmd").is_some() {
                        "cmd"
                    } else {
                        "command"
                    };
                    return Ok(OpenAiCall::Function {
                        name: "exec_command".into(),
                        arguments: json!({ key: shell_edit }).to_string(),
                    });
                }
            }
            match named("apply_patch") {
                Some(t) if t["type"] == "custom" => Ok(OpenAiCall::Custom {
                    name: "apply_patch".into(),
                    input: patch,
                }),
                Some(_) => Ok(OpenAiCall::Function {
                    name: "apply_patch".into(),
                    arguments: json!({"input": patch}).to_string(),
                }),
                None => Err("no file tool was offered".into()),
            }
        }
        None => Err(plain_reply(reply, &results)),
    }
}

/// Whether a codex tool output reports a failed command: its `Process exited with code N` (or
/// the older `Exit code: N`) line with `N` not 0. The Responses API has no `is_error`.
fn exited_non_zero(output: &str) -> bool {
    output.lines().any(|l| {
        let code = l
            .strip_prefix("Process exited with code ")
            .or_else(|| l.strip_prefix("Exit code: "));
        code.and_then(|c| c.trim().parse::<i64>().ok()).is_some_and(|c| c != 0)
    })
}

/// A Responses `*_call_output`'s `output`: a string (codex sometimes wraps it in JSON with an
/// `output` field) or content parts.
fn openai_output_text(output: &Value) -> String {
    match output {
        Value::String(s) => serde_json::from_str::<Value>(s)
            .ok()
            .and_then(|v| v.get("output").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| s.clone()),
        other => result_text(other),
    }
}

/// The streamed (SSE) Responses answer: `Err(text)` is a message, `Ok(call)` a tool call.
pub fn openai_sse(turn: &Result<OpenAiCall, String>, model: &str) -> String {
    openai_events(turn, model, "resp_standin01")
        .into_iter()
        .map(|v| format!("event: {}\ndata: {v}\n\n", v["type"].as_str().unwrap_or_default()))
        .collect()
}

/// The events of one streamed Responses answer, each with its `type` and `sequence_number`
/// (the JSON of an SSE event's `data`, or of one WebSocket text message), ending with
/// `response.completed` whose `response.output` holds the answer's one item.
pub fn openai_events(turn: &Result<OpenAiCall, String>, model: &str, resp_id: &str) -> Vec<Value> {
    let base = json!({"id": resp_id, "object": "response", "created_at": 1_700_000_000, "model": model,
        "status": "in_progress", "output": [], "usage": null});
    let mut events: Vec<(&str, Value)> = vec![
        ("response.created", json!({"response": base.clone()})),
        ("response.in_progress", json!({"response": base.clone()})),
    ];
    let item = match turn {
        Err(text) => {
            let msg_id = "msg_standin01";
            let item = json!({"type": "message", "id": msg_id, "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]});
            events.push((
                "response.output_item.added",
                json!({"output_index": 0, "item": {"type": "message", "id": msg_id, "status": "in_progress",
                    "role": "assistant", "content": []}}),
            ));
            events.push((
                "response.content_part.added",
                json!({"item_id": msg_id, "output_index": 0, "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []}}),
            ));
            events.push((
                "response.output_text.delta",
                json!({"item_id": msg_id, "output_index": 0, "content_index": 0, "delta": text}),
            ));
            events.push((
                "response.output_text.done",
                json!({"item_id": msg_id, "output_index": 0, "content_index": 0, "text": text}),
            ));
            events.push((
                "response.content_part.done",
                json!({"item_id": msg_id, "output_index": 0, "content_index": 0,
                    "part": {"type": "output_text", "text": text, "annotations": []}}),
            ));
            item
        }
        Ok(OpenAiCall::Function { name, arguments }) => {
            let item = json!({"type": "function_call", "id": "fc_standin01", "call_id": "call_standin01",
                "name": name, "arguments": arguments, "status": "completed"});
            let mut added = item.clone();
            added["arguments"] = "".into();
            added["status"] = "in_progress".into();
            events.push(("response.output_item.added", json!({"output_index": 0, "item": added})));
            events.push((
                "response.function_call_arguments.delta",
                json!({"item_id": "fc_standin01", "output_index": 0, "delta": arguments}),
            ));
            events.push((
                "response.function_call_arguments.done",
                json!({"item_id": "fc_standin01", "output_index": 0, "arguments": arguments}),
            ));
            item
        }
        Ok(OpenAiCall::Custom { name, input }) => {
            let item = json!({"type": "custom_tool_call", "id": "ctc_standin01", "call_id": "call_standin01",
                "name": name, "input": input, "status": "completed"});
            let mut added = item.clone();
            added["input"] = "".into();
            events.push(("response.output_item.added", json!({"output_index": 0, "item": added})));
            events.push((
                "response.custom_tool_call_input.delta",
                json!({"item_id": "ctc_standin01", "output_index": 0, "delta": input}),
            ));
            events.push((
                "response.custom_tool_call_input.done",
                json!({"item_id": "ctc_standin01", "output_index": 0, "input": input}),
            ));
            item
        }
    };
    events.push((
        "response.output_item.done",
        json!({"output_index": 0, "item": item.clone()}),
    ));
    let mut completed = base;
    completed["status"] = "completed".into();
    completed["output"] = json!([item]);
    completed["usage"] = json!({"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 19});
    events.push(("response.completed", json!({"response": completed})));
    events
        .into_iter()
        .enumerate()
        .map(|(i, (t, mut v))| {
            v["type"] = t.into();
            v["sequence_number"] = i.into();
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_script_calls_then_quotes() {
        let tools = json!([{"name": "Bash", "input_schema": {"properties": {"command": {}, "description": {}}}},
            {"name": "Write", "input_schema": {"properties": {"file_path": {}, "content": {}}}}]);
        let first = json!({"tools": tools, "messages": [{"role": "user", "content": "please\nLAP-RUN: echo hi"}]});
        assert_eq!(
            anthropic_turn(&first, "r"),
            Turn::Call {
                tool: "Bash".into(),
                input: json!({"command": "echo hi", "description": "Run the command the user asked for"})
            }
        );
        let second = json!({"tools": tools, "messages": [
            {"role": "user", "content": "LAP-RUN: echo hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "hi"}]}]});
        assert_eq!(anthropic_turn(&second, "r"), Turn::Text("Tool result: hi".into()));
        let mut third = second.clone();
        third["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "user", "content": [{"type": "text", "text": "and?"}]}));
        assert_eq!(
            anthropic_turn(&third, "r"),
            Turn::Text("r (earlier tool results: hi)".into())
        );
        let write = json!({"tools": tools, "messages": [{"role": "user", "content": "LAP-WRITE: /w/a.txt = x y"}]});
        assert_eq!(
            anthropic_turn(&write, "r"),
            Turn::Call {
                tool: "Write".into(),
                input: json!({"file_path": "/w/a.txt", "content": "x y"})
            }
        );
        // No tools offered (a title request): text.
        let bare = json!({"messages": [{"role": "user", "content": "LAP-RUN: echo hi"}]});
        assert!(matches!(anthropic_turn(&bare, "r"), Turn::Text(_)));
    }

    /// Claude Code 2.1 resumed: the new prompt shares a message with the last turn's tool result,
    /// and the new call's result is hoisted before that prompt. The call made for the prompt's
    /// directive answers it (claude looped on the stand-in's repeated call before).
    #[test]
    fn anthropic_script_reads_claudes_merged_resume() {
        let tools = json!([{"name": "Bash", "input_schema": {"properties": {"command": {}}}},
            {"name": "Write", "input_schema": {"properties": {"file_path": {}, "content": {}}}}]);
        let write =
            json!({"type": "tool_use", "id": "w", "name": "Write", "input": {"file_path": "/w/n", "content": "x"}});
        let run = json!({"type": "tool_use", "id": "b", "name": "Bash", "input": {"command": "cat n"}});
        let prompt = json!({"type": "text", "text": "Run it.\nLAP-RUN: cat n"});
        let asked = json!({"tools": tools, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "LAP-WRITE: /w/n = x"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Tool result: ok"}, write]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "w", "content": "ok"}, prompt]}]});
        assert_eq!(
            anthropic_turn(&asked, "r"),
            Turn::Call {
                tool: "Bash".into(),
                input: json!({"command": "cat n"})
            }
        );
        let ran = json!({"tools": tools, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "LAP-WRITE: /w/n = x"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Tool result: ok"}, write, run]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "w", "content": "ok"},
                {"type": "tool_result", "tool_use_id": "b", "content": "x"}, prompt]}]});
        assert_eq!(anthropic_turn(&ran, "r"), Turn::Text("Tool result: x".into()));
        let mut follow_up = ran.clone();
        follow_up["messages"][2]["content"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "text", "text": "What did you see?"}));
        assert_eq!(
            anthropic_turn(&follow_up, "r"),
            Turn::Text("r (earlier tool results: ok | x)".into())
        );
    }

    #[test]
    fn openai_script_calls_then_quotes() {
        let tools = json!([{"type": "function", "name": "shell_command"}, {"type": "custom", "name": "apply_patch"}]);
        let first = json!({"tools": tools, "input": [{"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "LAP-RUN: ls"}]}]});
        assert_eq!(
            openai_turn(&first, "r"),
            Ok(OpenAiCall::Function {
                name: "shell_command".into(),
                arguments: r#"{"command":"ls"}"#.into()
            })
        );
        let mut second = first.clone();
        second["input"].as_array_mut().unwrap().extend([
            json!({"type": "function_call", "call_id": "c", "name": "shell_command", "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": "c", "output": "a.txt\n"}),
        ]);
        assert_eq!(openai_turn(&second, "r"), Err("Tool result: a.txt\n".into()));
        let mut failed = first.clone();
        failed["input"].as_array_mut().unwrap().extend([
            json!({"type": "function_call", "call_id": "c", "name": "exec_command", "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": "c",
                "output": "Wall time: 0.0 seconds\nProcess exited with code 1\nOutput:\nbwrap: failed\n"}),
        ]);
        let reply = openai_turn(&failed, "r").unwrap_err();
        assert!(reply.starts_with("Tool result (the tool failed): "), "{reply}");
        assert!(!exited_non_zero("Process exited with code 0\n"));
        let write = json!({"tools": tools, "input": [{"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "LAP-WRITE: /w/n.txt = hello"}]}]});
        assert_eq!(
            openai_turn(&write, "r"),
            Ok(OpenAiCall::Custom {
                name: "apply_patch".into(),
                input: "*** Begin Patch\n*** Add File: /w/n.txt\n+hello\n*** End Patch\n".into()
            })
        );
        let sse = openai_sse(&openai_turn(&write, "r"), "m");
        assert!(
            sse.contains("custom_tool_call") && sse.contains("response.completed"),
            "{sse}"
        );
    }
}
