//! A small in-memory Kubernetes API server, served to `kube::Client` as a tower service.
//!
//! It implements the verbs the controller uses on any namespaced resource: list (with equality
//! label selectors), get, create, server-side apply and merge patch (as a recursive merge),
//! status-subresource patch, replace (with resourceVersion conflicts) and delete, plus the
//! garbage collector's cascade on owner references, and watches (namespaced or cluster-wide,
//! replayed from the requested resourceVersion, then live). Every request is logged.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::StreamBody;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// A change: (resourceVersion, object key, `ADDED`/`MODIFIED`/`DELETED`, object).
pub type Change = (u64, String, &'static str, Value);

/// Shared state of the fake.
pub struct State {
    /// Objects by `<collection path>/<name>`.
    pub objects: BTreeMap<String, Value>,
    /// `VERB path` of every request.
    pub log: Vec<String>,
    /// Path prefixes answered with 404 (e.g. a CRD that is not installed).
    pub unserved: Vec<String>,
    /// Creations refused as an admission controller or validation would: (object key prefix,
    /// HTTP code, reason, message).
    pub refusals: Vec<(String, u16, String, String)>,
    /// Requests that arrive before this instant are answered only at it (an API server that
    /// stopped answering for a while).
    pub stalled_until: Option<tokio::time::Instant>,
    counter: u64,
    history: Vec<Change>,
    changes: broadcast::Sender<Change>,
}

impl Default for State {
    fn default() -> Self {
        State {
            objects: BTreeMap::new(),
            log: Vec::new(),
            unserved: Vec::new(),
            refusals: Vec::new(),
            stalled_until: None,
            counter: 0,
            history: Vec::new(),
            changes: broadcast::channel(4096).0,
        }
    }
}

/// Whether object `key` belongs to the collection `path` (namespaced, e.g.
/// `/api/v1/namespaces/ns/pods`, or cluster-wide, e.g. `/api/v1/pods`).
fn in_collection(key: &str, path: &str) -> bool {
    if key.starts_with(&format!("{path}/")) {
        return true;
    }
    // Cluster-wide: drop `namespaces/<ns>/` from the key and compare again.
    let segs: Vec<&str> = key.split('/').collect();
    if let Some(i) = segs.iter().position(|s| *s == "namespaces") {
        let mut rest = segs.clone();
        if rest.len() > i + 1 {
            rest.drain(i..i + 2);
            return rest.join("/").starts_with(&format!("{path}/"));
        }
    }
    false
}

/// Either a complete JSON answer or a stream of watch events.
enum Answer {
    Json(u16, Value),
    Watch(Vec<Change>, broadcast::Receiver<Change>, String, String),
}

/// Handle on the fake server.
#[derive(Clone, Default)]
pub struct FakeApi {
    /// The state.
    pub state: Arc<Mutex<State>>,
}

fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

fn merge(into: &mut Value, patch: &Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                if v.is_null() {
                    a.remove(k);
                } else {
                    merge(a.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (slot, v) => *slot = v.clone(),
    }
}

/// Splits a request path into (collection, name, subresource).
fn split(path: &str) -> Option<(String, Option<String>, Option<String>)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/namespaces/ns/plural[/name[/sub]]  or  /apis/g/v/namespaces/ns/plural[/name[/sub]]
    let base = match *segs.first()? {
        "api" => 2,
        "apis" => 3,
        _ => return None,
    };
    if segs.get(base) != Some(&"namespaces") || segs.len() < base + 3 {
        // cluster-wide list, e.g. /api/v1/pods
        return Some((format!("/{}", segs.join("/")), None, None));
    }
    let collection = format!("/{}", segs[..base + 3].join("/"));
    Some((collection, segs.get(base + 3).map(|s| s.to_string()), segs.get(base + 4).map(|s| s.to_string())))
}

fn query_param(uri: &http::Uri, key: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.replace("%3D", "=").replace("%2C", ",").replace("%2F", "/"))
    })
}

fn labels_match(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (k, v) = term.split_once('=').unwrap_or((term, ""));
        obj["metadata"]["labels"][k].as_str() == Some(v)
    })
}

impl State {
    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    fn stamp_new(&mut self, obj: &mut Value, name: &str) {
        let n = self.next();
        let meta = &mut obj["metadata"];
        meta["name"] = json!(name);
        if meta["uid"].is_null() {
            meta["uid"] = json!(format!("uid-{n}"));
        }
        meta["resourceVersion"] = json!(n.to_string());
        meta["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    }

    fn record(&mut self, key: &str, kind: &'static str, obj: &Value) {
        let change = (self.counter, key.to_string(), kind, obj.clone());
        self.history.push(change.clone());
        let _ = self.changes.send(change);
    }

    /// The garbage collector, run after each write: objects whose owner no longer exists go.
    fn collect_garbage(&mut self) {
        loop {
            let uids: std::collections::BTreeSet<String> = self.objects.values().filter_map(|o| o["metadata"]["uid"].as_str().map(str::to_string)).collect();
            let orphan = self.objects.iter().find_map(|(k, o)| {
                let refs = o["metadata"]["ownerReferences"].as_array()?;
                refs.iter().any(|r| r["uid"].as_str().is_some_and(|u| !uids.contains(u))).then(|| k.clone())
            });
            match orphan {
                Some(k) => {
                    self.delete_cascade(&k);
                }
                None => return,
            }
        }
    }

    /// Deletes an object and, like the garbage collector, everything it owns.
    fn delete_cascade(&mut self, key: &str) -> Option<Value> {
        let obj = self.objects.remove(key)?;
        self.next();
        self.record(key, "DELETED", &obj);
        if let Some(uid) = obj["metadata"]["uid"].as_str() {
            let owned: Vec<String> = self
                .objects
                .iter()
                .filter(|(_, o)| o["metadata"]["ownerReferences"].as_array().is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid)))
                .map(|(k, _)| k.clone())
                .collect();
            for k in owned {
                self.delete_cascade(&k);
            }
        }
        Some(obj)
    }

    fn answer(&mut self, method: &str, uri: &http::Uri, body: &[u8]) -> Answer {
        if method == "GET" && query_param(uri, "watch").as_deref() == Some("true") {
            self.log.push(format!("WATCH {}", uri.path()));
            let since: u64 = query_param(uri, "resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
            let path = uri.path().to_string();
            let selector = query_param(uri, "labelSelector").unwrap_or_default();
            let replay = self.history.iter().filter(|c| c.0 > since && in_collection(&c.1, &path)).cloned().collect();
            return Answer::Watch(replay, self.changes.subscribe(), path, selector);
        }
        let (code, value) = self.handle(method, uri, body);
        if method != "GET" {
            self.collect_garbage();
        }
        Answer::Json(code, value)
    }

    fn handle(&mut self, method: &str, uri: &http::Uri, body: &[u8]) -> (u16, Value) {
        self.log.push(format!("{method} {}", uri.path()));
        if self.unserved.iter().any(|p| uri.path().starts_with(p.as_str())) {
            return status(404, "NotFound", "the server could not find the requested resource");
        }
        let Some((collection, name, sub)) = split(uri.path()) else {
            return status(404, "NotFound", "unknown path");
        };
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            match serde_json::from_slice(body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", &e.to_string()),
            }
        };
        match (method, name) {
            ("GET", None) => {
                let selector = query_param(uri, "labelSelector").unwrap_or_default();
                let items: Vec<Value> =
                    self.objects.iter().filter(|(k, _)| in_collection(k, &collection)).map(|(_, v)| v.clone()).filter(|o| labels_match(o, &selector)).collect();
                (200, json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": self.counter.to_string()}, "items": items}))
            }
            ("GET", Some(name)) => match self.objects.get(&format!("{collection}/{name}")) {
                Some(o) => (200, o.clone()),
                None => status(404, "NotFound", &format!("{name} not found")),
            },
            ("POST", None) => {
                let mut obj = body;
                let name = match obj["metadata"]["name"].as_str() {
                    Some(n) => n.to_string(),
                    None => {
                        let prefix = obj["metadata"]["generateName"].as_str().unwrap_or("obj-").to_string();
                        format!("{prefix}{}", self.next())
                    }
                };
                let key = format!("{collection}/{name}");
                if self.objects.contains_key(&key) {
                    return status(409, "AlreadyExists", &format!("{name} already exists"));
                }
                if let Some((_, code, reason, message)) = self.refusals.iter().find(|(prefix, ..)| key.starts_with(prefix.as_str())) {
                    return status(*code, reason, message);
                }
                self.stamp_new(&mut obj, &name);
                self.record(&key, "ADDED", &obj);
                self.objects.insert(key, obj.clone());
                (201, obj)
            }
            ("PATCH", Some(name)) => {
                let key = format!("{collection}/{name}");
                let n = self.next();
                if sub.as_deref() == Some("status") {
                    let Some(obj) = self.objects.get_mut(&key) else {
                        return status(404, "NotFound", &format!("{name} not found"));
                    };
                    // A patch that names a resourceVersion is a precondition, as on a real
                    // API server.
                    if let Some(rv) = body["metadata"]["resourceVersion"].as_str()
                        && obj["metadata"]["resourceVersion"] != rv
                    {
                        return status(409, "Conflict", "the object has been modified");
                    }
                    // Server-side apply of the status replaces the fields this manager owns.
                    obj["status"] = body["status"].clone();
                    obj["metadata"]["resourceVersion"] = json!(n.to_string());
                    let obj = obj.clone();
                    self.record(&key, "MODIFIED", &obj);
                    return (200, obj);
                }
                match self.objects.get_mut(&key) {
                    Some(obj) => {
                        let mut patch = body;
                        patch.as_object_mut().map(|o| o.remove("status"));
                        merge(obj, &patch);
                        obj["metadata"]["resourceVersion"] = json!(n.to_string());
                        let obj = obj.clone();
                        self.record(&key, "MODIFIED", &obj);
                        (200, obj)
                    }
                    None => {
                        let mut obj = body;
                        self.stamp_new(&mut obj, &name);
                        self.record(&key, "ADDED", &obj);
                        self.objects.insert(key, obj.clone());
                        (201, obj)
                    }
                }
            }
            ("PUT", Some(name)) => {
                let key = format!("{collection}/{name}");
                let Some(existing) = self.objects.get(&key) else {
                    return status(404, "NotFound", &format!("{name} not found"));
                };
                if body["metadata"]["resourceVersion"] != existing["metadata"]["resourceVersion"] {
                    return status(409, "Conflict", "the object has been modified");
                }
                let mut obj = body;
                obj["metadata"]["resourceVersion"] = json!(self.next().to_string());
                self.record(&key, "MODIFIED", &obj);
                self.objects.insert(key, obj.clone());
                (200, obj)
            }
            ("DELETE", Some(name)) => match self.delete_cascade(&format!("{collection}/{name}")) {
                Some(o) => (200, o),
                None => status(404, "NotFound", &format!("{name} not found")),
            },
            _ => status(405, "MethodNotAllowed", method),
        }
    }
}

impl FakeApi {
    /// A `kube::Client` talking to this fake.
    pub fn client(&self) -> kube::Client {
        type Frames = BoxStream<'static, Result<Frame<Bytes>, Infallible>>;
        let state = self.state.clone();
        let svc = tower::service_fn(move |req: Request<Body>| {
            let state = state.clone();
            async move {
                let stalled_until = state.lock().unwrap().stalled_until;
                if let Some(until) = stalled_until {
                    tokio::time::sleep_until(until).await;
                }
                let (parts, body) = req.into_parts();
                let bytes = body.collect_bytes().await.unwrap_or_default();
                let answer = state.lock().unwrap().answer(parts.method.as_str(), &parts.uri, &bytes);
                let (code, frames): (u16, Frames) = match answer {
                    Answer::Json(code, value) => {
                        let data = Bytes::from(serde_json::to_vec(&value).unwrap());
                        (code, futures::stream::once(async move { Ok(Frame::data(data)) }).boxed())
                    }
                    Answer::Watch(replay, rx, path, selector) => {
                        let line = |(_, _, kind, obj): Change| {
                            let mut v = serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap();
                            v.push(b'\n');
                            Ok(Frame::data(Bytes::from(v)))
                        };
                        let wanted = move |c: &Change| in_collection(&c.1, &path) && labels_match(&c.3, &selector);
                        let wanted2 = wanted.clone();
                        let replay = futures::stream::iter(replay.into_iter().filter(wanted).map(line));
                        let live = futures::stream::unfold(rx, |mut rx| async move {
                            loop {
                                match rx.recv().await {
                                    Ok(c) => return Some((c, rx)),
                                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                                    Err(broadcast::error::RecvError::Closed) => return None,
                                }
                            }
                        })
                        .filter(move |c| futures::future::ready(wanted2(c)))
                        .map(line);
                        (200, replay.chain(live).boxed())
                    }
                };
                let resp = Response::builder()
                    .status(StatusCode::from_u16(code).unwrap())
                    .header("content-type", "application/json")
                    .body(StreamBody::new(frames))
                    .unwrap();
                Ok::<_, Infallible>(resp)
            }
        });
        kube::Client::new(svc, "default")
    }

    /// Stores an object directly (like `kubectl apply` before the controller sees it).
    pub fn put(&self, collection: &str, obj: Value) {
        let mut st = self.state.lock().unwrap();
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let mut obj = obj;
        st.stamp_new(&mut obj, &name);
        let key = format!("{collection}/{name}");
        st.record(&key, "ADDED", &obj);
        st.objects.insert(key, obj);
    }

    /// An object, if present.
    pub fn get(&self, key: &str) -> Option<Value> {
        self.state.lock().unwrap().objects.get(key).cloned()
    }

    /// Mutates an object in place (e.g. the kubelet updating a pod's status).
    pub fn update(&self, key: &str, f: impl FnOnce(&mut Value)) {
        let mut st = self.state.lock().unwrap();
        let obj = st.objects.get_mut(key).unwrap_or_else(|| panic!("{key} missing"));
        f(obj);
    }

    /// Keys under a collection.
    pub fn names(&self, collection: &str) -> Vec<String> {
        let prefix = format!("{collection}/");
        self.state.lock().unwrap().objects.keys().filter_map(|k| k.strip_prefix(&prefix).map(str::to_string)).collect()
    }

    /// Takes the request log.
    pub fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut self.state.lock().unwrap().log)
    }

    /// Every stored object.
    pub fn all_keys(&self) -> Vec<String> {
        self.state.lock().unwrap().objects.keys().cloned().collect()
    }
}
