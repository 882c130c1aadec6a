//! Container resources, pure: Kubernetes quantities (`500m`, `2Gi`, `1e3`), the agent's
//! `resources` checked at the API edge, and merged over the defaults into the harness container's
//! `ResourceRequirements` (so no pod is BestEffort).
//!
//! Quantity syntax: <https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/>
//! (a decimal number, then a binary `Ki Mi Gi Ti Pi Ei`, decimal `n u m k M G T P E` or `e`/`E`
//! exponent suffix).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::model::Resources;

/// The resource names an agent may set.
pub const NAMES: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

/// The value of a quantity (cores, bytes), or `None` when it is not one.
pub fn parse_quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() || num.starts_with('-') {
        return None;
    }
    let n: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse::<i32>().ok()?),
        _ => return None,
    };
    Some(n * mult)
}

/// Check an agent's `resources`; the error names the field (`requests.cpu: …`).
pub fn check(r: &Resources) -> Result<(), String> {
    for (part, map) in [("requests", &r.requests), ("limits", &r.limits)] {
        for (k, v) in map {
            if !NAMES.contains(&k.as_str()) {
                return Err(format!("{part}.{k}: not a resource name (one of {})", NAMES.join(", ")));
            }
            match parse_quantity(v) {
                Some(q) if q > 0.0 => {}
                _ => {
                    return Err(format!(
                        "{part}.{k}: `{v}` is not a positive quantity (like 500m, 2, 512Mi, 4Gi)"
                    ))
                }
            }
        }
    }
    for (k, req) in &r.requests {
        if let (Some(lim), Some(req)) = (r.limits.get(k).and_then(|l| parse_quantity(l)), parse_quantity(req)) {
            if req > lim {
                return Err(format!("requests.{k}: more than limits.{k}"));
            }
        }
    }
    Ok(())
}

/// Check a RuntimeClass name (a DNS-1123 subdomain).
pub fn check_runtime_class(rc: &str) -> Result<(), String> {
    let ok = !rc.is_empty()
        && rc.len() <= 253
        && rc.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{rc}` is not a RuntimeClass name (lowercase letters, digits, '-', '.')"
        ))
    }
}

/// Parse `cpu=500m,memory=1Gi` (settings); the error says which item.
pub fn parse_list(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut map = BTreeMap::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((k, v)) = item.split_once('=') else {
            return Err(format!("`{item}` is not name=quantity"));
        };
        map.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    check(&Resources {
        requests: map.clone(),
        limits: BTreeMap::new(),
    })
    .map_err(|e| e.trim_start_matches("requests.").to_owned())?;
    Ok(map)
}

fn quantities(m: &BTreeMap<String, String>) -> Option<BTreeMap<String, Quantity>> {
    (!m.is_empty()).then(|| m.iter().map(|(k, v)| (k.clone(), Quantity(v.clone()))).collect())
}

/// The harness container's requirements: the agent's values over the defaults, key by key. A
/// default limit below the agent's request is raised to it, and a default request above the
/// agent's limit lowered to it (the pod must stay valid: request ≤ limit).
pub fn harness(defaults: &Resources, agent: Option<&Resources>) -> ResourceRequirements {
    let mut requests = defaults.requests.clone();
    let mut limits = defaults.limits.clone();
    if let Some(a) = agent {
        requests.extend(a.requests.clone());
        limits.extend(a.limits.clone());
        for (k, req) in &a.requests {
            let from_default = !a.limits.contains_key(k);
            if let (true, Some(l), Some(r)) = (
                from_default,
                limits.get(k).and_then(|l| parse_quantity(l)),
                parse_quantity(req),
            ) {
                if r > l {
                    limits.insert(k.clone(), req.clone());
                }
            }
        }
        // Likewise a default request above the agent's own limit is lowered to that limit
        // (`limits.cpu: 250m` under a default `requests.cpu: 500m`).
        for (k, lim) in &a.limits {
            let from_default = !a.requests.contains_key(k);
            if let (true, Some(r), Some(l)) = (
                from_default,
                requests.get(k).and_then(|r| parse_quantity(r)),
                parse_quantity(lim),
            ) {
                if r > l {
                    requests.insert(k.clone(), lim.clone());
                }
            }
        }
    }
    ResourceRequirements {
        requests: quantities(&requests),
        limits: quantities(&limits),
        ..ResourceRequirements::default()
    }
}

/// The vault's and the netfilter init container's fixed requirements: small, memory-capped.
pub fn small(cpu: &str, memory: &str, memory_limit: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
            ("memory".to_owned(), Quantity(memory.to_owned())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_owned(),
            Quantity(memory_limit.to_owned()),
        )])),
        ..ResourceRequirements::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn r(req: &[(&str, &str)], lim: &[(&str, &str)]) -> Resources {
        let m = |v: &[(&str, &str)]| v.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Resources {
            requests: m(req),
            limits: m(lim),
        }
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("500m"), Some(0.5));
        assert_eq!(parse_quantity("2"), Some(2.0));
        assert_eq!(parse_quantity("1Gi"), Some(1024f64.powi(3)));
        assert_eq!(parse_quantity("1G"), Some(1e9));
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("0.5"), Some(0.5));
        for bad in ["", "Gi", "-1", "1GB", "one", "1 Gi"] {
            assert_eq!(parse_quantity(bad), None, "{bad}");
        }
    }

    #[test]
    fn agent_resources_are_checked() {
        check(&r(&[("cpu", "1"), ("memory", "2Gi")], &[("memory", "4Gi")])).unwrap();
        assert!(check(&r(&[("gpu", "1")], &[])).unwrap_err().starts_with("requests.gpu"));
        assert!(check(&r(&[], &[("memory", "lots")]))
            .unwrap_err()
            .starts_with("limits.memory"));
        assert!(check(&r(&[("cpu", "0")], &[])).is_err());
        assert_eq!(
            check(&r(&[("memory", "8Gi")], &[("memory", "4Gi")])).unwrap_err(),
            "requests.memory: more than limits.memory"
        );
        check_runtime_class("gvisor").unwrap();
        check_runtime_class("kata.qemu").unwrap();
        assert!(check_runtime_class("G Visor").is_err());
        assert!(check_runtime_class("").is_err());
        assert_eq!(parse_list("cpu=500m, memory=1Gi").unwrap()["memory"], "1Gi");
        assert!(parse_list("cpu").is_err());
        assert!(parse_list("disk=1Gi").is_err());
    }

    #[test]
    fn agent_values_override_defaults_key_by_key() {
        let defaults = r(&[("cpu", "500m"), ("memory", "1Gi")], &[("memory", "4Gi")]);
        let none = harness(&defaults, None);
        assert_eq!(none.requests.as_ref().unwrap()["cpu"].0, "500m");
        assert_eq!(none.limits.as_ref().unwrap()["memory"].0, "4Gi");
        let agent = r(&[("memory", "8Gi")], &[("cpu", "2")]);
        let got = harness(&defaults, Some(&agent));
        let req = got.requests.unwrap();
        let lim = got.limits.unwrap();
        assert_eq!(req["cpu"].0, "500m");
        assert_eq!(req["memory"].0, "8Gi");
        assert_eq!(lim["cpu"].0, "2");
        assert_eq!(
            lim["memory"].0, "8Gi",
            "the default limit is raised to the agent's request"
        );
        let small = harness(&defaults, Some(&r(&[], &[("cpu", "250m")])));
        assert_eq!(
            small.requests.unwrap()["cpu"].0,
            "250m",
            "the default request is lowered to the agent's limit"
        );
        let empty = harness(&Resources::default(), None);
        assert_eq!((empty.requests, empty.limits), (None, None));
    }
}
