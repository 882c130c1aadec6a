//! The README's copy-paste blocks, extracted from README.md and run as a newcomer would, so they
//! cannot drift from what the binaries do: "Try the sidecar with curl" (its own upstream and
//! sidecar) and the REST API block of "Run the control plane" (against a lap-server whose
//! sessions reach the local model stand-in). Each block runs as written; only what names this
//! machine is replaced (the release binary's path, the server's URL).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support;
use support::anthropic::{StandIn, REPLY};
use support::server::{on_path, workspace_bin, LapServer};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

/// The first ```sh block after the line `heading`, or the first holding `marker`.
fn sh_block(readme: &str, after: &str, marker: &str) -> String {
    let start = readme
        .find(after)
        .unwrap_or_else(|| panic!("README.md has no {after:?}"));
    let mut rest = &readme[start..];
    loop {
        let open = rest
            .find("```sh\n")
            .unwrap_or_else(|| panic!("no sh block with {marker:?} after {after:?}"));
        let body = &rest[open + 6..];
        let close = body.find("\n```").expect("an unclosed block");
        if body[..close].contains(marker) {
            return body[..close].to_owned();
        }
        rest = &body[close + 4..];
    }
}

async fn bash(script: &str, cwd: &Path, env: &[(&str, String)]) -> (bool, String) {
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg("-c").arg(script).current_dir(cwd).kill_on_drop(true);
    cmd.env_remove("LAP_URL").env_remove("MASTER_KEY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .expect("the block ends within 3 minutes")
        .unwrap();
    let text = format!(
        "{}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A newcomer's checkout (`tmp/checkout`, 0755 as a clone is, so the sandbox's uid reaches
/// `.lap-sandboxes`) with `lap-server` running from it (its data in `.lap/`, the master key in
/// `.lap/master_key`), its sessions sending api.anthropic.com to a stand-in that answers `real`.
async fn checkout_with_server(tmp: &Path, real: &str) -> (PathBuf, LapServer, StandIn) {
    let standin = StandIn::start(real).await;
    let base = standin.base_config(tmp);
    let cwd = tmp.join("checkout");
    std::fs::create_dir(&cwd).unwrap();
    let server = LapServer::start(
        &cwd.join(".lap"),
        &[("LAP_SIDECAR_BASE_CONFIG", base.display().to_string())],
    )
    .await;
    std::fs::write(cwd.join(".lap/master_key"), &server.key).unwrap();
    (cwd, server, standin)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_sidecar_block_shows_the_real_key_arriving_upstream() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let block = sh_block(&readme, "## Try the sidecar with curl", "vault-sidecar");
    let sidecar = workspace_bin("vault-sidecar");
    assert!(block.contains("\"$OLDPWD/target/release/vault-sidecar\""), "{block}");
    let script = format!(
        "set -u\n{}\nkill %1 %2\nwait\n",
        block.replace(
            "\"$OLDPWD/target/release/vault-sidecar\"",
            &format!("{:?}", sidecar.display().to_string())
        )
    );
    let (ok, out) = bash(&script, &repo_root(), &[]).await;
    assert!(ok, "{out}");
    // The upstream prints what arrived: the real key, while the client sent the stub.
    assert!(
        out.contains("x-api-key: sk-ant-api03-REAL-KEY-1111111111111111"),
        "{out}"
    );
    assert!(!out.contains("did not start"), "{out}");
    assert!(
        out.contains("\"injected\":[{\"secret\":\"ANTHROPIC_API_KEY\""),
        "the audit: {out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_rest_block_runs_a_session_and_deletes_it() {
    assert!(
        on_path("claude"),
        "the `claude` CLI is not on PATH: npm install -g @anthropic-ai/claude-code (.ci/run does)"
    );
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let block = sh_block(&readme, "## Run the control plane", "LAP=http://127.0.0.1:4000");
    let real = "sk-ant-api03-REAL-readme-block-0123456789";
    let tmp = tempfile::tempdir().unwrap();
    // The block runs at the repository root of a newcomer's checkout: `.lap/` is the server's.
    let (cwd, server, _standin) = checkout_with_server(tmp.path(), real).await;
    let script = block.replace("http://127.0.0.1:4000", &server.url);
    let (ok, out) = bash(&script, &cwd, &[("ANTHROPIC_API_KEY", real.to_owned())]).await;
    assert!(ok, "{out}");
    assert!(out.contains("is ready"), "{out}");
    assert!(out.contains(REPLY), "the reply: {out}");
    assert!(
        out.contains("\"secret\":\"ANTHROPIC_API_KEY\""),
        "the interceptions: {out}"
    );
    assert!(out.contains("deleted"), "the trap deletes the session: {out}");
    // Run again: it stops at the create (409), saying why, instead of spinning.
    let (ok, out) = bash(&script, &cwd, &[("ANTHROPIC_API_KEY", real.to_owned())]).await;
    assert!(!ok, "{out}");
    assert!(out.contains("already exists") || out.contains("409"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_lap_block_runs_a_session_with_lap() {
    assert!(
        on_path("claude"),
        "the `claude` CLI is not on PATH: npm install -g @anthropic-ai/claude-code (.ci/run does)"
    );
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let block = sh_block(&readme, "## Run the control plane", "lap login");
    let real = "sk-ant-api03-REAL-readme-lap-0123456789";
    let tmp = tempfile::tempdir().unwrap();
    let (cwd, server, _standin) = checkout_with_server(tmp.path(), real).await;
    // What names this machine: the binaries (a debug build here), the URL, and the reader's key.
    let bins = workspace_bin("lap");
    let bins = bins.parent().unwrap().display().to_string();
    assert!(
        block.contains("$PWD/target/release") && block.contains("sk-ant-..."),
        "{block}"
    );
    let script = format!(
        "set -euo pipefail\n{}",
        block
            .replace("$PWD/target/release", &bins)
            .replace("sk-ant-...", real)
            .replace("http://127.0.0.1:4000", &server.url)
    );
    let config = tmp.path().join("lap.toml").display().to_string();
    let (ok, out) = bash(&script, &cwd, &[("LAP_CONFIG", config)]).await;
    assert!(ok, "{out}");
    assert!(out.contains(REPLY), "lap send's reply: {out}");
    assert!(out.contains("injected ANTHROPIC_API_KEY (header)"), "lap audit: {out}");
    assert!(out.contains("Stopped"), "lap stop: {out}");
}
