//! Processes of a local sandbox, identified by pid *and* start time (`/proc/<pid>/stat` field 22,
//! proc(5)), so a reused pid is never mistaken for the sidecar or signalled, across `lap-server`
//! restarts too (a pidfd would not survive one).

use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// One process this backend started: pid plus start time in clock ticks after boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessId {
    pub pid: i32,
    pub start: u64,
}

/// What `/proc` says of a [`ProcessId`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcState {
    /// Running or sleeping.
    Alive,
    /// Stopped by a signal (`T`) or traced (`t`): alive but not answering.
    Stopped,
    /// Gone: exited (also a zombie not reaped yet), or the pid now belongs to another process.
    Gone,
}

/// `(state letter, start time)` from the text of `/proc/<pid>/stat`. The command name (field 2)
/// may hold spaces and parentheses, so fields are counted after its last `)`.
pub fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // After the state (field 3) come fields 4..; the start time is field 22.
    let start = fields.nth(22 - 4)?.parse().ok()?;
    Some((state, start))
}

fn read_stat(pid: i32) -> Option<(char, u64)> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

impl ProcessId {
    /// The process `pid` as it is now (`None` if it is already gone).
    pub fn of(pid: i32) -> Option<Self> {
        read_stat(pid).map(|(_, start)| Self { pid, start })
    }

    pub fn state(&self) -> ProcState {
        match read_stat(self.pid) {
            Some((_, start)) if start != self.start => ProcState::Gone,
            Some(('Z' | 'X' | 'x', _)) | None => ProcState::Gone,
            Some(('T' | 't', _)) => ProcState::Stopped,
            Some(_) => ProcState::Alive,
        }
    }

    /// Signal this process's group (it leads one), only if the pid is still this process.
    pub fn signal_group(&self, signal: Signal) {
        if self.state() != ProcState::Gone {
            let _ = killpg(Pid::from_raw(self.pid), signal);
        }
    }
}

/// SIGTERM each group, wait up to `grace` for them to go, then SIGKILL what is left (a stopped
/// process is continued first, so it can act on its SIGTERM).
pub async fn stop_all(procs: &[ProcessId], grace: Duration) {
    for p in procs {
        p.signal_group(Signal::SIGTERM);
        p.signal_group(Signal::SIGCONT);
    }
    let deadline = Instant::now() + grace;
    while procs.iter().any(|p| p.state() != ProcState::Gone) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for p in procs {
        p.signal_group(Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let line = "4242 (we ird) name)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some(('S', 987654)));
        assert_eq!(parse_stat("1 (x) Z 0"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_is_alive_and_a_changed_start_time_is_gone() {
        let me = ProcessId::of(std::process::id() as i32).unwrap();
        assert_eq!(me.state(), ProcState::Alive);
        let reused = ProcessId {
            start: me.start + 1,
            ..me
        };
        assert_eq!(reused.state(), ProcState::Gone);
    }
}
