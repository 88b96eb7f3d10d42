//! A small in-memory Kubernetes API server, served to `kube::Client` as a tower service.
//!
//! It implements the verbs the controller uses on any namespaced resource: list (with equality
//! label selectors), get, create, server-side apply and merge patch (as a recursive merge),
//! status-subresource patch, replace (with resourceVersion conflicts) and delete, plus the
//! garbage collector's cascade on owner references. Every request is logged.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};

/// Shared state of the fake.
#[derive(Default)]
pub struct State {
    /// Objects by `<collection path>/<name>`.
    pub objects: BTreeMap<String, Value>,
    /// `VERB path` of every request.
    pub log: Vec<String>,
    /// Path prefixes answered with 404 (e.g. a CRD that is not installed).
    pub unserved: Vec<String>,
    counter: u64,
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
    Some((
        collection,
        segs.get(base + 3).map(|s| s.to_string()),
        segs.get(base + 4).map(|s| s.to_string()),
    ))
}

fn query_param(uri: &http::Uri, key: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| {
            v.replace("%3D", "=")
                .replace("%2C", ",")
                .replace("%2F", "/")
        })
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

    /// Deletes an object and, like the garbage collector, everything it owns.
    fn delete_cascade(&mut self, key: &str) -> Option<Value> {
        let obj = self.objects.remove(key)?;
        if let Some(uid) = obj["metadata"]["uid"].as_str() {
            let owned: Vec<String> = self
                .objects
                .iter()
                .filter(|(_, o)| {
                    o["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
                })
                .map(|(k, _)| k.clone())
                .collect();
            for k in owned {
                self.delete_cascade(&k);
            }
        }
        Some(obj)
    }

    fn handle(&mut self, method: &str, uri: &http::Uri, body: &[u8]) -> (u16, Value) {
        self.log.push(format!("{method} {}", uri.path()));
        if self
            .unserved
            .iter()
            .any(|p| uri.path().starts_with(p.as_str()))
        {
            return status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            );
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
                let items: Vec<Value> = self
                    .objects
                    .iter()
                    .filter(|(k, _)| k.starts_with(&format!("{collection}/")))
                    .map(|(_, v)| v.clone())
                    .filter(|o| labels_match(o, &selector))
                    .collect();
                (
                    200,
                    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": self.counter.to_string()}, "items": items}),
                )
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
                        let prefix = obj["metadata"]["generateName"]
                            .as_str()
                            .unwrap_or("obj-")
                            .to_string();
                        format!("{prefix}{}", self.next())
                    }
                };
                let key = format!("{collection}/{name}");
                if self.objects.contains_key(&key) {
                    return status(409, "AlreadyExists", &format!("{name} already exists"));
                }
                self.stamp_new(&mut obj, &name);
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
                    // Server-side apply of the status replaces the fields this manager owns.
                    obj["status"] = body["status"].clone();
                    obj["metadata"]["resourceVersion"] = json!(n.to_string());
                    return (200, obj.clone());
                }
                match self.objects.get_mut(&key) {
                    Some(obj) => {
                        let mut patch = body;
                        patch.as_object_mut().map(|o| o.remove("status"));
                        merge(obj, &patch);
                        obj["metadata"]["resourceVersion"] = json!(n.to_string());
                        (200, obj.clone())
                    }
                    None => {
                        let mut obj = body;
                        self.stamp_new(&mut obj, &name);
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
        let state = self.state.clone();
        let svc = tower::service_fn(move |req: Request<Body>| {
            let state = state.clone();
            async move {
                let (parts, body) = req.into_parts();
                let bytes = body.collect_bytes().await.unwrap_or_default();
                let (code, value) =
                    state
                        .lock()
                        .unwrap()
                        .handle(parts.method.as_str(), &parts.uri, &bytes);
                let resp = Response::builder()
                    .status(StatusCode::from_u16(code).unwrap())
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&value).unwrap()))
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
        st.objects.insert(format!("{collection}/{name}"), obj);
    }

    /// An object, if present.
    pub fn get(&self, key: &str) -> Option<Value> {
        self.state.lock().unwrap().objects.get(key).cloned()
    }

    /// Mutates an object in place (e.g. the kubelet updating a pod's status).
    pub fn update(&self, key: &str, f: impl FnOnce(&mut Value)) {
        let mut st = self.state.lock().unwrap();
        let obj = st
            .objects
            .get_mut(key)
            .unwrap_or_else(|| panic!("{key} missing"));
        f(obj);
    }

    /// Keys under a collection.
    pub fn names(&self, collection: &str) -> Vec<String> {
        let prefix = format!("{collection}/");
        self.state
            .lock()
            .unwrap()
            .objects
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix).map(str::to_string))
            .collect()
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
