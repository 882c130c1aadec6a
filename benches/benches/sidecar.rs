//! Criterion benches of the sidecar's hot path (SPEC §5): leaf mint (beside a raw P-256 signature
//! in the same run, so the ratio is what counts), leaf-cache hit, header rewrite, and streaming
//! body rewrite throughput.

use std::hint::black_box;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lap_vault_sidecar::hosts::{HostPattern, HostSet, TargetHost};
use lap_vault_sidecar::rewrite::{HostRules, Injections};
use lap_vault_sidecar::secrets::{Location, LocationSet, Secret, SecretSet};
use lap_vault_sidecar::tls::{Ca, LeafCache};

fn secrets() -> SecretSet {
    let mut locations = LocationSet::default();
    locations.insert(Location::Header);
    locations.insert(Location::Body);
    let secret = |name: &str, stub: &str, value: &str, host: &str| Secret {
        name: name.into(),
        stub: stub.into(),
        value: value.into(),
        hosts: HostSet(vec![host.parse::<HostPattern>().expect("host")]),
        locations,
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
            let rules = HostRules::new(&set, &host);
            let mut inj = Injections::default();
            black_box(
                rules
                    .header_value(b"sk-ant-api03-lapstub-aaaaaaaaaaaaaaaa", &mut inj)
                    .expect("ok"),
            )
        })
    });
    c.bench_function("header_rewrite_miss", |b| {
        let rules = HostRules::new(&set, &host);
        b.iter(|| black_box(rules.header_value(b"application/json; charset=utf-8", &mut Injections::default())))
    });

    let chunk = Bytes::from({
        let mut v = b"data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hello world\"}}\n\n".repeat(256);
        v.extend_from_slice(b"sk-ant-api03-lapstub-aaaaaaaaaaaaaaaa");
        v
    });
    let mut group = c.benchmark_group("body_rewrite");
    group.throughput(Throughput::Bytes(chunk.len() as u64));
    let rules = HostRules::new(&set, &host);
    group.bench_function("stream_16k_chunk", |b| {
        let mut rw = rules.body_rewriter().expect("rewriter");
        b.iter(|| black_box(rw.push(chunk.clone())))
    });
    group.finish();
}

criterion_group!(benches, certificates, rewriting);
criterion_main!(benches);
