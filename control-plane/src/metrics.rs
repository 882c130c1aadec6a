//! `/metrics`: a few counters, rendered as Prometheus text.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The server's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    pub http_requests: Counter,
    pub sessions_created: Counter,
    pub sessions_failed: Counter,
    pub sessions_reaped: Counter,
    pub sessions_vanished: Counter,
    pub messages: Counter,
    pub message_errors: Counter,
    pub tty_attaches: Counter,
    pub reconcile_passes: Counter,
}

impl Metrics {
    /// Prometheus text exposition, with `sessions` gauges by status.
    pub fn render(&self, sessions: &[(&str, usize)]) -> String {
        let mut out = String::new();
        let counters = [
            ("lap_http_requests_total", "HTTP requests served", &self.http_requests),
            ("lap_sessions_created_total", "Sessions created", &self.sessions_created),
            (
                "lap_sessions_failed_total",
                "Sessions that never became ready",
                &self.sessions_failed,
            ),
            (
                "lap_sessions_reaped_total",
                "Sessions stopped by the idle timeout",
                &self.sessions_reaped,
            ),
            (
                "lap_sessions_vanished_total",
                "Sessions whose sandbox disappeared",
                &self.sessions_vanished,
            ),
            ("lap_messages_total", "Messages sent to harnesses", &self.messages),
            ("lap_message_errors_total", "Messages that failed", &self.message_errors),
            (
                "lap_tty_attaches_total",
                "Terminal attaches relayed to harnesses",
                &self.tty_attaches,
            ),
            (
                "lap_reconcile_passes_total",
                "Reconcile passes this replica ran to the end",
                &self.reconcile_passes,
            ),
        ];
        for (name, help, c) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", c.get());
        }
        let _ = writeln!(out, "# HELP lap_sessions Sessions by status\n# TYPE lap_sessions gauge");
        for (status, n) in sessions {
            let _ = writeln!(out, "lap_sessions{{status=\"{status}\"}} {n}");
        }
        out
    }
}
