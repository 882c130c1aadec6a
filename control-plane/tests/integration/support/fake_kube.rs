//! A fake Kubernetes API server, in-process (axum on loopback), speaking enough of the REST API
//! for kube-rs: namespaced get / list / create / replace / merge-patch / delete of any resource
//! (core `/api/v1/...` and `/apis/{group}/{version}/...`), label and field selectors
//! (`metadata.name`, `involvedObject.name`), `?watch=true` streams of newline-delimited watch
//! events resumed from a `resourceVersion`, and `Status` errors (404 NotFound, 409
//! AlreadyExists / Conflict), `metadata.generation` bumped on spec changes, and garbage
//! collection by `ownerReferences` (background propagation).
//!
//! Beside the API server runs a port of the agent-sandbox v0.5.6 controllers (`Controller`
//! below; `controllers/sandbox_controller.go`, `extensions/controllers/sandboxwarmpool_controller.go`
//! and `sandboxclaim_controller.go`): a Sandbox gets its pod (through the admission plugins a
//! test installs: quota, PodSecurity, RuntimeClass) and its Service, and its status is computed
//! from the pod as the controller computes it (`Ready` with `DependenciesReady`,
//! `DependenciesNotReady`, `ReconcilerError`, `MultiplePods`, `SandboxSuspended`, `PodSucceeded`,
//! `PodFailed`, `SandboxExpired`; `Finished`, `PodScheduled`, `Suspended`), shutdownTime expiry
//! included. Warm pools keep their replicas of template-made Sandboxes; claims adopt one or
//! cold-start from the template. The only Event it writes is the controller's own
//! (`MultiplePods`). Tests play the kubelet and scheduler (`pod_running`, `pod_phase`,
//! `pod_unschedulable`, or `kubelet_auto`), add kubelet Events, cut a watch short, inject a
//! failure, read the request log.

#![allow(dead_code, clippy::unwrap_used, unreachable_pub)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use lap_test_support::{eventually, eventually_ok};
use serde_json::{json, Value};
use tokio::sync::broadcast;

#[path = "schema.rs"]
pub mod schema;

/// (plural, namespace, name)
type Key = (String, String, String);

#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    plural: String,
    ns: String,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: Vec<Change>,
    /// Requests seen: "METHOD path?query".
    log: Vec<String>,
    /// plural → how many next watch connections end after delivering one event.
    cut_watches: HashMap<String, usize>,
    /// (METHOD, plural) → queued failures (code, reason).
    failures: HashMap<(String, String), VecDeque<(u16, String)>>,
    /// The controller port's switches and the tests' admission plugins.
    sim: Sim,
}

/// An admission plugin: `Err(message)` refuses a pod ("pods \"x\" is forbidden: message").
pub type Admission = Arc<dyn Fn(&Value) -> Result<(), String> + Send + Sync>;

#[derive(Default)]
struct Sim {
    paused: bool,
    /// Every new pod is at once Running and Ready with this IP (the kubelet, instantly).
    auto_ip: Option<String>,
    admission: Vec<Admission>,
}

/// The fake API server.
#[derive(Clone)]
pub struct FakeKube {
    inner: Arc<Mutex<Inner>>,
    changes: broadcast::Sender<Change>,
    pub url: String,
}

fn status(code: u16, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    (
        StatusCode::from_u16(code).unwrap(),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn ok(code: StatusCode, v: &Value) -> Response {
    (code, [("content-type", "application/json")], v.to_string()).into_response()
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

struct Path {
    plural: String,
    ns: String,
    name: Option<String>,
    api_version: String,
}

fn parse_path(path: &str) -> Option<Path> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api_version, rest) = match parts.as_slice() {
        ["api", v, rest @ ..] => ((*v).to_owned(), rest),
        ["apis", g, v, rest @ ..] => (format!("{g}/{v}"), rest),
        _ => return None,
    };
    match rest {
        ["namespaces", ns, plural] => Some(Path {
            plural: (*plural).to_owned(),
            ns: (*ns).to_owned(),
            name: None,
            api_version,
        }),
        ["namespaces", ns, plural, name] => Some(Path {
            plural: (*plural).to_owned(),
            ns: (*ns).to_owned(),
            name: Some((*name).to_owned()),
            api_version,
        }),
        _ => None,
    }
}

fn query(uri: &Uri) -> HashMap<String, String> {
    uri.query()
        .map(|q| url_decode_pairs(q).into_iter().collect::<HashMap<String, String>>())
        .unwrap_or_default()
}

fn url_decode_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let h = u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("00"), 16).unwrap_or(b'?');
                out.push(h);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `obj` passes `labelSelector` (k=v,…) and `fieldSelector` (path=v,…).
fn selected(obj: &Value, q: &HashMap<String, String>) -> bool {
    if let Some(sel) = q.get("labelSelector").filter(|s| !s.is_empty()) {
        for term in sel.split(',') {
            let (k, v) = term.split_once('=').unwrap_or((term, ""));
            if obj["metadata"]["labels"][k].as_str() != Some(v) {
                return false;
            }
        }
    }
    if let Some(sel) = q.get("fieldSelector").filter(|s| !s.is_empty()) {
        for term in sel.split(',') {
            let (k, v) = term.split_once('=').unwrap_or((term, ""));
            let mut cur = obj;
            for part in k.split('.') {
                cur = &cur[part];
            }
            if cur.as_str() != Some(v) {
                return false;
            }
        }
    }
    true
}

/// The API server's schema validation of what clients write (LAP's kinds): `422 Invalid` with
/// every problem, as kube-apiserver answers a body its OpenAPI schema refuses.
fn invalid(plural: &str, obj: &Value, what: &str) -> Option<Response> {
    if !matches!(
        plural,
        "sandboxes" | "sandboxclaims" | "sandboxtemplates" | "sandboxwarmpools" | "secrets"
    ) {
        return None;
    }
    let problems = schema::problems(obj);
    (!problems.is_empty()).then(|| status(422, "Invalid", format!("{what} is invalid: {}", problems.join("; "))))
}

/// Kinds whose `.status` only the status subresource writes (the main resource ignores it).
fn has_status_subresource(plural: &str) -> bool {
    matches!(plural, "sandboxes" | "sandboxclaims" | "sandboxwarmpools" | "pods")
}

fn kind_of(plural: &str) -> &str {
    match plural {
        "sandboxes" => "Sandbox",
        "sandboxclaims" => "SandboxClaim",
        "sandboxtemplates" => "SandboxTemplate",
        "sandboxwarmpools" => "SandboxWarmPool",
        "services" => "Service",
        "secrets" => "Secret",
        "pods" => "Pod",
        "events" => "Event",
        "leases" => "Lease",
        _ => "Object",
    }
}

impl FakeKube {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let fake = FakeKube {
            inner: Arc::default(),
            changes: broadcast::channel(1024).0,
            url,
        };
        let app = axum::Router::new().fallback(handle).with_state(fake.clone());
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        let controller = fake.clone();
        let mut rx = fake.changes.subscribe();
        tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return,
                }
                // Level-based, like controller-runtime: every change reconciles everything
                // until nothing more changes (bounded: a bug here must not hang a test).
                for _ in 0..50 {
                    if !controller.reconcile_all() {
                        break;
                    }
                }
            }
        });
        fake
    }

    /// Stop (or restart) the controller port: for tests that write `.status` themselves, as an
    /// older controller would have left it (field case N14).
    pub fn pause_controller(&self, paused: bool) {
        self.inner.lock().unwrap().sim.paused = paused;
        if !paused {
            for _ in 0..50 {
                if !self.reconcile_all() {
                    break;
                }
            }
        }
    }

    /// Play an instant kubelet: every pod created from now on is Running and Ready at `ip`.
    pub fn kubelet_auto(&self, ip: &str) {
        self.inner.lock().unwrap().sim.auto_ip = Some(ip.to_owned());
    }

    /// Install an admission plugin for pods (ResourceQuota, PodSecurity, RuntimeClass…).
    pub fn admission(&self, plugin: impl Fn(&Value) -> Result<(), String> + Send + Sync + 'static) {
        self.inner.lock().unwrap().sim.admission.push(Arc::new(plugin));
    }

    /// The pod of a Sandbox (its name, unless adopted under another: the pod-name annotation).
    pub fn pod_of(&self, ns: &str, sandbox: &str) -> Option<Value> {
        let sb = self.get("sandboxes", ns, sandbox)?;
        let name = sb["metadata"]["annotations"][POD_NAME_ANNOTATION]
            .as_str()
            .unwrap_or(sandbox)
            .to_owned();
        self.get("pods", ns, &name)
    }

    /// Wait for a Sandbox's pod to exist; its name.
    pub async fn wait_pod(&self, ns: &str, sandbox: &str) -> String {
        let what = format!("the pod of {sandbox}");
        let pod = eventually(Duration::from_secs(20), &what, || async { self.pod_of(ns, sandbox) }).await;
        pod["metadata"]["name"].as_str().unwrap().to_owned()
    }

    /// The kubelet: the pod is Running at `ip`, Ready or not (its readiness probe).
    pub fn pod_running(&self, ns: &str, pod: &str, ip: &str, ready: bool) {
        self.write_status("pods", ns, pod, running_status(ip, ready));
    }

    /// The kubelet: the pod reached `phase` (Succeeded, Failed).
    pub fn pod_phase(&self, ns: &str, pod: &str, phase: &str) {
        let mut st = self.get("pods", ns, pod).expect("no such pod")["status"].clone();
        st["phase"] = json!(phase);
        st["conditions"] = json!([{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False", "reason": "PodCompleted"}]);
        self.write_status("pods", ns, pod, st);
    }

    /// The scheduler: no node fits the pod.
    pub fn pod_unschedulable(&self, ns: &str, pod: &str, message: &str) {
        self.write_status(
            "pods",
            ns,
            pod,
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}),
        );
    }

    /// Forget the request log (before counting the calls of one session).
    pub fn clear_requests(&self) {
        self.inner.lock().unwrap().log.clear();
    }

    /// A kube client pointed at this server.
    pub fn client(&self) -> kube::Client {
        let mut cfg = kube::Config::new(self.url.parse().unwrap());
        cfg.default_namespace = "default".into();
        kube::Client::try_from(cfg).unwrap()
    }

    /// Store `obj` as a create or update would (new resourceVersion, uid, creationTimestamp,
    /// `generation` 1 on create and +1 when the spec changes) and tell watchers. A delete takes
    /// the object's dependents with it (garbage collection by owner uid).
    fn write(&self, plural: &str, ns: &str, name: &str, mut obj: Value, kind: &'static str) -> Value {
        let mut dependents = Vec::new();
        let obj = {
            let mut inner = self.inner.lock().unwrap();
            inner.rv += 1;
            let rv = inner.rv;
            let key = (plural.to_owned(), ns.to_owned(), name.to_owned());
            let previous = inner.objects.get(&key).cloned();
            let generation = match &previous {
                None => 1,
                Some(p) => {
                    let g = p["metadata"]["generation"].as_i64().unwrap_or(1);
                    if p.get("spec") != obj.get("spec") && kind != "DELETED" {
                        g + 1
                    } else {
                        g
                    }
                }
            };
            let meta = obj["metadata"].as_object_mut().unwrap();
            meta.insert("resourceVersion".into(), json!(rv.to_string()));
            meta.insert("namespace".into(), json!(ns));
            meta.insert("name".into(), json!(name));
            meta.insert("generation".into(), json!(generation));
            meta.entry("uid").or_insert(json!(format!("uid-{name}-{rv}")));
            meta.entry("creationTimestamp").or_insert(json!("2020-01-01T00:00:00Z"));
            if kind == "DELETED" {
                inner.objects.remove(&key);
                let uid = obj["metadata"]["uid"].clone();
                for ((p, n, nm), o) in &inner.objects {
                    let owned = o["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid));
                    if owned && n == ns {
                        dependents.push((p.clone(), nm.clone()));
                    }
                }
            } else {
                inner.objects.insert(key, obj.clone());
            }
            let change = Change {
                rv,
                plural: plural.to_owned(),
                ns: ns.to_owned(),
                kind,
                object: obj.clone(),
            };
            inner.history.push(change.clone());
            let _ = self.changes.send(change);
            obj
        };
        for (p, n) in dependents {
            self.remove(&p, ns, &n);
        }
        obj
    }

    /// Replace `status` only, as a controller writes the status subresource (no generation bump,
    /// no conflict with the spec); `false` when the object is gone or the status is the same.
    pub fn write_status(&self, plural: &str, ns: &str, name: &str, status: Value) -> bool {
        let Some(mut o) = self.get(plural, ns, name) else {
            return false;
        };
        if o.get("status") == Some(&status) {
            return false;
        }
        o["status"] = status;
        self.write(plural, ns, name, o, "MODIFIED");
        true
    }

    /// Create or replace an object directly (as a controller would).
    pub fn put(&self, plural: &str, ns: &str, obj: Value) -> Value {
        let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
        let exists = self.get(plural, ns, &name).is_some();
        self.write(plural, ns, &name, obj, if exists { "MODIFIED" } else { "ADDED" })
    }

    /// Delete an object directly (as a controller or an operator would).
    pub fn remove(&self, plural: &str, ns: &str, name: &str) {
        if let Some(o) = self.get(plural, ns, name) {
            self.write(plural, ns, name, o, "DELETED");
        }
    }

    pub fn get(&self, plural: &str, ns: &str, name: &str) -> Option<Value> {
        let inner = self.inner.lock().unwrap();
        inner
            .objects
            .get(&(plural.to_owned(), ns.to_owned(), name.to_owned()))
            .cloned()
    }

    pub fn list(&self, plural: &str, ns: &str) -> Vec<Value> {
        let inner = self.inner.lock().unwrap();
        inner
            .objects
            .iter()
            .filter(|((p, n, _), _)| p == plural && n == ns)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Record a core/v1 Event the kubelet writes about the pod `involved` (image pulls, crash
    /// loops). The agent-sandbox controller writes none of these.
    pub fn add_event(&self, ns: &str, involved: &str, type_: &str, reason: &str, message: &str) {
        let n = self.inner.lock().unwrap().rv + 1;
        let name = format!("{involved}.{n:x}");
        self.put(
            "events",
            ns,
            json!({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": name, "namespace": ns},
                "involvedObject": {"kind": "Pod", "name": involved, "namespace": ns},
                "source": {"component": "kubelet"},
                "type": type_, "reason": reason, "message": message, "count": 1,
            }),
        );
    }

    /// The next `n` watch connections on `plural` end after delivering one event.
    pub fn cut_next_watches(&self, plural: &str, n: usize) {
        self.inner.lock().unwrap().cut_watches.insert(plural.to_owned(), n);
    }

    /// The next `method` request on `plural` fails with this status.
    pub fn fail_next(&self, method: &str, plural: &str, code: u16, reason: &str) {
        self.inner
            .lock()
            .unwrap()
            .failures
            .entry((method.to_owned(), plural.to_owned()))
            .or_default()
            .push_back((code, reason.to_owned()));
    }

    /// Requests seen so far, "METHOD path?query".
    pub fn requests(&self) -> Vec<String> {
        self.inner.lock().unwrap().log.clone()
    }

    /// Wait until `pred` holds over the request log.
    pub async fn wait_requests(&self, what: &str, pred: impl Fn(&[String]) -> bool) {
        eventually_ok(Duration::from_secs(20), what, || async {
            let log = self.requests();
            if pred(&log) {
                Ok(())
            } else {
                Err(format!("{log:#?}"))
            }
        })
        .await
    }

    /// Wait until an object exists.
    pub async fn wait_object(&self, plural: &str, ns: &str, name: &str) -> Value {
        let what = format!("{plural}/{name}");
        eventually(Duration::from_secs(20), &what, || async { self.get(plural, ns, name) }).await
    }
}

async fn handle(State(fake): State<FakeKube>, method: Method, uri: Uri, body: Bytes) -> Response {
    let line = format!("{method} {}", uri.path_and_query().map(|p| p.as_str()).unwrap_or(""));
    fake.inner.lock().unwrap().log.push(line);
    let Some(path) = parse_path(uri.path()) else {
        return status(404, "NotFound", format!("the server could not find {}", uri.path()));
    };
    let q = query(&uri);
    let injected = fake
        .inner
        .lock()
        .unwrap()
        .failures
        .get_mut(&(method.to_string(), path.plural.clone()))
        .and_then(VecDeque::pop_front);
    if let Some((code, reason)) = injected {
        return status(code, &reason, format!("injected {reason} on {}", path.plural));
    }
    let what = |n: &str| format!("{} \"{n}\"", path.plural);
    match (method.clone(), path.name.clone()) {
        (Method::GET, None) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => fake.watch_live(&path, &q),
        (Method::GET, None) => {
            let items: Vec<Value> = fake
                .list(&path.plural, &path.ns)
                .into_iter()
                .filter(|o| selected(o, &q))
                .collect();
            let rv = fake.inner.lock().unwrap().rv;
            ok(
                StatusCode::OK,
                &json!({
                    "apiVersion": path.api_version,
                    "kind": format!("{}List", kind_of(&path.plural)),
                    "metadata": {"resourceVersion": rv.to_string()},
                    "items": items,
                }),
            )
        }
        (Method::GET, Some(n)) => match fake.get(&path.plural, &path.ns, &n) {
            Some(o) => ok(StatusCode::OK, &o),
            None => status(404, "NotFound", format!("{} not found", what(&n))),
        },
        (Method::POST, None) => {
            let obj: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", e.to_string()),
            };
            let Some(n) = obj["metadata"]["name"].as_str().map(str::to_owned) else {
                return status(422, "Invalid", "metadata.name: Required value".into());
            };
            if let Some(refused) = invalid(&path.plural, &obj, &what(&n)) {
                return refused;
            }
            if fake.get(&path.plural, &path.ns, &n).is_some() {
                return status(409, "AlreadyExists", format!("{} already exists", what(&n)));
            }
            let created = fake.write(&path.plural, &path.ns, &n, obj, "ADDED");
            ok(StatusCode::CREATED, &created)
        }
        (Method::PUT, Some(n)) => {
            let obj: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", e.to_string()),
            };
            if let Some(refused) = invalid(&path.plural, &obj, &what(&n)) {
                return refused;
            }
            let Some(current) = fake.get(&path.plural, &path.ns, &n) else {
                return status(404, "NotFound", format!("{} not found", what(&n)));
            };
            let sent = obj["metadata"]["resourceVersion"].as_str();
            if sent.is_some() && sent != current["metadata"]["resourceVersion"].as_str() {
                return status(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {}: the object has been modified; please apply your changes to the latest version and try again",
                        what(&n)
                    ),
                );
            }
            let mut obj = obj;
            if has_status_subresource(&path.plural) {
                obj["status"] = current["status"].clone();
            }
            obj["metadata"]["uid"] = current["metadata"]["uid"].clone();
            obj["metadata"]["creationTimestamp"] = current["metadata"]["creationTimestamp"].clone();
            let updated = fake.write(&path.plural, &path.ns, &n, obj, "MODIFIED");
            ok(StatusCode::OK, &updated)
        }
        (Method::PATCH, Some(n)) => {
            let patch: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", e.to_string()),
            };
            let Some(mut current) = fake.get(&path.plural, &path.ns, &n) else {
                return status(404, "NotFound", format!("{} not found", what(&n)));
            };
            let kept = current["status"].clone();
            merge(&mut current, &patch);
            if has_status_subresource(&path.plural) {
                current["status"] = kept;
            }
            let updated = fake.write(&path.plural, &path.ns, &n, current, "MODIFIED");
            ok(StatusCode::OK, &updated)
        }
        (Method::DELETE, Some(n)) => match fake.get(&path.plural, &path.ns, &n) {
            Some(o) => {
                let gone = fake.write(&path.plural, &path.ns, &n, o, "DELETED");
                ok(StatusCode::OK, &gone)
            }
            None => status(404, "NotFound", format!("{} not found", what(&n))),
        },
        _ => status(405, "MethodNotAllowed", format!("{method} is not supported here")),
    }
}

impl FakeKube {
    /// A watch: the backlog after `resourceVersion`, then live changes, as JSON lines.
    fn watch_live(&self, path: &Path, q: &HashMap<String, String>) -> Response {
        let from: u64 = q.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
        let mut rx = self.changes.subscribe();
        let (backlog, cut) = {
            let mut inner = self.inner.lock().unwrap();
            let backlog: Vec<Change> = inner.history.iter().filter(|c| c.rv > from).cloned().collect();
            let cut = match inner.cut_watches.get_mut(&path.plural) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            };
            (backlog, cut)
        };
        let (plural, ns, q) = (path.plural.clone(), path.ns.clone(), q.clone());
        let want = move |c: &Change| c.plural == plural && c.ns == ns && selected(&c.object, &q);
        let (tx, out) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        tokio::spawn(async move {
            let line = |c: &Change| Bytes::from(format!("{}\n", json!({"type": c.kind, "object": c.object})));
            let mut last = from;
            for c in backlog {
                last = last.max(c.rv);
                if want(&c) && (tx.send(line(&c)).is_err() || cut) {
                    return;
                }
            }
            loop {
                let c = tokio::select! {
                    c = rx.recv() => match c {
                        Ok(c) => c,
                        Err(broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                    () = tx.closed() => return,
                };
                if c.rv <= last || !want(&c) {
                    continue;
                }
                last = c.rv;
                if tx.send(line(&c)).is_err() || cut {
                    return;
                }
            }
        });
        let stream = futures_util::stream::unfold(out, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
        });
        Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::from_stream(stream))
            .unwrap()
    }
}

// ---------------------------------------------------------------------------------------------
// The agent-sandbox v0.5.6 controllers, ported to this fake (only what LAP's objects exercise).

/// `agents.x-k8s.io/pod-name`: the pod a Sandbox adopted (warm pool).
pub const POD_NAME_ANNOTATION: &str = "agents.x-k8s.io/pod-name";
const NAME_HASH_LABEL: &str = "agents.x-k8s.io/sandbox-name-hash";
const WARM_POOL_LABEL: &str = "agents.x-k8s.io/warm-pool-sandbox";
const TEMPLATE_REF_HASH_LABEL: &str = "agents.x-k8s.io/sandbox-template-ref-hash";
const TEMPLATE_HASH_LABEL: &str = "agents.x-k8s.io/sandbox-template-hash";
const LAUNCH_TYPE_LABEL: &str = "agents.x-k8s.io/launch-type";
const CLAIM_UID_LABEL: &str = "agents.x-k8s.io/claim-uid";
const ASSIGNED_ANNOTATION: &str = "agents.x-k8s.io/sandbox-name";

/// `controllers.NameHash`: FNV-1a 32, as 8 hex digits.
pub fn name_hash(s: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

fn running_status(ip: &str, ready: bool) -> Value {
    json!({
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": if ready { "True" } else { "False" }},
        ],
    })
}

fn cond(t: &str, status: &str, reason: &str, message: &str, generation: i64) -> Value {
    json!({"type": t, "status": status, "reason": reason, "message": message,
           "observedGeneration": generation, "lastTransitionTime": "2020-01-01T00:00:00Z"})
}

fn controller_of(o: &Value) -> Option<&Value> {
    o["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == json!(true))
}

fn owner_ref(api_version: &str, kind: &str, o: &Value) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "name": o["metadata"]["name"],
           "uid": o["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true})
}

fn expired(shutdown: &Value) -> bool {
    shutdown
        .as_str()
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .is_some_and(|t| k8s_openapi::jiff::Timestamp::now() >= t)
}

/// `meta.SetStatusCondition`: keeps `lastTransitionTime` when the status did not change.
fn set_condition(conditions: &mut Vec<Value>, c: Value) {
    match conditions.iter_mut().find(|x| x["type"] == c["type"]) {
        Some(x) => {
            let ltt = if x["status"] == c["status"] {
                x["lastTransitionTime"].clone()
            } else {
                c["lastTransitionTime"].clone()
            };
            *x = c;
            x["lastTransitionTime"] = ltt;
        }
        None => conditions.push(c),
    }
}

impl FakeKube {
    /// One pass over every claim, pool and Sandbox; `true` when it wrote anything.
    fn reconcile_all(&self) -> bool {
        if self.inner.lock().unwrap().sim.paused {
            return false;
        }
        let namespaces: std::collections::BTreeSet<String> = self
            .inner
            .lock()
            .unwrap()
            .objects
            .keys()
            .map(|(_, n, _)| n.clone())
            .collect();
        let mut wrote = false;
        for ns in namespaces {
            for c in self.list("sandboxclaims", &ns) {
                wrote |= self.reconcile_claim(&ns, &c);
            }
            for p in self.list("sandboxwarmpools", &ns) {
                wrote |= self.reconcile_pool(&ns, &p);
            }
            for sb in self.list("sandboxes", &ns) {
                wrote |= self.reconcile_sandbox(&ns, &sb);
            }
        }
        wrote
    }

    fn create_if_absent(&self, plural: &str, ns: &str, obj: Value) -> bool {
        let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
        if self.get(plural, ns, &name).is_some() {
            return false;
        }
        self.write(plural, ns, &name, obj, "ADDED");
        true
    }

    /// `SandboxReconciler.Reconcile`.
    fn reconcile_sandbox(&self, ns: &str, sb: &Value) -> bool {
        let name = sb["metadata"]["name"].as_str().unwrap().to_owned();
        let generation = sb["metadata"]["generation"].as_i64().unwrap_or(1);
        let spec = &sb["spec"];
        let mut status = if sb["status"].is_object() {
            sb["status"].clone()
        } else {
            json!({})
        };
        let mut conditions: Vec<Value> = status["conditions"].as_array().cloned().unwrap_or_default();
        let pod_name = sb["metadata"]["annotations"][POD_NAME_ANNOTATION]
            .as_str()
            .unwrap_or(&name)
            .to_owned();
        let owned_by_me = |o: &Value| controller_of(o).is_some_and(|r| r["uid"] == sb["metadata"]["uid"]);

        // Expiry: Ready=False/SandboxExpired, then the pod and Service go, then (Delete) the
        // Sandbox itself; with Retain only the conditions stay.
        if expired(&spec["shutdownTime"]) {
            let mut wrote = false;
            for plural in ["pods", "services"] {
                let n = if plural == "pods" {
                    pod_name.as_str()
                } else {
                    name.as_str()
                };
                if let Some(o) = self.get(plural, ns, n).filter(|o| owned_by_me(o)) {
                    self.remove(plural, ns, o["metadata"]["name"].as_str().unwrap());
                    wrote = true;
                }
            }
            if spec["shutdownPolicy"] == "Delete" {
                self.remove("sandboxes", ns, &name);
                return true;
            }
            conditions.retain(|c| c["type"] != "PodScheduled");
            set_condition(
                &mut conditions,
                cond("Ready", "False", "SandboxExpired", "Sandbox has expired", generation),
            );
            return self.write_status("sandboxes", ns, &name, json!({"conditions": conditions})) || wrote;
        }

        let suspended = spec["operatingMode"] == "Suspended" || spec["replicas"] == json!(0);
        let name_hash = name_hash(&name);
        let mut wrote = false;
        let mut pod_err: Option<String> = None;
        let owned_pods: Vec<Value> = self.list("pods", ns).into_iter().filter(|p| owned_by_me(p)).collect();
        let multiple = owned_pods.len() > 1;
        let mut pod = self.get("pods", ns, &pod_name);
        if multiple {
            pod_err = Some(format!(
                "multiple Pods ({}) are controlled by this Sandbox; refusing to choose or create a Pod",
                owned_pods.len()
            ));
            let already = conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["reason"] == "MultiplePods");
            if !already {
                // The one Event this controller writes.
                self.put(
                    "events",
                    ns,
                    json!({"apiVersion": "v1", "kind": "Event",
                           "metadata": {"name": format!("{name}.multiplepods"), "namespace": ns},
                           "involvedObject": {"kind": "Sandbox", "name": name, "namespace": ns},
                           "source": {"component": "sandbox-controller"},
                           "type": "Warning", "reason": "MultiplePods", "action": "Reconciling",
                           "message": pod_err.clone().unwrap()}),
                );
                wrote = true;
            }
        } else if suspended {
            if let Some(p) = pod.take().filter(|p| owned_by_me(p)) {
                self.remove("pods", ns, p["metadata"]["name"].as_str().unwrap());
                wrote = true;
            }
        } else if pod.is_none() {
            let template = &spec["podTemplate"];
            let mut labels = template["metadata"]["labels"].clone();
            if !labels.is_object() {
                labels = json!({});
            }
            labels[NAME_HASH_LABEL] = json!(name_hash);
            let new_pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name, "namespace": ns, "labels": labels,
                             "annotations": template["metadata"]["annotations"].clone(),
                             "ownerReferences": [owner_ref("agents.x-k8s.io/v1beta1", "Sandbox", sb)]},
                "spec": template["spec"].clone(),
                "status": {"phase": "Pending"},
            });
            let admission = self.inner.lock().unwrap().sim.admission.clone();
            match admission.iter().find_map(|a| a(&new_pod).err()) {
                Some(refusal) => pod_err = Some(format!("pods \"{pod_name}\" is forbidden: {refusal}")),
                None => {
                    let auto = self.inner.lock().unwrap().sim.auto_ip.clone();
                    let mut new_pod = new_pod;
                    if let Some(ip) = auto {
                        new_pod["status"] = running_status(&ip, true);
                    }
                    self.write("pods", ns, &pod_name, new_pod, "ADDED");
                    wrote = true;
                    pod = self.get("pods", ns, &pod_name);
                }
            }
        }
        let pod = pod.filter(|p| owned_by_me(p));

        // The headless Service, only when asked for (since v0.4.6).
        let mut svc = self.get("services", ns, &name);
        if !multiple && svc.is_none() && spec["service"] == json!(true) {
            let s = json!({"apiVersion": "v1", "kind": "Service",
                           "metadata": {"name": name, "namespace": ns, "labels": {NAME_HASH_LABEL: name_hash},
                                        "ownerReferences": [owner_ref("agents.x-k8s.io/v1beta1", "Sandbox", sb)]},
                           "spec": {"clusterIP": "None", "selector": {NAME_HASH_LABEL: name_hash}}});
            wrote |= self.create_if_absent("services", ns, s);
            svc = self.get("services", ns, &name);
        }

        // computeConditions.
        let suspended_cond = if !suspended {
            cond(
                "Suspended",
                "False",
                "NotSuspended",
                "Sandbox is not suspended",
                generation,
            )
        } else if pod.is_none() {
            cond(
                "Suspended",
                "True",
                "PodTerminated",
                "Pod has been terminated. Sandbox is suspended",
                generation,
            )
        } else {
            cond(
                "Suspended",
                "False",
                "PodTerminating",
                "Pod is terminating. Sandbox is suspending",
                generation,
            )
        };
        set_condition(&mut conditions, suspended_cond);
        let phase = pod
            .as_ref()
            .map(|p| p["status"]["phase"].as_str().unwrap_or("Pending").to_owned());
        match phase.as_deref() {
            Some("Succeeded") => set_condition(
                &mut conditions,
                cond(
                    "Finished",
                    "True",
                    "PodSucceeded",
                    "Pod completed successfully",
                    generation,
                ),
            ),
            Some("Failed") => set_condition(
                &mut conditions,
                cond("Finished", "True", "PodFailed", "Pod failed", generation),
            ),
            _ => conditions.retain(|c| c["type"] != "Finished"),
        }
        match &pod {
            Some(p) => {
                let pc = p["status"]["conditions"]
                    .as_array()
                    .and_then(|cs| cs.iter().find(|c| c["type"] == "PodScheduled").cloned());
                let c = match pc {
                    Some(pc) => {
                        let st = pc["status"].as_str().unwrap_or("Unknown");
                        let reason = pc["reason"]
                            .as_str()
                            .filter(|r| !r.is_empty())
                            .unwrap_or(if st == "True" {
                                "PodScheduled"
                            } else {
                                "PodSchedulingUnknown"
                            });
                        cond(
                            "PodScheduled",
                            st,
                            reason,
                            pc["message"].as_str().unwrap_or(""),
                            generation,
                        )
                    }
                    None => cond(
                        "PodScheduled",
                        "Unknown",
                        "PodSchedulingUnknown",
                        "Pod has not reported a PodScheduled condition yet",
                        generation,
                    ),
                };
                set_condition(&mut conditions, c);
            }
            None if pod_err.is_some() && !multiple => set_condition(
                &mut conditions,
                cond(
                    "PodScheduled",
                    "Unknown",
                    "PodSchedulingUnknown",
                    "Pod state is unknown. Pod scheduling cannot be determined",
                    generation,
                ),
            ),
            None => conditions.retain(|c| c["type"] != "PodScheduled"),
        }
        let pod_ips: Vec<Value> = pod
            .as_ref()
            .and_then(|p| p["status"]["podIPs"].as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .map(|x| x["ip"].clone())
            .collect();
        let ready = if multiple {
            cond(
                "Ready",
                "False",
                "MultiplePods",
                pod_err.as_deref().unwrap(),
                generation,
            )
        } else if let Some(e) = &pod_err {
            cond(
                "Ready",
                "False",
                "ReconcilerError",
                &format!("Error seen: {e}"),
                generation,
            )
        } else if suspended {
            cond(
                "Ready",
                "False",
                "SandboxSuspended",
                if pod.is_some() {
                    "Sandbox is suspending"
                } else {
                    "Sandbox is suspended"
                },
                generation,
            )
        } else if phase.as_deref() == Some("Succeeded") {
            cond(
                "Ready",
                "False",
                "PodSucceeded",
                "Pod completed successfully",
                generation,
            )
        } else if phase.as_deref() == Some("Failed") {
            cond("Ready", "False", "PodFailed", "Pod failed", generation)
        } else {
            let (mut message, mut pod_ready) = match (&pod, phase.as_deref()) {
                (None, _) => ("Pod does not exist".to_owned(), false),
                (Some(p), Some("Running")) => {
                    let r = p["status"]["conditions"]
                        .as_array()
                        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready").cloned());
                    match r {
                        Some(r) if r["status"] == "True" && pod_ips.is_empty() => {
                            ("Pod is Ready but has no podIPs yet".to_owned(), false)
                        }
                        Some(r) if r["status"] == "True" => ("Pod is Ready".to_owned(), true),
                        _ => ("Pod is Running but not Ready".to_owned(), false),
                    }
                }
                (Some(_), ph) => (format!("Pod exists with phase: {}", ph.unwrap_or("")), false),
            };
            let svc_required = spec["service"].as_bool().unwrap_or(svc.is_some());
            if svc_required {
                if svc.is_some() {
                    message.push_str("; Service Exists");
                } else {
                    message.push_str("; Service does not exist");
                    pod_ready = false;
                }
            }
            if pod_ready {
                cond("Ready", "True", "DependenciesReady", &message, generation)
            } else {
                cond("Ready", "False", "DependenciesNotReady", &message, generation)
            }
        };
        set_condition(&mut conditions, ready);
        status["conditions"] = json!(conditions);
        if pod_ips.is_empty() {
            status.as_object_mut().unwrap().remove("podIPs");
        } else {
            status["podIPs"] = json!(pod_ips);
        }
        if pod.is_some() {
            status["selector"] = json!(format!("{NAME_HASH_LABEL}={name_hash}"));
        }
        if svc.is_some() {
            status["service"] = json!(name);
            status["serviceFQDN"] = json!(format!("{name}.{ns}.svc.cluster.local"));
        }
        self.write_status("sandboxes", ns, &name, status) || wrote
    }

    /// `SandboxWarmPoolReconciler.reconcilePool` (Recreate and OnReplenish, no autoscaler).
    fn reconcile_pool(&self, ns: &str, pool: &Value) -> bool {
        let pool_name = pool["metadata"]["name"].as_str().unwrap().to_owned();
        let Some(template) = self.get(
            "sandboxtemplates",
            ns,
            pool["spec"]["sandboxTemplateRef"]["name"].as_str().unwrap_or(""),
        ) else {
            return false;
        };
        let blueprint = json!({"podTemplate": template["spec"]["podTemplate"], "service": template["spec"]["service"]});
        let blueprint_hash = name_hash(&blueprint.to_string());
        let pool_hash = name_hash(&pool_name);
        let members: Vec<Value> = self
            .list("sandboxes", ns)
            .into_iter()
            .filter(|s| s["metadata"]["labels"][WARM_POOL_LABEL] == json!(pool_hash))
            .filter(|s| controller_of(s).is_some_and(|r| r["uid"] == pool["metadata"]["uid"]))
            .collect();
        let mut wrote = false;
        let recreate = pool["spec"]["updateStrategy"]["type"] == "Recreate";
        let mut fresh = Vec::new();
        for m in members {
            if recreate && m["metadata"]["labels"][TEMPLATE_HASH_LABEL] != json!(blueprint_hash) {
                self.remove("sandboxes", ns, m["metadata"]["name"].as_str().unwrap());
                wrote = true;
            } else {
                fresh.push(m);
            }
        }
        let want = pool["spec"]["replicas"].as_i64().unwrap_or(1);
        let mut n = i64::try_from(fresh.len()).unwrap();
        while n < want {
            let rv = self.inner.lock().unwrap().rv;
            let name = format!("{pool_name}-{}", &name_hash(&format!("{pool_name}{rv}{n}"))[..5]);
            let mut pod_template = template["spec"]["podTemplate"].clone();
            for (k, v) in [
                (WARM_POOL_LABEL, &pool_hash),
                (
                    TEMPLATE_REF_HASH_LABEL,
                    &name_hash(template["metadata"]["name"].as_str().unwrap()),
                ),
                (TEMPLATE_HASH_LABEL, &blueprint_hash),
            ] {
                pod_template["metadata"]["labels"][k] = json!(v);
            }
            if pod_template["spec"]["automountServiceAccountToken"].is_null() {
                pod_template["spec"]["automountServiceAccountToken"] = json!(false);
            }
            let sb = json!({
                "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                "metadata": {"name": name, "namespace": ns,
                    "labels": {WARM_POOL_LABEL: pool_hash, TEMPLATE_REF_HASH_LABEL: name_hash(template["metadata"]["name"].as_str().unwrap()),
                               LAUNCH_TYPE_LABEL: "warm", TEMPLATE_HASH_LABEL: blueprint_hash, "agents.x-k8s.io/created-by": "controller"},
                    "annotations": {"agents.x-k8s.io/sandbox-template-ref": template["metadata"]["name"]},
                    "ownerReferences": [owner_ref("extensions.agents.x-k8s.io/v1beta1", "SandboxWarmPool", pool)]},
                "spec": {"podTemplate": pod_template, "service": template["spec"]["service"]},
            });
            wrote |= self.create_if_absent("sandboxes", ns, sb);
            n += 1;
        }
        let ready = self
            .list("sandboxes", ns)
            .iter()
            .filter(|s| s["metadata"]["labels"][WARM_POOL_LABEL] == json!(pool_hash))
            .filter(|s| {
                s["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
            })
            .count();
        let st = json!({"replicas": want, "readyReplicas": ready, "selector": format!("{WARM_POOL_LABEL}={pool_hash}"),
                        "observedGeneration": pool["metadata"]["generation"]});
        self.write_status("sandboxwarmpools", ns, &pool_name, st) || wrote
    }

    /// `SandboxClaimReconciler.reconcileActive`: adopt a ready warm Sandbox, else cold-start one
    /// from the template; mirror its Ready condition.
    fn reconcile_claim(&self, ns: &str, claim: &Value) -> bool {
        let name = claim["metadata"]["name"].as_str().unwrap().to_owned();
        let generation = claim["metadata"]["generation"].as_i64().unwrap_or(1);
        if expired(&claim["spec"]["lifecycle"]["shutdownTime"]) {
            if claim["spec"]["lifecycle"]["shutdownPolicy"] == "Delete" {
                self.remove("sandboxclaims", ns, &name);
                return true;
            }
            // Retain: the Sandbox goes, the claim stays, marked.
            let mut wrote = false;
            for s in self.list("sandboxes", ns) {
                if controller_of(&s).is_some_and(|r| r["uid"] == claim["metadata"]["uid"]) {
                    self.remove("sandboxes", ns, s["metadata"]["name"].as_str().unwrap());
                    wrote = true;
                }
            }
            let mut conditions: Vec<Value> = claim["status"]["conditions"].as_array().cloned().unwrap_or_default();
            set_condition(
                &mut conditions,
                cond(
                    "Ready",
                    "False",
                    "ClaimExpired",
                    "Claim expired. Sandbox cleanup initiated.",
                    generation,
                ),
            );
            return self.write_status(
                "sandboxclaims",
                ns,
                &name,
                json!({"conditions": conditions, "sandbox": {}}),
            ) || wrote;
        }
        let pool_name = claim["spec"]["warmPoolRef"]["name"].as_str().unwrap_or("").to_owned();
        let mut status = if claim["status"].is_object() {
            claim["status"].clone()
        } else {
            json!({})
        };
        let mut conditions: Vec<Value> = status["conditions"].as_array().cloned().unwrap_or_default();
        let controlled = |s: &Value| controller_of(s).is_some_and(|r| r["uid"] == claim["metadata"]["uid"]);
        let mut wrote = false;
        let bound = status["sandbox"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .or(claim["metadata"]["annotations"][ASSIGNED_ANNOTATION].as_str())
            .and_then(|n| self.get("sandboxes", ns, n))
            .filter(|s| controlled(s));
        let sandbox = match bound {
            Some(s) => Some(s),
            None => match self.get("sandboxwarmpools", ns, &pool_name) {
                None => {
                    set_condition(
                        &mut conditions,
                        cond(
                            "Ready",
                            "False",
                            "WarmPoolNotFound",
                            &format!("SandboxWarmPool \"{pool_name}\" not found"),
                            generation,
                        ),
                    );
                    None
                }
                Some(pool) => {
                    let template_name = pool["spec"]["sandboxTemplateRef"]["name"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned();
                    match self.get("sandboxtemplates", ns, &template_name) {
                        None => {
                            set_condition(
                                &mut conditions,
                                cond(
                                    "Ready",
                                    "False",
                                    "TemplateNotFound",
                                    &format!("SandboxTemplate \"{template_name}\" not found"),
                                    generation,
                                ),
                            );
                            None
                        }
                        Some(template) => {
                            let pool_hash = name_hash(&pool_name);
                            let candidates: Vec<Value> = self
                                .list("sandboxes", ns)
                                .into_iter()
                                .filter(|s| s["metadata"]["labels"][WARM_POOL_LABEL] == json!(pool_hash))
                                .filter(|s| controller_of(s).is_some_and(|r| r["uid"] == pool["metadata"]["uid"]))
                                .filter(|s| s["status"]["podIPs"].as_array().is_some_and(|a| !a.is_empty()))
                                .collect();
                            let is_ready = |s: &Value| {
                                s["status"]["conditions"]
                                    .as_array()
                                    .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
                            };
                            let pick = candidates.iter().find(|s| is_ready(s)).or(candidates.first()).cloned();
                            match pick {
                                Some(mut s) => {
                                    wrote = true;
                                    // completeAdoption.
                                    let sname = s["metadata"]["name"].as_str().unwrap().to_owned();
                                    let labels = s["metadata"]["labels"].as_object_mut().unwrap();
                                    labels.remove(WARM_POOL_LABEL);
                                    labels.remove(TEMPLATE_HASH_LABEL);
                                    labels.insert(LAUNCH_TYPE_LABEL.into(), json!("warm"));
                                    labels.insert(CLAIM_UID_LABEL.into(), claim["metadata"]["uid"].clone());
                                    s["metadata"]["ownerReferences"] =
                                        json!([owner_ref("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", claim)]);
                                    s["metadata"]["annotations"][POD_NAME_ANNOTATION] = json!(sname);
                                    s["spec"]["podTemplate"]["metadata"]["labels"][CLAIM_UID_LABEL] =
                                        claim["metadata"]["uid"].clone();
                                    self.write("sandboxes", ns, &sname, s, "MODIFIED");
                                    let mut c = self.get("sandboxclaims", ns, &name).unwrap();
                                    c["metadata"]["annotations"][ASSIGNED_ANNOTATION] = json!(sname);
                                    self.write("sandboxclaims", ns, &name, c, "MODIFIED");
                                    self.get("sandboxes", ns, &sname)
                                }
                                None => {
                                    // createSandbox: a cold start from the template, named as the claim.
                                    let mut pod_template = template["spec"]["podTemplate"].clone();
                                    pod_template["metadata"]["labels"][CLAIM_UID_LABEL] =
                                        claim["metadata"]["uid"].clone();
                                    let sb = json!({
                                        "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                                        "metadata": {"name": name, "namespace": ns,
                                            "labels": {LAUNCH_TYPE_LABEL: "cold", CLAIM_UID_LABEL: claim["metadata"]["uid"],
                                                       TEMPLATE_REF_HASH_LABEL: name_hash(&template_name)},
                                            "ownerReferences": [owner_ref("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", claim)]},
                                        "spec": {"podTemplate": pod_template, "service": template["spec"]["service"]},
                                    });
                                    wrote |= self.create_if_absent("sandboxes", ns, sb);
                                    self.get("sandboxes", ns, &name)
                                }
                            }
                        }
                    }
                }
            },
        };
        if let Some(s) = &sandbox {
            let ready = s["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready").cloned())
                .unwrap_or_else(|| cond("Ready", "False", "SandboxNotReady", "Sandbox is not ready", generation));
            set_condition(&mut conditions, ready);
            status["sandbox"] = json!({"name": s["metadata"]["name"], "podIPs": s["status"]["podIPs"].as_array().cloned().unwrap_or_default()});
        }
        status["conditions"] = json!(conditions);
        self.write_status("sandboxclaims", ns, &name, status) || wrote
    }
}
