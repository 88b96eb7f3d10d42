//! Pod templates read strictly and checked for the values the API server would refuse.
//!
//! The CRD lets a replica's `template` through mostly unchecked (only the `tensorflow` container
//! and container names and images are in its schema, see [`crate::api`]): the API server keeps
//! unknown fields under `x-kubernetes-preserve-unknown-fields` and, by itself, checks a pod only
//! when the controller creates it. So a typo (`resource:` for `resources:`) would be dropped in
//! silence and a bad value (`imagePullPolicy: Sometimes`) would surface as a pod the API server
//! refuses, long after `kubectl apply` said yes. Instead [`read`] reads the template into
//! k8s-openapi's `PodTemplateSpec`, recording every field that type does not know
//! (`serde_ignored`) and the path of a value of the wrong type (`serde_path_to_error`), and
//! [`check`] looks at the values the API server validates most often: names, enums, ports,
//! quantities, volume mounts, probes, labels and tolerations. `tfjob validate`, `tfjob run` and
//! the controller all go through both, and report each problem with its field path.
//!
//! Everything here is pure. Paths are relative to the template (`spec.containers[0].image`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, Probe, Toleration, Volume};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use crate::field::{FieldError, is_dns1123_label, unsupported};

/// A replica's pod template, on the heap only when it is not empty. It reads as a
/// `PodTemplateSpec` (an empty one when there is none), so code uses it as one. Why not a plain
/// `PodTemplateSpec` or `Box`: the operator's TFJob cache drops the templates of finished jobs
/// (most jobs of a long-lived cluster), and even an empty `PodTemplateSpec` is 1.8 KB, which
/// a `BTreeMap` node or a `Box` would keep for every replica type of every job.
#[derive(Clone, Default)]
pub struct PodTemplate(Option<Box<PodTemplateSpec>>);

impl PodTemplate {
    /// Whether the template is empty (and takes no heap).
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }
}

impl From<PodTemplateSpec> for PodTemplate {
    fn from(template: PodTemplateSpec) -> Self {
        PodTemplate((template != PodTemplateSpec::default()).then(|| Box::new(template)))
    }
}

impl std::ops::Deref for PodTemplate {
    type Target = PodTemplateSpec;
    fn deref(&self) -> &PodTemplateSpec {
        static EMPTY: OnceLock<PodTemplateSpec> = OnceLock::new();
        self.0.as_deref().unwrap_or_else(|| EMPTY.get_or_init(PodTemplateSpec::default))
    }
}

impl std::ops::DerefMut for PodTemplate {
    fn deref_mut(&mut self) -> &mut PodTemplateSpec {
        self.0.get_or_insert_with(Box::default)
    }
}

impl PartialEq for PodTemplate {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for PodTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl serde::Serialize for PodTemplate {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(serializer)
    }
}

/// What reading a template found besides the template itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    /// Fields that `PodTemplateSpec` does not have, each with a hint when a known field is close.
    pub unknown_fields: Vec<FieldError>,
    /// The value that could not be decoded (wrong type); the template is then empty.
    pub error: Option<FieldError>,
}

/// Reads a template strictly: the typed template plus what did not fit in it.
pub fn read(value: Value) -> (PodTemplateSpec, Reading) {
    let mut ignored: Vec<String> = Vec::new();
    let mut record = |path: serde_ignored::Path<'_>| ignored.push(ignored_path(&path));
    let de = serde_ignored::Deserializer::new(value, &mut record);
    let result: Result<PodTemplateSpec, _> = serde_path_to_error::deserialize(de);
    let unknown_fields = ignored.iter().map(|p| FieldError::new(p.as_str(), unknown_field_message(p))).collect();
    match result {
        Ok(t) => (t, Reading { unknown_fields, error: None }),
        Err(e) => {
            let path = error_path(e.path());
            let error = FieldError::new(path, format!("cannot be decoded: {}", e.inner()));
            (PodTemplateSpec::default(), Reading { unknown_fields, error: Some(error) })
        }
    }
}

/// `spec.containers[0].resource` from serde_ignored's path.
fn ignored_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", ignored_path(parent)),
        Path::Map { parent, key } => join(&ignored_path(parent), key),
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => ignored_path(parent),
    }
}

/// `spec.containers[0].ports` from serde_path_to_error's path.
fn error_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } => out = join(&out, key),
            Segment::Enum { variant } => out = join(&out, variant),
            Segment::Unknown => {}
        }
    }
    out
}

fn join(parent: &str, field: &str) -> String {
    if parent.is_empty() { field.to_string() } else { format!("{parent}.{field}") }
}

/// `unknown field`, with `did you mean "resources"?` when a field of the same object is close.
fn unknown_field_message(path: &str) -> String {
    let (parent, field) = match path.rfind('.') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    };
    let hint = known_fields(parent).and_then(|known| closest(field, &known).map(|k| format!("; did you mean {k:?}?"))).unwrap_or_default();
    format!("unknown field{hint}")
}

/// The JSON schema of `PodTemplateSpec` (k8s-openapi's), for the field names of every object.
fn template_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let root = schemars::SchemaGenerator::default().into_root_schema_for::<PodTemplateSpec>();
        serde_json::to_value(root).unwrap_or(Value::Null)
    })
}

/// The field names of the object at `path` (`spec.containers[0]`) of a pod template.
fn known_fields(path: &str) -> Option<Vec<String>> {
    let root = template_schema();
    let resolve = |mut node: &'static Value| {
        while let Some(r) = node.get("$ref").and_then(Value::as_str) {
            let name = r.rsplit('/').next()?;
            node = root.get("$defs")?.get(name)?;
        }
        Some(node)
    };
    let mut node = resolve(root)?;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (field, indexed) = match part.find('[') {
            Some(i) => (&part[..i], true),
            None => (part, false),
        };
        node = match node.get("properties").and_then(|p| p.get(field)) {
            Some(child) => resolve(child)?,
            None => resolve(node.get("additionalProperties")?)?,
        };
        if indexed {
            node = resolve(node.get("items")?)?;
        }
    }
    let props = node.get("properties")?.as_object()?;
    Some(props.keys().cloned().collect())
}

/// The known name closest to `field`: the same but for case, or at most two edits away.
fn closest<'k>(field: &str, known: &'k [String]) -> Option<&'k String> {
    if let Some(k) = known.iter().find(|k| k.eq_ignore_ascii_case(field)) {
        return Some(k);
    }
    known.iter().map(|k| (edit_distance(field, k), k)).filter(|(d, _)| *d <= 2).min_by_key(|(d, _)| *d).map(|(_, k)| k)
}

/// Levenshtein distance (field names are short; quadratic is fine).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb { prev } else { 1 + prev.min(cur).min(row[j]) };
            prev = cur;
        }
    }
    row[b.len()]
}

/// Checks the values of a template that the API server would refuse when the controller creates
/// the pod. Paths are relative to the template.
pub fn check(template: &PodTemplateSpec) -> Vec<FieldError> {
    let mut c = Checker::default();
    if let Some(meta) = &template.metadata {
        c.labels("metadata.labels", meta.labels.as_ref());
        c.annotation_keys("metadata.annotations", meta.annotations.as_ref());
    }
    if let Some(spec) = &template.spec {
        c.pod_spec("spec", spec);
    }
    c.errs
}

#[derive(Default)]
struct Checker {
    errs: Vec<FieldError>,
}

const IMAGE_PULL_POLICIES: &[&str] = &["Always", "IfNotPresent", "Never"];
const TERMINATION_MESSAGE_POLICIES: &[&str] = &["File", "FallbackToLogsOnError"];
const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP"];
const POD_RESTART_POLICIES: &[&str] = &["Always", "OnFailure", "Never"];
const DNS_POLICIES: &[&str] = &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"];
const TOLERATION_OPERATORS: &[&str] = &["Exists", "Equal"];
const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

impl Checker {
    fn error(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errs.push(FieldError::new(field, message));
    }

    fn one_of(&mut self, field: &str, value: Option<&String>, allowed: &[&str]) {
        if let Some(v) = value
            && !allowed.contains(&v.as_str())
        {
            self.errs.push(unsupported(field, v, allowed));
        }
    }

    fn pod_spec(&mut self, path: &str, spec: &PodSpec) {
        self.one_of(&format!("{path}.restartPolicy"), spec.restart_policy.as_ref(), POD_RESTART_POLICIES);
        self.one_of(&format!("{path}.dnsPolicy"), spec.dns_policy.as_ref(), DNS_POLICIES);
        if let Some(v) = spec.active_deadline_seconds
            && v <= 0
        {
            self.error(format!("{path}.activeDeadlineSeconds"), format!("must be greater than 0, got {v}"));
        }
        self.labels(&format!("{path}.nodeSelector"), spec.node_selector.as_ref());
        let volumes = self.volumes(path, spec.volumes.as_deref().unwrap_or_default());
        let mut names = BTreeSet::new();
        let groups = [("containers", spec.containers.as_slice()), ("initContainers", spec.init_containers.as_deref().unwrap_or_default())];
        for (list, containers) in groups {
            for (i, container) in containers.iter().enumerate() {
                let cpath = format!("{path}.{list}[{i}]");
                if !container.name.is_empty() && !names.insert(container.name.as_str()) {
                    self.error(format!("{cpath}.name"), format!("duplicate container name {:?}", container.name));
                }
                self.container(&cpath, container, &volumes, list == "initContainers");
            }
        }
        for (i, t) in spec.tolerations.iter().flatten().enumerate() {
            self.toleration(&format!("{path}.tolerations[{i}]"), t);
        }
        for (i, s) in spec.image_pull_secrets.iter().flatten().enumerate() {
            if s.name.is_empty() {
                self.error(format!("{path}.imagePullSecrets[{i}].name"), "is required");
            }
        }
    }

    /// Checks the volumes; returns their names.
    fn volumes<'s>(&mut self, path: &str, volumes: &'s [Volume]) -> BTreeSet<&'s str> {
        let mut names = BTreeSet::new();
        for (i, v) in volumes.iter().enumerate() {
            let vpath = format!("{path}.volumes[{i}]");
            self.dns_label(&format!("{vpath}.name"), &v.name);
            if !names.insert(v.name.as_str()) {
                self.error(format!("{vpath}.name"), format!("duplicate volume name {:?}", v.name));
            }
            // A volume is its name and exactly one source (emptyDir, configMap, ...).
            let sources: Vec<String> = match serde_json::to_value(v) {
                Ok(Value::Object(o)) => o.keys().filter(|k| *k != "name").cloned().collect(),
                _ => Vec::new(),
            };
            if sources.is_empty() {
                self.error(vpath, "must specify a volume type (emptyDir, configMap, persistentVolumeClaim, ...)");
            } else if sources.len() > 1 {
                self.error(vpath, format!("may not specify more than one volume type, got {}", sources.join(", ")));
            }
        }
        names
    }

    fn container(&mut self, path: &str, c: &Container, volumes: &BTreeSet<&str>, init: bool) {
        if c.name.is_empty() {
            self.error(format!("{path}.name"), "is required");
        } else {
            self.dns_label(&format!("{path}.name"), &c.name);
        }
        if init && c.image.as_deref().unwrap_or("").trim().is_empty() {
            self.error(format!("{path}.image"), "must not be empty");
        }
        self.one_of(&format!("{path}.imagePullPolicy"), c.image_pull_policy.as_ref(), IMAGE_PULL_POLICIES);
        self.one_of(&format!("{path}.terminationMessagePolicy"), c.termination_message_policy.as_ref(), TERMINATION_MESSAGE_POLICIES);
        self.container_ports(path, c);
        self.env(path, c);
        if let Some(r) = &c.resources {
            self.resources(&format!("{path}.resources"), r);
        }
        self.volume_mounts(path, c, volumes);
        for (name, probe) in [("livenessProbe", &c.liveness_probe), ("readinessProbe", &c.readiness_probe), ("startupProbe", &c.startup_probe)] {
            if let Some(p) = probe {
                self.probe(&format!("{path}.{name}"), p);
            }
        }
    }

    /// The container's ports: numbers, names (each once) and protocols.
    fn container_ports(&mut self, path: &str, c: &Container) {
        let mut port_names = BTreeSet::new();
        for (i, p) in c.ports.iter().flatten().enumerate() {
            let ppath = format!("{path}.ports[{i}]");
            self.port_number(&format!("{ppath}.containerPort"), p.container_port);
            if let Some(h) = p.host_port
                && h != 0
            {
                self.port_number(&format!("{ppath}.hostPort"), h);
            }
            if let Some(name) = &p.name {
                self.port_name(&format!("{ppath}.name"), name);
                if !port_names.insert(name.as_str()) {
                    self.error(format!("{ppath}.name"), format!("duplicate port name {name:?}"));
                }
            }
            self.one_of(&format!("{ppath}.protocol"), p.protocol.as_ref(), PROTOCOLS);
        }
    }

    /// The container's environment: variable names, and `value` or `valueFrom`.
    fn env(&mut self, path: &str, c: &Container) {
        for (i, e) in c.env.iter().flatten().enumerate() {
            let epath = format!("{path}.env[{i}]");
            if e.name.is_empty() || e.name.contains('=') {
                self.error(
                    format!("{epath}.name"),
                    format!(
                        "{:?} is not a valid environment variable name: it must not be empty \
                         or contain '='",
                        e.name
                    ),
                );
            }
            if e.value.as_deref().is_some_and(|v| !v.is_empty()) && e.value_from.is_some() {
                self.error(format!("{epath}.valueFrom"), "may not be specified when `value` is not empty");
            }
        }
    }

    /// The container's volume mounts: of volumes of the pod, each path mounted once.
    fn volume_mounts(&mut self, path: &str, c: &Container, volumes: &BTreeSet<&str>) {
        let mut mount_paths = BTreeSet::new();
        for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
            let mpath = format!("{path}.volumeMounts[{i}]");
            if !volumes.contains(m.name.as_str()) {
                self.error(format!("{mpath}.name"), format!("volume {:?} is not among spec.volumes", m.name));
            }
            if m.mount_path.is_empty() {
                self.error(format!("{mpath}.mountPath"), "is required");
            } else if !mount_paths.insert(m.mount_path.as_str()) {
                self.error(format!("{mpath}.mountPath"), format!("{:?} is mounted twice", m.mount_path));
            }
        }
    }

    fn resources(&mut self, path: &str, r: &k8s_openapi::api::core::v1::ResourceRequirements) {
        let mut parsed: BTreeMap<(&str, &str), f64> = BTreeMap::new();
        for (kind, list) in [("limits", &r.limits), ("requests", &r.requests)] {
            for (name, q) in list.iter().flatten() {
                let field = format!("{path}.{kind}.{name}");
                match parse_quantity(&q.0) {
                    Some(v) if v < 0.0 => self.error(field, format!("{:?} must be >= 0", q.0)),
                    Some(v) => {
                        parsed.insert((kind, name.as_str()), v);
                    }
                    None => self.error(field, format!("{:?} is not a quantity (e.g. 500m, 2, 1.5Gi, 128974848, 129e6)", q.0)),
                }
            }
        }
        for ((kind, name), request) in &parsed {
            if *kind == "requests"
                && let Some(limit) = parsed.get(&("limits", name))
                && request > limit
            {
                self.error(format!("{path}.requests.{name}"), format!("must be less than or equal to the {name} limit"));
            }
        }
    }

    fn probe(&mut self, path: &str, p: &Probe) {
        let handlers = [p.exec.is_some(), p.http_get.is_some(), p.tcp_socket.is_some(), p.grpc.is_some()].iter().filter(|h| **h).count();
        if handlers != 1 {
            self.error(path, "must specify exactly one of exec, httpGet, tcpSocket and grpc");
        }
        if let Some(h) = &p.http_get {
            self.int_or_name_port(&format!("{path}.httpGet.port"), &h.port);
        }
        if let Some(t) = &p.tcp_socket {
            self.int_or_name_port(&format!("{path}.tcpSocket.port"), &t.port);
        }
        if let Some(g) = &p.grpc {
            self.port_number(&format!("{path}.grpc.port"), g.port);
        }
    }

    fn toleration(&mut self, path: &str, t: &Toleration) {
        let op = t.operator.as_deref().filter(|o| !o.is_empty());
        if let Some(o) = op
            && !TOLERATION_OPERATORS.contains(&o)
        {
            self.errs.push(unsupported(&format!("{path}.operator"), o, TOLERATION_OPERATORS));
        }
        if op == Some("Exists") && t.value.as_deref().is_some_and(|v| !v.is_empty()) {
            self.error(format!("{path}.value"), "must be empty when `operator` is 'Exists'");
        }
        if let Some(e) = t.effect.as_deref().filter(|e| !e.is_empty())
            && !TAINT_EFFECTS.contains(&e)
        {
            self.errs.push(unsupported(&format!("{path}.effect"), e, TAINT_EFFECTS));
        }
    }

    fn port_number(&mut self, field: &str, port: i32) {
        if !(1..=65535).contains(&port) {
            self.error(field, format!("must be between 1 and 65535, got {port}"));
        }
    }

    fn int_or_name_port(&mut self, field: &str, port: &IntOrString) {
        match port {
            IntOrString::Int(p) => self.port_number(field, *p),
            IntOrString::String(s) => match s.parse::<i32>() {
                Ok(p) => self.port_number(field, p),
                Err(_) => self.port_name(field, s),
            },
        }
    }

    fn port_name(&mut self, field: &str, name: &str) {
        if let Err(why) = check_port_name(name) {
            self.error(field, format!("{name:?} is not a valid port name (IANA_SVC_NAME): {why}"));
        }
    }

    fn dns_label(&mut self, field: &str, value: &str) {
        if !is_dns1123_label(value) {
            self.error(
                field,
                format!(
                    "{value:?} is not a valid DNS-1123 label: lower case alphanumeric characters \
                     or '-', starting and ending with an alphanumeric character, at most 63"
                ),
            );
        }
    }

    fn labels(&mut self, path: &str, labels: Option<&BTreeMap<String, String>>) {
        for (k, v) in labels.into_iter().flatten() {
            let field = format!("{path}.{k}");
            if let Err(why) = check_qualified_name(k) {
                self.error(&field, format!("key {k:?} is not valid: {why}"));
            }
            if !v.is_empty() && !is_name_part(v) || v.len() > 63 {
                self.error(
                    field,
                    format!(
                        "value {v:?} is not valid: at most 63 characters, alphanumerics, '-', \
                         '_' or '.', starting and ending with an alphanumeric character"
                    ),
                );
            }
        }
    }

    fn annotation_keys(&mut self, path: &str, annotations: Option<&BTreeMap<String, String>>) {
        for k in annotations.into_iter().flatten().map(|(k, _)| k) {
            if let Err(why) = check_qualified_name(k) {
                self.error(format!("{path}.{k}"), format!("key {k:?} is not valid: {why}"));
            }
        }
    }
}

/// An IANA service name as Kubernetes checks port names: at most 15 characters, lower-case
/// alphanumerics and '-', at least one letter, no '-' at either end nor two in a row.
pub fn check_port_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 15 {
        return Err("it must be 1 to 15 characters long");
    }
    if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        return Err("it may contain only lower case letters, digits and '-'");
    }
    if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        return Err("it must contain at least one letter");
    }
    if name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        return Err("'-' may not start or end it, nor follow another '-'");
    }
    Ok(())
}

/// A label value or the name part of a qualified name: alphanumerics, '-', '_', '.', starting
/// and ending with an alphanumeric.
fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A label or annotation key: `[prefix/]name`, the prefix a DNS subdomain, the name at most 63
/// characters.
fn check_qualified_name(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && (p.is_empty() || p.len() > 253 || !p.split('.').all(is_dns1123_label))
    {
        return Err("the prefix must be a DNS subdomain (e.g. example.com)");
    }
    if name.is_empty() || name.len() > 63 || !is_name_part(name) {
        return Err("the name must be at most 63 alphanumerics, '-', '_' or '.', starting and ending \
             with an alphanumeric");
    }
    Ok(())
}

/// The value of a Kubernetes quantity (`500m`, `1.5Gi`, `129e6`), `None` when it is not one.
pub fn parse_quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    let number_end = s.char_indices().find(|(i, c)| !(c.is_ascii_digit() || *c == '.' || (*i == 0 && (*c == '+' || *c == '-')))).map_or(s.len(), |(i, _)| i);
    let (number, suffix) = s.split_at(number_end);
    let digits = number.trim_start_matches(['+', '-']);
    if digits.is_empty() || digits == "." || digits.matches('.').count() > 1 {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "n" => 1e-9,
        "u" => 1e-6,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => {
            let exp = &e[1..];
            let unsigned = exp.trim_start_matches(['+', '-']);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            10f64.powi(exp.parse().ok()?)
        }
        _ => return None,
    };
    Some(value * factor)
}

#[cfg(test)]
mod tests;
