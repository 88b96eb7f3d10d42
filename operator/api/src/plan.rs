//! Pure planning: which replicas a TFJob has, their `TF_CONFIG`, and the Kubernetes objects
//! (pods, one headless Service, a token Secret, an optional PodGroup) that run them.
//!
//! Nothing here does I/O. The two layers are:
//! - [`ReplicaPlanner`] (and [`plan_replicas`]): backend-neutral; every replica with its
//!   `tensorflow` container's command, args, env and `TF_CONFIG`, with addresses from a
//!   caller-supplied [`AddressBook`]. The local backend uses `127.0.0.1:<port>`; the cluster
//!   uses [`ClusterDns`].
//! - [`PodPlanner`] (and [`desired_objects`]): the Kubernetes objects the controller applies
//!   for a job.
//!
//! A planning pass is linear in the number of replicas: the cluster spec is written once and
//! shared ([`TfConfig`]), and so are the classic host lists ([`ClassicEnv`]); a pod's
//! `TF_CONFIG` text and host lists, which list every replica, are written only when the pod is
//! sent ([`PlannedPod::into_pod`]).
//!
//! Besides `TF_CONFIG`, every replica gets the classic values of distributed TensorFlow 1.x as
//! environment variables (see [`ClassicEnv`]), so that a manifest can hand a tutorial script its
//! flags with Kubernetes' own syntax: `args: ["--ps_hosts=$(TFJOB_PS_HOSTS)", ...]`.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::autoscaling::v2::{CrossVersionObjectReference, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, Pod, PodSchedulingGate, PodSchedulingGroup, PodSpec, Secret, SecretKeySelector, Service, ServicePort, ServiceSpec, Volume,
    VolumeMount,
};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use serde_json::{Value, json};

use crate::api::{self, DEFAULT_CONTAINER_NAME, DEFAULT_PORT, DEFAULT_PORT_NAME, ReplicaSpec, ReplicaType, RestartPolicy, TFJob, TFJobSpec};
use crate::gang;
pub use crate::gang::{GangScheduler, KueuePodGroup};
use crate::pki::{CA_CERT_KEY, CA_KEY_KEY, CaPem};
use crate::tls;

/// Label: name of the operator that created the object.
pub const LABEL_OPERATOR_NAME: &str = "training.kubeflow.org/operator-name";
/// Label: name of the job.
pub const LABEL_JOB_NAME: &str = "training.kubeflow.org/job-name";
/// Label: lower-case replica type.
pub const LABEL_REPLICA_TYPE: &str = "training.kubeflow.org/replica-type";
/// Label: replica index.
pub const LABEL_REPLICA_INDEX: &str = "training.kubeflow.org/replica-index";
/// Label: `master` on the chief (or worker 0 when there is no chief).
pub const LABEL_JOB_ROLE: &str = "training.kubeflow.org/job-role";
/// Value of [`LABEL_OPERATOR_NAME`] (same as Kubeflow's).
pub const OPERATOR_NAME: &str = "tfjob-controller";
/// Environment variable holding the cluster spec.
pub const ENV_TF_CONFIG: &str = "TF_CONFIG";
/// Environment variable holding the job token.
pub const ENV_TOKEN: &str = "TFJOB_TOKEN";
/// Key of the token in the job's Secret.
pub const SECRET_TOKEN_KEY: &str = "token";
/// Classic value: the ps addresses, comma separated (`--ps_hosts`).
pub const ENV_PS_HOSTS: &str = "TFJOB_PS_HOSTS";
/// Classic value: the worker addresses, comma separated (`--worker_hosts`).
pub const ENV_WORKER_HOSTS: &str = "TFJOB_WORKER_HOSTS";
/// Classic value: the chief's (or master's) address (`--chief_hosts`), when the job has one.
pub const ENV_CHIEF_HOSTS: &str = "TFJOB_CHIEF_HOSTS";
/// Classic value: the evaluator addresses (`--evaluator_hosts`), when the job has some.
pub const ENV_EVALUATOR_HOSTS: &str = "TFJOB_EVALUATOR_HOSTS";
/// Classic value: this replica's job in the cluster: `ps`, `worker`, `chief` or `evaluator`
/// (`--job_name`).
pub const ENV_JOB_NAME: &str = "TFJOB_JOB_NAME";
/// Classic value: this replica's index in its job (`--task_index`).
pub const ENV_TASK_INDEX: &str = "TFJOB_TASK_INDEX";
/// Every variable the operator sets on the `tensorflow` container: a manifest's own value of
/// one of these is replaced.
pub const OPERATOR_ENV: [&str; 8] =
    [ENV_TF_CONFIG, ENV_TOKEN, ENV_PS_HOSTS, ENV_WORKER_HOSTS, ENV_CHIEF_HOSTS, ENV_EVALUATOR_HOSTS, ENV_JOB_NAME, ENV_TASK_INDEX];

/// Resolves the `host:port` address of a replica. The cluster uses [`ClusterDns`]; the local
/// backend maps each replica to `127.0.0.1:<free port>`.
pub trait AddressBook {
    /// Address (`host:port`) of replica `index` of type `rtype`; `port` is the replica type's
    /// `tfjob-port` from the manifest.
    fn address(&self, rtype: ReplicaType, index: i32, port: i32) -> String;
}

impl<F: Fn(ReplicaType, i32, i32) -> String> AddressBook for F {
    fn address(&self, rtype: ReplicaType, index: i32, port: i32) -> String {
        self(rtype, index, port)
    }
}

/// Cluster addresses: `<job>-<type>-<index>.<job>.<namespace>.svc[.<domain>]:<port>`.
#[derive(Clone, Debug)]
pub struct ClusterDns {
    /// Job name.
    pub job: String,
    /// Namespace of the job.
    pub namespace: String,
    /// Optional cluster domain appended after `svc` (e.g. `cluster.local`).
    pub cluster_domain: Option<String>,
}

impl AddressBook for ClusterDns {
    fn address(&self, rtype: ReplicaType, index: i32, port: i32) -> String {
        let host = format!("{}.{}", pod_name(&self.job, rtype, index), self.job);
        service_address(&host, &self.namespace, self.cluster_domain.as_deref(), port)
    }
}

/// `<host>.<namespace>.svc[.<domain>]:<port>`.
fn service_address(host: &str, namespace: &str, cluster_domain: Option<&str>, port: i32) -> String {
    match cluster_domain.filter(|d| !d.is_empty()) {
        Some(d) => format!("{host}.{namespace}.svc.{d}:{port}"),
        None => format!("{host}.{namespace}.svc:{port}"),
    }
}

/// Addresses as Kubeflow's training-operator writes them: `<job>-<type>-<index>.<namespace>.svc
/// [.<domain>]:<port>`, one headless Service per replica named like its pod. The pods of a job
/// started under Kubeflow and taken over name each other so ([`AddressLayout::Kubeflow`]).
#[derive(Clone, Debug)]
pub struct KubeflowDns {
    /// Job name.
    pub job: String,
    /// Namespace of the job.
    pub namespace: String,
    /// Optional cluster domain appended after `svc`.
    pub cluster_domain: Option<String>,
}

impl AddressBook for KubeflowDns {
    fn address(&self, rtype: ReplicaType, index: i32, port: i32) -> String {
        service_address(&pod_name(&self.job, rtype, index), &self.namespace, self.cluster_domain.as_deref(), port)
    }
}

/// How the pods of a job name each other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AddressLayout {
    /// This operator's: the job's one headless Service `<job>`, each pod's hostname and
    /// subdomain ([`ClusterDns`]), the job's token.
    #[default]
    Ours,
    /// Kubeflow's, for a job started under Kubeflow's training-operator and taken over: its
    /// running pods' `TF_CONFIG` names the per-replica Services, and they hold no token, so a
    /// pod created for that job (a restart, a new index) joins them on their terms
    /// ([`KubeflowDns`], [`build_replica_service`], no hostname, subdomain or token).
    Kubeflow,
}

impl AddressLayout {
    /// The layout of a job with these live pods: Kubeflow's when one of them was created
    /// without a subdomain (this operator always gives one). Pods being deleted do not count.
    /// When none of Kubeflow's is left, the job's next pods are all new and take this
    /// operator's layout.
    pub fn of_pods<'p>(pods: impl IntoIterator<Item = &'p Pod>) -> AddressLayout {
        let kubeflow = pods.into_iter().any(|p| p.metadata.deletion_timestamp.is_none() && p.spec.as_ref().is_some_and(|s| s.subdomain.is_none()));
        if kubeflow { AddressLayout::Kubeflow } else { AddressLayout::Ours }
    }
}

/// Name of the pod of a replica: `<job>-<type>-<index>`.
pub fn pod_name(job: &str, rtype: ReplicaType, index: i32) -> String {
    format!("{job}-{}-{index}", rtype.lower())
}

/// One replica of a job, independent of where it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedReplica {
    /// Replica type.
    pub replica_type: ReplicaType,
    /// Index within the type.
    pub index: i32,
    /// Pod (or process) name `<job>-<type>-<index>`.
    pub pod_name: String,
    /// Restart policy of the replica set.
    pub restart_policy: RestartPolicy,
    /// The `tfjob-port` of this replica type.
    pub port: i32,
    /// Address of this replica as given by the address book.
    pub address: String,
    /// `command` of the `tensorflow` container.
    pub command: Vec<String>,
    /// `args` of the `tensorflow` container.
    pub args: Vec<String>,
    /// The environment of the `tensorflow` container in the order the kubelet defines it: the
    /// classic values ([`ClassicEnv`]) first, so that the manifest's own values can refer to
    /// them (`value: "--worker_hosts=$(TFJOB_WORKER_HOSTS)"`), then the manifest's literal
    /// values, then `TF_CONFIG` when set. Values are as written: a backend expands their
    /// `$(VAR)` references as the kubelet does.
    pub env: Vec<(String, String)>,
    /// The `TF_CONFIG` JSON of this replica (`None` for a one-replica job).
    pub tf_config: Option<String>,
    /// Whether this replica carries `job-role: master`.
    pub is_master_role: bool,
    /// The pod template's volumes (the local backends map them to directories of the
    /// machine).
    pub volumes: Vec<Volume>,
    /// The `tensorflow` container's mounts of [`PlannedReplica::volumes`].
    pub volume_mounts: Vec<VolumeMount>,
}

/// The `tfjob-port` of a replica set (port named `tfjob-port` on the `tensorflow` container,
/// default 2222).
pub fn replica_port(rs: &ReplicaSpec) -> i32 {
    tensorflow_container(rs)
        .and_then(|c| c.ports.as_ref())
        .and_then(|ps| ps.iter().find(|p| p.name.as_deref() == Some(DEFAULT_PORT_NAME)))
        .map(|p| p.container_port)
        .unwrap_or(DEFAULT_PORT)
}

/// Whether the job has more than one replica in total (Kubeflow's `isDistributed`): only then
/// does it get `TF_CONFIG`.
pub fn is_distributed(spec: &TFJobSpec) -> bool {
    api::replica_specs(spec).values().map(|rs| rs.replicas.max(0) as i64).sum::<i64>() != 1
}

/// Whether replica (`rtype`, `index`) carries `job-role: master`: the chief/master, or worker 0
/// when the job has no chief/master.
fn master_role(has_chief: bool, rtype: ReplicaType, index: i32) -> bool {
    if has_chief { rtype.is_chief() } else { rtype == ReplicaType::Worker && index == 0 }
}

/// The `tensorflow` container of a replica set's template.
fn tensorflow_container(rs: &ReplicaSpec) -> Option<&Container> {
    rs.template.spec.as_ref()?.containers.iter().find(|c| c.name == DEFAULT_CONTAINER_NAME)
}

/// Appends the compact JSON of `value` (a string or a list of strings: it cannot fail).
fn push_json<T: Serialize + ?Sized>(out: &mut String, value: &T) {
    out.push_str(&serde_json::to_string(value).unwrap_or_default());
}

/// The `cluster` object of a job's `TF_CONFIG`, written once per planning pass and shared by
/// the [`TfConfig`] of every replica: a 10,000-address cluster spec is built once, not once per
/// replica.
#[derive(Debug, PartialEq, Eq)]
struct ClusterJson {
    /// Compact JSON, keys sorted: `{"ps":["<address>",...],"worker":[...]}`. Every replica type
    /// with at least one replica appears (evaluator included).
    json: String,
    /// Where each type's member (`"ps":[...]`) stands in `json`: sparse configs copy them.
    members: BTreeMap<ReplicaType, Range<usize>>,
    /// `enableDynamicWorker`: workers and ps get a sparse cluster.
    dynamic: bool,
}

impl ClusterJson {
    fn new(addresses: &BTreeMap<ReplicaType, Vec<String>>, dynamic: bool) -> ClusterJson {
        // Keys in the order of their JSON names, as serde_json writes a sorted map.
        let mut lists: Vec<(ReplicaType, &[String])> = addresses.iter().filter(|(_, list)| !list.is_empty()).map(|(t, list)| (*t, list.as_slice())).collect();
        lists.sort_by_key(|(t, _)| t.lower());
        let mut json = String::from("{");
        let mut members = BTreeMap::new();
        for (i, (rtype, list)) in lists.into_iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            let start = json.len();
            push_json(&mut json, rtype.lower());
            json.push(':');
            push_json(&mut json, list);
            members.insert(rtype, start..json.len());
        }
        json.push('}');
        ClusterJson { json, members, dynamic }
    }

    /// The members a sparse cluster keeps whole, in key order: who the chief is, and every ps.
    fn sparse_members(&self) -> impl Iterator<Item = &str> {
        [ReplicaType::Chief, ReplicaType::Master, ReplicaType::PS].into_iter().filter_map(|t| self.members.get(&t)).map(|r| &self.json[r.clone()])
    }
}

/// Which part of the job's cluster a replica's `TF_CONFIG` lists.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ClusterView {
    /// Every replica of the job.
    Full,
    /// `enableDynamicWorker`, for a worker or a ps: the chief (or master) and every ps, plus a
    /// worker's own address as `"worker":{"<index>":"<address>"}`.
    Sparse {
        /// The worker's own address (`None` for a ps).
        own: Option<String>,
    },
}

/// The `TF_CONFIG` of one replica before it is written out: the job's shared cluster spec and
/// the replica's task. [`TfConfig::render`] writes what TensorFlow reads, compact JSON with
/// sorted keys: `{"cluster":{...},"environment":"cloud","task":{"index":N,"type":"..."}}`.
///
/// With `enableDynamicWorker` the cluster of workers and ps is sparse, in the form TensorFlow
/// reads (`"worker":{"3":"<address>"}`): a worker sees itself, every ps and the chief (or
/// master); a ps sees every ps (so it knows how many there are) and the chief. Kubeflow gives a
/// worker only the ps and itself and a ps only itself, so a worker could not tell who the chief
/// is, nor a ps how many ps there are. The chief, master and evaluator see the full cluster
/// (unlike Kubeflow, issue 1763) so that they stay usable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TfConfig {
    cluster: Arc<ClusterJson>,
    replica_type: ReplicaType,
    index: i32,
    view: ClusterView,
}

impl TfConfig {
    /// The JSON text: the value of the `TF_CONFIG` environment variable.
    pub fn render(&self) -> String {
        let cluster = &self.cluster;
        let cluster_len = match &self.view {
            ClusterView::Full => cluster.json.len(),
            ClusterView::Sparse { own } => {
                let kept: usize = cluster.sparse_members().map(str::len).sum();
                kept + own.as_ref().map_or(0, String::len) + 32
            }
        };
        let mut out = String::with_capacity(cluster_len + 80);
        out.push_str(r#"{"cluster":"#);
        match &self.view {
            ClusterView::Full => out.push_str(&cluster.json),
            ClusterView::Sparse { own } => {
                out.push('{');
                let mut separator = "";
                for member in cluster.sparse_members() {
                    out.push_str(separator);
                    out.push_str(member);
                    separator = ",";
                }
                if let Some(own) = own {
                    out.push_str(separator);
                    push_json(&mut out, self.replica_type.lower());
                    out.push_str(":{");
                    push_json(&mut out, &self.index.to_string());
                    out.push(':');
                    push_json(&mut out, own);
                    out.push('}');
                }
                out.push('}');
            }
        }
        out.push_str(r#","environment":"cloud","task":{"index":"#);
        out.push_str(&self.index.to_string());
        out.push_str(r#","type":"#);
        push_json(&mut out, self.replica_type.lower());
        out.push_str("}}");
        out
    }
}

/// The job a replica type is in for the classic flags (`--job_name`, the `--*_hosts` it is
/// listed in). A `Master` is the chief under its older name: the classic flags (and
/// `tfjob-runtime`) know only `--chief_hosts`, and a job has at most one of the two.
pub fn classic_job(rtype: ReplicaType) -> &'static str {
    match rtype {
        ReplicaType::Chief | ReplicaType::Master => "chief",
        ReplicaType::PS => "ps",
        ReplicaType::Worker => "worker",
        ReplicaType::Evaluator => "evaluator",
    }
}

/// The classic values of distributed TensorFlow 1.x for every replica of a job, from the same
/// addresses as its `TF_CONFIG`: `TFJOB_PS_HOSTS` and `TFJOB_WORKER_HOSTS` (comma-separated
/// `host:port`; always set, empty when the job has none, so that `$(TFJOB_PS_HOSTS)` always
/// expands), `TFJOB_CHIEF_HOSTS` (the `Chief` or `Master`) and `TFJOB_EVALUATOR_HOSTS` when the
/// job has such replicas, and the replica's own `TFJOB_JOB_NAME` ([`classic_job`]) and
/// `TFJOB_TASK_INDEX`.
///
/// The host lists are written once per planning pass and shared, like the cluster spec of
/// `TF_CONFIG`. They are never sparse: with `enableDynamicWorker` a worker's `TF_CONFIG` lists
/// only itself, but the classic flags have no sparse form (a task's index is its position in
/// `--worker_hosts`), so every replica gets every worker planned when its pod was made, as in a
/// job without dynamic workers. A script that reads `TF_CONFIG` still sees the sparse cluster.
#[derive(Debug, PartialEq, Eq)]
pub struct ClassicEnv {
    /// `(variable, addresses comma separated)`, in the order they are set.
    hosts: Vec<(&'static str, String)>,
}

impl ClassicEnv {
    fn new(addresses: &BTreeMap<ReplicaType, Vec<String>>) -> ClassicEnv {
        let list = |types: &[ReplicaType]| -> Option<String> {
            let mut present = types.iter().filter_map(|t| addresses.get(t)).filter(|l| !l.is_empty()).peekable();
            present.peek()?;
            Some(present.flatten().map(String::as_str).collect::<Vec<_>>().join(","))
        };
        let mut hosts =
            vec![(ENV_PS_HOSTS, list(&[ReplicaType::PS]).unwrap_or_default()), (ENV_WORKER_HOSTS, list(&[ReplicaType::Worker]).unwrap_or_default())];
        if let Some(chief) = list(&[ReplicaType::Chief, ReplicaType::Master]) {
            hosts.push((ENV_CHIEF_HOSTS, chief));
        }
        if let Some(evaluators) = list(&[ReplicaType::Evaluator]) {
            hosts.push((ENV_EVALUATOR_HOSTS, evaluators));
        }
        ClassicEnv { hosts }
    }

    /// The host list held in variable `name`, if it is one of them.
    fn hosts(&self, name: &str) -> Option<&str> {
        self.hosts.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    /// The host-list variables, in the order they are set.
    fn host_vars(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.hosts.iter().map(|(n, v)| (*n, v.as_str()))
    }
}

/// `TFJOB_JOB_NAME` and `TFJOB_TASK_INDEX` of replica (`rtype`, `index`).
fn task_vars(rtype: ReplicaType, index: i32) -> [(&'static str, String); 2] {
    [(ENV_JOB_NAME, classic_job(rtype).to_string()), (ENV_TASK_INDEX, index.to_string())]
}

/// One planning pass over the replicas of a job: every address is resolved and the cluster spec
/// written once, after which each replica costs only its own fields (a 10,000-replica job is
/// planned in linear time). Backend-neutral: the local backends start replicas from
/// [`ReplicaPlanner::replica`], the controller builds pods through [`PodPlanner`].
pub struct ReplicaPlanner<'a> {
    job_name: &'a str,
    specs: BTreeMap<ReplicaType, &'a ReplicaSpec>,
    addresses: BTreeMap<ReplicaType, Vec<String>>,
    /// `None` for a one-replica job (no `TF_CONFIG`).
    cluster: Option<Arc<ClusterJson>>,
    /// The classic host lists (every job, one-replica jobs included).
    classic: Arc<ClassicEnv>,
    has_chief: bool,
}

/// What every view of one replica (a [`PlannedReplica`], a [`PlannedPod`]) is built from.
struct Slot<'p> {
    spec: &'p ReplicaSpec,
    address: &'p str,
    tf_config: Option<TfConfig>,
    is_master_role: bool,
}

impl<'a> ReplicaPlanner<'a> {
    /// Plans job `job_name` with addresses from `addresses` (asked once per replica, here).
    pub fn new(job_name: &'a str, spec: &'a TFJobSpec, addresses: &dyn AddressBook) -> Self {
        let specs = api::replica_specs(spec);
        let resolved: BTreeMap<ReplicaType, Vec<String>> = specs
            .iter()
            .map(|(&t, rs)| {
                let port = replica_port(rs);
                let list = (0..rs.replicas.max(0)).map(|i| addresses.address(t, i, port)).collect();
                (t, list)
            })
            .collect();
        let dynamic = spec.enable_dynamic_worker.unwrap_or(false);
        let cluster = is_distributed(spec).then(|| Arc::new(ClusterJson::new(&resolved, dynamic)));
        let classic = Arc::new(ClassicEnv::new(&resolved));
        let has_chief = specs.keys().any(|t| t.is_chief());
        ReplicaPlanner { job_name, specs, addresses: resolved, cluster, classic, has_chief }
    }

    /// Name of the job.
    pub fn job_name(&self) -> &'a str {
        self.job_name
    }

    /// Every replica as (type, index) in plan order: type order (Chief, Master, PS, Worker,
    /// Evaluator), then index. Unknown replica types are skipped (validation rejects them).
    pub fn replica_ids(&self) -> impl Iterator<Item = (ReplicaType, i32)> + '_ {
        self.specs.iter().flat_map(|(&t, rs)| (0..rs.replicas.max(0)).map(move |i| (t, i)))
    }

    fn slot(&self, rtype: ReplicaType, index: i32) -> Option<Slot<'_>> {
        let spec = *self.specs.get(&rtype)?;
        let address = self.addresses.get(&rtype)?.get(usize::try_from(index).ok()?)?;
        let tf_config = self.cluster.as_ref().map(|cluster| TfConfig {
            cluster: Arc::clone(cluster),
            replica_type: rtype,
            index,
            view: match rtype {
                ReplicaType::Worker | ReplicaType::PS if cluster.dynamic => {
                    ClusterView::Sparse { own: (rtype == ReplicaType::Worker).then(|| address.clone()) }
                }
                _ => ClusterView::Full,
            },
        });
        Some(Slot { spec, address, tf_config, is_master_role: master_role(self.has_chief, rtype, index) })
    }

    /// The `TF_CONFIG` of replica (`rtype`, `index`): `None` for a one-replica job or when the
    /// job has no such replica.
    pub fn tf_config(&self, rtype: ReplicaType, index: i32) -> Option<TfConfig> {
        self.slot(rtype, index)?.tf_config
    }

    /// Replica (`rtype`, `index`) with what a backend needs to start it, its `TF_CONFIG`
    /// written out; `None` when the job has no such replica.
    pub fn replica(&self, rtype: ReplicaType, index: i32) -> Option<PlannedReplica> {
        let slot = self.slot(rtype, index)?;
        let container = tensorflow_container(slot.spec);
        let tf_config = slot.tf_config.as_ref().map(TfConfig::render);
        let hosts = self.classic.host_vars().map(|(n, v)| (n, v.to_string()));
        let classic = hosts.chain(task_vars(rtype, index)).map(|(name, value)| (name.to_string(), value));
        let manifest = container
            .and_then(|c| c.env.as_ref())
            .into_iter()
            .flatten()
            .filter(|e| !OPERATOR_ENV.contains(&e.name.as_str()) && e.value_from.is_none())
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()));
        let mut env: Vec<(String, String)> = classic.chain(manifest).collect();
        if let Some(cfg) = &tf_config {
            env.push((ENV_TF_CONFIG.to_string(), cfg.clone()));
        }
        Some(PlannedReplica {
            replica_type: rtype,
            index,
            pod_name: pod_name(self.job_name, rtype, index),
            restart_policy: slot.spec.restart_policy.clone(),
            port: replica_port(slot.spec),
            address: slot.address.to_string(),
            command: container.and_then(|c| c.command.clone()).unwrap_or_default(),
            args: container.and_then(|c| c.args.clone()).unwrap_or_default(),
            env,
            tf_config,
            is_master_role: slot.is_master_role,
            volumes: slot.spec.template.spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default(),
            volume_mounts: container.and_then(|c| c.volume_mounts.clone()).unwrap_or_default(),
        })
    }
}

/// Lists every replica of a job with what a backend needs to run it: its name, the `tensorflow`
/// container's command/args/literal env, and its `TF_CONFIG` built from `addresses`.
///
/// Replicas come in [`ReplicaPlanner::replica_ids`] order. `TFJOB_TOKEN` is not included: each
/// backend passes the token its own way. Every `TF_CONFIG` is written out: for a large job,
/// plan with a [`ReplicaPlanner`] and take the replicas one at a time.
pub fn plan_replicas(job_name: &str, spec: &TFJobSpec, addresses: &dyn AddressBook) -> Vec<PlannedReplica> {
    let planner = ReplicaPlanner::new(job_name, spec, addresses);
    planner.replica_ids().filter_map(|(t, i)| planner.replica(t, i)).collect()
}

/// Settings of the planner that come from the operator rather than the manifest.
#[derive(Clone, Debug, Default)]
pub struct PlanOptions {
    /// Cluster domain appended to replica addresses (e.g. `cluster.local`).
    pub cluster_domain: Option<String>,
    /// Gang scheduler, if any.
    pub gang_scheduler: Option<GangScheduler>,
    /// Give each job a NetworkPolicy that lets only its own pods reach its replicas' ports
    /// ([`build_network_policy`]).
    pub network_policy: bool,
}

impl PlanOptions {
    /// The options as the operator and `tfjob render` take them from their flags: an empty
    /// cluster domain is none, the gang scheduler is read by [`GangScheduler::from_setting`].
    pub fn from_settings(cluster_domain: Option<&str>, gang_scheduler: Option<&str>, network_policy: bool) -> PlanOptions {
        PlanOptions {
            cluster_domain: cluster_domain.filter(|d| !d.is_empty()).map(str::to_string),
            gang_scheduler: gang_scheduler.and_then(GangScheduler::from_setting),
            network_policy,
        }
    }
}

/// Everything the controller applies for a job.
#[derive(Clone, Debug)]
pub struct DesiredObjects {
    /// The token Secret (created once; the token never changes afterwards).
    pub secret: Secret,
    /// The headless Service.
    pub service: Service,
    /// One pod per replica, in [`ReplicaPlanner::replica_ids`] order.
    pub pods: Vec<PlannedPod>,
    /// The PodGroup when gang scheduling is configured.
    pub pod_group: Option<Value>,
    /// The NetworkPolicy when configured.
    pub network_policy: Option<NetworkPolicy>,
    /// The HorizontalPodAutoscaler of `elasticPolicy.metrics`.
    pub autoscaler: Option<HorizontalPodAutoscaler>,
}

/// Owner reference pointing at the job (controller, blocks owner deletion).
pub fn owner_reference(job: &TFJob) -> OwnerReference {
    OwnerReference {
        api_version: format!("{}/{}", api::GROUP, api::VERSION),
        kind: api::KIND.to_string(),
        name: job.name().to_string(),
        uid: job.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Labels common to every object of a job.
pub fn job_labels(job_name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(LABEL_OPERATOR_NAME.to_string(), OPERATOR_NAME.to_string()), (LABEL_JOB_NAME.to_string(), job_name.to_string())])
}

/// Label selector (as a string) of the pods of one replica type.
pub fn replica_selector(job_name: &str, rtype: ReplicaType) -> String {
    format!("{LABEL_JOB_NAME}={job_name},{LABEL_OPERATOR_NAME}={OPERATOR_NAME},{LABEL_REPLICA_TYPE}={}", rtype.lower())
}

fn meta(job: &TFJob, name: String, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: job.metadata.namespace.clone(),
        labels: Some(labels),
        owner_references: Some(vec![owner_reference(job)]),
        ..Default::default()
    }
}

fn namespace(job: &TFJob) -> String {
    job.metadata.namespace.clone().unwrap_or_else(|| "default".to_string())
}

/// The Secret of a job (`<job>-token`): its token (key `token`) and, when its replicas talk
/// over TLS, its CA (`ca.crt`, `ca.key`: [`tls::mount_tls`]).
pub fn build_secret(job: &TFJob, token: &str, ca: Option<&CaPem>) -> Secret {
    let mut data = BTreeMap::from([(SECRET_TOKEN_KEY.to_string(), ByteString(token.as_bytes().to_vec()))]);
    if let Some(ca) = ca {
        data.insert(CA_CERT_KEY.to_string(), ByteString(ca.cert_pem.as_bytes().to_vec()));
        data.insert(CA_KEY_KEY.to_string(), ByteString(ca.key_pem.as_bytes().to_vec()));
    }
    Secret {
        metadata: meta(job, api::secret_name(job.name()), job_labels(job.name())),
        type_: Some("Opaque".to_string()),
        data: Some(data),
        ..Default::default()
    }
}

/// Whether a job's replicas talk over TLS when their pods name each other as `layout` says: a
/// pod joining Kubeflow's (whose peers have no certificate) goes without.
pub fn replicas_use_tls(job: &TFJob, layout: AddressLayout) -> bool {
    layout == AddressLayout::Ours && tls::job_uses_tls(job)
}

/// The headless Service `<job>` that gives every replica its DNS name.
pub fn build_service(job: &TFJob) -> Service {
    let ports = job_ports(job)
        .into_iter()
        .enumerate()
        .map(|(i, port)| ServicePort {
            name: Some(if i == 0 { DEFAULT_PORT_NAME.to_string() } else { format!("{DEFAULT_PORT_NAME}-{port}") }),
            port,
            target_port: None,
            ..Default::default()
        })
        .collect();
    Service {
        metadata: meta(job, job.name().to_string(), job_labels(job.name())),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            publish_not_ready_addresses: Some(true),
            selector: Some(job_labels(job.name())),
            ports: Some(ports),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The ports of a job's replicas (`tfjob-port` of each replica type), sorted.
fn job_ports(job: &TFJob) -> BTreeSet<i32> {
    api::replica_specs(&job.spec).values().map(|rs| replica_port(rs)).collect()
}

/// The headless Service of one replica, as Kubeflow's training-operator makes it: named like the
/// pod, selecting it by the job's labels, its type and index, with the replica type's
/// `tfjob-port`. Only for a job in [`AddressLayout::Kubeflow`] (a replica index Kubeflow never
/// created, after a scale).
pub fn build_replica_service(job: &TFJob, rtype: ReplicaType, index: i32) -> Option<Service> {
    let rs = api::replica_specs(&job.spec).get(&rtype).copied()?;
    let mut selector = job_labels(job.name());
    selector.insert(LABEL_REPLICA_TYPE.into(), rtype.lower().into());
    selector.insert(LABEL_REPLICA_INDEX.into(), index.to_string());
    let port = ServicePort { name: Some(DEFAULT_PORT_NAME.to_string()), port: replica_port(rs), ..Default::default() };
    Some(Service {
        metadata: meta(job, pod_name(job.name(), rtype, index), selector.clone()),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector),
            ports: Some(vec![port]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The NetworkPolicy `<job>` of a job: on the job's pods, the replicas' ports (`tfjob-port`,
/// where the gRPC servers and the tensor channel listen, protected by the job's token) accept
/// connections from the job's own pods only. Every other port (metrics, TensorBoard, whatever
/// else a template serves) stays open as it was: TCP around the replicas' ports, all of UDP and
/// SCTP.
pub fn build_network_policy(job: &TFJob) -> NetworkPolicy {
    let tcp = |port: i32, end_port: Option<i32>| NetworkPolicyPort { port: Some(IntOrString::Int(port)), end_port, protocol: Some("TCP".to_string()) };
    let ports = job_ports(job);
    let mut other_ports = Vec::new();
    let mut next = 1;
    for &p in &ports {
        if p > next {
            other_ports.push(tcp(next, (p - 1 > next).then_some(p - 1)));
        }
        next = p + 1;
    }
    if next <= 65535 {
        other_ports.push(tcp(next, (next < 65535).then_some(65535)));
    }
    for protocol in ["UDP", "SCTP"] {
        other_ports.push(NetworkPolicyPort { protocol: Some(protocol.to_string()), ..Default::default() });
    }
    let job_pods = LabelSelector { match_labels: Some(job_labels(job.name())), match_expressions: None };
    NetworkPolicy {
        metadata: meta(job, job.name().to_string(), job_labels(job.name())),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(job_pods.clone()),
            policy_types: Some(vec!["Ingress".to_string()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: Some(vec![NetworkPolicyPeer { pod_selector: Some(job_pods), ..Default::default() }]),
                    ports: Some(ports.iter().map(|&p| tcp(p, None)).collect()),
                },
                NetworkPolicyIngressRule { from: None, ports: Some(other_ports) },
            ]),
            egress: None,
        }),
    }
}

/// A pod of the plan, complete but for the text of its `TF_CONFIG`. That text lists every
/// replica's address, so the pods of a 10,000-replica job written out at once would hold
/// gigabytes; [`PlannedPod::into_pod`] writes it when the pod is sent.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedPod {
    /// The pod; the `TF_CONFIG` and host-list variables of its `tensorflow` container have no
    /// value yet.
    pod: Pod,
    tf_config: Option<TfConfig>,
    classic: Arc<ClassicEnv>,
}

impl PlannedPod {
    /// Name of the pod.
    pub fn name(&self) -> &str {
        self.pod.metadata.name.as_deref().unwrap_or_default()
    }

    /// The pod's `TF_CONFIG` (`None` for a one-replica job).
    pub fn tf_config(&self) -> Option<&TfConfig> {
        self.tf_config.as_ref()
    }

    /// The pod to apply, with its `TF_CONFIG` and host lists written out.
    pub fn into_pod(mut self) -> Pod {
        let vars = self
            .pod
            .spec
            .iter_mut()
            .flat_map(|s| s.containers.iter_mut())
            .filter(|c| c.name == DEFAULT_CONTAINER_NAME)
            .flat_map(|c| c.env.iter_mut().flatten())
            .filter(|e| e.value.is_none() && e.value_from.is_none());
        for var in vars {
            if var.name == ENV_TF_CONFIG {
                var.value = self.tf_config.as_ref().map(TfConfig::render);
            } else if let Some(list) = self.classic.hosts(&var.name) {
                var.value = Some(list.to_string());
            }
        }
        self.pod
    }
}

/// One planning pass over the pods of a (defaulted) job, with addresses from [`ClusterDns`]:
/// the controller plans once per reconcile and builds each pod it creates from it.
pub struct PodPlanner<'a> {
    job: &'a TFJob,
    opts: &'a PlanOptions,
    replicas: ReplicaPlanner<'a>,
    kueue_group: Option<KueuePodGroup>,
    layout: AddressLayout,
    /// The replicas talk over TLS ([`replicas_use_tls`]).
    tls: bool,
}

impl<'a> PodPlanner<'a> {
    /// Plans `job` (resolves every address, writes the cluster spec).
    pub fn new(job: &'a TFJob, opts: &'a PlanOptions) -> Self {
        Self::with_layout(job, opts, AddressLayout::Ours)
    }

    /// Plans `job` with the pods naming each other as `layout` says.
    pub fn with_layout(job: &'a TFJob, opts: &'a PlanOptions, layout: AddressLayout) -> Self {
        let (name, namespace, cluster_domain) = (job.name().to_string(), namespace(job), opts.cluster_domain.clone());
        let replicas = match layout {
            AddressLayout::Ours => ReplicaPlanner::new(job.name(), &job.spec, &ClusterDns { job: name, namespace, cluster_domain }),
            AddressLayout::Kubeflow => ReplicaPlanner::new(job.name(), &job.spec, &KubeflowDns { job: name, namespace, cluster_domain }),
        };
        let tls = replicas_use_tls(job, layout);
        PodPlanner { job, opts, replicas, kueue_group: None, layout, tls }
    }

    /// Creates the pods as members of a Kueue pod group ([`gang::kueue_pod_group`]): marked as
    /// Kueue's pod webhook would mark them, gated until Kueue admits the group, with Kueue's
    /// finalizer.
    pub fn in_kueue_pod_group(mut self, group: Option<KueuePodGroup>) -> Self {
        self.kueue_group = group;
        self
    }

    /// Every pod of the job, in [`ReplicaPlanner::replica_ids`] order.
    pub fn pods(&self) -> impl Iterator<Item = PlannedPod> + '_ {
        self.replicas.replica_ids().filter_map(|(t, i)| self.pod(t, i))
    }

    /// The pod of replica (`rtype`, `index`); `None` when the job has no such replica.
    pub fn pod(&self, rtype: ReplicaType, index: i32) -> Option<PlannedPod> {
        let (job, opts) = (self.job, self.opts);
        let slot = self.replicas.slot(rtype, index)?;
        let name = pod_name(job.name(), rtype, index);
        let template = &slot.spec.template;
        let mut labels = template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
        labels.extend(job_labels(job.name()));
        labels.insert(LABEL_REPLICA_TYPE.into(), rtype.lower().into());
        labels.insert(LABEL_REPLICA_INDEX.into(), index.to_string());
        if slot.is_master_role {
            labels.insert(LABEL_JOB_ROLE.into(), "master".into());
        }
        let mut metadata = meta(job, name.clone(), labels);
        metadata.annotations = template.metadata.as_ref().and_then(|m| m.annotations.clone());
        let mut spec: PodSpec = template.spec.clone().unwrap_or_default();
        spec.restart_policy = Some(slot.spec.restart_policy.pod_restart_policy().to_string());
        if let Some(gang) = &opts.gang_scheduler {
            if let Some(scheduler) = gang.scheduler_name() {
                spec.scheduler_name = Some(scheduler.to_string());
            }
            if *gang == GangScheduler::Kubernetes {
                spec.scheduling_group = Some(PodSchedulingGroup { pod_group_name: Some(job.name().to_string()) });
            }
            let (labels, annotations) = gang.pod_marks(job.name(), rtype);
            metadata.labels.get_or_insert_with(BTreeMap::new).extend(labels.into_iter().map(|(k, v)| (k.to_string(), v)));
            if !annotations.is_empty() {
                metadata.annotations.get_or_insert_with(BTreeMap::new).extend(annotations.into_iter().map(|(k, v)| (k.to_string(), v)));
            }
        }
        if let Some(group) = &self.kueue_group {
            join_kueue_pod_group(&mut metadata, &mut spec, group, rtype);
        }
        let tensorflow = spec.containers.iter_mut().filter(|c| c.name == DEFAULT_CONTAINER_NAME);
        for c in tensorflow {
            c.env = Some(self.tensorflow_env(c.env.take().unwrap_or_default(), rtype, index, slot.tf_config.is_some()));
        }
        // TLS between the replicas: the job's CA mounted from its Secret.
        if self.tls {
            tls::mount_tls(&mut spec, &api::secret_name(job.name()));
        }
        if self.layout == AddressLayout::Ours {
            spec.hostname = Some(name);
            spec.subdomain = Some(job.name().to_string());
        }
        Some(PlannedPod { pod: Pod { metadata, spec: Some(spec), status: None }, tf_config: slot.tf_config, classic: Arc::clone(&self.replicas.classic) })
    }
}

impl PodPlanner<'_> {
    /// The `tensorflow` container's environment: the classic values first (the manifest's
    /// values may refer to them; the host lists' values are written by
    /// [`PlannedPod::into_pod`]), the manifest's own but those the operator sets, `TF_CONFIG`
    /// (also written when the pod is sent), and the job's token.
    fn tensorflow_env(&self, manifest: Vec<EnvVar>, rtype: ReplicaType, index: i32, has_tf_config: bool) -> Vec<EnvVar> {
        let hosts = self.replicas.classic.host_vars().map(|(name, _)| EnvVar { name: name.into(), value: None, value_from: None });
        let task = task_vars(rtype, index).map(|(name, value)| EnvVar { name: name.into(), value: Some(value), value_from: None });
        let mut env: Vec<EnvVar> = hosts.chain(task).collect();
        env.extend(manifest.into_iter().filter(|e| !OPERATOR_ENV.contains(&e.name.as_str())));
        if has_tf_config {
            env.push(EnvVar { name: ENV_TF_CONFIG.into(), value: None, value_from: None });
        }
        // The token the job's pods check each other's calls by; a pod joining Kubeflow's (which
        // hold none) goes without.
        if self.layout == AddressLayout::Ours {
            let token = SecretKeySelector { name: api::secret_name(self.job.name()), key: SECRET_TOKEN_KEY.into(), optional: Some(false) };
            let value_from = Some(EnvVarSource { secret_key_ref: Some(token), ..Default::default() });
            env.push(EnvVar { name: ENV_TOKEN.into(), value: None, value_from });
        }
        env
    }
}

fn join_kueue_pod_group(metadata: &mut ObjectMeta, spec: &mut PodSpec, group: &KueuePodGroup, rtype: ReplicaType) {
    let (labels, annotations) = group.pod_marks(rtype);
    metadata.labels.get_or_insert_with(BTreeMap::new).extend(labels.into_iter().map(|(k, v)| (k.to_string(), v)));
    metadata.annotations.get_or_insert_with(BTreeMap::new).extend(annotations.into_iter().map(|(k, v)| (k.to_string(), v)));
    metadata.finalizers.get_or_insert_with(Vec::new).push(gang::KUEUE_POD_FINALIZER.to_string());
    spec.scheduling_gates.get_or_insert_with(Vec::new).push(PodSchedulingGate { name: gang::KUEUE_ADMISSION_GATE.to_string() });
}

/// Total number of replicas of a job.
pub fn total_replicas(spec: &TFJobSpec) -> i32 {
    api::replica_specs(spec).values().map(|rs| rs.replicas.max(0)).sum()
}

/// The PodGroup of a job for the configured gang scheduler ([`gang::pod_group_spec`]).
pub fn build_pod_group(job: &TFJob, gang: &GangScheduler) -> Value {
    let owner = serde_json::to_value(owner_reference(job)).unwrap_or(Value::Null);
    json!({
        "apiVersion": gang.api_version(),
        "kind": "PodGroup",
        "metadata": {
            "name": job.name(),
            "namespace": namespace(job),
            "labels": job_labels(job.name()),
            "ownerReferences": [owner],
        },
        "spec": gang::pod_group_spec(&job.spec, gang),
    })
}

/// All objects the controller applies for a (defaulted, valid) job: Secret (with the job's CA
/// `ca` when its replicas talk over TLS), headless Service, one pod per replica and, with a gang
/// scheduler, a PodGroup.
pub fn desired_objects(job: &TFJob, token: &str, ca: Option<&CaPem>, opts: &PlanOptions) -> DesiredObjects {
    let pods = PodPlanner::new(job, opts).pods().collect();
    DesiredObjects {
        secret: build_secret(job, token, ca.filter(|_| replicas_use_tls(job, AddressLayout::Ours))),
        service: build_service(job),
        pods,
        pod_group: opts.gang_scheduler.as_ref().map(|g| build_pod_group(job, g)),
        network_policy: opts.network_policy.then(|| build_network_policy(job)),
        autoscaler: build_autoscaler(job),
    }
}

/// The HorizontalPodAutoscaler `<job>` of a job with `elasticPolicy.metrics`: it scales the
/// `Worker` replicas through the TFJob's scale subresource, within the policy's bounds.
pub fn build_autoscaler(job: &TFJob) -> Option<HorizontalPodAutoscaler> {
    let policy = job.spec.elastic_policy.as_ref().filter(|p| !p.metrics.is_empty())?;
    let workers = api::replica_specs(&job.spec).get(&ReplicaType::Worker).map_or(1, |rs| rs.replicas);
    let bounds = crate::autoscale::Bounds::of(policy, workers);
    Some(HorizontalPodAutoscaler {
        metadata: meta(job, job.name().to_string(), job_labels(job.name())),
        spec: HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some(format!("{}/{}", api::GROUP, api::VERSION)),
                kind: api::KIND.to_string(),
                name: job.name().to_string(),
            },
            min_replicas: Some(bounds.min),
            max_replicas: bounds.max,
            metrics: Some(policy.metrics.clone()),
            behavior: None,
        },
        status: None,
    })
}

/// The replica whose metrics page holds the job's progress, and the port of that page: ps 0
/// (it sees every step and hands out the data), when its `tensorflow` container serves metrics
/// (`--metrics_port`).
pub fn progress_source(job_name: &str, spec: &TFJobSpec) -> Option<(String, u16)> {
    let ps = api::replica_specs(spec).get(&ReplicaType::PS).copied().filter(|rs| rs.replicas > 0)?;
    Some((pod_name(job_name, ReplicaType::PS, 0), metrics_port_of(&api::runtime_args(ps))?))
}

/// The `--metrics_port` (or `--metrics-port`) of `tfjob-runtime` args.
pub fn metrics_port_of(args: &[String]) -> Option<u16> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        for flag in ["--metrics_port", "--metrics-port"] {
            match a.strip_prefix(flag) {
                Some("") => return it.next()?.parse().ok(),
                Some(v) if v.starts_with('=') => return v[1..].parse().ok(),
                _ => {}
            }
        }
    }
    None
}

/// Generates a random job token (64 hex characters).
pub fn random_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::parse_and_validate;

    fn job(yaml: &str) -> TFJob {
        parse_and_validate(serde_saphyr::from_str(yaml).unwrap()).unwrap()
    }

    fn mnist(extra_spec: &str, types: &[(&str, i32)]) -> TFJob {
        let mut y = String::from("apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {name: mnist, namespace: default, uid: u-1}\nspec:\n");
        y.push_str(extra_spec);
        y.push_str("  tfReplicaSpecs:\n");
        for (t, n) in types {
            y.push_str(&format!(
                "    {t}:\n      replicas: {n}\n      template:\n        spec:\n          containers: [{{name: tensorflow, image: \"tfjob-runtime:latest\", command: [tfjob-runtime], args: [\"--model=linear\"]}}]\n"
            ));
        }
        job(&y)
    }

    /// The pods of a plan as the controller sends them.
    fn rendered(pods: &[PlannedPod]) -> Vec<Pod> {
        pods.iter().cloned().map(PlannedPod::into_pod).collect()
    }

    fn cfg_of(j: &TFJob, name: &str) -> Option<String> {
        let dns = ClusterDns { job: "mnist".into(), namespace: "default".into(), cluster_domain: None };
        plan_replicas(j.name(), &j.spec, &dns).into_iter().find(|r| r.pod_name == name).unwrap().tf_config
    }

    #[test]
    fn tf_config_table() {
        let ps_workers = mnist("", &[("PS", 1), ("Worker", 2)]);
        let with_chief = mnist("", &[("Chief", 1), ("PS", 2), ("Worker", 1), ("Evaluator", 1)]);
        let dynamic = mnist("  enableDynamicWorker: true\n", &[("Chief", 1), ("PS", 2), ("Worker", 2)]);
        let dynamic_no_chief = mnist("  enableDynamicWorker: true\n", &[("PS", 2), ("Worker", 3)]);
        let dynamic_master = mnist("  enableDynamicWorker: true\n", &[("Master", 1), ("Worker", 3)]);
        let single = mnist("", &[("Worker", 1)]);
        let cases: Vec<(&TFJob, &str, Option<&str>)> = vec![
            (
                &ps_workers,
                "mnist-worker-1",
                Some(
                    r#"{"cluster":{"ps":["mnist-ps-0.mnist.default.svc:2222"],"worker":["mnist-worker-0.mnist.default.svc:2222","mnist-worker-1.mnist.default.svc:2222"]},"environment":"cloud","task":{"index":1,"type":"worker"}}"#,
                ),
            ),
            (
                &ps_workers,
                "mnist-ps-0",
                Some(
                    r#"{"cluster":{"ps":["mnist-ps-0.mnist.default.svc:2222"],"worker":["mnist-worker-0.mnist.default.svc:2222","mnist-worker-1.mnist.default.svc:2222"]},"environment":"cloud","task":{"index":0,"type":"ps"}}"#,
                ),
            ),
            (
                &with_chief,
                "mnist-evaluator-0",
                Some(
                    r#"{"cluster":{"chief":["mnist-chief-0.mnist.default.svc:2222"],"evaluator":["mnist-evaluator-0.mnist.default.svc:2222"],"ps":["mnist-ps-0.mnist.default.svc:2222","mnist-ps-1.mnist.default.svc:2222"],"worker":["mnist-worker-0.mnist.default.svc:2222"]},"environment":"cloud","task":{"index":0,"type":"evaluator"}}"#,
                ),
            ),
            // A dynamic worker: the chief, every ps, and itself by index.
            (
                &dynamic,
                "mnist-worker-1",
                Some(
                    r#"{"cluster":{"chief":["mnist-chief-0.mnist.default.svc:2222"],"ps":["mnist-ps-0.mnist.default.svc:2222","mnist-ps-1.mnist.default.svc:2222"],"worker":{"1":"mnist-worker-1.mnist.default.svc:2222"}},"environment":"cloud","task":{"index":1,"type":"worker"}}"#,
                ),
            ),
            // A ps of a dynamic job: the chief and every ps (it knows there are 2).
            (
                &dynamic,
                "mnist-ps-1",
                Some(
                    r#"{"cluster":{"chief":["mnist-chief-0.mnist.default.svc:2222"],"ps":["mnist-ps-0.mnist.default.svc:2222","mnist-ps-1.mnist.default.svc:2222"]},"environment":"cloud","task":{"index":1,"type":"ps"}}"#,
                ),
            ),
            // Without a chief: worker 0 is the chief, every worker knows its own index.
            (
                &dynamic_no_chief,
                "mnist-worker-0",
                Some(
                    r#"{"cluster":{"ps":["mnist-ps-0.mnist.default.svc:2222","mnist-ps-1.mnist.default.svc:2222"],"worker":{"0":"mnist-worker-0.mnist.default.svc:2222"}},"environment":"cloud","task":{"index":0,"type":"worker"}}"#,
                ),
            ),
            (
                &dynamic_no_chief,
                "mnist-ps-0",
                Some(
                    r#"{"cluster":{"ps":["mnist-ps-0.mnist.default.svc:2222","mnist-ps-1.mnist.default.svc:2222"]},"environment":"cloud","task":{"index":0,"type":"ps"}}"#,
                ),
            ),
            // A master is the chief's older name: listed the same way.
            (
                &dynamic_master,
                "mnist-worker-2",
                Some(
                    r#"{"cluster":{"master":["mnist-master-0.mnist.default.svc:2222"],"worker":{"2":"mnist-worker-2.mnist.default.svc:2222"}},"environment":"cloud","task":{"index":2,"type":"worker"}}"#,
                ),
            ),
            (
                &dynamic,
                "mnist-chief-0",
                Some(
                    r#"{"cluster":{"chief":["mnist-chief-0.mnist.default.svc:2222"],"ps":["mnist-ps-0.mnist.default.svc:2222","mnist-ps-1.mnist.default.svc:2222"],"worker":["mnist-worker-0.mnist.default.svc:2222","mnist-worker-1.mnist.default.svc:2222"]},"environment":"cloud","task":{"index":0,"type":"chief"}}"#,
                ),
            ),
            (&single, "mnist-worker-0", None),
        ];
        for (j, name, expected) in cases {
            assert_eq!(cfg_of(j, name).as_deref(), expected, "{name}");
        }
    }

    /// The straightforward `TF_CONFIG` of one replica: every address looked up, the whole
    /// document built as a `serde_json::Value` and serialised. The planners must write exactly
    /// this.
    fn reference_tf_config(spec: &TFJobSpec, rtype: ReplicaType, index: i32, addresses: &dyn AddressBook) -> String {
        let specs = api::replica_specs(spec);
        let mut full: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
        for (t, rs) in &specs {
            if rs.replicas <= 0 {
                continue;
            }
            let port = replica_port(rs);
            let list = (0..rs.replicas).map(|i| addresses.address(*t, i, port));
            full.insert(t.lower(), list.collect());
        }
        let dynamic = spec.enable_dynamic_worker.unwrap_or(false);
        let cluster = if dynamic && matches!(rtype, ReplicaType::Worker | ReplicaType::PS) {
            // Who the chief is and every ps; a worker also itself, keyed by its index.
            let mut m: serde_json::Map<String, Value> =
                full.iter().filter(|(t, _)| ["chief", "master", "ps"].contains(t)).map(|(t, list)| (t.to_string(), json!(list))).collect();
            if rtype == ReplicaType::Worker {
                let port = specs.get(&rtype).map(|rs| replica_port(rs)).unwrap();
                let own = json!({ index.to_string(): addresses.address(rtype, index, port) });
                m.insert(rtype.lower().into(), own);
            }
            Value::Object(m)
        } else {
            json!(full)
        };
        let cfg = json!({
            "cluster": cluster,
            "task": {"type": rtype.lower(), "index": index},
            "environment": "cloud",
        });
        serde_json::to_string(&cfg).unwrap()
    }

    /// The classic variables (`TFJOB_*` but the token) of a replica's env, in order.
    fn classic_vars(env: &[(String, String)]) -> Vec<(String, String)> {
        let not_classic = [ENV_TOKEN, tls::ENV_TLS_CERT, tls::ENV_TLS_KEY, tls::ENV_TLS_CA, tls::ENV_TLS_CA_KEY];
        env.iter().filter(|(n, _)| n.starts_with("TFJOB_") && !not_classic.contains(&n.as_str())).cloned().collect()
    }

    #[test]
    fn classic_env_table() {
        let ps_workers = mnist("", &[("PS", 1), ("Worker", 2)]);
        let everything = mnist("", &[("Chief", 1), ("PS", 2), ("Worker", 1), ("Evaluator", 2)]);
        let dynamic = mnist("  enableDynamicWorker: true\n", &[("Chief", 1), ("PS", 2), ("Worker", 3)]);
        let master = mnist("", &[("Master", 1), ("Worker", 2)]);
        let single = mnist("", &[("Worker", 1)]);
        let book = |t: ReplicaType, i: i32, port: i32| format!("{}{i}:{port}", t.lower());
        // (job, replica, the classic variables in order)
        type Case<'a> = (&'a TFJob, &'a str, &'a [(&'a str, &'a str)]);
        let cases: Vec<Case> = vec![
            (
                &ps_workers,
                "mnist-worker-1",
                &[(ENV_PS_HOSTS, "ps0:2222"), (ENV_WORKER_HOSTS, "worker0:2222,worker1:2222"), (ENV_JOB_NAME, "worker"), (ENV_TASK_INDEX, "1")],
            ),
            (
                &ps_workers,
                "mnist-ps-0",
                &[(ENV_PS_HOSTS, "ps0:2222"), (ENV_WORKER_HOSTS, "worker0:2222,worker1:2222"), (ENV_JOB_NAME, "ps"), (ENV_TASK_INDEX, "0")],
            ),
            (
                &everything,
                "mnist-chief-0",
                &[
                    (ENV_PS_HOSTS, "ps0:2222,ps1:2222"),
                    (ENV_WORKER_HOSTS, "worker0:2222"),
                    (ENV_CHIEF_HOSTS, "chief0:2222"),
                    (ENV_EVALUATOR_HOSTS, "evaluator0:2222,evaluator1:2222"),
                    (ENV_JOB_NAME, "chief"),
                    (ENV_TASK_INDEX, "0"),
                ],
            ),
            (
                &everything,
                "mnist-ps-1",
                &[
                    (ENV_PS_HOSTS, "ps0:2222,ps1:2222"),
                    (ENV_WORKER_HOSTS, "worker0:2222"),
                    (ENV_CHIEF_HOSTS, "chief0:2222"),
                    (ENV_EVALUATOR_HOSTS, "evaluator0:2222,evaluator1:2222"),
                    (ENV_JOB_NAME, "ps"),
                    (ENV_TASK_INDEX, "1"),
                ],
            ),
            (
                &everything,
                "mnist-evaluator-1",
                &[
                    (ENV_PS_HOSTS, "ps0:2222,ps1:2222"),
                    (ENV_WORKER_HOSTS, "worker0:2222"),
                    (ENV_CHIEF_HOSTS, "chief0:2222"),
                    (ENV_EVALUATOR_HOSTS, "evaluator0:2222,evaluator1:2222"),
                    (ENV_JOB_NAME, "evaluator"),
                    (ENV_TASK_INDEX, "1"),
                ],
            ),
            // Dynamic workers: TF_CONFIG is sparse, the classic lists are whole.
            (
                &dynamic,
                "mnist-worker-2",
                &[
                    (ENV_PS_HOSTS, "ps0:2222,ps1:2222"),
                    (ENV_WORKER_HOSTS, "worker0:2222,worker1:2222,worker2:2222"),
                    (ENV_CHIEF_HOSTS, "chief0:2222"),
                    (ENV_JOB_NAME, "worker"),
                    (ENV_TASK_INDEX, "2"),
                ],
            ),
            (
                &dynamic,
                "mnist-ps-0",
                &[
                    (ENV_PS_HOSTS, "ps0:2222,ps1:2222"),
                    (ENV_WORKER_HOSTS, "worker0:2222,worker1:2222,worker2:2222"),
                    (ENV_CHIEF_HOSTS, "chief0:2222"),
                    (ENV_JOB_NAME, "ps"),
                    (ENV_TASK_INDEX, "0"),
                ],
            ),
            // A Master is the chief under its older name; no ps: an empty list.
            (
                &master,
                "mnist-master-0",
                &[
                    (ENV_PS_HOSTS, ""),
                    (ENV_WORKER_HOSTS, "worker0:2222,worker1:2222"),
                    (ENV_CHIEF_HOSTS, "master0:2222"),
                    (ENV_JOB_NAME, "chief"),
                    (ENV_TASK_INDEX, "0"),
                ],
            ),
            // One replica: no TF_CONFIG, the classic values all the same.
            (&single, "mnist-worker-0", &[(ENV_PS_HOSTS, ""), (ENV_WORKER_HOSTS, "worker0:2222"), (ENV_JOB_NAME, "worker"), (ENV_TASK_INDEX, "0")]),
        ];
        for (j, name, want) in cases {
            let replica = plan_replicas(j.name(), &j.spec, &book).into_iter().find(|r| r.pod_name == name).unwrap();
            let want: Vec<(String, String)> = want.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
            assert_eq!(classic_vars(&replica.env), want, "{name}");
            // First in the env, before the manifest's own values.
            assert_eq!(replica.env[..want.len()], want[..], "{name}");
        }
        assert_eq!(classic_job(ReplicaType::Master), "chief");
    }

    #[test]
    fn manifest_env_comes_after_the_classic_values_and_cannot_replace_them() {
        let y = r#"
apiVersion: kubeflow.org/v1
kind: TFJob
metadata: {name: mnist, namespace: default, uid: u-1}
spec:
  tfReplicaSpecs:
    PS:
      replicas: 1
      template:
        spec:
          containers: [{name: tensorflow, image: img, env: [{name: FLAGS, value: "--ps_hosts=$(TFJOB_PS_HOSTS)"}, {name: TFJOB_PS_HOSTS, value: "mine:1"}, {name: TFJOB_TASK_INDEX, value: "7"}]}]
    Worker:
      replicas: 1
      template:
        spec:
          containers: [{name: tensorflow, image: img}]
"#;
        let j = job(y);
        let replicas = plan_replicas("mnist", &j.spec, &|t: ReplicaType, i: i32, _| format!("{}{i}:1", t.lower()));
        let names: Vec<&str> = replicas[0].env.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, [ENV_PS_HOSTS, ENV_WORKER_HOSTS, ENV_JOB_NAME, ENV_TASK_INDEX, "FLAGS", ENV_TF_CONFIG]);
        assert_eq!(replicas[0].env[0].1, "ps0:1");
        assert_eq!(replicas[0].env[3].1, "0");
        assert_eq!(replicas[0].env[4].1, "--ps_hosts=$(TFJOB_PS_HOSTS)");
        // The pod: the same order, then the token; every classic value written out.
        let pod = desired_objects(&j, "t", None, &PlanOptions::default()).pods.remove(0).into_pod();
        let env = pod.spec.unwrap().containers[0].env.clone().unwrap();
        let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, [ENV_PS_HOSTS, ENV_WORKER_HOSTS, ENV_JOB_NAME, ENV_TASK_INDEX, "FLAGS", ENV_TF_CONFIG, ENV_TOKEN]);
        assert_eq!(env[0].value.as_deref(), Some("mnist-ps-0.mnist.default.svc:2222"));
        assert_eq!(env[1].value.as_deref(), Some("mnist-worker-0.mnist.default.svc:2222"));
    }

    /// The straightforward classic variables of one replica: every address looked up and
    /// joined. The planners must give exactly these.
    fn reference_classic(spec: &TFJobSpec, rtype: ReplicaType, index: i32, addresses: &dyn AddressBook) -> Vec<(String, String)> {
        let specs = api::replica_specs(spec);
        let list = |types: &[ReplicaType]| -> Vec<String> {
            types
                .iter()
                .filter_map(|t| specs.get(t).map(|rs| (*t, rs)))
                .flat_map(|(t, rs)| (0..rs.replicas).map(move |i| (t, i, replica_port(rs))))
                .map(|(t, i, port)| addresses.address(t, i, port))
                .collect()
        };
        let mut out = vec![(ENV_PS_HOSTS, list(&[ReplicaType::PS]).join(",")), (ENV_WORKER_HOSTS, list(&[ReplicaType::Worker]).join(","))];
        let chief = list(&[ReplicaType::Chief, ReplicaType::Master]);
        if !chief.is_empty() {
            out.push((ENV_CHIEF_HOSTS, chief.join(",")));
        }
        let evaluators = list(&[ReplicaType::Evaluator]);
        if !evaluators.is_empty() {
            out.push((ENV_EVALUATOR_HOSTS, evaluators.join(",")));
        }
        let job = match rtype {
            ReplicaType::Chief | ReplicaType::Master => "chief",
            other => other.lower(),
        };
        out.push((ENV_JOB_NAME, job.to_string()));
        out.push((ENV_TASK_INDEX, index.to_string()));
        out.into_iter().map(|(n, v)| (n.to_string(), v)).collect()
    }

    #[test]
    fn fast_tf_config_equals_the_straightforward_one() {
        let dynamic = "  enableDynamicWorker: true\n";
        let ports = r#"
apiVersion: kubeflow.org/v1
kind: TFJob
metadata: {name: ports, namespace: team-a}
spec:
  enableDynamicWorker: true
  tfReplicaSpecs:
    PS:
      replicas: 2
      template:
        spec:
          containers: [{name: tensorflow, image: img, ports: [{name: tfjob-port, containerPort: 3333}]}]
    Worker:
      replicas: 3
      template:
        spec:
          containers: [{name: tensorflow, image: img, ports: [{name: tfjob-port, containerPort: 4444}]}]
    Evaluator:
      replicas: 1
      template:
        spec:
          containers: [{name: tensorflow, image: img}]
"#;
        let jobs = [
            mnist("", &[("PS", 1), ("Worker", 2)]),
            mnist("", &[("Chief", 1), ("PS", 2), ("Worker", 3), ("Evaluator", 1)]),
            mnist(dynamic, &[("Chief", 1), ("PS", 2), ("Worker", 3), ("Evaluator", 1)]),
            mnist(dynamic, &[("Master", 1), ("Worker", 3)]),
            mnist(dynamic, &[("Chief", 1), ("PS", 2), ("Worker", 0)]),
            mnist(dynamic, &[("PS", 3), ("Worker", 2)]),
            mnist("", &[("Worker", 1)]),
            mnist("", &[("Worker", 40)]),
            job(ports),
        ];
        let local = |t: ReplicaType, i: i32, port: i32| format!("127.0.0.1:{}", port + 100 * t as i32 + i);
        // Characters JSON escapes: both paths must escape them alike.
        let odd = |t: ReplicaType, i: i32, port: i32| format!("h\"{}\\{i}\u{e9}\n\u{1}:{port}", t.lower());
        let mut checked = 0;
        for j in &jobs {
            let dns = ClusterDns { job: j.name().to_string(), namespace: namespace(j), cluster_domain: Some("cluster.local".into()) };
            let books: [&dyn AddressBook; 3] = [&dns, &local, &odd];
            for book in books {
                let planner = ReplicaPlanner::new(j.name(), &j.spec, book);
                for (t, i) in planner.replica_ids() {
                    let want = is_distributed(&j.spec).then(|| reference_tf_config(&j.spec, t, i, book));
                    let fast = planner.tf_config(t, i).map(|c| c.render());
                    assert_eq!(fast, want, "{} {t} {i}", j.name());
                    let replica = planner.replica(t, i).unwrap();
                    assert_eq!(replica.tf_config, want);
                    let classic = reference_classic(&j.spec, t, i, book);
                    assert_eq!(classic_vars(&replica.env), classic, "{} {t} {i}", j.name());
                    checked += 1;
                }
            }
            // The controller's pods carry the same text once written out.
            let opts = PlanOptions { cluster_domain: Some("cluster.local".into()), gang_scheduler: None, ..Default::default() };
            let planner = PodPlanner::new(j, &opts);
            for (t, i) in planner.replicas.replica_ids() {
                let pod = planner.pod(t, i).unwrap().into_pod();
                let env = pod.spec.unwrap().containers[0].env.clone().unwrap();
                let cfg = env.iter().find(|e| e.name == ENV_TF_CONFIG);
                let want = is_distributed(&j.spec).then(|| reference_tf_config(&j.spec, t, i, &dns));
                assert_eq!(cfg.and_then(|e| e.value.clone()), want, "{} {t} {i}", j.name());
                let classic: Vec<(String, String)> = env.iter().map(|e| (e.name.clone(), e.value.clone().unwrap_or_default())).collect();
                assert_eq!(classic_vars(&classic), reference_classic(&j.spec, t, i, &dns), "{} {t} {i}", j.name());
            }
        }
        assert_eq!(checked, 3 * (3 + 7 + 7 + 4 + 3 + 5 + 1 + 40 + 6));
    }

    #[test]
    fn cluster_domain_and_custom_port() {
        let y = r#"
apiVersion: kubeflow.org/v1
kind: TFJob
metadata: {name: dist, namespace: team-a}
spec:
  tfReplicaSpecs:
    Worker:
      replicas: 2
      template:
        spec:
          containers:
          - name: tensorflow
            image: img
            ports: [{name: tfjob-port, containerPort: 3333}]
"#;
        let j = job(y);
        let dns = ClusterDns { job: "dist".into(), namespace: "team-a".into(), cluster_domain: Some("cluster.local".into()) };
        let r = plan_replicas("dist", &j.spec, &dns);
        assert_eq!(r[0].address, "dist-worker-0.dist.team-a.svc.cluster.local:3333");
        assert_eq!(
            r[0].tf_config.as_deref(),
            Some(
                r#"{"cluster":{"worker":["dist-worker-0.dist.team-a.svc.cluster.local:3333","dist-worker-1.dist.team-a.svc.cluster.local:3333"]},"environment":"cloud","task":{"index":0,"type":"worker"}}"#
            )
        );
        let svc = build_service(&j);
        let ports = svc.spec.unwrap().ports.unwrap();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].port, 3333);
    }

    #[test]
    fn local_addresses_come_from_the_caller() {
        let j = mnist("", &[("PS", 1), ("Worker", 2)]);
        let local = |t: ReplicaType, i: i32, _port: i32| {
            let base = match t {
                ReplicaType::PS => 5000,
                _ => 6000,
            };
            format!("127.0.0.1:{}", base + i)
        };
        let r = plan_replicas("mnist", &j.spec, &local);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].pod_name, "mnist-ps-0");
        assert_eq!(r[0].command, vec!["tfjob-runtime".to_string()]);
        assert_eq!(r[0].args, vec!["--model=linear".to_string()]);
        assert_eq!(
            r[2].tf_config.as_deref(),
            Some(
                r#"{"cluster":{"ps":["127.0.0.1:5000"],"worker":["127.0.0.1:6000","127.0.0.1:6001"]},"environment":"cloud","task":{"index":1,"type":"worker"}}"#
            )
        );
        assert_eq!(r[2].env.last().unwrap().0, "TF_CONFIG");
        assert!(r[1].is_master_role && !r[2].is_master_role && !r[0].is_master_role);
    }

    #[test]
    fn pod_spec() {
        let y = r#"
apiVersion: kubeflow.org/v1
kind: TFJob
metadata: {name: mnist, namespace: default, uid: u-1}
spec:
  tfReplicaSpecs:
    Chief:
      template:
        metadata: {labels: {team: a}, annotations: {note: x}}
        spec:
          containers: [{name: tensorflow, image: img, env: [{name: A, value: b}, {name: TF_CONFIG, value: stale}]}]
    Worker:
      replicas: 1
      restartPolicy: ExitCode
      template:
        spec:
          containers: [{name: tensorflow, image: img}, {name: sidecar, image: side}]
"#;
        let j = job(y);
        let d = desired_objects(&j, "tok", None, &PlanOptions::default());
        let pods = rendered(&d.pods);
        assert_eq!(pods.len(), 2);
        let chief = &pods[0];
        let m = &chief.metadata;
        assert_eq!(m.name.as_deref(), Some("mnist-chief-0"));
        let labels = m.labels.clone().unwrap();
        let expected: BTreeMap<String, String> = [
            ("team", "a"),
            (LABEL_OPERATOR_NAME, OPERATOR_NAME),
            (LABEL_JOB_NAME, "mnist"),
            (LABEL_REPLICA_TYPE, "chief"),
            (LABEL_REPLICA_INDEX, "0"),
            (LABEL_JOB_ROLE, "master"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(labels, expected);
        assert_eq!(m.annotations.clone().unwrap()["note"], "x");
        let owner = &m.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str(), owner.controller), ("TFJob", "mnist", "u-1", Some(true)));
        let spec = chief.spec.as_ref().unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("mnist-chief-0"));
        assert_eq!(spec.subdomain.as_deref(), Some("mnist"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let env = spec.containers[0].env.clone().unwrap();
        let names: Vec<_> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, vec![ENV_PS_HOSTS, ENV_WORKER_HOSTS, ENV_CHIEF_HOSTS, ENV_JOB_NAME, ENV_TASK_INDEX, "A", "TF_CONFIG", "TFJOB_TOKEN"]);
        let env = &env[5..];
        assert_eq!(
            env[1].value.as_deref(),
            Some(
                r#"{"cluster":{"chief":["mnist-chief-0.mnist.default.svc:2222"],"worker":["mnist-worker-0.mnist.default.svc:2222"]},"environment":"cloud","task":{"index":0,"type":"chief"}}"#
            )
        );
        let sel = env[2].value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        assert_eq!((sel.name.as_str(), sel.key.as_str()), ("mnist-token", "token"));
        let worker = &pods[1];
        let wl = worker.metadata.labels.clone().unwrap();
        assert!(!wl.contains_key(LABEL_JOB_ROLE));
        let ws = worker.spec.as_ref().unwrap();
        assert_eq!(ws.restart_policy.as_deref(), Some("Never"));
        assert!(ws.containers[1].env.is_none(), "sidecar untouched");
        assert_eq!(ws.containers[0].ports.as_ref().unwrap()[0].container_port, 2222);

        let svc = &d.service;
        assert_eq!(svc.metadata.name.as_deref(), Some("mnist"));
        let ss = svc.spec.as_ref().unwrap();
        assert_eq!(ss.cluster_ip.as_deref(), Some("None"));
        assert_eq!(ss.publish_not_ready_addresses, Some(true));
        assert_eq!(ss.selector.clone().unwrap(), job_labels("mnist"));
        assert_eq!(d.secret.metadata.name.as_deref(), Some("mnist-token"));
        assert_eq!(d.secret.data.as_ref().unwrap()["token"].0, b"tok".to_vec());
        assert!(d.pod_group.is_none());
    }

    /// The job's Secret holds its CA when, and only when, its replicas talk over TLS.
    #[test]
    fn the_job_secret_holds_the_ca_of_a_tls_job() {
        let ca = CaPem { cert_pem: "C".into(), key_pem: "K".into() };
        let tls = mnist("", &[("PS", 1), ("Worker", 2)]);
        let mut plaintext = tls.clone();
        plaintext.metadata.annotations = Some([(tls::TLS_ANNOTATION.to_string(), "false".to_string())].into());
        // (job, the CA given, the Secret's keys and values)
        type Case<'a> = (&'a TFJob, Option<&'a CaPem>, &'a [(&'a str, &'a str)]);
        let cases: [Case; 3] = [
            (&tls, Some(&ca), &[("ca.crt", "C"), ("ca.key", "K"), ("token", "tok")]),
            (&tls, None, &[("token", "tok")]),
            (&plaintext, Some(&ca), &[("token", "tok")]),
        ];
        for (job, ca, want) in cases {
            let data = desired_objects(job, "tok", ca, &PlanOptions::default()).secret.data.unwrap();
            let got: Vec<(&str, &str)> = data.iter().map(|(k, v)| (k.as_str(), std::str::from_utf8(&v.0).unwrap())).collect();
            assert_eq!(got, want);
        }
    }

    /// A pod created for a job started under Kubeflow (a restart, a new index) names its peers
    /// as Kubeflow's pods do, and goes without hostname, subdomain and token; this operator's
    /// layout is untouched.
    #[test]
    fn pods_joining_a_job_started_under_kubeflow_take_its_addresses() {
        let j = mnist("", &[("PS", 1), ("Worker", 2)]);
        let opts = PlanOptions { cluster_domain: Some("cluster.local".into()), ..Default::default() };
        // (layout, worker 1's TF_CONFIG cluster, hostname, subdomain, has a token and TLS)
        let cases = [
            (
                AddressLayout::Kubeflow,
                r#"{"ps":["mnist-ps-0.default.svc.cluster.local:2222"],"worker":["mnist-worker-0.default.svc.cluster.local:2222","mnist-worker-1.default.svc.cluster.local:2222"]}"#,
                None,
                None,
                false,
            ),
            (
                AddressLayout::Ours,
                r#"{"ps":["mnist-ps-0.mnist.default.svc.cluster.local:2222"],"worker":["mnist-worker-0.mnist.default.svc.cluster.local:2222","mnist-worker-1.mnist.default.svc.cluster.local:2222"]}"#,
                Some("mnist-worker-1"),
                Some("mnist"),
                true,
            ),
        ];
        for (layout, cluster, hostname, subdomain, token) in cases {
            let planned = PodPlanner::with_layout(&j, &opts, layout).pod(ReplicaType::Worker, 1).unwrap();
            assert_eq!(replicas_use_tls(&j, layout), token, "{layout:?}");
            let pod = planned.into_pod();
            let spec = pod.spec.unwrap();
            let env = spec.containers[0].env.clone().unwrap();
            let tf_config: Value = serde_json::from_str(env.iter().find(|e| e.name == ENV_TF_CONFIG).unwrap().value.as_deref().unwrap()).unwrap();
            assert_eq!(tf_config["cluster"].to_string(), cluster, "{layout:?}");
            assert_eq!((spec.hostname.as_deref(), spec.subdomain.as_deref()), (hostname, subdomain), "{layout:?}");
            assert_eq!(env.iter().any(|e| e.name == ENV_TOKEN), token, "{layout:?}");
            assert_eq!(env.iter().any(|e| e.name == tls::ENV_TLS_CA_KEY), token, "{layout:?}");
            let ca_volume = spec.volumes.iter().flatten().find(|v| v.name == tls::TLS_VOLUME);
            assert_eq!(ca_volume.and_then(|v| v.secret.as_ref()?.secret_name.as_deref()), token.then_some("mnist-token"), "{layout:?}");
        }
        let svc = build_replica_service(&j, ReplicaType::Worker, 2).unwrap();
        assert_eq!(svc.metadata.name.as_deref(), Some("mnist-worker-2"));
        let spec = svc.spec.unwrap();
        let selector = spec.selector.unwrap();
        assert_eq!(
            (selector[LABEL_JOB_NAME].as_str(), selector[LABEL_REPLICA_TYPE].as_str(), selector[LABEL_REPLICA_INDEX].as_str()),
            ("mnist", "worker", "2")
        );
        assert_eq!((spec.cluster_ip.as_deref(), spec.ports.unwrap()[0].port), (Some("None"), 2222));
        assert!(build_replica_service(&j, ReplicaType::Chief, 0).is_none());
    }

    /// Which layout a job's live pods say it has: Kubeflow's while one of its pods was made
    /// without a subdomain; a pod being deleted does not count.
    #[test]
    fn address_layout_of_a_jobs_pods() {
        let pod = |subdomain: Option<&str>, deleting: bool| Pod {
            metadata: ObjectMeta {
                deletion_timestamp: deleting.then(|| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default())),
                ..Default::default()
            },
            spec: Some(PodSpec { subdomain: subdomain.map(str::to_string), ..Default::default() }),
            status: None,
        };
        let (ours, kubeflow, kubeflow_going) = (pod(Some("mnist"), false), pod(None, false), pod(None, true));
        let cases: [(&[&Pod], AddressLayout); 5] = [
            (&[], AddressLayout::Ours),
            (&[&ours], AddressLayout::Ours),
            (&[&kubeflow], AddressLayout::Kubeflow),
            (&[&ours, &kubeflow], AddressLayout::Kubeflow),
            (&[&ours, &kubeflow_going], AddressLayout::Ours),
        ];
        for (pods, want) in cases {
            assert_eq!(AddressLayout::of_pods(pods.iter().copied()), want, "{} pod(s)", pods.len());
        }
    }

    #[test]
    fn options_from_settings() {
        let none = PlanOptions::from_settings(Some(""), Some("none"), false);
        assert_eq!((none.cluster_domain, none.gang_scheduler, none.network_policy), (None, None, false));
        let all = PlanOptions::from_settings(Some("cluster.local"), Some("volcano"), true);
        assert_eq!((all.cluster_domain.as_deref(), all.gang_scheduler, all.network_policy), (Some("cluster.local"), Some(GangScheduler::Volcano), true));
        let plugins = PlanOptions::from_settings(None, Some("scheduler-plugins-scheduler"), false);
        assert_eq!(plugins.gang_scheduler, Some(GangScheduler::SchedulerPlugins("scheduler-plugins-scheduler".into())));
    }

    #[test]
    fn gang_scheduling() {
        let j = mnist("  runPolicy:\n    schedulingPolicy: {queue: q1, priorityClass: high}\n", &[("PS", 2), ("Worker", 3)]);
        let opts = PlanOptions { cluster_domain: None, gang_scheduler: Some(GangScheduler::Volcano), ..Default::default() };
        let d = desired_objects(&j, "t", None, &opts);
        let pg = d.pod_group.unwrap();
        assert_eq!(pg["apiVersion"], "scheduling.volcano.sh/v1beta1");
        assert_eq!(pg["metadata"]["name"], "mnist");
        assert_eq!(pg["spec"], json!({"minMember": 5, "queue": "q1", "priorityClassName": "high"}));
        let p = &rendered(&d.pods)[0];
        assert_eq!(p.spec.as_ref().unwrap().scheduler_name.as_deref(), Some("volcano"));
        assert_eq!(p.metadata.annotations.as_ref().unwrap()["scheduling.k8s.io/group-name"], "mnist");

        let j2 = mnist("  runPolicy:\n    schedulingPolicy: {minAvailable: 2, scheduleTimeoutSeconds: 30}\n", &[("Worker", 3)]);
        let opts = PlanOptions { cluster_domain: None, gang_scheduler: GangScheduler::from_setting("scheduler-plugins-scheduler"), ..Default::default() };
        let d = desired_objects(&j2, "t", None, &opts);
        let pg = d.pod_group.unwrap();
        assert_eq!(pg["apiVersion"], "scheduling.x-k8s.io/v1alpha1");
        assert_eq!(pg["spec"], json!({"minMember": 2, "scheduleTimeoutSeconds": 30}));
        let pods = rendered(&d.pods);
        assert_eq!(pods[2].metadata.labels.as_ref().unwrap()["scheduling.x-k8s.io/pod-group"], "mnist");
        assert_eq!(pods[2].spec.as_ref().unwrap().scheduler_name.as_deref(), Some("scheduler-plugins-scheduler"));

        // Kubernetes' own gangs: each pod names the job's PodGroup; the scheduler stays the default.
        let opts = PlanOptions { cluster_domain: None, gang_scheduler: GangScheduler::from_setting("kubernetes"), ..Default::default() };
        let d = desired_objects(&j2, "t", None, &opts);
        assert_eq!(d.pod_group.unwrap()["apiVersion"], "scheduling.k8s.io/v1beta1");
        for p in rendered(&d.pods) {
            let spec = p.spec.unwrap();
            assert_eq!((spec.scheduling_group.and_then(|g| g.pod_group_name).as_deref(), spec.scheduler_name), (Some("mnist"), None));
        }
    }

    #[test]
    fn pods_of_a_kueue_pod_group_are_gated_and_marked_as_kueues_webhook_would() {
        let j = mnist("", &[("PS", 1), ("Worker", 2)]);
        let opts = PlanOptions::default();
        let group = KueuePodGroup { name: "mnist-0123abcd-g1".into(), queue: "team".into(), total: 3, priority_class: Some("high".into()) };
        let planner = PodPlanner::new(&j, &opts).in_kueue_pod_group(Some(group));
        let pod = planner.pod(ReplicaType::Worker, 1).unwrap().into_pod();
        let labels = pod.metadata.labels.unwrap();
        let annotations = pod.metadata.annotations.unwrap();
        let mark = |m: &BTreeMap<String, String>, k: &str| m.get(k).cloned().unwrap_or_default();
        assert_eq!(
            [
                mark(&labels, "kueue.x-k8s.io/managed"),
                mark(&labels, "kueue.x-k8s.io/queue-name"),
                mark(&labels, "kueue.x-k8s.io/pod-group-name"),
                mark(&labels, "kueue.x-k8s.io/priority-class"),
                mark(&annotations, "kueue.x-k8s.io/pod-group-total-count"),
                mark(&annotations, "kueue.x-k8s.io/role-hash"),
            ],
            ["true", "team", "mnist-0123abcd-g1", "high", "3", "worker"]
        );
        assert_eq!(pod.metadata.finalizers, Some(vec!["kueue.x-k8s.io/managed".to_string()]));
        let gates: Vec<String> = pod.spec.unwrap().scheduling_gates.unwrap().into_iter().map(|g| g.name).collect();
        assert_eq!(gates, ["kueue.x-k8s.io/admission"]);
        // Without a group: none of it.
        let plain = PodPlanner::new(&j, &opts).pod(ReplicaType::PS, 0).unwrap().into_pod();
        assert!(plain.metadata.finalizers.is_none() && plain.spec.unwrap().scheduling_gates.is_none());
    }

    #[test]
    fn planner_replica_matches_plan_replicas() {
        let j = mnist("", &[("Master", 1), ("PS", 2), ("Worker", 3)]);
        let dns = ClusterDns { job: "mnist".into(), namespace: "default".into(), cluster_domain: None };
        let all = plan_replicas("mnist", &j.spec, &dns);
        assert_eq!(all.len(), 6);
        let planner = ReplicaPlanner::new("mnist", &j.spec, &dns);
        for r in &all {
            assert_eq!(planner.replica(r.replica_type, r.index).as_ref(), Some(r));
        }
        assert!(planner.replica(ReplicaType::Worker, 3).is_none());
        assert!(planner.replica(ReplicaType::Worker, -1).is_none());
        assert!(planner.replica(ReplicaType::Chief, 0).is_none());
        assert!(planner.tf_config(ReplicaType::Chief, 0).is_none());
        assert_eq!(
            all[0].tf_config.as_deref(),
            Some(
                r#"{"cluster":{"master":["mnist-master-0.mnist.default.svc:2222"],"ps":["mnist-ps-0.mnist.default.svc:2222","mnist-ps-1.mnist.default.svc:2222"],"worker":["mnist-worker-0.mnist.default.svc:2222","mnist-worker-1.mnist.default.svc:2222","mnist-worker-2.mnist.default.svc:2222"]},"environment":"cloud","task":{"index":0,"type":"master"}}"#
            )
        );
        assert!(all[0].is_master_role && !all[3].is_master_role);
    }

    #[test]
    fn scaling_changes_the_cluster_of_new_pods() {
        let small = mnist("", &[("Worker", 2)]);
        let big = mnist("", &[("Worker", 3)]);
        assert_eq!(cfg_of(&small, "mnist-worker-0").unwrap().matches("mnist-worker-").count(), 2);
        assert_eq!(cfg_of(&big, "mnist-worker-2").unwrap().matches("mnist-worker-").count(), 3);
    }

    #[test]
    fn network_policy_opens_the_replica_ports_to_the_job_only() {
        /// (protocol, port, endPort) of a rule's ports.
        fn ports(rule: &NetworkPolicyIngressRule) -> Vec<(String, Option<i32>, Option<i32>)> {
            rule.ports
                .iter()
                .flatten()
                .map(|p| {
                    let port = match &p.port {
                        Some(IntOrString::Int(n)) => Some(*n),
                        _ => None,
                    };
                    (p.protocol.clone().unwrap_or_default(), port, p.end_port)
                })
                .collect()
        }
        let tcp = |a: i32, b: Option<i32>| ("TCP".to_string(), Some(a), b);
        let rest = [("UDP".to_string(), None, None), ("SCTP".to_string(), None, None)];
        let with_port = |t: &str, port: i32| {
            format!(
                "    {t}:\n      template:\n        spec:\n          containers: [{{name: tensorflow, image: i, ports: [{{name: tfjob-port, containerPort: {port}}}]}}]\n"
            )
        };
        // (replica sets, the job's ports, every other port)
        let cases = vec![
            (mnist("", &[("Worker", 2)]), vec![tcp(2222, None)], vec![tcp(1, Some(2221)), tcp(2223, Some(65535))]),
            (
                job(&format!(
                    "apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {{name: mnist, namespace: default, uid: u-1}}\nspec:\n  tfReplicaSpecs:\n{}{}",
                    with_port("PS", 1),
                    with_port("Worker", 3)
                )),
                vec![tcp(1, None), tcp(3, None)],
                vec![tcp(2, None), tcp(4, Some(65535))],
            ),
            (
                job(&format!(
                    "apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {{name: mnist, namespace: default, uid: u-1}}\nspec:\n  tfReplicaSpecs:\n{}",
                    with_port("Worker", 65535)
                )),
                vec![tcp(65535, None)],
                vec![tcp(1, Some(65534))],
            ),
        ];
        for (j, own, others) in cases {
            let np = build_network_policy(&j);
            assert_eq!(np.metadata.name.as_deref(), Some("mnist"));
            assert_eq!(np.metadata.owner_references, Some(vec![owner_reference(&j)]));
            let spec = np.spec.unwrap();
            let job_pods = Some(job_labels("mnist"));
            assert_eq!(spec.pod_selector.unwrap().match_labels, job_pods);
            assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
            let rules = spec.ingress.unwrap();
            assert_eq!(rules.len(), 2);
            let from = rules[0].from.clone().unwrap();
            assert_eq!(from.len(), 1);
            assert_eq!(from[0].pod_selector.clone().unwrap().match_labels, job_pods);
            assert!(from[0].namespace_selector.is_none() && from[0].ip_block.is_none());
            assert_eq!(ports(&rules[0]), own);
            assert!(rules[1].from.is_none(), "other ports: from anywhere");
            let mut want = others.clone();
            want.extend(rest.iter().cloned());
            assert_eq!(ports(&rules[1]), want);
        }
    }

    #[test]
    fn tokens_are_random() {
        let a = random_token();
        assert_eq!(a.len(), 64);
        assert_ne!(a, random_token());
    }

    #[test]
    fn elastic_metrics_make_an_autoscaler_of_the_worker_replicas() {
        let policy = "  elasticPolicy:\n    minReplicas: 1\n    maxReplicas: 5\n    metrics:\n    - type: Resource\n      resource: {name: cpu, target: {type: Utilization, averageUtilization: 80}}\n";
        let j = mnist(policy, &[("PS", 1), ("Worker", 2)]);
        let hpa = build_autoscaler(&j).expect("an autoscaler");
        assert_eq!(hpa.metadata.name.as_deref(), Some("mnist"));
        assert_eq!(hpa.metadata.owner_references.as_ref().map(|o| o[0].kind.as_str()), Some("TFJob"));
        let spec = hpa.spec;
        assert_eq!(
            (spec.scale_target_ref.api_version.as_deref(), spec.scale_target_ref.kind.as_str(), spec.scale_target_ref.name.as_str()),
            (Some("kubeflow.org/v1"), "TFJob", "mnist")
        );
        assert_eq!((spec.min_replicas, spec.max_replicas), (Some(1), 5));
        assert_eq!(spec.metrics.unwrap()[0].resource.as_ref().unwrap().name, "cpu");
        // Without metrics (or with the built-in policy) no autoscaler object.
        assert!(build_autoscaler(&mnist("  elasticPolicy: {minReplicas: 1, maxReplicas: 5, autoscale: Throughput}\n", &[("Worker", 2)])).is_none());
        assert!(build_autoscaler(&mnist("", &[("Worker", 2)])).is_none());
    }

    #[test]
    fn progress_comes_from_ps_0_when_it_serves_metrics() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for (a, port) in [
            (args(&["--metrics_port=9100"]), Some(9100)),
            (args(&["--model=mlp", "--metrics-port", "9101"]), Some(9101)),
            (args(&["--metrics_port"]), None),
            (args(&["--metrics_port=x"]), None),
            (args(&["--metrics_portal=1"]), None),
            (args(&[]), None),
        ] {
            assert_eq!(metrics_port_of(&a), port, "{a:?}");
        }
        let mut j = mnist("", &[("PS", 2), ("Worker", 2)]);
        assert_eq!(progress_source("mnist", &j.spec), None);
        for rs in j.spec.tf_replica_specs.values_mut() {
            rs.template.spec.as_mut().unwrap().containers[0].args.as_mut().unwrap().push("--metrics_port=9200".into());
        }
        assert_eq!(progress_source("mnist", &j.spec), Some(("mnist-ps-0".to_string(), 9200)));
        assert_eq!(progress_source("mnist", &mnist("", &[("Worker", 2)]).spec), None);
    }
}
