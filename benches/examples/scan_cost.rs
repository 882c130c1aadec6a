//! Instruction counts for body rewriting, steadier than wall time on a shared machine:
//! `valgrind --tool=callgrind target/release/examples/scan_cost` and divide the total by the bytes
//! it prints. Pushes 4 MiB of JSON lines holding no stub through a request-body rewriter.

use bytes::Bytes;
use lap_vault_sidecar::HostRules;
use lap_vault_sidecar::{Binding, BindingSet, TargetHost};
use lap_vault_sidecar::{Secret, SecretSet, Surface, Surfaces};

fn main() {
    // Header credentials, and every body to the model's messages endpoint.
    let surfaces = Surfaces(vec![
        Surface::CredentialHeaders,
        "body:POST /v1/messages".parse::<Surface>().expect("surface"),
    ]);
    let set = SecretSet::new(
        [
            (
                "ANTHROPIC_API_KEY",
                "sk-ant-api03-lapstub-aaaaaaaaaaaaaaaa",
                "sk-ant-api03-REAL-bbbbbbbbbbbbbbbb",
            ),
            (
                "OPENAI_API_KEY",
                "sk-lapstub-cccccccccccccccc",
                "sk-REAL-dddddddddddddddddddd",
            ),
            (
                "GITHUB_TOKEN",
                "ghp_lapstubeeeeeeeeeeeeeeee",
                "ghp_REALffffffffffffffffffff",
            ),
        ]
        .into_iter()
        .map(|(name, stub, value)| Secret {
            name: name.into(),
            stub: stub.into(),
            value: value.into(),
            hosts: BindingSet(vec!["api.anthropic.com".parse::<Binding>().expect("host")]),
            surfaces: surfaces.clone(),
        })
        .collect(),
    );
    let rules = HostRules::new(&set, &TargetHost::parse("api.anthropic.com"), 443);
    let mut rw = rules.body_rewriter("POST", "/v1/messages", None).expect("rewriter");
    let chunk = Bytes::from(
        b"{\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"fn main() { skip(); }\"}}\n"
            .repeat(160),
    );
    let mut out = 0usize;
    for _ in 0..256 {
        out += rw.push(chunk.clone()).len();
    }
    out += rw.finish().len();
    println!("{out} bytes");
}
