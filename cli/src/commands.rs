//! What each `lap` command does.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::agent_spec::{self, AgentFlags, Edit};
use crate::client::{Client, ClientError, AGENT_FLAGS, SECRET_FLAGS, SESSION_FLAGS};
use crate::config::{self, Saved};
use crate::stream::agent_text;
use crate::terminal::{self, End};
use crate::{harness_keys, resolve, vault_events, when, RunArgs};
use lap_sse::SseReader;

const SPINNER: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];
/// How long a session may stay `creating` before `lap` gives up waiting (the server has its
/// own, longer, LAP_CREATE_TIMEOUT).
const READY_WAIT: Duration = Duration::from_secs(15 * 60);

fn client() -> Result<Client> {
    Ok(Client::new(config::creds()?)?)
}

fn str_of<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(|x| x.as_str()).unwrap_or("-")
}

/// Print rows as aligned columns.
fn table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = width[i]));
            }
        }
        out!("{}", s.trim_end());
    };
    line(header.iter().map(|h| (*h).to_owned()).collect());
    for r in rows {
        line(r);
    }
}

/// A line from stdin: echoed when `secret` is false, hidden (raw mode) when it is true.
fn prompt(label: &str, secret: bool) -> Result<String> {
    eprint!("{label}");
    std::io::stderr().flush().ok();
    if secret && std::io::stdin().is_terminal() {
        let mut value = Vec::new();
        {
            let _raw = terminal::RawMode::enter()?;
            let mut byte = [0u8; 1];
            let mut stdin = std::io::stdin().lock();
            loop {
                if stdin.read(&mut byte)? == 0 {
                    break;
                }
                match byte[0] {
                    b'\r' | b'\n' => break,
                    0x03 => bail!("cancelled"),
                    0x7f | 0x08 => {
                        value.pop();
                    }
                    b => value.push(b),
                }
            }
        }
        eprintln!();
        return Ok(String::from_utf8_lossy(&value).trim().to_owned());
    }
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(line.trim().to_owned())
}

pub(crate) async fn login(url: Option<String>) -> Result<ExitCode> {
    let path = config::path()?;
    let saved = config::load(&path)?;
    let url = match url.or_else(|| std::env::var("LAP_URL").ok().filter(|v| !v.is_empty())) {
        Some(u) => u,
        None => {
            let default = saved.url.clone().unwrap_or_else(|| "http://127.0.0.1:4000".into());
            let u = prompt(&format!("LAP server URL [{default}]: "), false)?;
            if u.is_empty() {
                default
            } else {
                u
            }
        }
    };
    let url = config::normalise_url(&url).map_err(anyhow::Error::msg)?;
    let key = match std::env::var("MASTER_KEY").ok().filter(|v| !v.is_empty()) {
        Some(k) => k,
        None => prompt("Master key (input hidden): ", true)?,
    };
    if key.is_empty() {
        bail!("no key given");
    }
    let creds = config::Creds { url, key };
    match Client::new(creds.clone())?.check().await {
        Ok(()) => {}
        Err(ClientError::Unauthorized { message }) => {
            bail!(
                "the server at {} refused the key ({message}); nothing saved. A local `lap-server` \
                 prints its key at start and keeps it in .lap/master_key where it runs",
                creds.url
            )
        }
        Err(e) => bail!("{e}; nothing saved"),
    }
    config::save(
        &path,
        &Saved {
            url: Some(creds.url.clone()),
            key: Some(creds.key),
        },
    )?;
    eprintln!("Logged in to {}; saved to {} (0600).", creds.url, path.display());
    Ok(ExitCode::SUCCESS)
}

/// Print `v` as indented JSON (for `--json`).
fn print_json(v: &Value) -> Result<()> {
    out!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn list_of(v: &Value, k: &str) -> String {
    v[k].as_array()
        .map(|a| a.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(","))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "-".to_owned())
}

pub(crate) async fn agents(json: bool) -> Result<ExitCode> {
    let agents = client()?.agents().await?;
    if json {
        print_json(&Value::Array(agents))?;
        return Ok(ExitCode::SUCCESS);
    }
    table(
        &["NAME", "HARNESS", "MODEL", "REPO", "SECRETS", "ID"],
        agents
            .iter()
            .map(|a| {
                vec![
                    str_of(a, "name").to_owned(),
                    str_of(a, "harness_id").to_owned(),
                    str_of(a, "model").to_owned(),
                    str_of(a, "repo_url").to_owned(),
                    list_of(a, "secrets"),
                    str_of(a, "id").to_owned(),
                ]
            })
            .collect(),
    );
    Ok(ExitCode::SUCCESS)
}

/// One agent, as a few labelled lines.
fn show_agent(a: &Value) {
    out!("{} ({})", str_of(a, "name"), str_of(a, "id"));
    let env_names: Vec<&str> = a["env_vars"]
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    for (label, value) in [
        ("harness", str_of(a, "harness_id").to_owned()),
        ("model", str_of(a, "model").to_owned()),
        ("repo", str_of(a, "repo_url").to_owned()),
        ("branch", str_of(a, "branch").to_owned()),
        ("secrets", list_of(a, "secrets")),
        ("allow out", list_of(a, "allow_out")),
        ("deny out", list_of(a, "deny_out")),
        (
            "env",
            if env_names.is_empty() {
                "-".to_owned()
            } else {
                env_names.join(",")
            },
        ),
    ] {
        out!("  {label:<10} {value}");
    }
}

fn from_env(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

pub(crate) async fn agents_create(name: &str, flags: &AgentFlags, json: bool) -> Result<ExitCode> {
    let body = agent_spec::create_body(name, flags, from_env)?;
    let c = client()?;
    let a = match c.create_agent(&body).await {
        Err(ClientError::Api { status: 409, .. }) => {
            bail!("an agent named `{name}` already exists: `lap agents edit {name} …` changes it")
        }
        r => r.map_err(|e| e.in_flags(AGENT_FLAGS))?,
    };
    if json {
        print_json(&a)?;
    } else {
        eprintln!("Created agent {name}. Start a session: lap {name}");
        show_agent(&a);
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn agents_edit(agent: &str, flags: &AgentFlags, edit: &Edit, json: bool) -> Result<ExitCode> {
    let c = client()?;
    let current = c.agent(agent).await?;
    let body = agent_spec::patch_body(&current, flags, edit, from_env)?;
    let a = c
        .patch_agent(str_of(&current, "id"), &body)
        .await
        .map_err(|e| e.in_flags(AGENT_FLAGS))?;
    if json {
        print_json(&a)?;
    } else {
        eprintln!(
            "Changed agent {} (new sessions get it; running ones keep theirs).",
            str_of(&a, "name")
        );
        show_agent(&a);
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn agents_rm(agent: &str, stop_sessions: bool) -> Result<ExitCode> {
    let c = client()?;
    let a = c.agent(agent).await?;
    let name = str_of(&a, "name");
    match c.delete_agent(str_of(&a, "id"), stop_sessions).await {
        Err(ClientError::Api { status: 409, .. }) if !stop_sessions => bail!(
            "agent `{name}` has live sessions (`lap sessions --agent {name}`): stop them, or \
             `lap agents rm {name} --stop-sessions` stops them first"
        ),
        r => r?,
    }
    eprintln!("Removed agent {name}.");
    Ok(ExitCode::SUCCESS)
}

/// The sessions shown by default: all but the stopped ones.
fn shown(s: &Value, all: bool) -> bool {
    all || s["status"] != "dead"
}

/// What a person wants to know beside a session's status: why it failed, where its bring-up
/// is, else its title.
fn note(s: &Value) -> String {
    match str_of(s, "status") {
        "failed" => s["failure_reason"].as_str().unwrap_or("no reason given").to_owned(),
        "creating" => format!("phase {}", str_of(s, "phase")),
        _ => s["title"].as_str().unwrap_or("").to_owned(),
    }
}

pub(crate) async fn sessions(agent: Option<String>, all: bool, json: bool) -> Result<ExitCode> {
    let c = client()?;
    let agents = c.agents().await?;
    let name_of: BTreeMap<String, String> = agents
        .iter()
        .map(|a| (str_of(a, "id").to_owned(), str_of(a, "name").to_owned()))
        .collect();
    let agent_id = match agent {
        Some(a) => Some(str_of(&c.agent(&a).await?, "id").to_owned()),
        None => None,
    };
    let sessions: Vec<Value> = c
        .sessions(agent_id.as_deref())
        .await?
        .into_iter()
        .filter(|s| shown(s, all))
        .collect();
    if json {
        print_json(&Value::Array(sessions))?;
        return Ok(ExitCode::SUCCESS);
    }
    let now = when::now_ms();
    table(
        &["ID", "AGENT", "STATUS", "CREATED", "LAST SEEN", "NOTE"],
        sessions
            .iter()
            .map(|s| {
                let aid = str_of(s, "agent_id");
                vec![
                    str_of(s, "id").to_owned(),
                    name_of.get(aid).cloned().unwrap_or_else(|| aid.to_owned()),
                    str_of(s, "status").to_owned(),
                    when::ago_text(s["created_at"].as_str(), now),
                    when::ago_text(s["last_seen_at"].as_str(), now),
                    note(s),
                ]
            })
            .collect(),
    );
    Ok(ExitCode::SUCCESS)
}

/// The session `query` means: an id (one GET), else a unique id prefix or an agent's name
/// ([`resolve::session`] over every session).
async fn find_session(c: &Client, query: &str) -> Result<Value> {
    if query.starts_with("ses_") {
        match c.session(query).await {
            Ok(s) => return Ok(s),
            Err(ClientError::Api { status: 404, .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (agents, sessions) = (c.agents().await?, c.sessions(None).await?);
    Ok(resolve::session(query, &sessions, &agents)?.clone())
}

/// How the phase just left ended, judged by the state it left into: still `creating` or
/// `ready` is done (✓); `failed` or `dead` means it is where bring-up stopped (✗).
fn phase_mark(next: &Value) -> &'static str {
    match next["status"].as_str() {
        Some("creating" | "ready") => "✓",
        _ => "✗",
    }
}

/// Follow a session's bring-up until it leaves `creating`: one line per phase (from the
/// session's `/events`, so none is missed), with a spinner on a terminal. Returns the session.
async fn wait_ready(c: &Client, id: &str) -> Result<Value> {
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut phase_started = Instant::now();
    let mut shown: Option<String> = None;
    let mut frame = 0usize;
    let mut events = c.events(id).await?.bytes_stream();
    let mut parser = SseReader::default();
    let mut tick = tokio::time::interval(Duration::from_millis(120));
    let mut last: Option<Value> = None;
    loop {
        tokio::select! {
            chunk = events.next() => match chunk {
                Some(Ok(bytes)) => {
                    for ev in parser.feed(&bytes).into_iter().filter(|e| e.event == "session") {
                        let s: Value = serde_json::from_str(&ev.data).unwrap_or_default();
                        let phase = str_of(&s, "phase").to_owned();
                        if shown.as_deref() != Some(phase.as_str()) {
                            if let Some(prev) = shown.take() {
                                if tty {
                                    eprint!("\r\x1b[2K");
                                }
                                eprintln!("  {} {prev} ({:.1}s)", phase_mark(&s), phase_started.elapsed().as_secs_f64());
                            }
                            if s["status"] == "creating" {
                                shown = Some(phase);
                                phase_started = Instant::now();
                            }
                        }
                        last = Some(s);
                    }
                }
                // The stream broke (server restart?): look once, then follow a new one.
                _ => {
                    last = Some(c.session(id).await?);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    events = c.events(id).await?.bytes_stream();
                    parser = SseReader::default();
                }
            },
            _ = tick.tick() => {
                if tty {
                    if let Some(p) = &shown {
                        eprint!(
                            "\r\x1b[2K  {} {p} ({:.0}s)",
                            SPINNER[frame % SPINNER.len()],
                            started.elapsed().as_secs_f64()
                        );
                        std::io::stderr().flush().ok();
                    }
                }
                frame += 1;
            }
        }
        if let Some(s) = last.take() {
            if s["status"] != "creating" {
                if tty {
                    eprint!("\r\x1b[2K");
                }
                // The last phase ends with the session's bring-up, whether or not the final state
                // names another phase.
                if let Some(prev) = shown.take() {
                    eprintln!(
                        "  {} {prev} ({:.1}s)",
                        phase_mark(&s),
                        phase_started.elapsed().as_secs_f64()
                    );
                }
                return Ok(s);
            }
        }
        if started.elapsed() > READY_WAIT {
            bail!("session {id} is still creating after {READY_WAIT:?}; `lap sessions` shows it");
        }
    }
}

/// Attach to a ready session; says how to reattach on detach.
async fn attach_ready(c: &Client, s: &Value) -> Result<ExitCode> {
    let id = str_of(s, "id");
    let (Some(path), Some(token)) = (s["tty_url"].as_str(), s["tty_token"].as_str()) else {
        bail!("the server did not give a terminal for session {id}");
    };
    let end = terminal::attach(&c.creds().url, path, token).await?;
    match end {
        End::Detached => {
            eprintln!("\r\nDetached from {id}; it keeps running. Reattach with: lap attach {id}");
            Ok(ExitCode::SUCCESS)
        }
        End::AgentExited(code) => {
            eprintln!("\r\nThe agent in {id} exited (code {code}). `lap attach {id}` starts it again.");
            Ok(ExitCode::SUCCESS)
        }
        End::Closed => {
            let status = c
                .session(id)
                .await
                .map(|s| str_of(&s, "status").to_owned())
                .unwrap_or_else(|_| "unknown".into());
            eprintln!("\r\nThe connection to {id} closed (session {status}).");
            Ok(ExitCode::FAILURE)
        }
    }
}

fn settled(s: &Value) -> Result<()> {
    match str_of(s, "status") {
        "ready" => Ok(()),
        "failed" => bail!(
            "session {} failed: {}",
            str_of(s, "id"),
            s["failure_reason"].as_str().unwrap_or("no reason given")
        ),
        other => bail!("session {} is {other}", str_of(s, "id")),
    }
}

pub(crate) async fn attach(session: &str) -> Result<ExitCode> {
    let c = client()?;
    let mut s = find_session(&c, session).await?;
    if s["status"] == "creating" {
        let id = str_of(&s, "id").to_owned();
        s = wait_ready(&c, &id).await?;
    }
    settled(&s)?;
    attach_ready(&c, &s).await
}

/// `-e KEY` (value from this environment) or `-e KEY=VALUE`.
fn env_vars(specs: &[String]) -> Result<BTreeMap<String, String>> {
    agent_spec::env_values(specs, from_env).map_err(|e| anyhow::anyhow!("{}", e.to_string().replacen("--env", "-e", 2)))
}

pub(crate) async fn run(args: RunArgs) -> Result<ExitCode> {
    let c = client()?;
    let agent = c.agent(&args.agent).await?;
    let env = env_vars(&args.env)?;
    let names: Vec<&str> = env.keys().map(String::as_str).collect();
    if let Some(w) = harness_keys::missing_key_warning(&agent, &names) {
        eprintln!("{w}");
    }
    let mut body = json!({ "env_vars": env });
    if let Some(t) = &args.title {
        body["title"] = t.clone().into();
    }
    let s = c
        .create_session(str_of(&agent, "id"), body)
        .await
        .map_err(|e| e.in_flags(SESSION_FLAGS))?;
    let id = str_of(&s, "id").to_owned();
    eprintln!(
        "Starting {} ({}) as session {id}",
        str_of(&agent, "name"),
        str_of(&agent, "harness_id")
    );
    let s = wait_ready(&c, &id).await?;
    settled(&s)?;
    if args.no_attach {
        out!("{id}");
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("Ready. Attaching (Ctrl-D detaches; the session keeps running).");
    attach_ready(&c, &s).await
}

/// Whether the text of an `error` event was already shown as the agent's own text (claude
/// prints its API error as an assistant block, then fails the turn with the same words).
fn already_shown(error: &str, shown: &[String]) -> bool {
    let e = error.trim();
    // The server may prefix it ("the agent failed: API Error: …").
    !e.is_empty()
        && shown
            .iter()
            .map(|t| t.trim())
            .any(|t| !t.is_empty() && (t.contains(e) || e.ends_with(t)))
}

pub(crate) async fn send(session: &str, text: &str) -> Result<ExitCode> {
    let c = client()?;
    let s = find_session(&c, session).await?;
    let id = str_of(&s, "id").to_owned();
    // The vault's interceptions before this message: only newer ones are reported.
    let mut vault_seen = c.interceptions(&id).await.map(|v| v.len()).unwrap_or(0);
    let resp = c.message_stream(&id, text).await?;
    let mut body = resp.bytes_stream();
    let mut vault_poll = tokio::time::interval(Duration::from_secs(2));
    vault_poll.tick().await;
    let mut parser = SseReader::default();
    let mut shown: Vec<String> = Vec::new();
    let mut out = std::io::stdout();
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    // Until the agent's first text: say what is happening, with the time it has taken.
    let mut waiting = true;
    let mut frame = 0usize;
    let mut last_note = Instant::now();
    let mut problems: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut repeated: Option<(String, usize)> = None;
    if !tty {
        eprintln!("Sent to {id}; waiting for the agent's reply…");
    }
    let mut tick = tokio::time::interval(Duration::from_millis(120));
    let stop_waiting = |waiting: &mut bool| {
        if *waiting && tty {
            eprint!("\r\x1b[2K");
            std::io::stderr().flush().ok();
        }
        *waiting = false;
    };
    loop {
        let chunk = tokio::select! {
            next = body.next() => next,
            _ = vault_poll.tick() => {
                // What the vault saw go wrong, as it happens (a DNS failure, a block, …).
                // Each problem is printed once; its repeats (a CLI retrying) are counted on the
                // waiting line.
                if let Ok(events) = c.interceptions(&id).await {
                    for p in events.iter().skip(vault_seen).filter_map(vault_events::problem) {
                        let n = problems.entry(p.clone()).or_insert(0);
                        *n += 1;
                        if *n == 1 {
                            if waiting && tty {
                                eprint!("\r\x1b[2K");
                            }
                            eprintln!("  {p}");
                        } else {
                            repeated = Some((p, *n));
                        }
                    }
                    vault_seen = vault_seen.max(events.len());
                }
                continue;
            }
            _ = tick.tick() => {
                if waiting {
                    let secs = started.elapsed().as_secs();
                    if tty {
                        let again = repeated.as_ref().map(|(p, n)| format!(" · {p} ×{n}")).unwrap_or_default();
                        eprint!("\r\x1b[2K  {} waiting for {id}'s reply ({secs}s){again}", SPINNER[frame % SPINNER.len()]);
                        std::io::stderr().flush().ok();
                    } else if last_note.elapsed() >= Duration::from_secs(30) {
                        eprintln!("  still waiting for the agent's reply ({secs}s)");
                        last_note = Instant::now();
                    }
                    frame += 1;
                }
                continue;
            }
        };
        let Some(chunk) = chunk else { break };
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => {
                stop_waiting(&mut waiting);
                return Err(ended_early(&c, &id, &e.to_string()).await);
            }
        };
        for ev in parser.feed(&chunk) {
            // LAP's frames (`ready`, `harness_event`, `done`, `error`); `agent` and `message` are
            // what a harness before them sent.
            match ev.event.as_str() {
                "harness_event" | "agent" => {
                    // An event without text (the CLI's own start-up, a tool call) is no reply
                    // yet: keep saying that lap is waiting, and what the vault sees meanwhile.
                    let v: Value = serde_json::from_str(&ev.data).unwrap_or_default();
                    if let Some(t) = agent_text(&v) {
                        stop_waiting(&mut waiting);
                        if !shown.is_empty() {
                            writeln!(out)?;
                        }
                        write!(out, "{t}")?;
                        out.flush()?;
                        shown.push(t);
                    }
                }
                "done" | "message" => {
                    stop_waiting(&mut waiting);
                    if shown.is_empty() {
                        let v: Value = serde_json::from_str(&ev.data).unwrap_or_default();
                        let texts: Vec<&str> = v["parts"]
                            .as_array()
                            .map(|p| p.iter().filter_map(|x| x["text"].as_str()).collect())
                            .unwrap_or_default();
                        write!(out, "{}", texts.join("\n"))?;
                    }
                    writeln!(out)?;
                    return Ok(ExitCode::SUCCESS);
                }
                "error" => {
                    stop_waiting(&mut waiting);
                    if !shown.is_empty() {
                        writeln!(out)?;
                    }
                    let v: Value = serde_json::from_str(&ev.data).unwrap_or_default();
                    let error = v["error"].as_str().unwrap_or(&ev.data);
                    if already_shown(error, &shown) {
                        bail!(
                            "the agent's turn failed after {:.0}s (its error is above)",
                            started.elapsed().as_secs_f64()
                        );
                    }
                    bail!(
                        "the agent's turn failed after {:.0}s: {error}",
                        started.elapsed().as_secs_f64()
                    );
                }
                _ => {}
            }
        }
    }
    stop_waiting(&mut waiting);
    Err(ended_early(&c, &id, "it ended").await)
}

/// Why a reply stream ended before the reply, in words: the session stopped (or failed) during
/// the turn, or the stream itself broke (`what`), the session still being as it was.
async fn ended_early(c: &Client, id: &str, what: &str) -> anyhow::Error {
    match c.session(id).await {
        Ok(s) if s["status"] == "dead" || s["status"] == "failed" => {
            let mut m = format!("session {id} is {} (stopped during the turn)", str_of(&s, "status"));
            if let Some(r) = s["failure_reason"].as_str() {
                m.push_str(&format!(": {r}"));
            }
            anyhow::anyhow!(m)
        }
        _ => anyhow::anyhow!(
            "the reply stream broke before the reply ({what}); `lap sessions` shows whether {id} is still ready"
        ),
    }
}

pub(crate) async fn stop(session: &str, json: bool) -> Result<ExitCode> {
    let c = client()?;
    let s = find_session(&c, session).await?;
    let id = str_of(&s, "id");
    // Stopping a stopped session is not an error (the API's DELETE is idempotent), but saying
    // "Stopped" would claim this call did it.
    let was = str_of(&s, "status").to_owned();
    let s = c.stop_session(id).await?;
    if json {
        print_json(&s)?;
    } else if was == "dead" || was == "failed" {
        eprintln!("{id} was already {was}; nothing to stop.");
    } else {
        eprintln!("Stopped {} (status {}).", str_of(&s, "id"), str_of(&s, "status"));
    }
    Ok(ExitCode::SUCCESS)
}

/// One audit event's detail, short: its fields as `k=v`, strings unquoted.
fn detail_text(d: &Value) -> String {
    match d.as_object() {
        Some(o) => o
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            })
            .collect::<Vec<_>>()
            .join(" "),
        None if d.is_null() => String::new(),
        None => d.to_string(),
    }
}

pub(crate) async fn audit(session: &str, json: bool) -> Result<ExitCode> {
    let c = client()?;
    let s = find_session(&c, session).await?;
    let id = str_of(&s, "id");
    // Pull the vault's newest interceptions into the durable audit first.
    let _ = c.interceptions(id).await;
    let rows = c.audit(id).await?;
    if json {
        print_json(&Value::Array(rows))?;
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        eprintln!("No audit events for {id} yet.");
        return Ok(ExitCode::SUCCESS);
    }
    let now = when::now_ms();
    table(
        &["TIME", "KIND", "ACTOR", "SECRETS", "DETAIL"],
        rows.iter()
            .map(|r| {
                vec![
                    when::ago_text(r["time"].as_str(), now),
                    str_of(r, "kind").to_owned(),
                    str_of(r, "actor").to_owned(),
                    list_of(r, "secrets"),
                    if r["kind"] == "interception" {
                        vault_events::summary(&r["detail"])
                    } else {
                        detail_text(&r["detail"])
                    },
                ]
            })
            .collect(),
    );
    Ok(ExitCode::SUCCESS)
}

/// A `session` event whose status is terminal (`dead`, `failed`).
fn ends_the_log(event: &str, data: &str) -> bool {
    event == "session"
        && serde_json::from_str::<Value>(data).is_ok_and(|v| v["status"] == "dead" || v["status"] == "failed")
}

/// One event of a session's `/events` as a line: `session` changes as status and phase, agent
/// events as their text when they have one, else their JSON.
fn event_line(event: &str, data: &str) -> String {
    let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
    match event {
        "session" => {
            let mut l = format!(
                "session {} {} (phase {})",
                str_of(&v, "id"),
                str_of(&v, "status"),
                str_of(&v, "phase")
            );
            if let Some(r) = v["failure_reason"].as_str() {
                l.push_str(&format!(": {r}"));
            }
            l
        }
        "agent" => match agent_text(&v) {
            Some(t) => format!("agent: {t}"),
            None => format!("agent {data}"),
        },
        other => format!("{other} {data}"),
    }
}

pub(crate) async fn logs(session: &str, follow: bool, quiet_for: u64, json: bool) -> Result<ExitCode> {
    let c = client()?;
    let s = find_session(&c, session).await?;
    let id = str_of(&s, "id").to_owned();
    let mut events = c.events(&id).await?.bytes_stream();
    let mut parser = SseReader::default();
    let quiet = Duration::from_secs(quiet_for);
    loop {
        let next = if follow {
            events.next().await
        } else {
            match tokio::time::timeout(quiet, events.next()).await {
                Ok(n) => n,
                Err(_) => return Ok(ExitCode::SUCCESS),
            }
        };
        let Some(chunk) = next else {
            return Ok(ExitCode::SUCCESS);
        };
        let chunk = chunk.context("the event stream broke")?;
        for ev in parser.feed(&chunk) {
            if json {
                let data: Value = serde_json::from_str(&ev.data).unwrap_or(Value::String(ev.data.clone()));
                out!("{}", json!({ "event": ev.event, "data": data }));
            } else {
                out!("{}", event_line(&ev.event, &ev.data));
            }
            // A dead or failed session has nothing more to say (`-f` included).
            if ends_the_log(&ev.event, &ev.data) {
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
}

/// `lap logs SESSION --harness|--vault`: the last lines of that log, as the server keeps it.
pub(crate) async fn log_file(session: &str, source: &str, tail: u32, json: bool) -> Result<ExitCode> {
    let c = client()?;
    let s = find_session(&c, session).await?;
    let v = c.logs(str_of(&s, "id"), source, tail).await?;
    if json {
        print_json(&v)?;
        return Ok(ExitCode::SUCCESS);
    }
    let lines = v["lines"].as_array().cloned().unwrap_or_default();
    if lines.is_empty() {
        eprintln!("{}'s {source} log is empty (or not kept any more).", str_of(&s, "id"));
    }
    for l in lines {
        out!("{}", l.as_str().unwrap_or_default());
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn secrets_list(json: bool) -> Result<ExitCode> {
    let secrets = client()?.secrets().await?;
    if json {
        print_json(&Value::Array(secrets))?;
        return Ok(ExitCode::SUCCESS);
    }
    let now = when::now_ms();
    table(
        &["NAME", "HOSTS", "LOCATIONS", "UPDATED"],
        secrets
            .iter()
            .map(|s| {
                vec![
                    str_of(s, "name").to_owned(),
                    list_of(s, "hosts"),
                    list_of(s, "locations"),
                    when::ago_text(s["updated_at"].as_str(), now),
                ]
            })
            .collect(),
    );
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn secrets_rm(name: &str) -> Result<ExitCode> {
    match client()?.delete_secret(name).await {
        Err(ClientError::Api { status: 404, .. }) => bail!("no secret named `{name}`: `lap secrets list` lists them"),
        r => r?,
    }
    eprintln!("Removed secret {name} (revoked from running sessions that had it).");
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn secrets_set(name: &str, hosts: &[String], locations: &[String]) -> Result<ExitCode> {
    let c = client()?;
    let value = if std::io::stdin().is_terminal() {
        prompt(&format!("Value of {name} (input hidden): "), true)?
    } else {
        let mut v = String::new();
        std::io::stdin()
            .read_to_string(&mut v)
            .context("cannot read the value from stdin")?;
        let v = v.strip_suffix('\n').unwrap_or(&v);
        v.strip_suffix('\r').unwrap_or(v).to_owned()
    };
    if value.is_empty() {
        bail!("no value on stdin: `printf %s \"$VALUE\" | lap secrets set {name} --host …`");
    }
    let s = c
        .put_secret(name, &value, hosts, locations)
        .await
        .map_err(|e| e.in_flags(SECRET_FLAGS))?;
    eprintln!(
        "Secret {} set (hosts: {}).",
        str_of(&s, "name"),
        s["hosts"]
            .as_array()
            .map(|h| h.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(", "))
            .unwrap_or_default()
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_error_the_agent_already_printed_is_not_repeated() {
        let shown = vec!["API Error: Connection error.".to_owned()];
        assert!(already_shown("API Error: Connection error.", &shown));
        assert!(already_shown("  API Error: Connection error.\n", &shown));
        assert!(already_shown("the agent failed: API Error: Connection error.", &shown));
        assert!(!already_shown("the harness is gone", &shown));
        assert!(!already_shown("", &shown));
        assert!(!already_shown("x", &[]));
    }

    #[test]
    fn the_phase_bring_up_stopped_in_is_crossed() {
        assert_eq!(phase_mark(&json!({"status": "creating"})), "✓");
        assert_eq!(phase_mark(&json!({"status": "ready"})), "✓");
        assert_eq!(phase_mark(&json!({"status": "failed"})), "✗");
        assert_eq!(phase_mark(&json!({"status": "dead"})), "✗");
    }

    #[test]
    fn a_terminal_session_event_ends_the_log() {
        assert!(ends_the_log("session", r#"{"id":"s","status":"dead"}"#));
        assert!(ends_the_log("session", r#"{"id":"s","status":"failed"}"#));
        assert!(!ends_the_log("session", r#"{"id":"s","status":"ready"}"#));
        assert!(!ends_the_log("agent", r#"{"status":"dead"}"#));
    }

    #[test]
    fn sessions_notes_and_event_lines() {
        let failed = json!({"status": "failed", "failure_reason": "bwrap: not installed"});
        assert_eq!(note(&failed), "bwrap: not installed");
        assert_eq!(
            note(&json!({"status": "creating", "phase": "starting-vault"})),
            "phase starting-vault"
        );
        assert_eq!(note(&json!({"status": "ready", "title": "t"})), "t");
        assert!(!shown(&json!({"status": "dead"}), false));
        assert!(shown(&json!({"status": "dead"}), true));
        assert!(shown(&json!({"status": "failed"}), false));
        assert_eq!(
            event_line(
                "session",
                r#"{"id":"ses_1","status":"failed","phase":"x","failure_reason":"boom"}"#
            ),
            "session ses_1 failed (phase x): boom"
        );
        assert_eq!(
            event_line(
                "agent",
                r#"{"type":"item.completed","item":{"type":"agent_message","text":"Done"}}"#
            ),
            "agent: Done"
        );
        assert_eq!(detail_text(&json!({"host": "a", "n": 2})), "host=a n=2");
    }

    #[test]
    fn env_var_specs() {
        let v = env_vars(&["A=1".into(), "B=x=y".into()]).unwrap();
        assert_eq!(v["A"], "1");
        assert_eq!(v["B"], "x=y");
        let e = env_vars(&["LAP_CLI_TEST_SURELY_UNSET".into()]).unwrap_err();
        assert!(e.to_string().contains("not set"), "{e}");
    }
}
