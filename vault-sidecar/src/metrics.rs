//! Prometheus metrics (text exposition at `GET /metrics` on the admin port).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    /// `intercepted`, `forwarded` (absolute-form http://) or `tunnel` (CONNECT passed through).
    pub mode: &'static str,
    /// `2xx`, `4xx`, ...
    pub class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct InjectionLabels {
    pub secret: String,
    pub location: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BlockLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ErrorLabels {
    pub kind: &'static str,
}

/// The `mode` labels of `vault_requests_total`, in the order of [`Metrics::request_counters`].
pub(crate) const MODES: [&str; 3] = ["intercepted", "forwarded", "tunnel"];
/// The `class` labels, by [`class_index`].
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// All metrics of one sidecar.
pub(crate) struct Metrics {
    pub registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    /// Each `requests` series once it exists, by mode and class: a request's count is one
    /// increment, not a hash of its labels (a series still appears only once counted).
    request_counters: [[std::sync::OnceLock<Counter>; CLASSES.len()]; MODES.len()],
    pub injections: Family<InjectionLabels, Counter>,
    pub redactions: Family<InjectionLabels, Counter>,
    pub blocked: Family<BlockLabels, Counter>,
    pub errors: Family<ErrorLabels, Counter>,
    pub cert_mints: Counter,
    pub cert_cache_hits: Counter,
    pub upstream_connects: Counter,
    pub reloads: Counter,
    pub reload_failures: Counter,
    /// Time spent in the sidecar itself (request preparation + response preparation), seconds.
    pub added_latency: Histogram,
    /// Whole request duration until response headers, seconds.
    pub request_duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("vault");
        let requests = Family::<RequestLabels, Counter>::default();
        let injections = Family::<InjectionLabels, Counter>::default();
        let redactions = Family::<InjectionLabels, Counter>::default();
        let blocked = Family::<BlockLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let cert_mints = Counter::default();
        let cert_cache_hits = Counter::default();
        let upstream_connects = Counter::default();
        let reloads = Counter::default();
        let reload_failures = Counter::default();
        let added_latency = Histogram::new(exponential_buckets(0.000_01, 2.0, 20));
        let request_duration = Histogram::new(exponential_buckets(0.000_1, 2.0, 20));
        registry.register(
            "requests",
            "Requests handled, by mode and status class",
            requests.clone(),
        );
        registry.register(
            "injections",
            "Stubs swapped for real values, by secret and location",
            injections.clone(),
        );
        registry.register(
            "redactions",
            "Real values replaced by stubs in responses",
            redactions.clone(),
        );
        registry.register("blocked", "Requests refused, by reason", blocked.clone());
        registry.register(
            "errors",
            "Requests answered with X-Vault-Error, by kind",
            errors.clone(),
        );
        registry.register("cert_mints", "Leaf certificates minted", cert_mints.clone());
        registry.register(
            "cert_cache_hits",
            "Leaf certificate cache hits",
            cert_cache_hits.clone(),
        );
        registry.register(
            "upstream_connects",
            "New upstream connections (the rest reuse the pool)",
            upstream_connects.clone(),
        );
        registry.register("reloads", "Successful secret reloads", reloads.clone());
        registry.register(
            "reload_failures",
            "Rejected secret reloads (old secrets kept)",
            reload_failures.clone(),
        );
        registry.register(
            "added_latency_seconds",
            "Time spent inside the sidecar per request",
            added_latency.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time to response headers through the sidecar",
            request_duration.clone(),
        );
        Self {
            registry,
            requests,
            request_counters: Default::default(),
            injections,
            redactions,
            blocked,
            errors,
            cert_mints,
            cert_cache_hits,
            upstream_connects,
            reloads,
            reload_failures,
            added_latency,
            request_duration,
        }
    }
}

impl Metrics {
    /// One request answered with `status` (`vault_requests_total{mode, class}`).
    pub(crate) fn count_request(&self, mode: &'static str, status: u16) {
        let class = class_index(status);
        let series = || {
            self.requests
                .get_or_create(&RequestLabels {
                    mode,
                    class: CLASSES[class],
                })
                .clone()
        };
        match MODES
            .iter()
            .position(|m| *m == mode)
            .map(|m| &self.request_counters[m][class])
        {
            Some(slot) => slot.get_or_init(series).inc(),
            None => series().inc(),
        };
    }

    /// A refusal: `vault_blocked_total{reason}` for a block (or a misdirected request),
    /// `vault_errors_total{kind}` for a failure.
    pub(crate) fn count_refusal(&self, refusal: &crate::refusal::Refusal) {
        if let Some(reason) = refusal.audit_blocked() {
            self.blocked.get_or_create(&BlockLabels { reason }).inc();
        }
        if let Some(kind) = refusal.audit_error() {
            self.errors.get_or_create(&ErrorLabels { kind }).inc();
        }
    }

    /// Prometheus text exposition.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// A status's class as an index into [`CLASSES`] (`1xx` is 0; anything past `4xx` is `5xx`).
fn class_index(status: u16) -> usize {
    usize::from((status / 100).clamp(1, 5) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intercept::context::Mode;

    #[test]
    fn every_mode_has_its_cached_series() {
        for mode in [Mode::Intercepted, Mode::Forwarded, Mode::Tunnel] {
            assert!(MODES.contains(&mode.as_str()), "{}", mode.as_str());
        }
    }

    #[test]
    fn status_classes() {
        for (status, class) in [
            (100, "1xx"),
            (204, "2xx"),
            (304, "3xx"),
            (421, "4xx"),
            (502, "5xx"),
            (999, "5xx"),
        ] {
            assert_eq!(CLASSES[class_index(status)], class, "{status}");
        }
    }

    #[test]
    fn cached_and_uncached_counts_land_in_the_same_series() {
        let m = Metrics::default();
        m.count_request("intercepted", 200);
        m.count_request("intercepted", 204);
        m.count_request("intercepted", 502);
        m.count_request("some-other-mode", 200);
        let text = m.encode();
        assert!(
            text.contains(r#"vault_requests_total{mode="intercepted",class="2xx"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"vault_requests_total{mode="intercepted",class="5xx"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"vault_requests_total{mode="some-other-mode",class="2xx"} 1"#),
            "{text}"
        );
        assert!(
            !text.contains(r#"class="4xx""#),
            "a series appears only once counted: {text}"
        );
    }
}
