//! Who am I: the cluster (TensorFlow's `ClusterSpec`) and this task's
//! identity, read from `TF_CONFIG` or from the classic distributed-TF flags.
//!
//! Pure: parsing takes strings and returns plain data or a [`ClusterError`]
//! that names the field at fault.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

/// The job names a TFJob can have (TensorFlow's `ClusterSpec` jobs).
pub const KNOWN_JOBS: [&str; 5] = ["chief", "master", "ps", "worker", "evaluator"];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClusterError {
    #[error("TF_CONFIG is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("{field}: expected {expected}")]
    WrongType { field: String, expected: &'static str },
    #[error("{field}: unknown job {job:?} (known jobs: chief, master, ps, worker, evaluator)")]
    UnknownJob { field: String, job: String },
    #[error("{field}: malformed address {value:?}: {reason}")]
    MalformedAddress { field: String, value: String, reason: String },
    #[error("{second}: address {address} is already used by {first}")]
    DuplicateAddress { address: String, first: String, second: String },
    #[error("{field}: task index {index} is out of range: job {job:?} has {count} task(s)")]
    TaskIndexOutOfRange { field: String, job: String, index: u32, count: usize },
    #[error("{field}: job {job:?} is not in the cluster")]
    JobNotInCluster { field: String, job: String },
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
}

/// A task's identity: job name and index (`/job:worker/task:1`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId {
    pub job: String,
    pub index: u32,
}

impl TaskId {
    pub fn new(job: &str, index: u32) -> Self {
        TaskId { job: job.to_string(), index }
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.job, self.index)
    }
}

/// TensorFlow's `ClusterSpec`: job name → task index → `host:port`.
/// Indices may be sparse (TF_CONFIG's dictionary form, used by dynamic
/// workers), so tasks are kept in a map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSpec {
    jobs: BTreeMap<String, BTreeMap<u32, String>>,
    /// Jobs given in the sparse form (an object of index to address): the
    /// tasks listed may be only some of the job's (Kubeflow's
    /// `enableDynamicWorker` lists a worker itself and no other worker).
    sparse: std::collections::BTreeSet<String>,
}

impl ClusterSpec {
    pub fn is_empty(&self) -> bool {
        self.jobs.values().all(|t| t.is_empty())
    }
    /// Tasks of a job in index order (empty when the job is absent).
    pub fn tasks(&self, job: &str) -> Vec<(u32, &str)> {
        self.jobs.get(job).map(|t| t.iter().map(|(i, a)| (*i, a.as_str())).collect()).unwrap_or_default()
    }
    /// Addresses of a job in index order.
    pub fn addresses(&self, job: &str) -> Vec<String> {
        self.tasks(job).into_iter().map(|(_, a)| a.to_string()).collect()
    }
    pub fn address(&self, task: &TaskId) -> Option<&str> {
        self.jobs.get(&task.job)?.get(&task.index).map(String::as_str)
    }
    pub fn num_tasks(&self, job: &str) -> usize {
        self.jobs.get(job).map_or(0, BTreeMap::len)
    }
    pub fn jobs(&self) -> impl Iterator<Item = &str> {
        self.jobs.keys().map(String::as_str)
    }
    /// Was `job` given in the sparse form, so that its tasks may be only
    /// some of the job's (its size is not known)?
    pub fn is_sparse(&self, job: &str) -> bool {
        self.sparse.contains(job)
    }
    /// The task that initialises variables and decides when training ends:
    /// `chief:0`, else `master:0`, else `worker:0` (TensorFlow's rule).
    ///
    /// Task 0 even when the sparse form leaves it out (a dynamic worker sees
    /// only itself and the ps tasks, and must not take itself for the chief).
    pub fn chief(&self) -> Option<TaskId> {
        ["chief", "master", "worker"].into_iter().find(|job| self.jobs.get(*job).is_some_and(|t| !t.is_empty())).map(|job| TaskId::new(job, 0))
    }
    /// Tasks that compute gradients: chief/master and workers.
    pub fn training_tasks(&self) -> Vec<TaskId> {
        ["chief", "master", "worker"].iter().flat_map(|job| self.tasks(job).into_iter().map(move |(i, _)| TaskId::new(job, i))).collect()
    }

    /// Builds a cluster from job → addresses, checking every address and
    /// rejecting duplicates. `field_prefix` names where the data came from
    /// (`cluster` for TF_CONFIG, `--` for flags).
    fn insert_job(
        &mut self,
        job: &str,
        tasks: BTreeMap<u32, String>,
        field_of: impl Fn(u32) -> String,
        seen: &mut BTreeMap<String, String>,
    ) -> Result<(), ClusterError> {
        for (index, address) in &tasks {
            let field = field_of(*index);
            check_address(&field, address)?;
            if let Some(first) = seen.insert(address.clone(), field.clone()) {
                return Err(ClusterError::DuplicateAddress { address: address.clone(), first, second: field });
            }
        }
        if !tasks.is_empty() {
            self.jobs.insert(job.to_string(), tasks);
        }
        Ok(())
    }
}

/// What this process is: the cluster and its own task, or nothing (single
/// process training).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    pub cluster: ClusterSpec,
    pub task: TaskId,
    /// Where they came from.
    pub source: ClusterSource,
}

impl ClusterConfig {
    pub fn is_chief(&self) -> bool {
        self.cluster.chief().as_ref() == Some(&self.task)
    }
    pub fn own_address(&self) -> Option<&str> {
        self.cluster.address(&self.task)
    }
    pub fn role(&self) -> Role {
        match self.task.job.as_str() {
            "ps" => Role::Ps,
            "evaluator" => Role::Evaluator,
            _ => Role::Worker,
        }
    }
}

/// What a task does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Ps,
    /// chief, master and worker tasks all train.
    Worker,
    Evaluator,
}

/// The classic flags of distributed TensorFlow scripts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFlags {
    pub ps_hosts: Option<String>,
    pub worker_hosts: Option<String>,
    pub chief_hosts: Option<String>,
    pub evaluator_hosts: Option<String>,
    pub job_name: Option<String>,
    pub task_index: Option<u32>,
}

impl ClusterFlags {
    fn has_hosts(&self) -> bool {
        self.ps_hosts.is_some() || self.worker_hosts.is_some() || self.chief_hosts.is_some() || self.evaluator_hosts.is_some()
    }

    /// Whether any classic flag was given: the cluster then comes from the
    /// flags alone.
    pub fn any_given(&self) -> bool {
        self.has_hosts() || self.job_name.is_some() || self.task_index.is_some()
    }
}

/// Where a task's cluster and identity came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterSource {
    /// `--ps_hosts`, `--worker_hosts`, `--chief_hosts`, `--evaluator_hosts`,
    /// `--job_name`, `--task_index`.
    Flags,
    /// The `TF_CONFIG` environment variable.
    TfConfig,
}

impl fmt::Display for ClusterSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClusterSource::Flags => "the classic flags (--ps_hosts/--worker_hosts/--job_name/--task_index)",
            ClusterSource::TfConfig => "TF_CONFIG",
        })
    }
}

/// The source [`resolve`] takes the cluster from: the classic flags when
/// any of them is given, else `TF_CONFIG` when it is set and not blank, else
/// none (single-process training).
pub fn source(flags: &ClusterFlags, tf_config: Option<&str>) -> Option<ClusterSource> {
    if flags.any_given() {
        Some(ClusterSource::Flags)
    } else if tf_config.is_some_and(|s| !s.trim().is_empty()) {
        Some(ClusterSource::TfConfig)
    } else {
        None
    }
}

/// Resolves the cluster and this task from ONE source, never a mix ([`source`]):
/// - any classic flag given: the cluster comes from the `--*_hosts` flags
///   and the task from `--job_name` and `--task_index` (default 0), as in
///   TensorFlow's tutorials; `TF_CONFIG` is not read at all (a TFJob sets it
///   on every replica, so a script run with the classic flags ignores it);
///   a `--job_name` or `--task_index` without any `--*_hosts` flag is an error;
/// - else `TF_CONFIG`'s cluster and task;
/// - else `Ok(None)`: single-process training.
pub fn resolve(flags: &ClusterFlags, tf_config: Option<&str>) -> Result<Option<ClusterConfig>, ClusterError> {
    let (cluster, job, index, job_field, index_field, source) = match source(flags, tf_config) {
        None => return Ok(None),
        Some(ClusterSource::Flags) => {
            if !flags.has_hosts() {
                let field = if flags.job_name.is_some() { "--job_name" } else { "--task_index" };
                return Err(ClusterError::Invalid {
                    field: field.into(),
                    reason: "given without --ps_hosts/--worker_hosts/--chief_hosts/--evaluator_hosts: the classic flags \
                             give the whole cluster (TF_CONFIG is read only when none of them is given)"
                        .into(),
                });
            }
            let job = flags
                .job_name
                .clone()
                .ok_or_else(|| ClusterError::Invalid { field: "--job_name".into(), reason: "missing: which task of the cluster is this process?".into() })?;
            let index = flags.task_index.unwrap_or(0);
            (cluster_from_flags(flags)?, job, index, "--job_name", "--task_index", ClusterSource::Flags)
        }
        Some(ClusterSource::TfConfig) => {
            let env = parse_tf_config(tf_config.unwrap_or_default().trim())?;
            let task =
                env.task.ok_or_else(|| ClusterError::Invalid { field: "task".into(), reason: "missing: which task of the cluster is this process?".into() })?;
            (env.cluster, task.job, task.index, "task.type", "task.index", ClusterSource::TfConfig)
        }
    };
    let job = normalise_job(&job).ok_or_else(|| ClusterError::UnknownJob { field: job_field.into(), job: job.clone() })?;
    let count = cluster.num_tasks(&job);
    // TensorFlow lets an evaluator stay out of the cluster: it only reads
    // from the ps tasks. Kubeflow puts it in; both work.
    let outside_ok = job == "evaluator" && count == 0 && index == 0;
    if count == 0 && !outside_ok {
        return Err(ClusterError::JobNotInCluster { field: job_field.into(), job });
    }
    if !outside_ok && cluster.address(&TaskId::new(&job, index)).is_none() {
        return Err(ClusterError::TaskIndexOutOfRange { field: index_field.into(), job, index, count });
    }
    if cluster.num_tasks("ps") == 0 && job != "evaluator" && cluster.training_tasks().len() > 1 {
        return Err(ClusterError::Invalid { field: "cluster.ps".into(), reason: "a cluster with several training tasks needs at least one ps task".into() });
    }
    if cluster.num_tasks("chief") + cluster.num_tasks("master") > 1 {
        return Err(ClusterError::Invalid { field: "cluster.chief".into(), reason: "at most one chief (or master) task".into() });
    }
    Ok(Some(ClusterConfig { cluster, task: TaskId { job, index }, source }))
}

fn normalise_job(job: &str) -> Option<String> {
    let lower = job.trim().to_ascii_lowercase();
    KNOWN_JOBS.contains(&lower.as_str()).then_some(lower)
}

/// The parts of TF_CONFIG this runtime reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TfConfig {
    pub cluster: ClusterSpec,
    pub task: Option<TaskId>,
}

/// Parses TensorFlow's `TF_CONFIG` JSON. `cluster` maps a job to a list of
/// `host:port`, or (sparse form) to an object keyed by task index.
pub fn parse_tf_config(json: &str) -> Result<TfConfig, ClusterError> {
    let value: Value = serde_json::from_str(json).map_err(|e| ClusterError::InvalidJson(e.to_string()))?;
    let obj = value.as_object().ok_or(ClusterError::WrongType { field: "TF_CONFIG".into(), expected: "a JSON object" })?;
    let mut cluster = ClusterSpec::default();
    let mut seen = BTreeMap::new();
    match obj.get("cluster") {
        None | Some(Value::Null) => {}
        Some(Value::Object(jobs)) => {
            for (job_key, tasks) in jobs {
                let field = format!("cluster.{job_key}");
                let job = normalise_job(job_key).ok_or_else(|| ClusterError::UnknownJob { field: "cluster".into(), job: job_key.clone() })?;
                let parsed = parse_job_tasks(&field, tasks)?;
                let sparse = tasks.is_object();
                cluster.insert_job(&job, parsed, |i| if sparse { format!("{field}.\"{i}\"") } else { format!("{field}[{i}]") }, &mut seen)?;
                if sparse {
                    cluster.sparse.insert(job);
                }
            }
        }
        Some(_) => {
            return Err(ClusterError::WrongType { field: "cluster".into(), expected: "an object of job name to addresses" });
        }
    }
    let task = match obj.get("task") {
        None | Some(Value::Null) => None,
        Some(Value::Object(t)) => {
            let job = match t.get("type") {
                Some(Value::String(s)) => normalise_job(s).ok_or_else(|| ClusterError::UnknownJob { field: "task.type".into(), job: s.clone() })?,
                _ => return Err(ClusterError::WrongType { field: "task.type".into(), expected: "a job name string" }),
            };
            let index = match t.get("index") {
                None | Some(Value::Null) => 0,
                Some(v) => v
                    .as_u64()
                    .and_then(|i| u32::try_from(i).ok())
                    .ok_or(ClusterError::WrongType { field: "task.index".into(), expected: "a non-negative integer" })?,
            };
            Some(TaskId { job, index })
        }
        Some(_) => return Err(ClusterError::WrongType { field: "task".into(), expected: "an object {type, index}" }),
    };
    Ok(TfConfig { cluster, task })
}

fn parse_job_tasks(field: &str, tasks: &Value) -> Result<BTreeMap<u32, String>, ClusterError> {
    let addr = |f: String, v: &Value| -> Result<String, ClusterError> {
        v.as_str().map(str::to_string).ok_or(ClusterError::WrongType { field: f, expected: "a \"host:port\" string" })
    };
    match tasks {
        Value::Array(list) => list.iter().enumerate().map(|(i, v)| Ok((i as u32, addr(format!("{field}[{i}]"), v)?))).collect(),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| {
                let index = k
                    .parse::<u32>()
                    .map_err(|_| ClusterError::Invalid { field: format!("{field}.{k:?}"), reason: "keys of the sparse form must be task indices".into() })?;
                Ok((index, addr(format!("{field}.\"{k}\""), v)?))
            })
            .collect(),
        _ => Err(ClusterError::WrongType { field: field.into(), expected: "a list of \"host:port\" or an object of index to \"host:port\"" }),
    }
}

fn cluster_from_flags(flags: &ClusterFlags) -> Result<ClusterSpec, ClusterError> {
    let mut cluster = ClusterSpec::default();
    let mut seen = BTreeMap::new();
    for (job, value, flag) in [
        ("chief", &flags.chief_hosts, "--chief_hosts"),
        ("ps", &flags.ps_hosts, "--ps_hosts"),
        ("worker", &flags.worker_hosts, "--worker_hosts"),
        ("evaluator", &flags.evaluator_hosts, "--evaluator_hosts"),
    ] {
        let Some(value) = value else { continue };
        let tasks: BTreeMap<u32, String> =
            value.split(',').map(str::trim).filter(|s| !s.is_empty()).enumerate().map(|(i, a)| (i as u32, a.to_string())).collect();
        cluster.insert_job(job, tasks, |i| format!("{flag}[{i}]"), &mut seen)?;
    }
    Ok(cluster)
}

/// Checks `host:port`: a non-empty host (DNS name, IPv4, or `[IPv6]`) and a
/// port in 1..=65535.
pub fn check_address(field: &str, address: &str) -> Result<(), ClusterError> {
    let bad = |reason: &str| ClusterError::MalformedAddress { field: field.to_string(), value: address.to_string(), reason: reason.to_string() };
    let (host, port) = if let Some(rest) = address.strip_prefix('[') {
        let (h, p) = rest.split_once(']').ok_or_else(|| bad("missing ']' after an IPv6 host"))?;
        let p = p.strip_prefix(':').ok_or_else(|| bad("expected host:port"))?;
        h.parse::<std::net::Ipv6Addr>().map_err(|_| bad("not an IPv6 address"))?;
        return check_port(p).ok_or_else(|| bad("port must be a number from 1 to 65535"));
    } else {
        let (h, p) = address.rsplit_once(':').ok_or_else(|| bad("expected host:port"))?;
        if h.contains(':') {
            return Err(bad("an IPv6 host must be written in brackets"));
        }
        (h, p)
    };
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    if !host.starts_with(|c: char| c.is_ascii_digit()) || host.parse::<std::net::Ipv4Addr>().is_err() {
        // A DNS name: labels of letters, digits and '-', not starting or
        // ending with '-'.
        let valid = host.len() <= 253
            && host.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            });
        if !valid {
            return Err(bad("not a valid host name"));
        }
    }
    check_port(port).ok_or_else(|| bad("port must be a number from 1 to 65535"))
}

fn check_port(port: &str) -> Option<()> {
    port.parse::<u32>().ok().filter(|p| (1..=65535).contains(p)).map(|_| ())
}

/// The port part of `host:port`.
pub fn port_of(address: &str) -> Option<u16> {
    address.rsplit_once(':').and_then(|(_, p)| p.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(ps: &str, workers: &str, job: &str, index: u32) -> ClusterFlags {
        ClusterFlags {
            ps_hosts: Some(ps.into()),
            worker_hosts: Some(workers.into()),
            job_name: Some(job.into()),
            task_index: Some(index),
            ..Default::default()
        }
    }

    #[test]
    fn good_inputs() {
        type Case = (&'static str, ClusterFlags, Option<&'static str>, &'static str, u32, Vec<&'static str>);
        let cases: Vec<Case> = vec![
            (
                "dense TF_CONFIG",
                ClusterFlags::default(),
                Some(r#"{"cluster":{"ps":["h0:2222"],"worker":["h1:2222","h2:2222"]},"task":{"type":"worker","index":1},"environment":"cloud"}"#),
                "worker",
                1,
                vec!["h1:2222", "h2:2222"],
            ),
            (
                "sparse TF_CONFIG: worker keyed by index",
                ClusterFlags::default(),
                Some(r#"{"cluster":{"ps":["h0:2222"],"worker":{"3":"w3:2222"}},"task":{"type":"worker","index":3}}"#),
                "worker",
                3,
                vec!["w3:2222"],
            ),
            (
                "classic flags with spaces",
                flags("127.0.0.1:2222", "127.0.0.1:2223, 127.0.0.1:2224", "ps", 0),
                None,
                "ps",
                0,
                vec!["127.0.0.1:2223", "127.0.0.1:2224"],
            ),
            (
                "flags win over TF_CONFIG",
                flags("a:1", "b:2", "worker", 0),
                Some(r#"{"cluster":{"ps":["x:1"],"worker":["y:1","z:1"]},"task":{"type":"worker","index":1}}"#),
                "worker",
                0,
                vec!["b:2"],
            ),
            ("with the flags, TF_CONFIG is not even read", flags("a:1", "b:2,c:3", "worker", 1), Some("{not json"), "worker", 1, vec!["b:2", "c:3"]),
            ("--task_index defaults to 0, as in the tutorials", ClusterFlags { task_index: None, ..flags("a:1", "b:2", "ps", 0) }, None, "ps", 0, vec!["b:2"]),
            ("an empty --ps_hosts (a TFJob without ps) and one worker", flags("", "b:2", "worker", 0), None, "worker", 0, vec!["b:2"]),
            ("the chief of --chief_hosts", ClusterFlags { chief_hosts: Some("c:1".into()), ..flags("a:1", "b:2", "chief", 0) }, None, "chief", 0, vec!["b:2"]),
            (
                "evaluator outside the cluster, as TensorFlow allows",
                ClusterFlags::default(),
                Some(r#"{"cluster":{"ps":["x:1"],"chief":["c:1"]},"task":{"type":"evaluator","index":0}}"#),
                "evaluator",
                0,
                vec![],
            ),
            (
                "upper-case job names are normalised",
                ClusterFlags::default(),
                Some(r#"{"cluster":{"PS":["x:1"],"Worker":["[::1]:5"]},"task":{"type":"Worker","index":0}}"#),
                "worker",
                0,
                vec!["[::1]:5"],
            ),
        ];
        for (name, f, env, job, index, workers) in cases {
            let got = resolve(&f, env).unwrap_or_else(|e| panic!("{name}: {e}")).expect(name);
            let want_source = if f.any_given() { ClusterSource::Flags } else { ClusterSource::TfConfig };
            assert_eq!(got.source, want_source, "{name}");
            assert_eq!(got.task, TaskId::new(job, index), "{name}");
            assert_eq!(got.cluster.addresses("worker"), workers, "{name}");
        }
    }

    #[test]
    fn bad_inputs_name_the_field() {
        let cases: Vec<(&str, ClusterFlags, Option<&str>, &str)> = vec![
            ("invalid JSON", ClusterFlags::default(), Some("{\"cluster\":"), "TF_CONFIG is not valid JSON"),
            (
                "task index out of range",
                ClusterFlags::default(),
                Some(r#"{"cluster":{"ps":["a:1"],"worker":["b:1"]},"task":{"type":"worker","index":2}}"#),
                "task.index: task index 2 is out of range: job \"worker\" has 1 task(s)",
            ),
            ("flag index out of range", flags("a:1", "b:1,c:1", "worker", 5), None, "--task_index: task index 5"),
            (
                "unknown job in cluster",
                ClusterFlags::default(),
                Some(r#"{"cluster":{"ps":["a:1"],"trainer":["b:1"]},"task":{"type":"ps","index":0}}"#),
                "cluster: unknown job \"trainer\"",
            ),
            ("unknown job name flag", flags("a:1", "b:1", "gardener", 0), None, "--job_name: unknown job \"gardener\""),
            ("malformed host:port", flags("a:1", "b", "ps", 0), None, "--worker_hosts[0]: malformed address \"b\""),
            ("port out of range", flags("a:70000", "b:1", "ps", 0), None, "--ps_hosts[0]: malformed address"),
            ("empty host", flags(":80", "b:1", "ps", 0), None, "empty host"),
            (
                "malformed address in TF_CONFIG",
                ClusterFlags::default(),
                Some(r#"{"cluster":{"ps":["a:b"],"worker":["c:1"]},"task":{"type":"ps","index":0}}"#),
                "cluster.ps[0]: malformed address \"a:b\"",
            ),
            ("duplicate addresses", flags("a:1", "b:1,a:1", "ps", 0), None, "--worker_hosts[1]: address a:1 is already used by --ps_hosts[0]"),
            (
                "job not in cluster",
                ClusterFlags::default(),
                Some(r#"{"cluster":{"worker":["a:1"]},"task":{"type":"ps","index":0}}"#),
                "task.type: job \"ps\" is not in the cluster",
            ),
            (
                "wrong type of task.index",
                ClusterFlags::default(),
                Some(r#"{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":"0"}}"#),
                "task.index: expected a non-negative integer",
            ),
            ("cluster without task", ClusterFlags::default(), Some(r#"{"cluster":{"worker":["a:1"]}}"#), "task: missing"),
            (
                "several workers and no ps",
                ClusterFlags::default(),
                Some(r#"{"cluster":{"worker":["a:1","b:1"]},"task":{"type":"worker","index":0}}"#),
                "cluster.ps: a cluster with several training tasks needs at least one ps task",
            ),
            ("job name without cluster", ClusterFlags { job_name: Some("worker".into()), ..Default::default() }, None, "--job_name: given without --ps_hosts"),
            (
                "the flags and TF_CONFIG are never mixed: --job_name",
                ClusterFlags { job_name: Some("worker".into()), ..Default::default() },
                Some(r#"{"cluster":{"ps":["x:1"],"worker":["y:1","z:1"]},"task":{"type":"worker","index":1}}"#),
                "--job_name: given without --ps_hosts",
            ),
            (
                "the flags and TF_CONFIG are never mixed: --task_index",
                ClusterFlags { task_index: Some(0), ..Default::default() },
                Some(r#"{"cluster":{"ps":["x:1"],"worker":["y:1","z:1"]},"task":{"type":"worker","index":1}}"#),
                "--task_index: given without --ps_hosts",
            ),
            (
                "hosts without --job_name",
                ClusterFlags { job_name: None, ..flags("a:1", "b:1", "ps", 0) },
                Some(r#"{"cluster":{"ps":["x:1"]},"task":{"type":"ps","index":0}}"#),
                "--job_name: missing",
            ),
        ];
        for (name, f, env, want) in cases {
            let err = resolve(&f, env).expect_err(name).to_string();
            assert!(err.contains(want), "{name}: got {err:?}, want it to contain {want:?}");
        }
    }

    #[test]
    fn nothing_given_means_single_process() {
        assert_eq!(resolve(&ClusterFlags::default(), None).unwrap(), None);
        assert_eq!(resolve(&ClusterFlags::default(), Some("  ")).unwrap(), None);
        assert_eq!(source(&ClusterFlags::default(), Some("  ")), None);
    }

    #[test]
    fn one_source_only() {
        let env = Some(r#"{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":0}}"#);
        // (flags, TF_CONFIG, source)
        let cases = [
            (ClusterFlags::default(), env, Some(ClusterSource::TfConfig)),
            (ClusterFlags::default(), None, None),
            (flags("a:1", "b:1", "ps", 0), env, Some(ClusterSource::Flags)),
            (ClusterFlags { ps_hosts: Some(String::new()), ..Default::default() }, env, Some(ClusterSource::Flags)),
            (ClusterFlags { task_index: Some(1), ..Default::default() }, env, Some(ClusterSource::Flags)),
        ];
        for (f, tf_config, want) in cases {
            assert_eq!(source(&f, tf_config), want, "{f:?} {tf_config:?}");
        }
        assert!(ClusterSource::Flags.to_string().contains("--ps_hosts"));
        assert_eq!(ClusterSource::TfConfig.to_string(), "TF_CONFIG");
    }

    #[test]
    fn sparse_jobs_are_known_as_such() {
        let cfg = parse_tf_config(r#"{"cluster":{"chief":["c:1"],"ps":["p:1","q:1"],"worker":{"3":"w:1"}}}"#).unwrap();
        assert!(cfg.cluster.is_sparse("worker"));
        assert!(!cfg.cluster.is_sparse("ps") && !cfg.cluster.is_sparse("chief"));
        assert_eq!(cfg.cluster.chief(), Some(TaskId::new("chief", 0)), "the chief listed beside a sparse worker");
        // Even an object listing indices 0..n is sparse: nothing says the job ends there.
        let cfg = parse_tf_config(r#"{"cluster":{"ps":{"0":"p:1"}}}"#).unwrap();
        assert!(cfg.cluster.is_sparse("ps"));
    }

    #[test]
    fn chief_rule() {
        let cfg = |json: &str| parse_tf_config(json).unwrap().cluster.chief();
        assert_eq!(cfg(r#"{"cluster":{"chief":["c:1"],"worker":["w:1"]}}"#), Some(TaskId::new("chief", 0)));
        assert_eq!(cfg(r#"{"cluster":{"master":["c:1"],"worker":["w:1"]}}"#), Some(TaskId::new("master", 0)));
        assert_eq!(cfg(r#"{"cluster":{"ps":["p:1"],"worker":["w:1","v:1"]}}"#), Some(TaskId::new("worker", 0)));
        assert_eq!(cfg(r#"{"cluster":{"ps":["p:1"]}}"#), None);
        // The sparse form of a dynamic worker: worker 0 is the chief even when absent.
        assert_eq!(cfg(r#"{"cluster":{"ps":["p:1"],"worker":{"3":"w:1"}}}"#), Some(TaskId::new("worker", 0)));
    }

    #[test]
    fn addresses() {
        for ok in ["a:1", "127.0.0.1:2222", "my-job-worker-0.my-job.default.svc:2222", "[::1]:2222", "localhost:65535"] {
            assert_eq!(check_address("f", ok), Ok(()), "{ok}");
        }
        for bad in ["a", "a:0", "a:x", "-a:1", "::1:80", "[::1:80", "a b:1"] {
            assert!(check_address("f", bad).is_err(), "{bad}");
        }
    }
}
