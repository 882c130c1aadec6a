//! A fake Kubernetes API server, in-process (axum on loopback), speaking enough of the REST API
//! for kube-rs: namespaced get / list / create / replace / merge-patch / delete of any resource
//! (core `/api/v1/...` and `/apis/{group}/{version}/...`), label and field selectors
//! (`metadata.name`, `involvedObject.name`), `?watch=true` streams of newline-delimited watch
//! events resumed from a `resourceVersion`, and `Status` errors (404 NotFound, 409
//! AlreadyExists / Conflict). Tests drive it: flip a Sandbox's status, add Events, cut a watch
//! short, inject a failure, read the request log.

#![allow(dead_code, clippy::unwrap_used, unreachable_pub)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::broadcast;

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

fn kind_of(plural: &str) -> &str {
    match plural {
        "sandboxes" => "Sandbox",
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
        fake
    }

    /// A kube client pointed at this server.
    pub fn client(&self) -> kube::Client {
        let mut cfg = kube::Config::new(self.url.parse().unwrap());
        cfg.default_namespace = "default".into();
        kube::Client::try_from(cfg).unwrap()
    }

    /// Store `obj` as a create or update would (new resourceVersion, uid, creationTimestamp) and
    /// tell watchers.
    fn write(&self, plural: &str, ns: &str, name: &str, mut obj: Value, kind: &'static str) -> Value {
        let mut inner = self.inner.lock().unwrap();
        inner.rv += 1;
        let rv = inner.rv;
        let meta = obj["metadata"].as_object_mut().unwrap();
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.insert("namespace".into(), json!(ns));
        meta.insert("name".into(), json!(name));
        meta.entry("uid").or_insert(json!(format!("uid-{name}-{rv}")));
        meta.entry("creationTimestamp").or_insert(json!("2020-01-01T00:00:00Z"));
        let key = (plural.to_owned(), ns.to_owned(), name.to_owned());
        if kind == "DELETED" {
            inner.objects.remove(&key);
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

    /// Set `status.conditions` (and `serviceFQDN`) of a Sandbox, as the controller does.
    pub fn set_sandbox_status(&self, ns: &str, name: &str, ready: &str, reason: &str, fqdn: &str) {
        let mut sb = self.get("sandboxes", ns, name).expect("no such Sandbox");
        sb["status"] = json!({
            "serviceFQDN": fqdn,
            "conditions": [{
                "type": "Ready", "status": ready, "reason": reason, "message": "",
                "lastTransitionTime": "2020-01-01T00:00:00Z",
            }],
        });
        self.put("sandboxes", ns, sb);
    }

    /// Record a core/v1 Event about the object `involved` (a pod or Sandbox name).
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
        let deadline = Instant::now() + Duration::from_secs(20);
        while !pred(&self.requests()) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {:#?}",
                self.requests()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Wait until an object exists.
    pub async fn wait_object(&self, plural: &str, ns: &str, name: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(v) = self.get(plural, ns, name) {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {plural}/{name}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
            merge(&mut current, &patch);
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
