#!/usr/bin/env node
// lap-agent-sdk: one message through the Claude Agent SDK (@anthropic-ai/claude-agent-sdk),
// for lap-harness's claude-agent-sdk harness. Prints every SDK message as one JSON line: the
// same shapes as `claude -p --output-format stream-json` (system, assistant, user, result, each
// with session_id), so the harness reads both the same way.
//
//   lap-agent-sdk [--permission-mode MODE] [--allowedTools A,B] [--disallowedTools C,D]
//                 [--resume ID] [--model M] [--append-system-prompt P] [--mcp-config=JSON] -- TEXT
//
// The flags are claude's own (lap-harness passes the same ones): they become the SDK's
// permissionMode (bypassPermissions also sets allowDangerouslySkipPermissions), allowedTools,
// disallowedTools and mcpServers (from `--mcp-config={"mcpServers": {...}}`, as claude reads it).
//
// `lap-agent-sdk --check` loads the SDK and exits (0: it is installed).
//
// lap-harness carries a copy of this file: where no `lap-agent-sdk` is on PATH (the local
// backend), it writes that copy to $HOME/.lap/lap-agent-sdk and runs it.
//
// The SDK is found as an ordinary import, else under LAP_NODE_MODULES, else under `npm root -g`.
import { execFileSync } from "node:child_process";
import path from "node:path";
import { pathToFileURL } from "node:url";

async function loadSdk() {
  try {
    return await import("@anthropic-ai/claude-agent-sdk");
  } catch {
    const root =
      process.env.LAP_NODE_MODULES || execFileSync("npm", ["root", "-g"], { encoding: "utf8" }).trim();
    return await import(pathToFileURL(path.join(root, "@anthropic-ai", "claude-agent-sdk", "sdk.mjs")).href);
  }
}

function parseArgs(argv) {
  const opts = {};
  let text;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--") {
      text = argv.slice(i + 1).join(" ");
      break;
    } else if (a === "--resume") opts.resume = argv[++i];
    else if (a === "--model") opts.model = argv[++i];
    else if (a === "--append-system-prompt") opts.append = argv[++i];
    else if (a === "--permission-mode") opts.permissionMode = argv[++i];
    else if (a === "--allowedTools") opts.allowedTools = argv[++i].split(",").filter(Boolean);
    else if (a === "--disallowedTools") opts.disallowedTools = argv[++i].split(",").filter(Boolean);
    else if (a.startsWith("--mcp-config=")) opts.mcpServers = JSON.parse(a.slice("--mcp-config=".length)).mcpServers;
    else throw new Error(`unknown argument ${a}`);
  }
  if (text === undefined)
    throw new Error(
      "usage: lap-agent-sdk [--permission-mode M] [--allowedTools A,B] [--disallowedTools C] [--resume ID] [--model M] [--append-system-prompt P] [--mcp-config=JSON] -- TEXT",
    );
  return { opts, text };
}

async function main() {
  if (process.argv[2] === "--check") {
    await loadSdk();
    return;
  }
  const { opts, text } = parseArgs(process.argv.slice(2));
  const { query } = await loadSdk();
  const options = {
    cwd: process.cwd(),
    systemPrompt: { type: "preset", preset: "claude_code", ...(opts.append ? { append: opts.append } : {}) },
    settingSources: ["user", "project"],
  };
  if (opts.resume) options.resume = opts.resume;
  if (opts.model) options.model = opts.model;
  if (opts.permissionMode) {
    options.permissionMode = opts.permissionMode;
    if (opts.permissionMode === "bypassPermissions") options.allowDangerouslySkipPermissions = true;
  }
  if (opts.allowedTools) options.allowedTools = opts.allowedTools;
  if (opts.disallowedTools) options.disallowedTools = opts.disallowedTools;
  if (opts.mcpServers) options.mcpServers = opts.mcpServers;
  for await (const message of query({ prompt: text, options })) {
    process.stdout.write(JSON.stringify(message) + "\n");
  }
}

main().catch((e) => {
  process.stderr.write(`lap-agent-sdk: ${e && e.message ? e.message : e}\n`);
  process.exit(1);
});
