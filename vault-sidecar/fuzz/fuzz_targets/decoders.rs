//! `decode` (compressed responses decoded for redaction): any body under any `Content-Encoding`
//! either decodes or fails with an error, never a panic; a body the fuzzer encodes itself decodes
//! to its bytes. `offer` keeps only codings the sidecar decodes.
#![no_main]

use std::io::Write as _;

use lap_vault_sidecar::fuzz::{decode, offer};
use libfuzzer_sys::fuzz_target;

const CODINGS: [&str; 8] = ["gzip", "deflate", "br", "zstd", "identity", "gzip, br", "x-gzip", "compress"];

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
    })
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("gzip");
    e.finish().expect("gzip")
}

fn zlib(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("zlib");
    e.finish().expect("zlib")
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let coding = CODINGS[(data[0] & 7) as usize];
    let body = &data[1..];
    // Arbitrary bytes: decoded or refused.
    let _ = runtime().block_on(decode(coding, bytes::Bytes::copy_from_slice(body)));
    // Bytes encoded here decode back to themselves.
    for (name, encoded) in [("gzip", gzip(body)), ("deflate", zlib(body))] {
        let got = runtime()
            .block_on(decode(name, encoded.into()))
            .unwrap_or_else(|e| panic!("{name} of the input did not decode: {e}"));
        assert_eq!(got, body, "{name} round trip");
    }
    // The offer is a subset of what the sidecar decodes.
    if let Ok(accept) = std::str::from_utf8(body) {
        if let Some(offered) = offer(accept) {
            for item in offered.split(',') {
                let name = item.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
                assert!(
                    matches!(name.as_str(), "gzip" | "x-gzip" | "deflate" | "br" | "zstd"),
                    "offered `{name}` from {accept:?}"
                );
            }
        }
    }
});
