//! The harness images' Dockerfiles (`harness-images/<harness_id>/Dockerfile`), checked for
//! structure without a Docker engine: a multi-stage build of `lap-harness`, the agent CLI from
//! its npm package, git, a non-root user, and the entrypoint that picks up the pod CA.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use lap_harness::agent::AgentKind;

/// One Dockerfile instruction: keyword (upper-cased) and its arguments, continuations joined.
#[derive(Debug)]
struct Instruction {
    keyword: String,
    args: String,
}

fn parse(text: &str) -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if let Some(body) = trimmed.strip_suffix('\\') {
            current.push_str(body);
            current.push(' ');
            continue;
        }
        current.push_str(trimmed);
        let (k, a) = current.split_once(char::is_whitespace).unwrap_or((&current, ""));
        out.push(Instruction {
            keyword: k.to_uppercase(),
            args: a.split_whitespace().collect::<Vec<_>>().join(" "),
        });
        current.clear();
    }
    assert!(current.is_empty(), "a continuation runs off the end");
    out
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

const HARNESS_IDS: [&str; 4] = ["claude-code", "codex", "opencode", "claude-agent-sdk"];

#[test]
fn every_harness_has_a_well_formed_dockerfile() {
    for id in HARNESS_IDS {
        let path = root().join(id).join("Dockerfile");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let ins = parse(&text);
        let at = |i: &Instruction| format!("{id}: {} {}", i.keyword, i.args);
        let froms: Vec<usize> = ins
            .iter()
            .enumerate()
            .filter(|(_, i)| i.keyword == "FROM")
            .map(|(n, _)| n)
            .collect();
        assert!(froms.len() >= 2, "{id}: a multi-stage build");

        // Stage 1 builds lap-harness from this workspace, reproducibly.
        let build = &ins[froms[0]];
        let stage = build.args.rsplit(' ').next().unwrap();
        assert!(build.args.to_lowercase().contains(" as "), "{}", at(build));
        let build_steps = &ins[froms[0]..froms[froms.len() - 1]];
        assert!(
            build_steps.iter().any(|i| i.keyword == "RUN"
                && i.args.contains("cargo build")
                && i.args.contains("--release")
                && i.args.contains("--locked")
                && i.args.contains("-p lap-harness")),
            "{id}: the build stage runs cargo build --release --locked -p lap-harness"
        );

        // The final stage.
        let last = &ins[froms[froms.len() - 1]..];
        let runs: Vec<&str> = last
            .iter()
            .filter(|i| i.keyword == "RUN")
            .map(|i| i.args.as_str())
            .collect();
        let kind = AgentKind::parse(id).unwrap();
        assert!(
            runs.iter()
                .any(|r| r.contains("npm install -g") && r.contains(kind.npm_package())),
            "{id}: the agent CLI from npm ({})",
            kind.npm_package()
        );
        assert!(
            runs.iter()
                .any(|r| r.contains("apt-get install") && r.split(' ').any(|w| w == "git")),
            "{id}: git installed"
        );
        assert!(
            last.iter().any(|i| i.keyword == "COPY"
                && i.args.contains(&format!("--from={stage}"))
                && i.args.contains("lap-harness")),
            "{id}: lap-harness copied from the build stage `{stage}`"
        );
        let user = last
            .iter()
            .rev()
            .find(|i| i.keyword == "USER")
            .unwrap_or_else(|| panic!("{id}: no USER"));
        let uid = user.args.split(':').next().unwrap();
        assert!(uid != "root" && uid != "0", "{id}: runs as root ({})", user.args);
        assert!(
            runs.iter().any(|r| r.contains("useradd") && r.contains(uid)),
            "{id}: the user {uid} is created"
        );
        let env: String = last
            .iter()
            .filter(|i| i.keyword == "ENV")
            .map(|i| i.args.clone())
            .collect::<Vec<_>>()
            .join(" ");
        assert!(env.contains(&format!("LAP_HARNESS_ID={id}")), "{id}: LAP_HARNESS_ID");
        assert!(
            env.contains("LAP_HARNESS_HOST=0.0.0.0"),
            "{id}: listens beyond loopback"
        );
        assert!(
            env.contains("LAP_CA_FILE=/lap-shared/ca.pem"),
            "{id}: the pod CA's path"
        );
        let entry = last
            .iter()
            .find(|i| i.keyword == "ENTRYPOINT")
            .unwrap_or_else(|| panic!("{id}: no ENTRYPOINT"));
        let argv: Vec<String> = serde_json::from_str(&entry.args).unwrap_or_else(|e| panic!("{}: {e}", at(entry)));
        assert!(argv.iter().any(|a| a.ends_with("lap-entrypoint")), "{}", at(entry));
        assert!(
            last.iter()
                .any(|i| i.keyword == "COPY" && i.args.contains("harness-images/entrypoint.sh")),
            "{id}: the entrypoint is copied in"
        );
        // Every COPY source of the final stage exists in the repository (the build context).
        for c in last
            .iter()
            .filter(|i| i.keyword == "COPY" && !i.args.contains("--from"))
        {
            let parts: Vec<&str> = c.args.split(' ').filter(|p| !p.starts_with("--")).collect();
            for src in &parts[..parts.len() - 1] {
                assert!(root().parent().unwrap().join(src).exists(), "{}: {src} missing", at(c));
            }
        }
    }
}

/// The entrypoint: waits for the pod CA, builds a bundle, exports the SPEC §2.3 variables it
/// was not given, and runs lap-harness. Run for real with `sh`, with a stand-in `lap-harness`
/// that prints its environment.
#[test]
fn the_entrypoint_picks_up_the_pod_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\nPODCA\n-----END CERTIFICATE-----\n").unwrap();
    let script = std::fs::read_to_string(root().join("entrypoint.sh")).unwrap();
    let fake = dir.path().join("lap-harness");
    std::fs::write(&fake, "#!/bin/sh\nenv\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = script.replace("/usr/local/bin/lap-harness", &fake.display().to_string());
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir.path())
        .env("LAP_CA_FILE", &ca)
        .env("LAP_CA_WAIT_SECONDS", "2")
        .env("GIT_SSL_CAINFO", "/given.pem")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let env = String::from_utf8_lossy(&out.stdout);
    let bundle = dir.path().join(".lap-ca-bundle.pem");
    assert!(env.contains(&format!("NODE_EXTRA_CA_CERTS={}", ca.display())), "{env}");
    assert!(env.contains(&format!("SSL_CERT_FILE={}", bundle.display())), "{env}");
    assert!(
        env.contains("GIT_SSL_CAINFO=/given.pem"),
        "a given variable is kept: {env}"
    );
    let b = std::fs::read_to_string(&bundle).unwrap();
    assert!(
        b.ends_with("PODCA\n-----END CERTIFICATE-----\n"),
        "the bundle ends with the pod CA"
    );
}
