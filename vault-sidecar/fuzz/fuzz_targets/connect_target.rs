//! CONNECT / absolute-form target parsing: the authority the listener gets from hyper is parsed with
//! `connect::parse_target`; whatever it accepts must print back (`authority()`) to the same target.
#![no_main]

use lap_vault_sidecar::{is_self, parse_target};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    // 1. Raw host / port strings, as a buggy client could send them.
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, p.parse::<u16>().ok()),
        None => (s, None),
    };
    check(parse_target(Some(host), port, 443));
    check(parse_target(Some(s), None, 80));
    // 2. The way the listener sees it: through http's authority parser.
    if let Ok(a) = s.parse::<http::uri::Authority>() {
        check(parse_target(Some(a.host()), a.port_u16(), 443));
    }
});

fn check(r: Result<lap_vault_sidecar::Target, lap_vault_sidecar::TargetError>) {
    let Ok(t) = r else { return };
    assert_ne!(t.port, 0);
    let printed = t.authority();
    let a: http::uri::Authority = printed
        .parse()
        .unwrap_or_else(|e| panic!("accepted target prints as an invalid authority {printed:?}: {e}"));
    let again = parse_target(Some(a.host()), a.port_u16(), 443)
        .unwrap_or_else(|e| panic!("printed target {printed:?} no longer parses: {e}"));
    assert_eq!(again, t, "round trip through {printed:?}");
    let _ = t.uri_authority(443);
    let _ = is_self(&t, &["127.0.0.1:14322".parse().expect("addr")]);
}
