//! The in-process reconciler: a pass at start (so a restarted server picks its sessions back
//! up), then one every `LAP_RECONCILE_INTERVAL`. Decisions are in [`crate::lifecycle`].

use std::sync::Arc;
use std::time::Duration;

use crate::app::App;

/// Run forever.
pub async fn run(app: Arc<App>, interval: Duration) {
    loop {
        if let Err(e) = app.reconcile_once().await {
            tracing::warn!(error = %e, "reconcile pass failed");
        }
        tokio::time::sleep(interval).await;
    }
}
