//! What each `lap` command does.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::client::Client;
use crate::config::{self, Saved};
use crate::stream::{agent_text, SseParser};
use crate::terminal::{self, End};
use crate::RunArgs;

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
        println!("{}", s.trim_end());
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
    Client::new(creds.clone())?
        .check()
        .await
        .context("the server refused the key")?;
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

pub(crate) async fn agents() -> Result<ExitCode> {
    let agents = client()?.agents().await?;
    table(
        &["NAME", "HARNESS", "MODEL", "REPO", "ID"],
        agents
            .iter()
            .map(|a| {
                vec![
                    str_of(a, "name").to_owned(),
                    str_of(a, "harness_id").to_owned(),
                    str_of(a, "model").to_owned(),
                    str_of(a, "repo_url").to_owned(),
                    str_of(a, "id").to_owned(),
                ]
            })
            .collect(),
    );
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn sessions(agent: Option<String>) -> Result<ExitCode> {
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
    let sessions = c.sessions(agent_id.as_deref()).await?;
    table(
        &["ID", "AGENT", "STATUS", "PHASE", "LAST SEEN", "TITLE"],
        sessions
            .iter()
            .map(|s| {
                let aid = str_of(s, "agent_id");
                vec![
                    str_of(s, "id").to_owned(),
                    name_of.get(aid).cloned().unwrap_or_else(|| aid.to_owned()),
                    str_of(s, "status").to_owned(),
                    str_of(s, "phase").to_owned(),
                    str_of(s, "last_seen_at").to_owned(),
                    s["title"].as_str().unwrap_or("").to_owned(),
                ]
            })
            .collect(),
    );
    Ok(ExitCode::SUCCESS)
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
    let mut parser = SseParser::default();
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
                                eprintln!("  ✓ {prev} ({:.1}s)", phase_started.elapsed().as_secs_f64());
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
                    parser = SseParser::default();
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
    let mut s = c.session(session).await?;
    if s["status"] == "creating" {
        s = wait_ready(&c, session).await?;
    }
    settled(&s)?;
    attach_ready(&c, &s).await
}

/// `-e KEY` (value from this environment) or `-e KEY=VALUE`.
fn env_vars(specs: &[String]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for spec in specs {
        let (k, v) = match spec.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => {
                let v = std::env::var(spec)
                    .with_context(|| format!("-e {spec}: `{spec}` is not set in this environment"))?;
                (spec.clone(), v)
            }
        };
        out.insert(k, v);
    }
    Ok(out)
}

pub(crate) async fn run(args: RunArgs) -> Result<ExitCode> {
    let c = client()?;
    let agent = c.agent(&args.agent).await?;
    let mut body = json!({ "env_vars": env_vars(&args.env)? });
    if let Some(t) = &args.title {
        body["title"] = t.clone().into();
    }
    let s = c.create_session(str_of(&agent, "id"), body).await?;
    let id = str_of(&s, "id").to_owned();
    eprintln!(
        "Starting {} ({}) as session {id}",
        str_of(&agent, "name"),
        str_of(&agent, "harness_id")
    );
    let s = wait_ready(&c, &id).await?;
    settled(&s)?;
    if args.no_attach {
        println!("{id}");
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("Ready. Attaching (Ctrl-D detaches; the session keeps running).");
    attach_ready(&c, &s).await
}

pub(crate) async fn send(session: &str, text: &str) -> Result<ExitCode> {
    let c = client()?;
    let resp = c.message_stream(session, text).await?;
    let mut body = resp.bytes_stream();
    let mut parser = SseParser::default();
    let mut printed = false;
    let mut out = std::io::stdout();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.context("the reply stream broke")?;
        for ev in parser.feed(&chunk) {
            match ev.event.as_str() {
                "agent" => {
                    let v: Value = serde_json::from_str(&ev.data).unwrap_or_default();
                    if let Some(t) = agent_text(&v) {
                        if printed {
                            writeln!(out)?;
                        }
                        write!(out, "{t}")?;
                        out.flush()?;
                        printed = true;
                    }
                }
                "message" => {
                    if !printed {
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
                    if printed {
                        writeln!(out)?;
                    }
                    let v: Value = serde_json::from_str(&ev.data).unwrap_or_default();
                    bail!("{}", v["error"].as_str().unwrap_or(&ev.data));
                }
                _ => {}
            }
        }
    }
    bail!("the reply stream ended before the reply")
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
    let s = c.put_secret(name, &value, hosts, locations).await?;
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
    fn env_var_specs() {
        let v = env_vars(&["A=1".into(), "B=x=y".into()]).unwrap();
        assert_eq!(v["A"], "1");
        assert_eq!(v["B"], "x=y");
        let e = env_vars(&["LAP_CLI_TEST_SURELY_UNSET".into()]).unwrap_err();
        assert!(e.to_string().contains("not set"), "{e}");
    }
}
