//! Criterion benches of the sidecar's hot path (SPEC §5): leaf mint (beside a raw P-256 signature
//! in the same run, so the ratio is what counts), leaf-cache hit, header rewrite, streaming body
//! rewrite throughput, and one keep-alive request through an in-process sidecar beside the same
//! request sent direct to the same in-process TLS upstream.

use std::hint::black_box;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lap_benches::pki::UpstreamPki;
use lap_vault_sidecar::{Binding, BindingSet, TargetHost};
use lap_vault_sidecar::{Ca, LeafCache};
use lap_vault_sidecar::{HostRules, Injections};
use lap_vault_sidecar::{Secret, SecretSet, Surface, Surfaces};

fn secrets() -> SecretSet {
    // Header credentials, and every body to the model's messages endpoint.
    let surfaces = Surfaces(vec![
        Surface::CredentialHeaders,
        "body:POST /v1/messages".parse::<Surface>().expect("surface"),
    ]);
    let secret = |name: &str, stub: &str, value: &str, host: &str| Secret {
        name: name.into(),
        stub: stub.into(),
        value: value.into(),
        hosts: BindingSet(vec![host.parse::<Binding>().expect("host")]),
        surfaces: surfaces.clone(),
    };
    SecretSet::new(vec![
        secret(
            "ANTHROPIC_API_KEY",
            "sk-ant-api03-lapstub-aaaaaaaaaaaaaaaa",
            "sk-ant-api03-REAL-bbbbbbbbbbbbbbbbbbbb",
            "api.anthropic.com",
        ),
        secret(
            "OPENAI_API_KEY",
            "sk-lapstub-cccccccccccccccc",
            "sk-REAL-dddddddddddddddddddd",
            "api.openai.com",
        ),
        secret(
            "GITHUB_TOKEN",
            "ghp_lapstubeeeeeeeeeeeeeeee",
            "ghp_REALffffffffffffffffffff",
            "github.com",
        ),
    ])
}

fn certificates(c: &mut Criterion) {
    let ca = Ca::generate().expect("ca");
    let host = TargetHost::parse("api.anthropic.com");
    c.bench_function("leaf_mint", |b| {
        b.iter(|| black_box(ca.mint_leaf(&host).expect("leaf")))
    });

    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(&ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
        .expect("key");
    let key = ring::signature::EcdsaKeyPair::from_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        pkcs8.as_ref(),
        &rng,
    )
    .expect("key");
    c.bench_function("raw_p256_sign", |b| {
        b.iter(|| black_box(key.sign(&rng, b"tbs certificate").expect("sign")))
    });

    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let cache = Arc::new(LeafCache::new(Arc::new(ca)));
    runtime.block_on(cache.get(&host)).expect("warm");
    c.bench_function("leaf_cache_hit", |b| {
        b.iter(|| black_box(runtime.block_on(cache.get(&host)).expect("hit")))
    });
}

fn rewriting(c: &mut Criterion) {
    let set = secrets();
    let host = TargetHost::parse("api.anthropic.com");
    c.bench_function("header_rewrite_hit", |b| {
        b.iter(|| {
            let rules = HostRules::new(&set, &host, 443);
            let mut inj = Injections::default();
            black_box(
                rules
                    .header_value("x-api-key", b"sk-ant-api03-lapstub-aaaaaaaaaaaaaaaa", &mut inj)
                    .expect("ok"),
            )
        })
    });
    c.bench_function("header_rewrite_miss", |b| {
        let rules = HostRules::new(&set, &host, 443);
        b.iter(|| {
            black_box(rules.header_value(
                "content-type",
                b"application/json; charset=utf-8",
                &mut Injections::default(),
            ))
        })
    });

    let chunk = Bytes::from({
        let mut v = b"data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hello world\"}}\n\n".repeat(256);
        v.extend_from_slice(b"sk-ant-api03-lapstub-aaaaaaaaaaaaaaaa");
        v
    });
    let mut group = c.benchmark_group("body_rewrite");
    group.throughput(Throughput::Bytes(chunk.len() as u64));
    let rules = HostRules::new(&set, &host, 443);
    group.bench_function("stream_16k_chunk", |b| {
        let mut rw = rules.body_rewriter("POST", "/v1/messages", None).expect("rewriter");
        b.iter(|| black_box(rw.push(chunk.clone())))
    });
    // The common case on a download or a model's answer: a body with no stub and no value in it.
    let plain = Bytes::from(
        b"{\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"fn main() { skip(); }\"}}\n"
            .repeat(160),
    );
    group.throughput(Throughput::Bytes(plain.len() as u64));
    group.bench_function("stream_16k_chunk_no_match", |b| {
        let mut rw = rules.body_rewriter("POST", "/v1/messages", None).expect("rewriter");
        b.iter(|| black_box(rw.push(plain.clone())))
    });
    group.finish();
}

/// A compressed response decoded and redacted (issue 14, W02) beside the same identity response
/// redacted: MiB/s of decoded bytes, so the ratio is what decoding costs. The decoded body is
/// collected whole here (the sidecar streams it), which the identity case does not pay.
fn decoding(c: &mut Criterion) {
    use async_compression::tokio::bufread::{GzipEncoder, ZstdEncoder};
    use lap_vault_sidecar::fuzz::decode;
    use tokio::io::AsyncReadExt as _;

    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let set = secrets();
    let real = "sk-ant-api03-REAL-bbbbbbbbbbbbbbbbbbbb"; // ANTHROPIC_API_KEY's value in `secrets()`
                                                         // 1 MiB of model-shaped JSON lines; a reflected real value in every 64th.
    let mut text = Vec::with_capacity(1 << 20);
    let mut i = 0u32;
    while text.len() < 1 << 20 {
        let line = if i.is_multiple_of(64) {
            format!("{{\"type\":\"content_block_delta\",\"delta\":{{\"text\":\"key {real} line {i}\"}}}}\n")
        } else {
            format!("{{\"type\":\"content_block_delta\",\"delta\":{{\"text\":\"fn main() {{ step({i}); }}\"}}}}\n")
        };
        text.extend_from_slice(line.as_bytes());
        i += 1;
    }
    let plain = Bytes::from(text);
    let encode = |gzip: bool| -> Bytes {
        rt.block_on(async {
            let mut out = Vec::new();
            if gzip {
                GzipEncoder::new(&plain[..]).read_to_end(&mut out).await.expect("gzip");
            } else {
                ZstdEncoder::new(&plain[..]).read_to_end(&mut out).await.expect("zstd");
            }
            Bytes::from(out)
        })
    };
    let (gz, zst) = (encode(true), encode(false));
    let redact = |body: Bytes| {
        let mut r = lap_vault_sidecar::redactor(&set).expect("redactor");
        let out = [r.push(body), r.finish()].concat();
        assert!(
            !out.windows(real.len()).any(|w| w == real.as_bytes()),
            "a value left unredacted"
        );
        out.len()
    };
    let mut group = c.benchmark_group("decode_redact");
    group.throughput(Throughput::Bytes(plain.len() as u64));
    group.bench_function("identity_1mib", |b| b.iter(|| black_box(redact(plain.clone()))));
    for (name, coding, body) in [("gzip_1mib", "gzip", &gz), ("zstd_1mib", "zstd", &zst)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let decoded = rt.block_on(decode(coding, body.clone())).expect("decoded");
                black_box(redact(Bytes::from(decoded)))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, certificates, rewriting, decoding, request);
criterion_main!(benches);

const REAL: &str = "sk-ant-api03-REAL-bench-0123456789abcdef";
const STUB: &str = "sk-ant-api03-lapstub-bench-fedcba98765432";

/// `GET /v1/small` on a warm keep-alive connection (http/1.1 and h2), direct to an in-process TLS
/// upstream and through an in-process sidecar to the same upstream. No log subscriber is installed,
/// so the sidecar's per-request audit line costs nothing here (the comparison runs the real binary).
fn request(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let pki = UpstreamPki::generate().expect("pki");
    let tls = pki.server_config(&[b"h2", b"http/1.1"]).expect("upstream tls");
    let upstream = runtime
        .block_on(lap_benches::upstream::serve(tls, REAL))
        .expect("upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("upstream-ca.pem"), &pki.ca_pem).expect("write CA");
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
    };
    let (listen, admin) = (free(), free());
    let d = dir.path().display();
    let port = upstream.port();
    let config = lap_vault_sidecar::config::parse_config(&format!(
        r#"
        listen = "{listen}"
        admin_listen = "{admin}"
        ca_cert_path = "{d}/sidecar-ca.pem"
        upstream_ca_files = ["{d}/upstream-ca.pem"]
        [resolve]
        "localhost:{port}" = "127.0.0.1:{port}"
        [[secrets]]
        name = "ANTHROPIC_API_KEY"
        stub = "{STUB}"
        value = "{REAL}"
        hosts = ["localhost:{port}"]
        "#
    ))
    .expect("sidecar config");
    let settings = lap_vault_sidecar::config::Settings::from_config(&config).expect("sidecar settings");
    runtime.spawn(lap_vault_sidecar::run(settings));
    let ca_path = dir.path().join("sidecar-ca.pem");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect(listen).is_err() || !ca_path.exists() {
        assert!(std::time::Instant::now() < deadline, "in-process sidecar did not start");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let sidecar_ca = std::fs::read(&ca_path).expect("sidecar CA");

    let url = format!("https://localhost:{port}/v1/small");
    let client = |roots: &[u8], proxy: bool, h2: bool| {
        let mut b = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(roots).expect("root"));
        b = if proxy {
            b.proxy(reqwest::Proxy::all(format!("http://{listen}")).expect("proxy"))
        } else {
            b.no_proxy().resolve("localhost", upstream)
        };
        if !h2 {
            b = b.http1_only();
        }
        b.build().expect("client")
    };
    let mut group = c.benchmark_group("request");
    for (proto, h2) in [("http1", false), ("h2", true)] {
        for (route, proxy, roots, key) in [
            ("direct", false, pki.ca_pem.as_bytes(), REAL),
            ("via_sidecar", true, &sidecar_ca[..], STUB),
        ] {
            let client = client(roots, proxy, h2);
            let get = || async {
                let resp = client.get(&url).header("x-api-key", key).send().await.expect("send");
                assert_eq!(resp.status(), 200, "{route}: the upstream refused the key");
                resp.bytes().await.expect("body")
            };
            runtime.block_on(get());
            group.bench_function(format!("{route}_{proto}"), |b| {
                b.iter(|| black_box(runtime.block_on(get())))
            });
        }
    }
    group.finish();
}
