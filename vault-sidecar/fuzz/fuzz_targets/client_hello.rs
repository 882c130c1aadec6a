//! Transparent mode's ClientHello peek (`transparent::parse_hello`) on arbitrary bytes: never panics,
//! non-TLS is recognised from the first byte, and no prefix of a still-incomplete buffer is judged a
//! complete hello.
#![no_main]

use lap_vault_sidecar::{parse_hello, Hello};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let full = parse_hello(data);
    match data.first() {
        None => assert_eq!(full, Hello::Incomplete),
        Some(&b) if b != 0x16 => assert_eq!(full, Hello::NotTls),
        _ => {}
    }
    if let Hello::Tls { sni: Some(name) } = &full {
        assert!(!name.is_empty());
    }
    // Every prefix of the buffer is classified without panicking; a prefix of a buffer that is still
    // incomplete cannot already be a full hello with a different SNI.
    for cut in [1, data.len() / 3, data.len() / 2, data.len().saturating_sub(1)] {
        if cut == 0 || cut >= data.len() {
            continue;
        }
        let part = parse_hello(&data[..cut]);
        if full == Hello::Incomplete {
            assert!(
                !matches!(part, Hello::Tls { .. }),
                "a prefix is a complete hello but the whole buffer is incomplete"
            );
        }
    }
});
