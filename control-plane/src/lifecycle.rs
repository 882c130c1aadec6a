//! Session lifecycle decisions, pure: what the reconciler does with a session given the time,
//! the timeouts and whether its sandbox still runs and answers.

use crate::backend::Liveness;
use crate::model::{Session, Status};

/// Failed health probes in a row (one per reconcile pass) after which a `ready` session whose
/// sandbox still exists is ended: a stopped or wedged sidecar or harness is noticed within two
/// reconcile intervals, and one slow answer alone ends nothing.
pub const UNHEALTHY_THRESHOLD: u32 = 2;

/// What to do with one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Nothing,
    /// `creating` → `failed` with this reason (stop whatever was started).
    Fail(String),
    /// `ready` → stop what is left → `dead`, with this reason: the sandbox vanished or stopped
    /// answering.
    Vanished(String),
    /// `ready` → stop the sandbox → `dead`.
    IdleStop,
}

/// Decide for one session. `in_flight` says a bring-up for it runs in this process;
/// `liveness` is `None` when the session has no sandbox handle; `unhealthy` counts the failed
/// health probes in a row, this one included.
pub fn decide(
    s: &Session,
    now_ms: i64,
    create_timeout_ms: i64,
    in_flight: bool,
    liveness: Option<Liveness>,
    unhealthy: u32,
) -> Action {
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
            None => Action::Vanished("the sandbox stopped unexpectedly: the session has no sandbox record".into()),
            Some(Liveness::Gone(cause)) => Action::Vanished(format!("the sandbox stopped unexpectedly: {cause}")),
            Some(Liveness::Ended(reason)) => Action::Vanished(reason),
            Some(Liveness::Unhealthy(cause)) if unhealthy >= UNHEALTHY_THRESHOLD => Action::Vanished(cause),
            Some(Liveness::Unhealthy(_)) => Action::Nothing,
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
            tty_token_hash: "sha256:t".into(),
            isolation: None,
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
        assert_eq!(decide(&s, 2_000, 5_000, true, None, 0), Action::Nothing);
        assert!(matches!(decide(&s, 7_000, 5_000, true, None, 0), Action::Fail(r) if r.contains("LAP_CREATE_TIMEOUT")));
        assert!(matches!(decide(&s, 2_000, 5_000, false, None, 0), Action::Fail(r) if r.contains("restarted")));
    }

    #[test]
    fn ready() {
        let s = session(Status::Ready);
        assert_eq!(
            decide(&s, 2_000, 5_000, false, Some(Liveness::Running), 0),
            Action::Nothing
        );
        assert_eq!(
            decide(
                &s,
                2_000,
                5_000,
                false,
                Some(Liveness::Gone("the vault sidecar exited".into())),
                0
            ),
            Action::Vanished("the sandbox stopped unexpectedly: the vault sidecar exited".into())
        );
        assert!(
            matches!(decide(&s, 2_000, 5_000, false, None, 0), Action::Vanished(r) if r.contains("stopped unexpectedly"))
        );
        // An end by design (a Kubernetes Sandbox's shutdownTime) keeps its own reason.
        assert_eq!(
            decide(
                &s,
                2_000,
                5_000,
                false,
                Some(Liveness::Ended("the sandbox expired".into())),
                0
            ),
            Action::Vanished("the sandbox expired".into())
        );
        assert_eq!(
            decide(&s, 11_001, 5_000, false, Some(Liveness::Running), 0),
            Action::IdleStop
        );
        assert_eq!(
            decide(&s, 11_000, 5_000, false, Some(Liveness::Running), 0),
            Action::Nothing
        );
    }

    #[test]
    fn unhealthy_ends_the_session_at_the_threshold_only() {
        let s = session(Status::Ready);
        let sick = || Some(Liveness::Unhealthy("the vault sidecar stopped answering".into()));
        assert_eq!(decide(&s, 2_000, 5_000, false, sick(), 1), Action::Nothing);
        assert_eq!(
            decide(&s, 2_000, 5_000, false, sick(), UNHEALTHY_THRESHOLD),
            Action::Vanished("the vault sidecar stopped answering".into())
        );
        // An unanswering sandbox is not idle-stopped silently either: it ends with its reason.
        assert_eq!(
            decide(&s, 11_001, 5_000, false, sick(), UNHEALTHY_THRESHOLD),
            Action::Vanished("the vault sidecar stopped answering".into())
        );
    }

    #[test]
    fn terminal_states_stay() {
        for st in [Status::Dead, Status::Failed] {
            assert_eq!(
                decide(&session(st), 1_000_000, 1, false, Some(Liveness::Gone("x".into())), 9),
                Action::Nothing
            );
        }
    }
}
