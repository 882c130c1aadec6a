//! Bring-up before the harness serves (SPEC §4): clone the repository, install requirements and
//! prepare the agent CLI's auth from the stubs it holds. Each step is a [`Phase`] that `/healthz`
//! reports while it runs, so the control plane can show it as the session's `phase`.

use std::path::Path;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;

/// Where bring-up is. `/healthz` answers `503 {"status":"starting","phase":…}` until
/// [`Phase::HarnessListening`], then `200 {"status":"ok","phase":"harness_listening"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    CloningRepo,
    InstallingDeps,
    HarnessListening,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CloningRepo => "cloning_repo",
            Self::InstallingDeps => "installing_deps",
            Self::HarnessListening => "harness_listening",
        }
    }
}

/// A bring-up step failed; the message is the session's `failure_reason`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BringUpError(pub String);

/// The last lines of a tool's stderr on one line (`a; b`), so the whole cause reaches the
/// session's `failure_reason` (which the control plane reads from the `fatal:` line); git's
/// progress lines (`Cloning into '.'...`) are left out.
fn stderr_tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Cloning into "))
        .collect();
    lines[lines.len().saturating_sub(5)..].join("; ")
}

/// The credential helper git runs for the clone: it answers with the token from the
/// environment of that one `git` process (never in argv, the URL or `.git/config`).
const CREDENTIAL_HELPER: &str =
    "!f() { test \"$1\" = get || exit 0; echo username=x-access-token; echo \"password=$LAP_CLONE_TOKEN\"; }; f";

/// `git clone --depth 1 [--branch B] URL .` into `dir`, through the sidecar (the proxy and CA
/// variables are in the environment). `token` (the `GIT_TOKEN` stub) is offered as HTTP Basic
/// credentials to this clone only; the sidecar swaps in the real token.
pub async fn clone_repo(url: &str, branch: Option<&str>, token: Option<&str>, dir: &Path) -> Result<(), BringUpError> {
    let mut cmd = tokio::process::Command::new("git");
    cmd.current_dir(dir).env("GIT_TERMINAL_PROMPT", "0");
    if let Some(t) = token {
        cmd.args(["-c", "credential.helper=", "-c"])
            .arg(format!("credential.helper={CREDENTIAL_HELPER}"))
            .env("LAP_CLONE_TOKEN", t);
    }
    cmd.args(["clone", "--depth", "1"]);
    if let Some(b) = branch {
        cmd.args(["--branch", b]);
    }
    cmd.args(["--", url, "."]);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| BringUpError(format!("cannot run git: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(BringUpError(format!(
            "git clone {url} failed: {}",
            stderr_tail(&out.stderr)
        )))
    }
}

/// `AGENT_REQUIREMENTS`: a shell command run in the workspace (`npm ci`, `pip install -r
/// requirements.txt`, …). A non-zero exit fails the session with its last lines.
pub async fn install_requirements(command: &str, dir: &Path) -> Result<(), BringUpError> {
    let out = tokio::process::Command::new("sh")
        .args(["-c", command])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| BringUpError(format!("cannot run AGENT_REQUIREMENTS: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(BringUpError(format!(
            "AGENT_REQUIREMENTS (`{command}`) failed: {}",
            stderr_tail(&out.stderr)
        )))
    }
}

/// `codex login --with-api-key`, reading the (stub) key from stdin.
pub async fn codex_login(bin: &Path, key: &str) -> Result<(), BringUpError> {
    let mut child = tokio::process::Command::new(bin)
        .args(["login", "--with-api-key"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| BringUpError(format!("cannot run codex login: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(format!("{key}\n").as_bytes()).await;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| BringUpError(format!("codex login: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(BringUpError(format!(
            "codex login failed: {}",
            stderr_tail(&out.stderr)
        )))
    }
}

/// Claude Code's `~/.claude.json` for a sandbox (pure): onboarding done, the stub `api_key`
/// approved (Claude Code records the last 20 characters of approved keys) and `workspace`
/// trusted, so its TUI opens straight at the prompt. Other keys of `existing` are kept.
pub fn claude_state(existing: Option<serde_json::Value>, api_key: Option<&str>, workspace: &str) -> serde_json::Value {
    let mut v = existing
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| serde_json::json!({}));
    v["hasCompletedOnboarding"] = true.into();
    if v.get("theme").is_none() {
        v["theme"] = "dark".into();
    }
    if let Some(key) = api_key {
        let tail: String = {
            let chars: Vec<char> = key.chars().collect();
            chars[chars.len().saturating_sub(20)..].iter().collect()
        };
        let approved = &mut v["customApiKeyResponses"]["approved"];
        if !approved.is_array() {
            *approved = serde_json::json!([]);
        }
        if let Some(list) = approved.as_array_mut() {
            if !list.iter().any(|x| x.as_str() == Some(tail.as_str())) {
                list.push(tail.into());
            }
        }
        if !v["customApiKeyResponses"]["rejected"].is_array() {
            v["customApiKeyResponses"]["rejected"] = serde_json::json!([]);
        }
    }
    v["projects"][workspace]["hasTrustDialogAccepted"] = true.into();
    v
}

/// Write [`claude_state`] to `$HOME/.claude.json` (0600).
pub fn prepare_claude(home: &Path, api_key: Option<&str>, workspace: &Path) -> Result<(), BringUpError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = home.join(".claude.json");
    let existing = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok());
    let state = claude_state(existing, api_key, &workspace.display().to_string());
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)?;
        f.write_all(state.to_string().as_bytes())
    };
    write().map_err(|e| BringUpError(format!("cannot write {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn claude_state_approves_the_stub_and_trusts_the_workspace() {
        let key = "sk-ant-api03-lapstub-ABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let v = claude_state(
            Some(serde_json::json!({"machineID": "m", "theme": "light"})),
            Some(key),
            "/w",
        );
        assert_eq!(v["machineID"], "m");
        assert_eq!(v["theme"], "light");
        assert_eq!(v["hasCompletedOnboarding"], true);
        assert_eq!(
            v["customApiKeyResponses"]["approved"],
            serde_json::json!(["GHIJKLMNOPQRSTUVWXYZ"])
        );
        assert_eq!(v["projects"]["/w"]["hasTrustDialogAccepted"], true);
        // Idempotent.
        let again = claude_state(Some(v.clone()), Some(key), "/w");
        assert_eq!(again, v);
        // No key, not an object: still a usable state.
        let v = claude_state(Some(serde_json::json!([1])), None, "/w");
        assert_eq!(v["theme"], "dark");
        assert!(v.get("customApiKeyResponses").is_none());
    }

    #[test]
    fn a_tools_error_tail_is_one_line_without_progress() {
        let stderr =
            b"Cloning into '.'...\n\nfatal: unable to access 'https://x/r.git/': CONNECT tunnel failed, response 502\n";
        assert_eq!(
            stderr_tail(stderr),
            "fatal: unable to access 'https://x/r.git/': CONNECT tunnel failed, response 502"
        );
        let many: String = (1..=7).map(|i| format!("line {i}\n")).collect();
        assert_eq!(stderr_tail(many.as_bytes()), "line 3; line 4; line 5; line 6; line 7");
    }

    #[test]
    fn phases() {
        assert_eq!(Phase::CloningRepo.as_str(), "cloning_repo");
        assert_eq!(Phase::InstallingDeps.as_str(), "installing_deps");
        assert_eq!(Phase::HarnessListening.as_str(), "harness_listening");
    }
}
