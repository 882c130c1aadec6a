//! Session lifecycle decisions, pure: what the reconciler does with a session given the time,
//! the timeouts and whether its sandbox still runs.

use crate::backend::Liveness;
use crate::model::{Session, Status};

/// What to do with one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Nothing,
    /// `creating` → `failed` with this reason (stop whatever was started).
    Fail(String),
    /// `ready` → `dead` because the sandbox vanished.
    Vanished,
    /// `ready` → stop the sandbox → `dead`.
    IdleStop,
}

/// Decide for one session. `in_flight` says a bring-up for it runs in this process;
/// `liveness` is `None` when the session has no sandbox handle.
pub fn decide(s: &Session, now_ms: i64, create_timeout_ms: i64, in_flight: bool, liveness: Option<Liveness>) -> Action {
    match s.status {
        Status::Creating => {
            if now_ms - s.created_at > create_timeout_ms {
                Action::Fail(format!(
                    "the sandbox did not become ready within {}s (LAP_CREATE_TIMEOUT); check the server log",
                    create_timeout_ms / 1000
                ))
            } else if !in_flight {
                Action::Fail("the server restarted while this session was being created; create a new session".into())
            } else {
                Action::Nothing
            }
        }
        Status::Ready => match liveness {
            None | Some(Liveness::Gone) => Action::Vanished,
            Some(Liveness::Running) if now_ms - s.last_seen_at > s.idle_timeout_ms => Action::IdleStop,
            Some(Liveness::Running) => Action::Nothing,
        },
        Status::Dead | Status::Failed => Action::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(status: Status) -> Session {
        Session {
            id: "s".into(),
            agent_id: "a".into(),
            title: None,
            status,
            phase: status.as_str().into(),
            failure_reason: None,
            tty_token: "t".into(),
            sandbox: None,
            created_at: 1_000,
            last_seen_at: 1_000,
            stopped_at: None,
            idle_timeout_ms: 10_000,
        }
    }

    #[test]
    fn creating() {
        let s = session(Status::Creating);
        assert_eq!(decide(&s, 2_000, 5_000, true, None), Action::Nothing);
        assert!(matches!(decide(&s, 7_000, 5_000, true, None), Action::Fail(r) if r.contains("LAP_CREATE_TIMEOUT")));
        assert!(matches!(decide(&s, 2_000, 5_000, false, None), Action::Fail(r) if r.contains("restarted")));
    }

    #[test]
    fn ready() {
        let s = session(Status::Ready);
        assert_eq!(
            decide(&s, 2_000, 5_000, false, Some(Liveness::Running)),
            Action::Nothing
        );
        assert_eq!(decide(&s, 2_000, 5_000, false, Some(Liveness::Gone)), Action::Vanished);
        assert_eq!(decide(&s, 2_000, 5_000, false, None), Action::Vanished);
        assert_eq!(
            decide(&s, 11_001, 5_000, false, Some(Liveness::Running)),
            Action::IdleStop
        );
        assert_eq!(
            decide(&s, 11_000, 5_000, false, Some(Liveness::Running)),
            Action::Nothing
        );
    }

    #[test]
    fn terminal_states_stay() {
        for st in [Status::Dead, Status::Failed] {
            assert_eq!(
                decide(&session(st), 1_000_000, 1, false, Some(Liveness::Gone)),
                Action::Nothing
            );
        }
    }
}
