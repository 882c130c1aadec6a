//! Validate Kubernetes objects against their real schemas with the `jsonschema` crate:
//!
//! - agent-sandbox kinds (Sandbox v1beta1 and v1alpha1, SandboxTemplate, SandboxWarmPool,
//!   SandboxClaim): `spec.versions[].schema.openAPIV3Schema` of the vendored v0.5.6 CRDs
//!   (`tests/data/agent-sandbox-crd/`), where every object node that lists its `properties` is
//!   closed (`additionalProperties: false`): the API server would *prune* an unknown field
//!   silently, which for LAP is a bug. `x-kubernetes-list-type: map` keys are checked unique
//!   (the API server refuses duplicates); `format: date-time` is checked. CEL
//!   (`x-kubernetes-validations`) is not evaluated.
//! - built-in kinds (Secret, Pod, Deployment, Role, NetworkPolicy…): the Kubernetes 1.33 "strict"
//!   JSON schemas (unknown fields refused) that PyPI's `kubernetes-validate` package ships
//!   (`.ci/run` installs it); found through `LAP_K8S_JSON_SCHEMAS` (the directory holding
//!   `_definitions.json`), else through `python3`. Required: without them this panics and says
//!   how to install them.
//! - `metadata` of every object: name (DNS-1123 subdomain), label keys and values, as the API
//!   server's ObjectMeta validation.

#![allow(dead_code, clippy::unwrap_used, unreachable_pub)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use serde_json::{json, Value};

fn crd_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/agent-sandbox-crd")
}

/// Close every object schema that lists its properties (unless it preserves unknown fields).
fn close(schema: &mut Value) {
    match schema {
        Value::Object(m) => {
            let preserve = m.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
            if m.contains_key("properties") && !m.contains_key("additionalProperties") && !preserve {
                m.insert("additionalProperties".into(), json!(false));
            }
            for v in m.values_mut() {
                close(v);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(close),
        _ => {}
    }
}

struct Crd {
    schema: Value,
    validator: jsonschema::Validator,
}

fn crds() -> &'static HashMap<(String, String), Crd> {
    static CRDS: OnceLock<HashMap<(String, String), Crd>> = OnceLock::new();
    CRDS.get_or_init(|| {
        let mut map = HashMap::new();
        for f in [
            "agents.x-k8s.io_sandboxes.yaml",
            "extensions.agents.x-k8s.io_sandboxtemplates.yaml",
            "extensions.agents.x-k8s.io_sandboxwarmpools.yaml",
            "extensions.agents.x-k8s.io_sandboxclaims.yaml",
        ] {
            let text = std::fs::read_to_string(crd_dir().join(f)).unwrap();
            let crd: Value = serde_saphyr::from_str(&text).unwrap();
            let group = crd["spec"]["group"].as_str().unwrap();
            let kind = crd["spec"]["names"]["kind"].as_str().unwrap();
            for v in crd["spec"]["versions"].as_array().unwrap() {
                let mut schema = v["schema"]["openAPIV3Schema"].clone();
                close(&mut schema);
                // The root's metadata is checked by `check_metadata`; apiVersion and kind must match.
                let api_version = format!("{group}/{}", v["name"].as_str().unwrap());
                schema["properties"]["apiVersion"] = json!({"type": "string", "enum": [api_version]});
                schema["properties"]["kind"] = json!({"type": "string", "enum": [kind]});
                schema["required"] = json!(["apiVersion", "kind", "metadata", "spec"]);
                let validator = jsonschema::options()
                    .with_draft(jsonschema::Draft::Draft4)
                    .should_validate_formats(true)
                    .build(&schema)
                    .unwrap();
                map.insert((api_version, kind.to_owned()), Crd { schema, validator });
            }
        }
        map
    })
}

/// The directory of the Kubernetes JSON schemas (`_definitions.json`).
pub fn k8s_schema_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LAP_K8S_JSON_SCHEMAS") {
        return PathBuf::from(d);
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import importlib.util as u; s = u.find_spec('kubernetes_validate'); print(s.submodule_search_locations[0] if s else '')",
        ])
        .output();
    let dir = out
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join("kubernetes-json-schema/v1.33.0-local-strict"));
    match dir.filter(|d| d.join("_definitions.json").is_file()) {
        Some(d) => d,
        None => panic!(
            "the Kubernetes JSON schemas are missing: `python3 -m pip install kubernetes-validate==1.37.0` \
             (as .ci/run does), or set LAP_K8S_JSON_SCHEMAS to a directory holding _definitions.json"
        ),
    }
}

fn k8s_defs() -> &'static Value {
    static DEFS: OnceLock<Value> = OnceLock::new();
    DEFS.get_or_init(|| {
        let text = std::fs::read_to_string(k8s_schema_dir().join("_definitions.json")).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        v["$defs"].clone()
    })
}

/// The `$defs` name of a built-in kind.
fn k8s_def(api_version: &str, kind: &str) -> String {
    let (group, version) = api_version.split_once('/').unwrap_or(("core", api_version));
    let prefix = match group {
        "core" => "io.k8s.api.core".to_owned(),
        // `networking.k8s.io` → `networking`, `rbac.authorization.k8s.io` → `rbac`, `apps` → `apps`.
        g => format!("io.k8s.api.{}", g.split('.').next().unwrap_or(g)),
    };
    format!("{prefix}.{version}.{kind}")
}

fn k8s_validator(def: &str) -> &'static jsonschema::Validator {
    static CACHE: OnceLock<Mutex<HashMap<String, &'static jsonschema::Validator>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    if let Some(v) = cache.lock().unwrap().get(def) {
        return v;
    }
    let defs = k8s_defs();
    assert!(defs.get(def).is_some(), "no Kubernetes schema for {def}");
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": defs,
        "$ref": format!("#/$defs/{def}"),
    });
    let v: &'static jsonschema::Validator = Box::leak(Box::new(
        jsonschema::options()
            .should_validate_formats(true)
            .build(&schema)
            .unwrap(),
    ));
    cache.lock().unwrap().insert(def.to_owned(), v);
    v
}

fn dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

fn label_value(v: &str) -> bool {
    v.len() <= 63
        && (v.is_empty()
            || (v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                && v.as_bytes()[0].is_ascii_alphanumeric()
                && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric()))
}

fn label_key(k: &str) -> bool {
    let (prefix, name) = k.rsplit_once('/').map_or((None, k), |(p, n)| (Some(p), n));
    prefix.is_none_or(dns_subdomain) && !name.is_empty() && label_value(name)
}

/// ObjectMeta checks the API server makes on create (name, labels, annotations' keys).
fn check_metadata(meta: &Value, at: &str, errors: &mut Vec<String>) {
    if let Some(name) = meta["name"].as_str() {
        if !dns_subdomain(name) {
            errors.push(format!("{at}.name: `{name}` is not a DNS-1123 subdomain"));
        }
    }
    for (field, value_too) in [("labels", true), ("annotations", false)] {
        if let Some(m) = meta[field].as_object() {
            for (k, v) in m {
                if !label_key(k) {
                    errors.push(format!("{at}.{field}: key `{k}` is not a qualified name"));
                }
                if value_too && !v.as_str().is_some_and(label_value) {
                    errors.push(format!("{at}.{field}.{k}: `{v}` is not a label value"));
                }
            }
        }
    }
}

/// `x-kubernetes-list-type: map` lists have unique keys; pod template metadata is ObjectMeta.
fn walk(schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    if schema["x-kubernetes-list-type"] == "map" {
        if let (Some(keys), Some(items)) = (schema["x-kubernetes-list-map-keys"].as_array(), value.as_array()) {
            let mut seen = HashSet::new();
            for item in items {
                let key: Vec<String> = keys.iter().map(|k| item[k.as_str().unwrap()].to_string()).collect();
                if !seen.insert(key.clone()) {
                    errors.push(format!("{at}: duplicate list-map key {key:?}"));
                }
            }
        }
    }
    match value {
        Value::Object(m) => {
            for (k, v) in m {
                if let Some(s) = schema["properties"].get(k) {
                    walk(s, v, &format!("{at}.{k}"), errors);
                } else if schema["additionalProperties"].is_object() {
                    walk(&schema["additionalProperties"], v, &format!("{at}.{k}"), errors);
                }
            }
            if at.ends_with("podTemplate") {
                check_metadata(
                    &m.get("metadata").cloned().unwrap_or_default(),
                    &format!("{at}.metadata"),
                    errors,
                );
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                walk(&schema["items"], v, &format!("{at}[{i}]"), errors);
            }
        }
        _ => {}
    }
}

/// Every problem the API server's schema validation would find in `obj` (empty: valid).
pub fn problems(obj: &Value) -> Vec<String> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default().to_owned();
    let kind = obj["kind"].as_str().unwrap_or_default().to_owned();
    let mut errors = Vec::new();
    check_metadata(&obj["metadata"], "metadata", &mut errors);
    if let Some(crd) = crds().get(&(api_version.clone(), kind.clone())) {
        errors.extend(
            crd.validator
                .iter_errors(obj)
                .map(|e| format!("{}: {e}", e.instance_path())),
        );
        walk(&crd.schema, obj, "", &mut errors);
    } else if api_version.contains("agents.x-k8s.io") {
        errors.push(format!("{api_version} {kind}: no such kind in the agent-sandbox CRDs"));
    } else {
        let v = k8s_validator(&k8s_def(&api_version, &kind));
        errors.extend(v.iter_errors(obj).map(|e| format!("{}: {e}", e.instance_path())));
    }
    errors
}

/// Panic with every problem, naming the object.
pub fn assert_valid(obj: &Value) {
    let p = problems(obj);
    assert!(
        p.is_empty(),
        "{} {} {} fails its schema:\n  {}",
        obj["apiVersion"],
        obj["kind"],
        obj["metadata"]["name"],
        p.join("\n  ")
    );
}
