#!/usr/bin/env python3
"""An offline stand-in for the Anthropic Messages API, for trying LAP without internet or a key.

Usage: model-standin.py CERT KEY PORT REAL_KEY   (examples/offline-demo.sh runs it for you)

It serves HTTPS on 127.0.0.1:PORT (0: a free port, printed on its first line) with CERT/KEY (a leaf for api.anthropic.com) and answers
`POST /v1/messages` (streamed SSE or JSON) and `POST /v1/messages/count_tokens` only when the
request's `x-api-key` (or `Authorization: Bearer`) is REAL_KEY; anything else gets the API's 401.
The agent in a LAP session only ever holds a stub, so a 200 here means the vault swapped the real
key in on the wire. Each request is printed on this terminal: authorised or not, never the key.

What the "model" says, read from the latest user text:
- `LAP-RUN: <command>` asks the agent's shell tool (`Bash`) to run the command; once the tool's
  result comes back the reply is `Tool result: <what the command printed>`;
- anything else gets `Hello from the offline model stand-in. You said: <text>`.
"""
import http.server
import json
import ssl
import sys

REPLY = "Hello from the offline model stand-in."


def text_of(content):
    """The text of a message's or tool result's `content` (a string or a list of blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and "text" in b)
    return ""


def turn(body):
    """("text", reply) or ("tool", name, input) for one Messages API request."""
    messages = [m for m in body.get("messages", []) if m.get("role") != "system"]
    if not messages:
        return ("text", REPLY)
    last = messages[-1].get("content")
    blocks = [{"type": "text", "text": last}] if isinstance(last, str) else (last or [])
    results = [b for b in blocks if b.get("type") == "tool_result"]
    if results:
        failed = " (the tool failed)" if results[-1].get("is_error") else ""
        return ("text", f"Tool result{failed}: {text_of(results[-1].get('content')).strip()}")
    # The user's text since the model last spoke: a CLI may add its own user messages.
    said = []
    for m in reversed(messages):
        if m.get("role") != "user":
            break
        said.insert(0, text_of(m.get("content")))
    said = "\n".join(said)
    for line in said.splitlines():
        if "LAP-RUN:" in line:
            command = line.split("LAP-RUN:", 1)[1].strip()
            tools = [t for t in body.get("tools", []) if t.get("name") in ("Bash", "bash")]
            if not tools:
                return ("text", "no shell tool was offered")
            tool = tools[0]
            args = {"command": command}
            if "description" in tool.get("input_schema", {}).get("properties", {}):
                args["description"] = "Run the command the user asked for"
            return ("tool", tool["name"], args)
    # The prompt, without the reminders some CLIs wrap around it.
    prompt = [l for l in said.splitlines() if l.strip() and "<system-reminder>" not in l]
    return ("text", f"{REPLY} You said: {prompt[-1].strip() if prompt else ''}")


def sse(answer, model):
    if answer[0] == "text":
        block, delta, stop = {"type": "text", "text": ""}, {"type": "text_delta", "text": answer[1]}, "end_turn"
    else:
        block = {"type": "tool_use", "id": "toolu_offline01", "name": answer[1], "input": {}}
        delta, stop = {"type": "input_json_delta", "partial_json": json.dumps(answer[2])}, "tool_use"
    usage = {"input_tokens": 10, "output_tokens": 1}
    events = [
        ("message_start", {"type": "message_start", "message": {
            "id": "msg_offline", "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                           "usage": {"output_tokens": 9}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return "".join(f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in events)


def whole(answer, model):
    if answer[0] == "text":
        content, stop = [{"type": "text", "text": answer[1]}], "end_turn"
    else:
        content = [{"type": "tool_use", "id": "toolu_offline01", "name": answer[1], "input": answer[2]}]
        stop = "tool_use"
    return json.dumps({"id": "msg_offline", "type": "message", "role": "assistant", "model": model,
                       "content": content, "stop_reason": stop, "stop_sequence": None,
                       "usage": {"input_tokens": 10, "output_tokens": 9}})


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, content_type, body):
        data = body.encode()
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        key = self.headers.get("x-api-key") or self.headers.get("authorization", "").removeprefix("Bearer ")
        path = self.path.split("?", 1)[0]
        if key != REAL_KEY:
            print(f"model stand-in: {self.command} {path} → 401 (not the real key)", flush=True)
            return self.answer(401, "application/json", json.dumps(
                {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}))
        try:
            body = json.loads(raw or b"{}")
        except ValueError as e:
            return self.answer(400, "application/json", json.dumps(
                {"type": "error", "error": {"type": "invalid_request_error", "message": f"body is not JSON: {e}"}}))
        if path == "/v1/messages/count_tokens":
            return self.answer(200, "application/json", '{"input_tokens":10}')
        if path != "/v1/messages":
            return self.answer(404, "application/json", json.dumps(
                {"type": "error", "error": {"type": "not_found_error", "message": f"{path}: not served here"}}))
        model = body.get("model") or "claude-offline"
        reply = turn(body)
        print(f"model stand-in: POST {path} → 200 with the real key ({reply[0]})", flush=True)
        if body.get("stream"):
            return self.answer(200, "text/event-stream", sse(reply, model))
        return self.answer(200, "application/json", whole(reply, model))

    def do_GET(self):
        self.answer(404, "application/json", '{"type":"error","error":{"type":"not_found_error","message":"POST /v1/messages"}}')

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: model-standin.py CERT KEY PORT REAL_KEY")
    cert, keyfile, port, REAL_KEY = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, keyfile)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    # PORT 0 takes a free port; this line says which.
    print(f"model stand-in: https://127.0.0.1:{server.server_address[1]} (as api.anthropic.com)", flush=True)
    server.serve_forever()
