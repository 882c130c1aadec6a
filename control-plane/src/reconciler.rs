//! The in-process reconciler: a pass at start (so a restarted server picks its sessions back
//! up), then one every `LAP_RECONCILE_INTERVAL`. Decisions are pure ([`crate::lifecycle::decide`]);
//! this module observes (health probes and interception pulls, all sessions at once), executes
//! the decisions, and keeps slow work out of the pass: stops and the orphan sweep run in the
//! background, so one wedged sandbox never delays noticing another.
//!
//! Several replicas: a pass runs under the `reconciler` lease, short and renewed while the pass
//! runs ([`crate::app::RECONCILER_LEASE_MS`]), so a replica killed mid-pass holds up the others
//! for seconds, not a minute. A session is *in flight* while any replica (this one included)
//! holds its `bringup:` lease, which is taken before its row exists: no pass ever fails a session
//! that is being brought up.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::app::{App, LEASE_RENEW, RECONCILER_LEASE_MS};
use crate::backend::{Liveness, SandboxHandle};
use crate::error::ApiError;
use crate::lifecycle::{self, Action};
use crate::model::{now_ms, Session, Status};

/// Run forever.
pub async fn run(app: Arc<App>, interval: Duration) {
    loop {
        if let Err(e) = reconcile_once(&app).await {
            tracing::warn!(error = %e, "reconcile pass failed");
        }
        tokio::time::sleep(interval).await;
    }
}

/// One reconcile pass, unless another replica is in the middle of one; returns whether this
/// replica ran it. Within the pass every change is also a compare-and-set on the row, so even
/// overlapping passes never act twice.
pub async fn reconcile_once(app: &Arc<App>) -> Result<bool, ApiError> {
    if !app
        .store
        .try_lease("reconciler", &app.replica, now_ms(), RECONCILER_LEASE_MS)
        .await?
    {
        return Ok(false);
    }
    let renew = {
        let (store, replica) = (app.store.clone(), app.replica.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LEASE_RENEW).await;
                if let Err(e) = store
                    .try_lease("reconciler", &replica, now_ms(), RECONCILER_LEASE_MS)
                    .await
                {
                    tracing::warn!(error = %e, "renewing the reconciler lease failed");
                }
            }
        })
    };
    let result = pass(app).await;
    renew.abort();
    if result.is_ok() {
        app.metrics.reconcile_passes.inc();
    }
    let _ = app.store.release_lease("reconciler", &app.replica).await;
    result.map(|()| true)
}

/// What a pass learns of one session before deciding.
struct Observed {
    session: Session,
    handle: Option<SandboxHandle>,
    liveness: Option<Liveness>,
}

/// Probe a ready session's sandbox (and pull its new interceptions while at it).
async fn observe(app: &App, session: Session) -> Observed {
    let handle = app.sandbox_handle(&session);
    let liveness = match (&handle, session.status) {
        (Some(h), Status::Ready) => {
            let l = app.backend.liveness(h).await;
            if l == Liveness::Running {
                if let Err(e) = app.pull_interceptions(&session, h).await {
                    tracing::warn!(session = %session.id, error = %e, "could not pull interceptions");
                }
            }
            Some(l)
        }
        _ => None,
    };
    Observed {
        session,
        handle,
        liveness,
    }
}

/// Over `creating` and `ready` sessions; then the orphan sweep and pruning in the background.
async fn pass(app: &Arc<App>) -> Result<(), ApiError> {
    let now = now_ms();
    let create_ms = i64::try_from(app.config.create_timeout.as_millis()).unwrap_or(i64::MAX);
    let sessions = app
        .store
        .sessions_with_status(&[Status::Creating, Status::Ready])
        .await?;
    let observed = futures_util::future::join_all(sessions.into_iter().map(|s| observe(app, s))).await;
    let unhealthy = count_unhealthy(app, &observed);
    if !app.passed_once.swap(true, Ordering::AcqRel) {
        let alive = observed
            .iter()
            .filter(|o| o.liveness == Some(Liveness::Running))
            .count();
        let creating = observed.iter().filter(|o| o.session.status == Status::Creating).count();
        tracing::info!(
            adopted = alive,
            creating,
            "reconcile: first pass since start: adopted the ready sessions whose sandboxes answer"
        );
    }
    let local: HashSet<String> = app
        .in_flight
        .lock()
        .map(|f| f.keys().cloned().collect())
        .unwrap_or_default();
    for (o, unhealthy) in observed.into_iter().zip(unhealthy) {
        let s = &o.session;
        let in_flight = s.status == Status::Creating
            && (local.contains(&s.id) || app.store.lease_holder(&App::bringup_lease(&s.id), now).await?.is_some());
        match lifecycle::decide(s, now, create_ms, in_flight, o.liveness.clone(), unhealthy) {
            Action::Nothing => {}
            Action::Fail(reason) => {
                if app
                    .store
                    .transition(&s.id, Status::Creating, Status::Failed, Some(&reason), None)
                    .await?
                {
                    tracing::warn!(session = %s.id, reason = %reason, "reconcile: session failed");
                    app.metrics.sessions_failed.inc();
                    app.emit_session(&s.id).await;
                }
            }
            Action::Vanished(reason) => {
                if app
                    .store
                    .transition(&s.id, Status::Ready, Status::Dead, Some(&reason), None)
                    .await?
                {
                    tracing::warn!(session = %s.id, reason = %reason, "reconcile: sandbox vanished or stopped answering");
                    app.metrics.sessions_vanished.inc();
                    if let Some(h) = o.handle {
                        app.stop_in_background(o.session.clone(), h);
                    }
                    app.emit_session(&s.id).await;
                }
            }
            Action::IdleStop => {
                if app
                    .store
                    .transition(&s.id, Status::Ready, Status::Dead, None, None)
                    .await?
                {
                    tracing::info!(session = %s.id, "reconcile: idle timeout, stopping");
                    app.metrics.sessions_reaped.inc();
                    app.record(
                        "session.delete",
                        &crate::audit::Actor::SERVER,
                        Some(&s.id),
                        Some(&s.agent_id),
                        &[],
                        serde_json::json!({"reason": "idle timeout"}),
                    )
                    .await;
                    if let Some(h) = o.handle {
                        app.stop_in_background(o.session.clone(), h);
                    }
                    app.emit_session(&s.id).await;
                }
            }
        }
    }
    sweep_in_background(app);
    app.store.prune_leases(now - 3_600_000).await?;
    let retention = i64::try_from(app.config.audit_retention.as_millis()).unwrap_or(i64::MAX);
    let pruned = app.store.prune_audit(now.saturating_sub(retention)).await?;
    if pruned > 0 {
        tracing::info!(
            events = pruned,
            "reconcile: pruned audit events past LAP_AUDIT_RETENTION"
        );
    }
    app.backend.prune_logs(app.config.audit_retention).await;
    Ok(())
}

/// Failed health probes in a row per session, this probe included (0 when it answered).
fn count_unhealthy(app: &App, observed: &[Observed]) -> Vec<u32> {
    let mut counts = app.unhealthy.lock().unwrap_or_else(|p| p.into_inner());
    counts.retain(|id, _| observed.iter().any(|o| &o.session.id == id));
    observed
        .iter()
        .map(|o| match &o.liveness {
            Some(Liveness::Unhealthy(why)) => {
                let n = counts.entry(o.session.id.clone()).or_insert(0);
                *n += 1;
                tracing::warn!(session = %o.session.id, failures = *n, reason = %why, "reconcile: health probe failed");
                *n
            }
            _ => {
                counts.remove(&o.session.id);
                0
            }
        })
        .collect()
}

/// Remove sandboxes no live session owns, outside the pass (one sweep at a time).
fn sweep_in_background(app: &Arc<App>) {
    if app.sweeping.swap(true, Ordering::AcqRel) {
        return;
    }
    let app = Arc::clone(app);
    tokio::spawn(async move {
        let keep: Result<HashSet<String>, ApiError> = async {
            let mut keep: HashSet<String> = app
                .store
                .sessions_with_status(&[Status::Creating, Status::Ready])
                .await?
                .into_iter()
                .map(|s| s.id)
                .collect();
            keep.extend(
                app.in_flight
                    .lock()
                    .map(|f| f.keys().cloned().collect::<Vec<_>>())
                    .unwrap_or_default(),
            );
            Ok(keep)
        }
        .await;
        match keep {
            Ok(keep) => {
                let removed = app.backend.remove_orphans(&keep).await;
                if removed > 0 {
                    tracing::info!(removed, "reconcile: removed orphaned sandboxes");
                }
            }
            Err(e) => tracing::warn!(error = %e, "orphan sweep skipped"),
        }
        app.sweeping.store(false, Ordering::Release);
    });
}
