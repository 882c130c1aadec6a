//! `deploy/` renders with `kubectl kustomize` (Debian's kubernetes-client in CI) and every
//! rendered object validates against the Kubernetes 1.33 JSON schemas (`support/schema.rs`,
//! unknown fields refused), and deserializes into its k8s-openapi type and serializes back with
//! nothing lost. Then the properties the deployment promises: least-privilege RBAC, the
//! sandbox egress policy, a non-root control plane.

#![allow(clippy::unwrap_used)]

use crate::support::schema;

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// `kubectl kustomize DIR` as JSON documents (a missing kubectl fails the test with the install
/// command).
fn render(dir: &Path) -> Vec<Value> {
    let out = match std::process::Command::new("kubectl").arg("kustomize").arg(dir).output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!("kubectl is not installed: apt-get install kubernetes-client (.ci/run does)")
        }
        Err(e) => panic!("kubectl: {e}"),
    };
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// `original` and its typed round trip `round` have the same keys and values (numbers may come
/// back as the same text, e.g. an int-or-string port).
fn assert_subset(original: &Value, round: &Value, path: &str) {
    match (original, round) {
        (Value::Object(o), Value::Object(r)) => {
            for (k, v) in o {
                let Some(rv) = r.get(k) else {
                    panic!("{path}.{k}: not a field of this kind (unknown or misspelt)");
                };
                assert_subset(v, rv, &format!("{path}.{k}"));
            }
            // k8s-openapi serializes optional fields only when set, required ones always (a
            // missing one defaulted): a key only the round trip has is a missing required field.
            // (Not `apiVersion`/`kind`: it writes them on embedded objects such as
            // volumeClaimTemplates, where the API server does not require them.)
            for k in r.keys().filter(|k| *k != "apiVersion" && *k != "kind") {
                assert!(o.contains_key(k), "{path}.{k}: required field missing");
            }
        }
        (Value::Array(o), Value::Array(r)) => {
            assert_eq!(o.len(), r.len(), "{path}: list length changed");
            for (i, (a, b)) in o.iter().zip(r).enumerate() {
                assert_subset(a, b, &format!("{path}[{i}]"));
            }
        }
        (Value::Number(n), Value::String(s)) | (Value::String(s), Value::Number(n)) => {
            assert_eq!(n.to_string(), *s, "{path}");
        }
        (a, b) => assert_eq!(a, b, "{path}"),
    }
}

fn check<T: DeserializeOwned + Serialize>(doc: &Value, what: &str) -> T {
    schema::assert_valid(doc);
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let round = serde_json::to_value(&typed).unwrap();
    assert_subset(doc, &round, what);
    typed
}

/// Validate each document by kind; returns them typed for the property checks.
#[derive(Default)]
struct Rendered {
    namespaces: Vec<Namespace>,
    roles: Vec<Role>,
    bindings: Vec<RoleBinding>,
    deployments: Vec<Deployment>,
    statefulsets: Vec<StatefulSet>,
    policies: Vec<NetworkPolicy>,
    services: Vec<Service>,
    accounts: Vec<ServiceAccount>,
}

fn validate(docs: &[Value]) -> Rendered {
    let mut r = Rendered::default();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        let api = doc["apiVersion"].as_str().unwrap_or_default();
        let what = format!("{kind} {}", doc["metadata"]["name"].as_str().unwrap_or("?"));
        match (api, kind) {
            ("v1", "Namespace") => r.namespaces.push(check(doc, &what)),
            ("v1", "ServiceAccount") => r.accounts.push(check(doc, &what)),
            ("v1", "Service") => r.services.push(check(doc, &what)),
            ("rbac.authorization.k8s.io/v1", "Role") => r.roles.push(check(doc, &what)),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => r.bindings.push(check(doc, &what)),
            ("apps/v1", "Deployment") => r.deployments.push(check(doc, &what)),
            ("apps/v1", "StatefulSet") => r.statefulsets.push(check(doc, &what)),
            ("networking.k8s.io/v1", "NetworkPolicy") => r.policies.push(check(doc, &what)),
            _ => panic!("{what}: {api} {kind} has no schema in this test; add it"),
        }
    }
    r
}

fn properties(r: &Rendered) {
    // Namespaces.
    let ns: Vec<&str> = r.namespaces.iter().filter_map(|n| n.metadata.name.as_deref()).collect();
    assert!(ns.contains(&"lap-system") && ns.contains(&"lap-sandboxes"), "{ns:?}");

    // RBAC: namespaced only, in the sandbox namespace, no wildcards, no pods/exec.
    assert_eq!(r.roles.len(), 1);
    let role = &r.roles[0];
    assert_eq!(role.metadata.namespace.as_deref(), Some("lap-sandboxes"));
    for rule in role.rules.as_deref().unwrap() {
        let all = [
            rule.api_groups.clone().unwrap_or_default(),
            rule.resources.clone().unwrap_or_default(),
            rule.verbs.clone(),
        ]
        .concat();
        assert!(!all.iter().any(|x| x == "*"), "wildcard in {rule:?}");
        for res in rule.resources.as_deref().unwrap_or_default() {
            assert!(
                [
                    "sandboxes",
                    "secrets",
                    "events",
                    "sandboxclaims",
                    "sandboxtemplates",
                    "sandboxwarmpools"
                ]
                .contains(&res.as_str()),
                "{res}"
            );
            // `sandboxes/finalizers` would be what `blockOwnerDeletion: true` needs; LAP's owner
            // references do not block, so it is not granted.
            assert!(!res.contains('/'), "no subresources: {res}");
        }
    }
    let binding = &r.bindings[0];
    assert_eq!(binding.role_ref.kind, "Role");
    let subject = &binding.subjects.as_deref().unwrap()[0];
    assert_eq!(
        (subject.name.as_str(), subject.namespace.as_deref()),
        ("lap-server", Some("lap-system"))
    );

    // The control plane: Kubernetes backend, secrets from Secrets, non-root, read-only root.
    let d = r
        .deployments
        .iter()
        .find(|d| d.metadata.name.as_deref() == Some("lap-server"))
        .unwrap();
    let pod = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("lap-server"));
    assert_eq!(pod.security_context.as_ref().unwrap().run_as_non_root, Some(true));
    let c = &pod.containers[0];
    let env = c.env.as_deref().unwrap();
    let var = |k: &str| env.iter().find(|e| e.name == k).unwrap_or_else(|| panic!("no {k}"));
    assert_eq!(var("LAP_BACKEND").value.as_deref(), Some("kubernetes"));
    for k in ["DATABASE_URL", "MASTER_KEY", "LAP_ENCRYPTION_KEY"] {
        assert!(var(k).value.is_none(), "{k} must come from a Secret");
        assert!(var(k).value_from.as_ref().unwrap().secret_key_ref.is_some(), "{k}");
    }
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_owned()][..])
    );

    // Sandbox egress: DNS, then TCP 80/443 to public addresses only.
    let np = r
        .policies
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("lap-sandbox"))
        .unwrap();
    assert_eq!(np.metadata.namespace.as_deref(), Some("lap-sandboxes"));
    let spec = np.spec.as_ref().unwrap();
    assert_eq!(
        spec.pod_selector.as_ref().unwrap().match_labels.as_ref().unwrap()["app.kubernetes.io/name"],
        "lap-sandbox"
    );
    let types = spec.policy_types.clone().unwrap();
    assert!(types.contains(&"Egress".to_owned()) && types.contains(&"Ingress".to_owned()));
    let mut ports = Vec::new();
    let mut excepted = Vec::new();
    for rule in spec.egress.as_deref().unwrap() {
        for p in rule.ports.as_deref().unwrap() {
            ports.push(serde_json::to_value(p.port.as_ref().unwrap()).unwrap().to_string());
        }
        for peer in rule.to.as_deref().unwrap_or_default() {
            if let Some(b) = &peer.ip_block {
                if b.cidr == "0.0.0.0/0" || b.cidr == "::/0" {
                    excepted.extend(b.except.clone().unwrap_or_default());
                } else {
                    panic!("unexpected ipBlock {}", b.cidr);
                }
            }
        }
    }
    ports.sort();
    ports.dedup();
    assert_eq!(ports, ["443", "53", "80"]);
    for cidr in [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
        "fc00::/7",
        "fe80::/10",
    ] {
        assert!(excepted.iter().any(|e| e == cidr), "egress to {cidr} is not excluded");
    }
}

#[test]
fn deploy_renders_and_validates() {
    let base = render(&deploy_dir().join("base"));
    let r = validate(&base);
    properties(&r);
    assert!(r.statefulsets.is_empty(), "the base uses an external DATABASE_URL");

    let kind = render(&deploy_dir().join("overlays/kind"));
    let r = validate(&kind);
    properties(&r);
    assert_eq!(r.services.len(), 2, "lap-server and lap-postgres");
    assert_eq!(r.accounts.len(), 1);
    let pg = &r.statefulsets[0];
    let pod = pg.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let pw = pod.containers[0]
        .env
        .as_deref()
        .unwrap()
        .iter()
        .find(|e| e.name == "POSTGRES_PASSWORD")
        .unwrap();
    assert!(pw.value.is_none(), "the Postgres password comes from a Secret");
    let d = &r.deployments[0];
    let env = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    assert!(env.iter().any(|e| e.name == "LAP_LOG"), "the overlay's patch applied");
}

/// The validator itself catches a misspelt field and a missing required one.
#[test]
fn validator_rejects_bad_objects() {
    let doc = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"selektor": {"a": "b"}, "ports": [{"port": 80}]}
    });
    let r = std::panic::catch_unwind(|| check::<Service>(&doc, "Service x"));
    assert!(r.is_err(), "a misspelt field passed");
    let doc = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"targetPort": 80}]}
    });
    let r = std::panic::catch_unwind(|| check::<Service>(&doc, "Service x"));
    assert!(r.is_err(), "a missing required field (port) passed");
    // The JSON-schema half alone, too.
    let doc = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "x", "namespace": "n"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verb": ["get"]}]
    });
    assert!(
        !schema::problems(&doc).is_empty(),
        "a misspelt field (verb) passed the schema"
    );
}

/// Instructions of a Dockerfile as (KEYWORD, arguments), continuations joined, comments dropped.
fn dockerfile(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines().map(str::trim) {
        if current.is_empty() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        if let Some(body) = line.strip_suffix('\\') {
            current.push_str(body);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        let (k, a) = current.split_once(char::is_whitespace).unwrap_or((&current, ""));
        out.push((k.to_uppercase(), a.split_whitespace().collect::<Vec<_>>().join(" ")));
        current.clear();
    }
    out
}

/// The images the deployment and the backend name: lap-server and the vault, each a multi-stage
/// build of its binary with `--locked`, run as the user the pod expects, and the build script
/// tagging every image with the names the defaults use.
#[test]
fn server_and_vault_images_are_well_formed_and_named_as_deployed() {
    use clap::Parser as _;
    use lap_control_plane::backend::sandbox::VAULT_UID;
    for (dir, krate, bin, user) in [
        (
            "lap-server",
            "lap-control-plane",
            "lap-server",
            "10001:10001".to_owned(),
        ),
        (
            "vault-sidecar",
            "lap-vault-sidecar",
            "vault-sidecar",
            format!("{VAULT_UID}:{VAULT_UID}"),
        ),
    ] {
        let ins = dockerfile(&deploy_dir().join("images").join(dir).join("Dockerfile"));
        let froms: Vec<usize> = ins
            .iter()
            .enumerate()
            .filter(|(_, (k, _))| k == "FROM")
            .map(|(i, _)| i)
            .collect();
        assert_eq!(froms.len(), 2, "{dir}: a build stage and the image");
        assert!(ins[froms[0]].1.ends_with("AS build"), "{dir}: first stage is `build`");
        let build = &ins[froms[0]..froms[1]];
        let image = &ins[froms[1]..];
        assert!(
            build.iter().any(|(k, a)| k == "RUN"
                && a.contains("cargo build --release --locked")
                && a.contains(&format!("-p {krate}"))),
            "{dir}: builds {krate} with --locked"
        );
        assert!(
            image.iter().any(|(k, a)| k == "COPY"
                && a.starts_with("--from=build")
                && a.contains(&format!("target/release/{bin} /usr/local/bin/{bin}"))),
            "{dir}: copies {bin} out of the build stage"
        );
        let users: Vec<&String> = image.iter().filter(|(k, _)| k == "USER").map(|(_, a)| a).collect();
        assert_eq!(users, [&user], "{dir}: runs as {user}");
        let entry = image.iter().rev().find(|(k, _)| k == "ENTRYPOINT").expect("ENTRYPOINT");
        assert!(
            entry.1.contains(&format!("/usr/local/bin/{bin}")),
            "{dir}: ENTRYPOINT runs {bin}"
        );
    }
    let vault = dockerfile(&deploy_dir().join("images/vault-sidecar/Dockerfile"));
    assert!(
        vault.iter().any(|(k, a)| k == "RUN" && a.contains("iptables")),
        "the netfilter init container runs the vault image, which needs iptables"
    );

    let script = std::fs::read_to_string(deploy_dir().join("build-images.sh")).unwrap();
    for tag in ["lap/lap-server:$tag", "lap/vault-sidecar:$tag", "lap/harness-$id:$tag"] {
        assert!(script.contains(tag), "build-images.sh tags {tag}");
    }
    let deployment = std::fs::read_to_string(deploy_dir().join("base/deployment.yaml")).unwrap();
    assert!(deployment.contains("image: lap/lap-server:dev"));
    let settings = lap_control_plane::settings::Settings::try_parse_from(["lap-server"]).unwrap();
    assert_eq!(settings.k8s.vault_image, "lap/vault-sidecar:dev");
    assert_eq!(settings.k8s.harness_image, "lap/harness-{harness_id}:dev");
}
