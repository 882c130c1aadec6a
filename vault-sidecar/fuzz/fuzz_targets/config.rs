//! Config parsing: `config::parse_config` then `Settings::from_config` (with an empty environment) on
//! arbitrary text. Never panics; every rejection names at least one problem; an accepted file
//! survives a serialise/parse round trip unchanged.
#![no_main]

use lap_vault_sidecar::config::{parse_config, Settings};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Validation reads the files the config names (CA, value_file, secrets_file): keep the fuzzer off
    // device and proc files that never end.
    if text.contains("/dev") || text.contains("/proc") || text.contains("/sys") {
        return;
    }
    let cfg = match parse_config(text) {
        Ok(c) => c,
        Err(e) => {
            assert!(!e.0.is_empty(), "a rejection without a problem");
            return;
        }
    };
    let printed = toml::to_string(&cfg).expect("an accepted config serialises");
    let again = parse_config(&printed).unwrap_or_else(|e| panic!("re-parse of {printed:?} failed: {e}"));
    assert_eq!(again, cfg, "round trip");
    match Settings::from_config_with_env(&cfg, &|_| None) {
        Ok(s) => {
            for secret in &s.secrets {
                assert!(!secret.name.is_empty() && !secret.stub.is_empty(), "{secret:?}");
            }
        }
        Err(e) => {
            assert!(!e.0.is_empty(), "a rejection without a problem");
            for p in &e.0 {
                assert!(!p.key.is_empty(), "a problem without a key: {p}");
            }
        }
    }
});
