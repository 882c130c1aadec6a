//! `rewrite::StubScanner` (the tripwire over a streamed request body): any bytes in any chunking
//! are refused exactly when the same bytes in one push are; a stub of a secret not bound to the
//! host, written as is anywhere in the stream, is always refused; and so is whatever the tripwire
//! over the whole input refuses (its percent-decoded and encoded forms). Never a panic.
#![no_main]

mod common;

use lap_vault_sidecar::{HostRules, Location, TargetHost};
use libfuzzer_sys::fuzz_target;

use common::{bound, contains, expand, set, HOSTS, SECRETS};

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let host = data[0] as usize % HOSTS.len();
    let chunk = (data[1] as usize % 64) + 1;
    let stream = expand(&data[2..]);
    let rules = HostRules::new(set(), &TargetHost::parse(HOSTS[host]), 443);
    let Some(scanner) = rules.stub_scanner(Location::Body) else {
        // Every secret is bound to this host: nothing to refuse.
        assert!((0..SECRETS.len()).all(|i| bound(i, host)));
        return;
    };
    let whole = scanner.clone().push(set(), &stream).is_err();
    let mut chunked = scanner;
    let refused = stream.chunks(chunk).any(|piece| chunked.push(set(), piece).is_err());
    assert_eq!(refused, whole, "chunks of {chunk} disagree with one push");
    let unbound_stub = SECRETS
        .iter()
        .enumerate()
        .any(|(i, s)| !bound(i, host) && contains(&stream, s.1.as_bytes()));
    if unbound_stub {
        assert!(whole, "a stub of a secret not bound to {} passed", HOSTS[host]);
    }
    if rules.tripwire(&stream, Location::Body).is_err() {
        assert!(whole, "the whole-input tripwire refuses what the stream scanner passed");
    }
});
