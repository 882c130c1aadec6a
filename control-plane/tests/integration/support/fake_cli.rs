//! A stand-in `claude` CLI for lifecycle tests: a shell script that answers `-p TEXT` in
//! stream-json, reports `--resume` (continuity), and, when it holds `ANTHROPIC_API_KEY`, calls
//! the Messages API with `curl` through the harness's proxy and CA environment — so the vault
//! path is still real.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const SCRIPT: &str = r#"#!/bin/sh
text=""
resume=none
while [ $# -gt 0 ]; do
  case "$1" in --resume) resume="$2"; shift ;; --) text="$2"; break ;; esac
  shift
done
api=nokey
if [ -n "$ANTHROPIC_API_KEY" ]; then
  if curl -sS --max-time 20 https://api.anthropic.com/v1/messages \
      -H "x-api-key: $ANTHROPIC_API_KEY" -H 'content-type: application/json' \
      -d '{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}' \
      | grep -q 'Hello from'; then
    api=authorized
  else
    api=rejected
  fi
fi
echo "$text" >> "$HOME/fake-claude-calls.log"
echo '{"type":"system","subtype":"init","session_id":"fake-conv-1"}'
echo "{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"result\":\"echo:$text api:$api resume:$resume\",\"session_id\":\"fake-conv-1\"}"
"#;

/// A directory holding the fake `claude`, plus the real PATH (for curl), as a PATH value.
pub fn path_with_fake_claude(dir: &Path) -> String {
    let bin = dir.join("fake-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let p: PathBuf = bin.join("claude");
    std::fs::write(&p, SCRIPT).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    let rest = std::env::var("PATH").unwrap_or_default();
    format!("{}:{rest}", bin.display())
}
