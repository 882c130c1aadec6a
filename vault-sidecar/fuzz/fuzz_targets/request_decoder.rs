//! The request-body tripwire over a compressed body (`decode::DecodingScanner`): a stream the
//! fuzzer compresses itself (gzip, deflate, zstd), pushed in any chunking, is refused whenever the
//! same stream uncompressed is refused by the plain scanner (the compressed bytes are read as
//! they are too, so it may refuse more); arbitrary bytes under any coding are refused, passed or
//! reported as not decoding, never a panic.
#![no_main]

mod common;

use std::io::Write as _;
use std::sync::{Arc, OnceLock};

use lap_vault_sidecar::fuzz::scan_compressed;
use lap_vault_sidecar::{HostRules, Location, SecretSet, TargetHost};
use libfuzzer_sys::fuzz_target;

use common::{build_set, expand, HOSTS};

fn shared() -> Arc<SecretSet> {
    static SET: OnceLock<Arc<SecretSet>> = OnceLock::new();
    SET.get_or_init(|| Arc::new(build_set())).clone()
}

const CODINGS: [&str; 4] = ["gzip", "deflate", "zstd", "br"];

fn compress(coding: &str, bytes: &[u8]) -> Option<Vec<u8>> {
    match coding {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(bytes).expect("gzip");
            Some(e.finish().expect("gzip"))
        }
        "deflate" => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(bytes).expect("zlib");
            Some(e.finish().expect("zlib"))
        }
        "zstd" => Some(zstd::stream::encode_all(bytes, 1).expect("zstd")),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let host = data[0] as usize % HOSTS.len();
    let chunk = (data[1] as usize % 64) + 1;
    let coding = CODINGS[data[2] as usize % CODINGS.len()];
    let secrets = shared();
    let rules = HostRules::new(&secrets, &TargetHost::parse(HOSTS[host]), 443);
    let Some(scanner) = rules.stub_scanner(Location::Body) else {
        return;
    };
    // Arbitrary bytes as if compressed: any answer but a panic.
    let _ = scan_compressed(coding, scanner.clone(), secrets.clone(), data[3..].chunks(chunk));
    let stream = expand(&data[3..]);
    let Some(compressed) = compress(coding, &stream) else {
        return;
    };
    let plain = scanner.clone().push(&secrets, &stream).is_err();
    let decoded = scan_compressed(coding, scanner, secrets.clone(), compressed.chunks(chunk))
        .unwrap_or_else(|e| panic!("{coding} of the input did not decode: {e}"));
    if plain {
        assert!(decoded, "{coding} in chunks of {chunk} passed what the plain stream refuses");
    }
});
