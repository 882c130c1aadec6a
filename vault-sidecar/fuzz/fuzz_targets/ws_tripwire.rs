//! `ws::FrameTripwire` (the client's WebSocket frames toward a host): any frames in any chunking
//! end the same way as in one push (passed, a stub refused, or unreadable framing), and when
//! the framing is readable, a stub of a secret not bound to the host inside the data messages'
//! payloads (across frames) or inside one control frame is always refused. Never a panic.
#![no_main]

mod common;

use std::sync::{Arc, OnceLock};

use lap_vault_sidecar::fuzz::{ClientFrames, FrameTripwire};
use lap_vault_sidecar::{HostRules, Location, SecretSet, TargetHost};
use libfuzzer_sys::fuzz_target;

use common::{bound, build_set, contains, frames_with, HOSTS, SECRETS};

fn shared() -> Arc<SecretSet> {
    static SET: OnceLock<Arc<SecretSet>> = OnceLock::new();
    SET.get_or_init(|| Arc::new(build_set())).clone()
}

#[derive(Debug, PartialEq)]
enum End {
    Passed,
    Stub,
    Frame,
}

fn end(r: Result<(), ClientFrames>) -> Option<End> {
    match r {
        Ok(()) => None,
        Err(ClientFrames::Stub(_)) => Some(End::Stub),
        Err(ClientFrames::Frame(_)) => Some(End::Frame),
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let host = data[0] as usize % HOSTS.len();
    let chunk = (data[1] as usize % 64) + 1;
    let (input, built, raw) = frames_with(&data[2..]);
    let set = shared();
    let rules = HostRules::new(&set, &TargetHost::parse(HOSTS[host]), 443);
    let Some(scanner) = rules.stub_scanner(Location::Body) else {
        return;
    };
    let whole = end(FrameTripwire::new(set.clone(), scanner.clone()).push(&input)).unwrap_or(End::Passed);
    let mut tripwire = FrameTripwire::new(set.clone(), scanner);
    let chunked = input
        .chunks(chunk)
        .find_map(|piece| end(tripwire.push(piece)))
        .unwrap_or(End::Passed);
    assert_eq!(chunked, whole, "chunks of {chunk} disagree with one push");
    if raw || whole == End::Frame {
        return;
    }
    let data_stream: Vec<u8> = built.iter().filter(|(op, _)| *op < 0x8).flat_map(|(_, p)| p.clone()).collect();
    let unbound = |hay: &[u8]| {
        SECRETS
            .iter()
            .enumerate()
            .any(|(i, s)| !bound(i, host) && contains(hay, s.1.as_bytes()))
    };
    let stub_inside = unbound(&data_stream) || built.iter().any(|(op, p)| *op >= 0x8 && unbound(p));
    if stub_inside {
        assert_eq!(whole, End::Stub, "a stub of a secret not bound to {} passed", HOSTS[host]);
    }
});
