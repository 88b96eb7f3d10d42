//! The `TFJob` API (`kubeflow.org/v1`): types, defaulting, normalisation of replica-type
//! spellings and validation.
//!
//! The types follow Kubeflow's training-operator v1 TFJob field by field, so a Kubeflow manifest
//! deserialises unchanged. Defaults the API server can persist are written into the CRD schema
//! (`replicas: 1`, `restartPolicy: Never`, `cleanPodPolicy: Running`, ...); the rest (the
//! `tfjob-port` on the `tensorflow` container) is applied in memory by [`apply_defaults`].

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::ContainerPort;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::autoscale::{AutoscalerState, ElasticPolicy};
use crate::field::{DNS_LABEL_MAX, FieldError, ValidationErrors, is_dns1035_label, is_dns1123_label, unsupported};
use crate::progress::TrainingProgress;

/// API group of the TFJob resource.
pub const GROUP: &str = "kubeflow.org";
/// API version of the TFJob resource.
pub const VERSION: &str = "v1";
/// Kind of the TFJob resource.
pub const KIND: &str = "TFJob";
/// Name of the container that runs TensorFlow; it gets `TF_CONFIG` and the default port.
pub const DEFAULT_CONTAINER_NAME: &str = "tensorflow";
/// Name of the container port that TensorFlow listens on.
pub const DEFAULT_PORT_NAME: &str = "tfjob-port";
/// Default value of the `tfjob-port` port.
pub const DEFAULT_PORT: i32 = 2222;
/// `managedBy` value of this controller (the same value as Kubeflow's training-operator).
pub const MANAGED_BY_THIS: &str = "kubeflow.org/training-operator";
/// `managedBy` value of Kueue's MultiKueue; jobs carrying it are left alone.
pub const MANAGED_BY_MULTIKUEUE: &str = "kueue.x-k8s.io/multikueue";
/// `managedBy` value that gives a job to this operator by name: the only jobs it takes when it
/// runs beside Kubeflow's training-operator ([`Claim::OwnOnly`]).
pub const MANAGED_BY_TFJOB_RS: &str = "tfjob-rs.io/operator";

/// Which TFJobs this operator reconciles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Claim {
    /// It is the cluster's TFJob controller: jobs without `managedBy`, with Kubeflow's value for
    /// the built-in controller, or with this operator's own value.
    #[default]
    Unmanaged,
    /// It runs beside Kubeflow's training-operator: only jobs whose `managedBy` is
    /// [`MANAGED_BY_TFJOB_RS`]; every other job is Kubeflow's (or MultiKueue's).
    OwnOnly,
}

impl Claim {
    /// Whether a job with this `spec.runPolicy.managedBy` is this operator's.
    pub fn takes(self, managed_by: Option<&str>) -> bool {
        matches!((self, managed_by), (_, Some(MANAGED_BY_TFJOB_RS)) | (Claim::Unmanaged, None | Some(MANAGED_BY_THIS)))
    }
}

/// The specification of a TFJob.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "kubeflow.org",
    version = "v1",
    kind = "TFJob",
    plural = "tfjobs",
    singular = "tfjob",
    namespaced,
    status = "TFJobStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "TFJob represents a distributed TensorFlow training job (Kubeflow-compatible).",
    printcolumn(
        name = "State",
        type_ = "string",
        description = "The latest condition of the job",
        json_path = ".status.conditions[-1:].type"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        description = "Worker pods running",
        json_path = ".status.replicaStatuses.Worker.active"
    ),
    printcolumn(
        name = "Workers",
        type_ = "integer",
        description = "Worker replicas requested",
        json_path = ".spec.tfReplicaSpecs.Worker.replicas"
    ),
    printcolumn(
        name = "Step",
        type_ = "integer",
        description = "The global step",
        json_path = ".status.trainingProgress.globalStep"
    ),
    printcolumn(
        name = "Epoch",
        type_ = "integer",
        description = "Epochs completed",
        json_path = ".status.trainingProgress.epochsCompleted"
    ),
    printcolumn(
        name = "Ex/s",
        type_ = "integer",
        description = "Examples trained per second over the last minute",
        json_path = ".status.trainingProgress.examplesPerSecond"
    ),
    printcolumn(
        name = "ETA",
        type_ = "string",
        description = "Estimated time left",
        json_path = ".status.trainingProgress.estimatedRemainingTimeSummary"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    scale(
        spec_replicas_path = ".spec.tfReplicaSpecs.Worker.replicas",
        status_replicas_path = ".status.replicaStatuses.Worker.replicas",
        label_selector_path = ".status.replicaStatuses.Worker.selector"
    ),
    validation = name_rule(),
    validation = name_length_rule()
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("required" = ["tfReplicaSpecs"]))]
pub struct TFJobSpec {
    /// Policies that apply to the whole job (cleanup, TTL, deadline, backoff, scheduling, ...).
    #[serde(default)]
    pub run_policy: RunPolicy,

    /// When the job counts as succeeded: `""` (default: the chief, else worker 0) or
    /// `AllWorkers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_policy: Option<SuccessPolicy>,

    /// The replica sets of the job, keyed by replica type (`PS`, `Worker`, `Chief`, `Master`,
    /// `Evaluator`; other spellings are normalised).
    #[serde(default)]
    #[schemars(schema_with = "replica_specs_schema", transform = no_default)]
    pub tf_replica_specs: BTreeMap<String, ReplicaSpec>,

    /// Give workers and ps a sparse cluster in `TF_CONFIG` (a worker: itself, every ps and the
    /// chief; a ps: every ps and the chief) so that workers can come and go; a worker that
    /// failed for good is tolerated while the job can still finish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_dynamic_worker: Option<bool>,

    /// Bounds of the `Worker` replicas and what scales them: a HorizontalPodAutoscaler on
    /// `metrics`, or the built-in `autoscale: Throughput` policy ([`crate::autoscale`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic_policy: Option<ElasticPolicy>,

    /// Success and failure by a share of the `Worker` replicas (tfjob-rs; not in Kubeflow's
    /// TFJob).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_shares: Option<WorkerShares>,
}

/// Success and failure decided by a share of the `Worker` replicas planned (tfjob-rs; Kubeflow's
/// TFJob has only `successPolicy` and `enableDynamicWorker`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerShares {
    /// A job without `Chief` or `Master` also succeeds once at least this percentage of its
    /// workers have succeeded (rounded up: 75 of 3 workers is 3), the others stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub succeeded_percent: Option<i32>,
    /// Workers that failed for good (their restart policy does not restart them) are left as
    /// they are and the job goes on while they are at most this percentage of its workers; one
    /// more fails the job. Worker 0 of a job without `Chief` or `Master` (its chief) fails it
    /// whatever the share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 99))]
    pub failed_percent: Option<i32>,
}

/// Why a job without `Chief` or `Master` needs a Worker (the message of the validation error
/// and of the CRD's rule).
pub const WORKER_FLOOR_MESSAGE: &str = "Worker replicas must be at least 1 when the job has no Chief or Master: worker 0 is the chief";

// ---------------------------------------------------------------------------------------------
// Admission rules: what the API server itself refuses at `kubectl apply`.
//
// The CRD carries CEL rules (`x-kubernetes-validations`) for what CEL can express of
// [`validate`]: replica type keys (any case, each type once, Chief or Master, a Chief, Master or
// Worker, at most one chief, worker 0 as chief), the `tensorflow` container and every container's
// name and image, and the job name as a DNS label short enough for the names generated from it;
// enums and minimums are plain schema. The controller still runs [`validate`] (for clusters with
// an older CRD, and for what CEL cannot see: the rest of the pod template, see
// [`crate::template`]). Every list and map the rules iterate has a bound (`maxItems`,
// `maxProperties`, `maxLength`) so that the API server's cost estimate of each rule stays within
// its budget.

/// The replica types, lower case, as CEL compares keys (`k.lowerAscii()`).
const CEL_TYPES: &str = "['chief', 'master', 'ps', 'worker', 'evaluator']";

/// One CEL rule: its expression, its message (or message expression) and the field it names.
fn cel_rule(rule: &str, message: &str, field_path: Option<&str>) -> serde_json::Value {
    let mut r = serde_json::json!({"rule": rule, "message": message});
    if let Some(p) = field_path {
        r["fieldPath"] = p.into();
    }
    r
}

/// The rules on `spec.tfReplicaSpecs` (`self` is the map of replica sets).
fn replica_type_rules() -> serde_json::Value {
    let known = format!("self.all(k, k.lowerAscii() in {CEL_TYPES})");
    // The message names the first unknown key (`unknown replica type "Foo"`). Not all of them:
    // map keys have no length bound, and the API server estimates the cost of joining them far
    // over its budget; one key, concatenated once, is within it.
    let unknown = format!(
        "'unknown replica type \"' + self.filter(k, !(k.lowerAscii() in {CEL_TYPES}))[0] + '\": the keys must be PS, Worker, Chief, Master or Evaluator (any case)'"
    );
    let mut known_rule = cel_rule(&known, "unknown replica type: the keys must be PS, Worker, Chief, Master or Evaluator (any case)", None);
    known_rule["messageExpression"] = unknown.into();
    serde_json::json!([
        known_rule,
        cel_rule(
            "self.all(k, self.filter(j, j.lowerAscii() == k.lowerAscii()).size() == 1)",
            "each replica type may appear once (PS and ps are the same type)",
            None,
        ),
        cel_rule("self.exists(k, k.lowerAscii() in ['chief', 'master', 'worker'])", "must contain a Chief, a Master or a Worker replica type", None,),
        cel_rule(
            "!(self.exists(k, k.lowerAscii() == 'chief') && self.exists(k, k.lowerAscii() == 'master'))",
            "at most one of Chief and Master may be set",
            None,
        ),
        cel_rule(
            "self.all(k, !(k.lowerAscii() in ['chief', 'master']) || !has(self[k].replicas) || self[k].replicas <= 1)",
            "Chief and Master must have 0 or 1 replicas",
            None,
        ),
        cel_rule(
            "self.exists(k, k.lowerAscii() in ['chief', 'master']) || self.all(k, k.lowerAscii() != 'worker' || !has(self[k].replicas) || self[k].replicas >= 1)",
            WORKER_FLOOR_MESSAGE,
            None,
        ),
    ])
}

/// Drops the `default` schemars derives from `#[serde(default)]`: the replica sets are
/// required (and at least one), an empty default would only turn a missing field into a
/// confusing error.
fn no_default(schema: &mut schemars::Schema) {
    schema.remove("default");
}

fn replica_specs_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let replica_set = generator.subschema_for::<ReplicaSpec>();
    schemars::json_schema!({
        "type": "object",
        "description": "The replica sets of the job, keyed by replica type (PS, Worker, Chief, Master, Evaluator; other spellings are normalised).",
        "minProperties": 1,
        "maxProperties": ReplicaType::ALL.len(),
        "additionalProperties": replica_set,
        "x-kubernetes-validations": replica_type_rules(),
    })
}

/// Most containers a replica's template may have (bounds the cost of the container rules).
pub const MAX_CONTAINERS: usize = 64;
/// Longest container image reference the CRD accepts.
pub const MAX_IMAGE_LENGTH: usize = 1024;

/// The schema of a replica's `template`: any pod template (unknown fields are kept; the
/// controller reads it strictly, see [`crate::template`]), with the containers' names and images
/// declared so that the CRD's rules can check them.
fn template_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let image_rule = cel_rule("has(self.image) && self.image.trim() != ''", "must not be empty", Some(".image"));
    schemars::json_schema!({
        "type": "object",
        "description": "A pod template (core/v1 PodTemplateSpec).",
        "x-kubernetes-preserve-unknown-fields": true,
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true,
                "properties": {
                    "containers": {
                        "type": "array",
                        "maxItems": MAX_CONTAINERS,
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": true,
                            "required": ["name"],
                            "properties": {
                                "name": {
                                    "type": "string",
                                    "maxLength": DNS_LABEL_MAX,
                                    "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                                },
                                "image": {"type": "string", "maxLength": MAX_IMAGE_LENGTH},
                            },
                            "x-kubernetes-validations": [image_rule],
                        },
                    },
                },
            },
        },
    })
}

/// The rule on a replica set (`self`): a `tensorflow` container.
const TENSORFLOW_CONTAINER_RULE: &str = "has(self.template) && has(self.template.spec) \
    && has(self.template.spec.containers) \
    && self.template.spec.containers.exists(c, c.name == 'tensorflow')";

/// The root rule on the job's name: a DNS-1035 label (it names the job's Service).
fn name_rule() -> kube::core::Rule {
    kube::core::Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message(
        "metadata.name must be a DNS-1035 label (it names the job's Service): lower case \
             alphanumeric characters or '-', starting with a letter and ending with an \
             alphanumeric character",
    )
}

/// The root rule on the length of the names generated from the job's name: pods and hostnames
/// `<job>-<type>-<index>` and the Secret `<job>-token` are DNS labels (at most 63 characters).
fn name_length_rule() -> kube::core::Rule {
    let rule = format!(
        "size(self.metadata.name) + {} <= {DNS_LABEL_MAX} && self.spec.tfReplicaSpecs.all(k, \
         size(self.metadata.name) + size(k) + 2 + size(string(self.spec.tfReplicaSpecs[k].replicas > 1 \
         ? self.spec.tfReplicaSpecs[k].replicas - 1 : 0)) <= {DNS_LABEL_MAX})",
        SECRET_SUFFIX.len()
    );
    kube::core::Rule::new(rule).message(
        "metadata.name is too long: the names generated from it (pods <name>-<type>-<index>, \
             the Secret <name>-token) must be at most 63 characters",
    )
}

/// When a job without chief counts as succeeded.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub enum SuccessPolicy {
    /// Worker 0 (or the chief/master) decides.
    #[default]
    #[serde(rename = "")]
    Default,
    /// Every worker must succeed.
    AllWorkers,
    /// Any other value: kept so that one bad job never breaks the watch of all jobs;
    /// validation rejects it.
    #[serde(untagged)]
    Unsupported(String),
}

/// A plain `{type: string, enum: [...]}` schema (structural, unlike the `anyOf` schemars derives
/// for enums with documented variants).
macro_rules! string_enum_schema {
    ($ty:ident, $desc:literal, [$($v:literal),*]) => {
        impl JsonSchema for $ty {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($ty).into()
            }
            fn inline_schema() -> bool {
                true
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({
                    "type": "string",
                    "description": $desc,
                    "enum": [$($v),*]
                })
            }
        }
    };
}

string_enum_schema!(SuccessPolicy, "When a job without chief counts as succeeded: \"\" (worker 0) or AllWorkers.", ["", "AllWorkers"]);
string_enum_schema!(
    RestartPolicy,
    "Always and OnFailure restart in place; ExitCode recreates the pod on exit codes >= 128 and fails the job on 1-127; Never fails the job.",
    ["Always", "OnFailure", "Never", "ExitCode"]
);
string_enum_schema!(CleanPodPolicy, "Which pods to delete once the job has finished: All, Running (default) or None.", ["All", "Running", "None"]);

/// One replica set.
#[derive(Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": TENSORFLOW_CONTAINER_RULE,
    "message": "must contain a container named \"tensorflow\"",
    "fieldPath": ".template.spec.containers"
}]))]
pub struct ReplicaSpec {
    /// Number of replicas (default 1).
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    // Not inline (`crate::template::PodTemplate`): a `BTreeMap` node holds room for 11 values
    // whatever the count, and an inline template (1.8 KB) made every cached job's two-entry
    // map cost 22 KB.
    /// The pod template of every replica of this type.
    #[serde(default)]
    #[schemars(schema_with = "template_schema")]
    pub template: crate::template::PodTemplate,
    /// What happens when a replica exits (default `Never`).
    #[serde(default)]
    pub restart_policy: RestartPolicy,
    /// What reading `template` strictly found: fields a pod template does not have, or a value
    /// that could not be decoded (the template is then left empty). The schema keeps unknown
    /// fields (`x-kubernetes-preserve-unknown-fields`), so the API server stores such jobs; they
    /// must fail validation instead of failing to deserialise, which would break the
    /// controller's list of every TFJob. Not part of the API.
    #[serde(skip)]
    pub template_reading: crate::template::Reading,
}

impl<'de> Deserialize<'de> for ReplicaSpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Raw {
            #[serde(default = "default_replicas")]
            replicas: i32,
            #[serde(default)]
            template: Option<serde_json::Value>,
            #[serde(default)]
            restart_policy: RestartPolicy,
        }
        let raw = Raw::deserialize(deserializer)?;
        let (template, template_reading) = match raw.template {
            None | Some(serde_json::Value::Null) => Default::default(),
            Some(v) => crate::template::read(v),
        };
        Ok(ReplicaSpec { replicas: raw.replicas, template: template.into(), restart_policy: raw.restart_policy, template_reading })
    }
}

fn default_replicas() -> i32 {
    1
}

/// Restart policy of a replica set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub enum RestartPolicy {
    /// Restart the container in place whatever its exit code.
    Always,
    /// Restart the container in place when it fails.
    OnFailure,
    /// Never restart; a failed replica fails the job.
    #[default]
    Never,
    /// Recreate the pod when the `tensorflow` container exits with a retryable code (>= 128);
    /// fail the job on 1-127.
    ExitCode,
    /// Any other value (rejected by validation; treated as `Never`).
    #[serde(untagged)]
    Unsupported(String),
}

impl RestartPolicy {
    /// The pod-level restart policy this maps to (`ExitCode` becomes `Never`: the controller
    /// restarts).
    pub fn pod_restart_policy(&self) -> &'static str {
        match self {
            RestartPolicy::Always => "Always",
            RestartPolicy::OnFailure => "OnFailure",
            RestartPolicy::Never | RestartPolicy::ExitCode | RestartPolicy::Unsupported(_) => "Never",
        }
    }
}

/// What to do with pods once the job has finished.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub enum CleanPodPolicy {
    /// Delete every pod.
    All,
    /// Delete the pods that are still running (the default here; see README).
    #[default]
    Running,
    /// Keep every pod.
    None,
    /// Any other value (rejected by validation; treated as `Running`).
    #[serde(untagged)]
    Unsupported(String),
}

/// Policies for the whole job.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.managedBy) == has(oldSelf.managedBy) && (!has(self.managedBy) || self.managedBy == oldSelf.managedBy)",
    "message": "spec.runPolicy.managedBy is immutable"
}]))]
pub struct RunPolicy {
    /// Which pods to delete when the job finishes (default `Running`).
    #[serde(default)]
    pub clean_pod_policy: CleanPodPolicy,
    /// Delete the job this many seconds after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
    /// Fail the job when it has been active for this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub active_deadline_seconds: Option<i64>,
    /// Number of restarts before the job is failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub backoff_limit: Option<i32>,
    /// Gang-scheduling settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_policy: Option<SchedulingPolicy>,
    /// Suspend the job: delete its pods and keep it until resumed.
    #[serde(default)]
    pub suspend: bool,
    /// The controller that manages this job (immutable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "managed_by_schema")]
    pub managed_by: Option<String>,
}

fn managed_by_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "description": "The controller that manages this job (immutable).",
        "enum": [MANAGED_BY_THIS, MANAGED_BY_MULTIKUEUE, MANAGED_BY_TFJOB_RS]
    })
}

fn resource_list_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "description": "Minimum resources of the gang (resource name to quantity).",
        "additionalProperties": {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": true
        }
    })
}

/// Gang-scheduling settings (PodGroup).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingPolicy {
    /// Minimum number of pods scheduled together (default: all replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min_available: Option<i32>,
    /// Scheduler queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Minimum resources of the gang.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resource_list_schema")]
    pub min_resources: Option<BTreeMap<String, Quantity>>,
    /// Priority class of the PodGroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class: Option<String>,
    /// Scheduling timeout of the gang.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub schedule_timeout_seconds: Option<i32>,
}

/// Observed state of a TFJob.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TFJobStatus {
    /// Conditions, in the order they first appeared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<JobCondition>,
    /// Per replica type counts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub replica_statuses: BTreeMap<String, ReplicaStatus>,
    /// When the job was first (or, after a resume, again) started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the job finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Last time the controller reconciled the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reconcile_time: Option<Time>,
    /// Where training is, as last read from ps 0's metrics ([`crate::progress`]). Written by
    /// the controller's progress reader, not by the reconcile. Not in Kubeflow's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_progress: Option<TrainingProgress>,
    /// The state of the `Throughput` autoscaler ([`crate::autoscale`]). Not in Kubeflow's
    /// status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaler: Option<AutoscalerState>,
}

/// Counts of one replica type.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    /// Running pods.
    #[serde(default)]
    pub active: i32,
    /// Succeeded pods.
    #[serde(default)]
    pub succeeded: i32,
    /// Failed pods.
    #[serde(default)]
    pub failed: i32,
    /// Label selector of the pods of this type, as a string (`key=value,...`): the `Worker`
    /// one is the scale subresource's `status.selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The number of replicas the controller last planned for this type: the spec's
    /// `replicas` once acted on (for `Worker`, at least 1 when worker 0 is the chief). The
    /// `Worker` one is the scale subresource's `status.replicas`. Not in Kubeflow's status;
    /// absent until the controller has planned the type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Pods of this type that the controller deleted and recreated after a retryable failure
    /// (counts towards `backoffLimit` together with in-place container restarts). Not in
    /// Kubeflow's status; omitted while zero.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recreated: i32,
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

/// A job condition, as Kubeflow writes it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobCondition {
    /// `Created`, `Running`, `Restarting`, `Succeeded`, `Suspended` or `Failed`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// CamelCase reason, e.g. `TFJobRunning`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Last time the condition was updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// Last time the condition changed status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// The replica types of a TFJob, in TF_CONFIG order of importance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReplicaType {
    /// The chief: coordinates training, checkpoints.
    Chief,
    /// Kubeflow's older name for the chief.
    Master,
    /// A parameter server.
    PS,
    /// A worker.
    Worker,
    /// An evaluator (not part of the training cluster).
    Evaluator,
}

impl ReplicaType {
    /// All replica types.
    pub const ALL: [ReplicaType; 5] = [ReplicaType::Chief, ReplicaType::Master, ReplicaType::PS, ReplicaType::Worker, ReplicaType::Evaluator];

    /// The canonical spelling used as key in `tfReplicaSpecs`, e.g. `PS`, `Worker`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaType::Chief => "Chief",
            ReplicaType::Master => "Master",
            ReplicaType::PS => "PS",
            ReplicaType::Worker => "Worker",
            ReplicaType::Evaluator => "Evaluator",
        }
    }

    /// Lower-case spelling used in pod names, labels and TF_CONFIG, e.g. `ps`, `worker`.
    pub fn lower(self) -> &'static str {
        match self {
            ReplicaType::Chief => "chief",
            ReplicaType::Master => "master",
            ReplicaType::PS => "ps",
            ReplicaType::Worker => "worker",
            ReplicaType::Evaluator => "evaluator",
        }
    }

    /// Parses any spelling (case-insensitive) of a replica type.
    pub fn parse(s: &str) -> Option<ReplicaType> {
        ReplicaType::ALL.into_iter().find(|t| t.as_str().eq_ignore_ascii_case(s))
    }

    /// Chief or Master.
    pub fn is_chief(self) -> bool {
        matches!(self, ReplicaType::Chief | ReplicaType::Master)
    }
}

impl fmt::Display for ReplicaType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of loading a manifest.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The text is not YAML/JSON (boxed: the parser's error is large).
    #[error("not valid YAML: {0}")]
    Yaml(Box<serde_saphyr::Error>),
    /// The document is not a TFJob.
    #[error("document {index}: expected apiVersion kubeflow.org/v1 and kind TFJob, found {found}")]
    NotATFJob {
        /// Position of the document in the file (0-based).
        index: usize,
        /// What was found instead.
        found: String,
    },
    /// The document is a TFJob with problems.
    #[error("TFJob {name}: {errors}")]
    Invalid {
        /// Name of the job (or `<unnamed>`).
        name: String,
        /// Every problem found.
        errors: ValidationErrors,
    },
}

impl From<serde_saphyr::Error> for ManifestError {
    fn from(e: serde_saphyr::Error) -> Self {
        ManifestError::Yaml(Box::new(e))
    }
}

/// The replica sets of a spec, keyed by normalised type. Unknown keys are skipped (validation
/// reports them); when two spellings map to the same type, the canonical one wins.
pub fn replica_specs(spec: &TFJobSpec) -> BTreeMap<ReplicaType, &ReplicaSpec> {
    let mut out = BTreeMap::new();
    for (key, rs) in &spec.tf_replica_specs {
        if let Some(t) = ReplicaType::parse(key)
            && (key == t.as_str() || !out.contains_key(&t))
        {
            out.insert(t, rs);
        }
    }
    out
}

/// Applies the in-memory defaults of Kubeflow's defaulter: replica-type keys normalised to
/// their canonical spelling, and the `tfjob-port` port (2222) added to the `tensorflow`
/// container when it has none. Schema defaults (`replicas`, `restartPolicy`, `cleanPodPolicy`)
/// are already filled in by deserialisation.
pub fn apply_defaults(spec: &mut TFJobSpec) {
    let old = std::mem::take(&mut spec.tf_replica_specs);
    let mut normalised: BTreeMap<String, ReplicaSpec> = BTreeMap::new();
    for (key, rs) in old {
        let new_key = match ReplicaType::parse(&key) {
            Some(t) => t.as_str().to_string(),
            None => key.clone(),
        };
        // The canonical spelling wins over another spelling of the same type.
        if normalised.contains_key(&new_key) && key != new_key {
            continue;
        }
        normalised.insert(new_key, rs);
    }
    spec.tf_replica_specs = normalised;
    for rs in spec.tf_replica_specs.values_mut() {
        if let Some(pod) = rs.template.spec.as_mut() {
            for c in pod.containers.iter_mut().filter(|c| c.name == DEFAULT_CONTAINER_NAME) {
                let ports = c.ports.get_or_insert_with(Vec::new);
                if !ports.iter().any(|p| p.name.as_deref() == Some(DEFAULT_PORT_NAME)) {
                    ports.push(ContainerPort { name: Some(DEFAULT_PORT_NAME.to_string()), container_port: DEFAULT_PORT, ..Default::default() });
                }
            }
        }
    }
}

/// Whether worker 0 is the job's chief: the job has no `Chief` or `Master` replica type.
pub fn worker0_is_chief(spec: &TFJobSpec) -> bool {
    !replica_specs(spec).keys().any(|t| t.is_chief())
}

/// The fewest replicas of type `rtype` the job runs with: 1 `Worker` when worker 0 is the
/// chief (it is never removed), otherwise 0.
pub fn min_replicas(spec: &TFJobSpec, rtype: ReplicaType) -> i32 {
    i32::from(rtype == ReplicaType::Worker && worker0_is_chief(spec))
}

/// The count of replica set `rs` of type `rtype` that the controller plans: the spec's
/// `replicas`, but never below [`min_replicas`].
pub fn planned_replicas(spec: &TFJobSpec, rtype: ReplicaType, rs: &ReplicaSpec) -> i32 {
    rs.replicas.max(min_replicas(spec, rtype))
}

/// The validation error of a `Worker` count below [`min_replicas`] (a negative count has its
/// own error). A job that already runs is not failed for it: its worker 0 is kept (see
/// [`crate::status`]).
pub fn worker_floor_error(spec: &TFJobSpec) -> Option<FieldError> {
    let (key, rs) = spec.tf_replica_specs.iter().find(|(key, _)| ReplicaType::parse(key) == Some(ReplicaType::Worker))?;
    let floor = min_replicas(spec, ReplicaType::Worker);
    (rs.replicas >= 0 && rs.replicas < floor).then(|| {
        FieldError::new(
            format!("spec.tfReplicaSpecs.{key}.replicas"),
            format!(
                "must be at least {floor} when the job has no Chief or Master: worker 0 is the \
                 chief, got {}",
                rs.replicas
            ),
        )
    })
}

/// Length of the longest name or hostname generated for a job with this name and spec (pods
/// `<job>-<type>-<index>`; the Service and Secret are shorter or equal).
pub fn longest_generated_name(job_name: &str, spec: &TFJobSpec) -> usize {
    let mut longest = secret_name(job_name).len();
    for (t, rs) in replica_specs(spec) {
        let last = (rs.replicas.max(1) - 1).to_string();
        longest = longest.max(job_name.len() + 1 + t.lower().len() + 1 + last.len());
    }
    longest
}

/// What the name of a job's Secret adds to the job's name.
const SECRET_SUFFIX: &str = "-token";

/// Name of the per-job Secret holding `TFJOB_TOKEN`.
pub fn secret_name(job_name: &str) -> String {
    format!("{job_name}{SECRET_SUFFIX}")
}

/// Validates a TFJob (name and spec) and returns every problem found, each naming its field.
/// An empty vector means the job is valid.
pub fn validate(job: &TFJob) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = job.metadata.name.as_deref().unwrap_or("");
    if name.is_empty() {
        errs.push(FieldError::new("metadata.name", "is required"));
    } else if !is_dns1035_label(name) {
        errs.push(FieldError::new(
            "metadata.name",
            format!(
                "{name:?} is not a valid DNS-1035 label: it must consist of lower case \
                 alphanumeric characters or '-', start with a letter, end with an alphanumeric \
                 character and be at most 63 characters"
            ),
        ));
    } else {
        let longest = longest_generated_name(name, &job.spec);
        if longest > DNS_LABEL_MAX {
            errs.push(FieldError::new(
                "metadata.name",
                format!(
                    "{name:?} is too long: the generated pod names and hostnames would be up to \
                     {longest} characters, the limit is {DNS_LABEL_MAX}; shorten the name by at \
                     least {} characters",
                    longest - DNS_LABEL_MAX
                ),
            ));
        }
    }
    if let Some(ns) = job.metadata.namespace.as_deref()
        && !is_dns1123_label(ns)
    {
        errs.push(FieldError::new("metadata.namespace", format!("{ns:?} is not a valid DNS-1123 label")));
    }
    if let Err(e) = tls_annotation(job) {
        errs.push(FieldError::new(format!("metadata.annotations[{TLS_ANNOTATION}]"), e));
    }
    errs.extend(validate_spec(&job.spec));
    errs
}

/// Annotation of a TFJob that turns TLS between its replicas on (`"true"`) or off (`"false"`)
/// whatever its containers run ([`crate::tls::job_uses_tls`]).
pub const TLS_ANNOTATION: &str = "tfjob-rs.io/tls";

/// What [`TLS_ANNOTATION`] says (`None`: absent), or why it cannot be read.
pub fn tls_annotation(job: &TFJob) -> Result<Option<bool>, String> {
    match job.metadata.annotations.as_ref().and_then(|a| a.get(TLS_ANNOTATION)).map(String::as_str) {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(other) => Err(format!("{other:?}: must be \"true\" or \"false\"")),
    }
}

/// Validates a spec alone (field paths start with `spec.`).
pub fn validate_spec(spec: &TFJobSpec) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let types = check_replica_sets(spec, &mut errs);
    check_leaders(spec, &types, &mut errs);
    errs.extend(worker_floor_error(spec));
    if let Some(SuccessPolicy::Unsupported(v)) = &spec.success_policy {
        errs.push(unsupported("spec.successPolicy", v, &["", "AllWorkers"]));
    }
    check_run_policy(&spec.run_policy, &mut errs);
    if let Some(shares) = &spec.worker_shares {
        check_worker_shares(spec, shares, &mut errs);
    }
    if let Some(policy) = &spec.elastic_policy {
        let workers = replica_specs(spec).get(&ReplicaType::Worker).map(|rs| (rs.replicas, runtime_args(rs)));
        crate::autoscale::check_policy(policy, workers.as_ref().map(|(n, a)| (*n, a.as_slice())), &mut errs);
    }
    errs
}

/// `workerShares`: percentages in range, on a job with workers, `succeededPercent` only where
/// the workers decide (no `Chief` or `Master`: there the chief does).
fn check_worker_shares(spec: &TFJobSpec, shares: &WorkerShares, errs: &mut Vec<FieldError>) {
    let field = "spec.workerShares";
    if let Some(p) = shares.succeeded_percent.filter(|p| !(1..=100).contains(p)) {
        errs.push(FieldError::new(format!("{field}.succeededPercent"), format!("{p} is not a percentage from 1 to 100")));
    }
    if let Some(p) = shares.failed_percent.filter(|p| !(0..=99).contains(p)) {
        errs.push(FieldError::new(format!("{field}.failedPercent"), format!("{p} is not a percentage from 0 to 99")));
    }
    if !replica_specs(spec).contains_key(&ReplicaType::Worker) {
        errs.push(FieldError::new(field, "the job has no Worker replicas to count"));
    } else if shares.succeeded_percent.is_some() && !worker0_is_chief(spec) {
        errs.push(FieldError::new(format!("{field}.succeededPercent"), "the job has a Chief or Master, which decides when it succeeds"));
    }
}

/// The command and args of a replica set's `tensorflow` container (where `tfjob-runtime`'s
/// flags are).
pub fn runtime_args(rs: &ReplicaSpec) -> Vec<String> {
    let containers = rs.template.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
    let c = containers.iter().find(|c| c.name == "tensorflow").or(containers.first());
    c.map(|c| c.command.iter().chain(c.args.iter()).flatten().cloned().collect()).unwrap_or_default()
}

/// Path of the replica sets of a spec.
const REPLICA_SPECS: &str = "spec.tfReplicaSpecs";

/// Checks the replica-set keys (at least one; each a known type, each type once) and each
/// replica set; returns the key of each replica type.
fn check_replica_sets<'s>(spec: &'s TFJobSpec, errs: &mut Vec<FieldError>) -> BTreeMap<ReplicaType, &'s str> {
    if spec.tf_replica_specs.is_empty() {
        errs.push(FieldError::new(REPLICA_SPECS, "must contain at least one replica type (Chief, Master, PS, Worker, Evaluator)"));
    }
    let mut types: BTreeMap<ReplicaType, &str> = BTreeMap::new();
    for (key, rs) in &spec.tf_replica_specs {
        let path = format!("{REPLICA_SPECS}.{key}");
        match ReplicaType::parse(key) {
            None => errs.push(FieldError::new(
                &path,
                format!(
                    "unknown replica type {key:?}; expected one of PS, Worker, Chief, Master, \
                     Evaluator"
                ),
            )),
            Some(t) => {
                if let Some(other) = types.insert(t, key) {
                    errs.push(FieldError::new(&path, format!("duplicate replica type: {key:?} and {other:?} both mean {t}")));
                }
            }
        }
        validate_replica(&path, rs, errs);
    }
    types
}

/// Checks who leads the job: not both Chief and Master, at most one of either, and a Chief,
/// Master or Worker (worker 0 leads when there is no chief).
fn check_leaders(spec: &TFJobSpec, types: &BTreeMap<ReplicaType, &str>, errs: &mut Vec<FieldError>) {
    let has = |t: ReplicaType| types.contains_key(&t);
    if has(ReplicaType::Chief) && has(ReplicaType::Master) {
        errs.push(FieldError::new(REPLICA_SPECS, "at most one of Chief and Master may be set"));
    }
    for key in types.iter().filter(|(t, _)| t.is_chief()).map(|(_, k)| *k) {
        let rs = &spec.tf_replica_specs[key];
        if rs.replicas > 1 {
            errs.push(FieldError::new(format!("{REPLICA_SPECS}.{key}.replicas"), format!("must be 0 or 1 for {key}, got {}", rs.replicas)));
        }
    }
    let has_leader = has(ReplicaType::Chief) || has(ReplicaType::Master) || has(ReplicaType::Worker);
    if !spec.tf_replica_specs.is_empty() && !has_leader {
        errs.push(FieldError::new(REPLICA_SPECS, "must contain a Chief, a Master or a Worker replica type"));
    }
}

/// `must be >= 0` when a count or a number of seconds is negative.
fn non_negative(field: impl Into<String>, value: Option<i64>) -> Option<FieldError> {
    value.filter(|v| *v < 0).map(|v| FieldError::new(field, format!("must be >= 0, got {v}")))
}

/// Checks the run policy: its enum, its counts and durations, and `managedBy`.
fn check_run_policy(rp: &RunPolicy, errs: &mut Vec<FieldError>) {
    let rpath = "spec.runPolicy";
    if let CleanPodPolicy::Unsupported(v) = &rp.clean_pod_policy {
        errs.push(unsupported(&format!("{rpath}.cleanPodPolicy"), v, &["All", "Running", "None"]));
    }
    errs.extend(non_negative(format!("{rpath}.ttlSecondsAfterFinished"), rp.ttl_seconds_after_finished.map(i64::from)));
    errs.extend(non_negative(format!("{rpath}.activeDeadlineSeconds"), rp.active_deadline_seconds));
    errs.extend(non_negative(format!("{rpath}.backoffLimit"), rp.backoff_limit.map(i64::from)));
    if let Some(sp) = &rp.scheduling_policy {
        errs.extend(non_negative(format!("{rpath}.schedulingPolicy.minAvailable"), sp.min_available.map(i64::from)));
        errs.extend(non_negative(format!("{rpath}.schedulingPolicy.scheduleTimeoutSeconds"), sp.schedule_timeout_seconds.map(i64::from)));
    }
    if let Some(m) = &rp.managed_by
        && ![MANAGED_BY_THIS, MANAGED_BY_MULTIKUEUE, MANAGED_BY_TFJOB_RS].contains(&m.as_str())
    {
        errs.push(FieldError::new(
            format!("{rpath}.managedBy"),
            format!(
                "unsupported value {m:?}; supported values: {MANAGED_BY_THIS:?}, \
                     {MANAGED_BY_MULTIKUEUE:?}, {MANAGED_BY_TFJOB_RS:?}"
            ),
        ));
    }
}

fn validate_replica(path: &str, rs: &ReplicaSpec, errs: &mut Vec<FieldError>) {
    if let RestartPolicy::Unsupported(v) = &rs.restart_policy {
        errs.push(unsupported(&format!("{path}.restartPolicy"), v, &["Always", "OnFailure", "Never", "ExitCode"]));
    }
    errs.extend(non_negative(format!("{path}.replicas"), Some(i64::from(rs.replicas))));
    let tpath = format!("{path}.template");
    let in_template =
        |e: &FieldError| FieldError { field: if e.field.is_empty() { tpath.clone() } else { format!("{tpath}.{}", e.field) }, message: e.message.clone() };
    errs.extend(rs.template_reading.unknown_fields.iter().map(in_template));
    if let Some(e) = &rs.template_reading.error {
        errs.push(in_template(e));
        return;
    }
    errs.extend(crate::template::check(&rs.template).iter().map(in_template));
    let cpath = format!("{path}.template.spec.containers");
    let containers = rs.template.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or(&[]);
    if containers.is_empty() {
        errs.push(FieldError::new(&cpath, "must contain at least one container"));
        return;
    }
    for (i, c) in containers.iter().enumerate() {
        if c.image.as_deref().unwrap_or("").trim().is_empty() {
            errs.push(FieldError::new(format!("{cpath}[{i}].image"), format!("must not be empty (container {:?})", c.name)));
        }
        if c.name.is_empty() {
            errs.push(FieldError::new(format!("{cpath}[{i}].name"), "is required"));
        }
    }
    if !containers.iter().any(|c| c.name == DEFAULT_CONTAINER_NAME) {
        errs.push(FieldError::new(&cpath, format!("must contain a container named {DEFAULT_CONTAINER_NAME:?}")));
    }
}

/// Validates an update: the new object must be valid and `spec.runPolicy.managedBy` must not
/// change.
pub fn validate_update(old: &TFJob, new: &TFJob) -> Vec<FieldError> {
    let mut errs = validate(new);
    if old.spec.run_policy.managed_by != new.spec.run_policy.managed_by {
        errs.push(FieldError::new("spec.runPolicy.managedBy", "is immutable"));
    }
    errs
}

/// Parses one document (already known to be a TFJob) and validates it, reporting every problem
/// at once. On success returns the job with defaults applied.
pub fn parse_and_validate(doc: serde_json::Value) -> Result<TFJob, ValidationErrors> {
    let mut errs = raw_checks(&doc);
    if doc.get("spec").is_none() {
        errs.push(FieldError::new("spec", "is required"));
    }
    match serde_json::from_value::<TFJob>(doc) {
        Ok(mut job) => {
            // A problem `raw_checks` already reported with its path is not reported twice.
            let reported: Vec<String> = errs.iter().map(|e| e.field.clone()).collect();
            errs.extend(validate(&job).into_iter().filter(|e| !reported.iter().any(|r| r.starts_with(&e.field))));
            if errs.is_empty() {
                apply_defaults(&mut job.spec);
                Ok(job)
            } else {
                Err(ValidationErrors(errs))
            }
        }
        Err(e) => {
            // Type errors are usually already reported with their path by `raw_checks`.
            if errs.is_empty() {
                errs.push(FieldError::new("spec", format!("cannot be decoded: {e}")));
            }
            Err(ValidationErrors(errs))
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Int,
    Bool,
    Str,
    Object,
    Array,
}

fn check_object(value: &serde_json::Value, path: &str, fields: &[(&str, Kind)], errs: &mut Vec<FieldError>) {
    use serde_json::Value;
    let Some(obj) = value.as_object() else {
        if !value.is_null() {
            errs.push(FieldError::new(path, format!("must be an object, got {value}")));
        }
        return;
    };
    for (key, v) in obj {
        let field = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
        match fields.iter().find(|(k, _)| k == key) {
            None => {
                let hint = fields.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(k, _)| format!("; did you mean {k:?}?")).unwrap_or_default();
                errs.push(FieldError::new(field, format!("unknown field{hint}")));
            }
            Some((_, kind)) => {
                let ok = match kind {
                    Kind::Int => v.is_i64() || v.is_null(),
                    Kind::Bool => v.is_boolean() || v.is_null(),
                    Kind::Str => v.is_string() || v.is_null(),
                    Kind::Object => matches!(v, Value::Object(_) | Value::Null),
                    Kind::Array => matches!(v, Value::Array(_) | Value::Null),
                };
                if !ok {
                    let want = match kind {
                        Kind::Int => "an integer",
                        Kind::Bool => "a boolean",
                        Kind::Str => "a string",
                        Kind::Object => "an object",
                        Kind::Array => "a list",
                    };
                    errs.push(FieldError::new(field, format!("must be {want}, got {v}")));
                }
            }
        }
    }
}

/// Checks a raw document for unknown fields and wrongly typed values, with their paths (the
/// API server rejects these too, with `kubectl apply`'s default strict field validation).
pub fn raw_checks(doc: &serde_json::Value) -> Vec<FieldError> {
    use Kind::*;
    let mut errs = Vec::new();
    check_object(doc, "", &[("apiVersion", Str), ("kind", Str), ("metadata", Object), ("spec", Object), ("status", Object)], &mut errs);
    let Some(spec) = doc.get("spec") else {
        return errs;
    };
    check_object(
        spec,
        "spec",
        &[
            ("runPolicy", Object),
            ("successPolicy", Str),
            ("tfReplicaSpecs", Object),
            ("enableDynamicWorker", Bool),
            ("elasticPolicy", Object),
            ("workerShares", Object),
        ],
        &mut errs,
    );
    if let Some(ws) = spec.get("workerShares") {
        check_object(ws, "spec.workerShares", &[("succeededPercent", Int), ("failedPercent", Int)], &mut errs);
    }
    if let Some(ep) = spec.get("elasticPolicy") {
        check_object(
            ep,
            "spec.elasticPolicy",
            &[("minReplicas", Int), ("maxReplicas", Int), ("metrics", Array), ("autoscale", Str), ("throughput", Object)],
            &mut errs,
        );
        if let Some(t) = ep.get("throughput") {
            let fields = [("minGainPercent", Int), ("settleSeconds", Int), ("measureSeconds", Int), ("cooldownSeconds", Int)];
            check_object(t, "spec.elasticPolicy.throughput", &fields, &mut errs);
        }
    }
    if let Some(rp) = spec.get("runPolicy") {
        check_object(
            rp,
            "spec.runPolicy",
            &[
                ("cleanPodPolicy", Str),
                ("ttlSecondsAfterFinished", Int),
                ("activeDeadlineSeconds", Int),
                ("backoffLimit", Int),
                ("schedulingPolicy", Object),
                ("suspend", Bool),
                ("managedBy", Str),
            ],
            &mut errs,
        );
        if let Some(sp) = rp.get("schedulingPolicy") {
            check_object(
                sp,
                "spec.runPolicy.schedulingPolicy",
                &[("minAvailable", Int), ("queue", Str), ("minResources", Object), ("priorityClass", Str), ("scheduleTimeoutSeconds", Int)],
                &mut errs,
            );
        }
    }
    if let Some(specs) = spec.get("tfReplicaSpecs").and_then(|v| v.as_object()) {
        for (key, rs) in specs {
            check_object(rs, &format!("spec.tfReplicaSpecs.{key}"), &[("replicas", Int), ("template", Object), ("restartPolicy", Str)], &mut errs);
        }
    }
    errs
}

/// Outcome of loading one document of a manifest.
pub type LoadedJob = Result<TFJob, ManifestError>;

/// Splits a (possibly multi-document) YAML manifest and parses + validates every TFJob in it.
/// Documents that are not TFJobs are reported as errors; empty documents are skipped.
pub fn load_manifest(text: &str) -> Result<Vec<LoadedJob>, ManifestError> {
    let mut out = Vec::new();
    // Empty documents (`---` alone, comments only) are skipped by the parser and here.
    let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(text)?;
    for (index, json) in documents.into_iter().enumerate() {
        if json.is_null() {
            continue;
        }
        let api_version = json.get("apiVersion").and_then(|v| v.as_str()).unwrap_or("");
        let kind = json.get("kind").and_then(|v| v.as_str()).unwrap_or("");
        if api_version != "kubeflow.org/v1" || kind != KIND {
            out.push(Err(ManifestError::NotATFJob { index, found: format!("apiVersion {api_version:?}, kind {kind:?}") }));
            continue;
        }
        let name = json.pointer("/metadata/name").and_then(|v| v.as_str()).unwrap_or("<unnamed>").to_string();
        out.push(parse_and_validate(json).map_err(|errors| ManifestError::Invalid { name, errors }));
    }
    Ok(out)
}

/// YAML text of a value as `tfjob` writes it (`tfjob crd`, `tfjob render`, `status.yaml`): block
/// style, multi-line strings as literal blocks, every other string on one line (no folded `>-`
/// scalars, so a line of the output can be searched for a whole message), and strings that
/// YAML 1.1 readers such as kubectl would take for booleans or numbers quoted.
pub fn to_yaml<T: Serialize>(value: &T) -> Result<String, serde_saphyr::SerializeError> {
    let mut options = serde_saphyr::SerializerOptions::default();
    // Multi-line strings stay literal blocks (`|`); no single-line string is long enough to fold.
    options.folded_wrap_chars = usize::MAX;
    serde_saphyr::to_string_with_options(value, options)
}

impl TFJob {
    /// The job's name (empty when unset).
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }

    /// Whether the job is managed by another controller (e.g. MultiKueue) and must be skipped.
    pub fn managed_elsewhere(&self) -> bool {
        !Claim::Unmanaged.takes(self.spec.run_policy.managed_by.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    fn job(yaml: &str) -> serde_json::Value {
        serde_saphyr::from_str(yaml).unwrap()
    }

    const VALID: &str = r#"
apiVersion: kubeflow.org/v1
kind: TFJob
metadata: {name: mnist, namespace: default}
spec:
  tfReplicaSpecs:
    ps:
      template:
        spec:
          containers: [{name: tensorflow, image: "tfjob-runtime:latest"}]
    WORKER:
      replicas: 2
      restartPolicy: OnFailure
      template:
        spec:
          containers: [{name: tensorflow, image: "tfjob-runtime:latest"}]
"#;

    #[test]
    fn defaults_and_normalisation() {
        let j = parse_and_validate(job(VALID)).unwrap();
        let keys: Vec<_> = j.spec.tf_replica_specs.keys().cloned().collect();
        assert_eq!(keys, vec!["PS".to_string(), "Worker".to_string()]);
        let ps = &j.spec.tf_replica_specs["PS"];
        assert_eq!(ps.replicas, 1);
        assert_eq!(ps.restart_policy, RestartPolicy::Never);
        let w = &j.spec.tf_replica_specs["Worker"];
        assert_eq!(w.replicas, 2);
        assert_eq!(w.restart_policy, RestartPolicy::OnFailure);
        assert_eq!(j.spec.run_policy.clean_pod_policy, CleanPodPolicy::Running);
        let ports = ps.template.spec.as_ref().unwrap().containers[0].ports.clone().unwrap();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].name.as_deref(), Some("tfjob-port"));
        assert_eq!(ports[0].container_port, 2222);
    }

    #[test]
    fn reports_every_problem_with_field_paths() {
        let bad = r#"
apiVersion: kubeflow.org/v1
kind: TFJob
metadata: {name: Bad_Name}
spec:
  successPolicy: Sometimes
  runPolicy: {cleanPodPolicy: Some, backoffLimit: -1, managedBy: me}
  tfReplicaSpecs:
    Chief: {replicas: 1, template: {spec: {containers: [{name: tensorflow, image: x}]}}}
    Master: {replicas: 1, template: {spec: {containers: [{name: tensorflow, image: x}]}}}
    Worker:
      replicas: -1
      restartPolicy: Sometimes
      template: {spec: {containers: [{name: main, image: ""}]}}
    Driver: {template: {spec: {containers: [{name: tensorflow, image: x}]}}}
    PS: {}
"#;
        let errs = parse_and_validate(job(bad)).unwrap_err().0;
        let fields: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
        for expected in [
            "metadata.name",
            "spec.successPolicy",
            "spec.runPolicy.cleanPodPolicy",
            "spec.runPolicy.backoffLimit",
            "spec.runPolicy.managedBy",
            "spec.tfReplicaSpecs",
            "spec.tfReplicaSpecs.Worker.replicas",
            "spec.tfReplicaSpecs.Worker.restartPolicy",
            "spec.tfReplicaSpecs.Worker.template.spec.containers[0].image",
            "spec.tfReplicaSpecs.Worker.template.spec.containers",
            "spec.tfReplicaSpecs.Driver",
            "spec.tfReplicaSpecs.PS.template.spec.containers",
        ] {
            assert!(fields.contains(&expected), "missing {expected} in {errs:#?}");
        }
        assert!(errs.iter().any(|e| e.message.contains("at most one of Chief and Master")));
    }

    #[test]
    fn unknown_fields_and_wrong_types_are_named() {
        let y = r#"
apiVersion: kubeflow.org/v1
kind: TFJob
metadata: {name: typo}
spec:
  tfReplicaSpecs:
    Worker:
      replicas: two
      restartpolicy: OnFailure
      template: {spec: {containers: [{name: tensorflow, image: x}]}}
  runPolicy: {suspend: "yes", cleanupPolicy: All}
  enableDynamicWorkers: true
"#;
        let errs = parse_and_validate(job(y)).unwrap_err().0;
        let got: Vec<(String, String)> = errs.into_iter().map(|e| (e.field, e.message)).collect();
        let want: Vec<(String, String)> = vec![
            ("spec.enableDynamicWorkers", "unknown field"),
            ("spec.runPolicy.cleanupPolicy", "unknown field"),
            ("spec.runPolicy.suspend", "must be a boolean, got \"yes\""),
            ("spec.tfReplicaSpecs.Worker.replicas", "must be an integer, got \"two\""),
            ("spec.tfReplicaSpecs.Worker.restartpolicy", "unknown field; did you mean \"restartPolicy\"?"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn needs_chief_or_worker() {
        let y = r#"
apiVersion: kubeflow.org/v1
kind: TFJob
metadata: {name: onlyps}
spec:
  tfReplicaSpecs:
    PS: {template: {spec: {containers: [{name: tensorflow, image: x}]}}}
"#;
        let errs = parse_and_validate(job(y)).unwrap_err().0;
        assert_eq!(errs, vec![FieldError::new("spec.tfReplicaSpecs", "must contain a Chief, a Master or a Worker replica type")]);
    }

    /// A job of the given `TYPE=N` replica sets (each with a valid template).
    fn job_of(types: &str) -> serde_json::Value {
        let mut y = String::from("apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {name: floor}\nspec:\n  tfReplicaSpecs:\n");
        for t in types.split(',') {
            let (t, n) = t.split_once('=').unwrap();
            y.push_str(&format!("    {t}: {{replicas: {n}, template: {{spec: {{containers: [{{name: tensorflow, image: x}}]}}}}}}\n"));
        }
        job(&y)
    }

    #[test]
    fn worker_shares_are_percentages_of_a_job_whose_workers_decide() {
        let with = |types: &str, shares: serde_json::Value| {
            let mut j = job_of(types);
            j["spec"]["workerShares"] = shares;
            parse_and_validate(j).err().map(|e| e.0).unwrap_or_default()
        };
        assert_eq!(with("PS=1,Worker=4", serde_json::json!({"succeededPercent": 75, "failedPercent": 25})), vec![]);
        assert_eq!(
            with("PS=1,Worker=4", serde_json::json!({"succeededPercent": 0, "failedPercent": 100})),
            vec![
                FieldError::new("spec.workerShares.succeededPercent", "0 is not a percentage from 1 to 100"),
                FieldError::new("spec.workerShares.failedPercent", "100 is not a percentage from 0 to 99"),
            ]
        );
        assert_eq!(
            with("Chief=1,Worker=4", serde_json::json!({"succeededPercent": 75})),
            vec![FieldError::new("spec.workerShares.succeededPercent", "the job has a Chief or Master, which decides when it succeeds")]
        );
        assert_eq!(with("Chief=1,Worker=4", serde_json::json!({"failedPercent": 25})), vec![]);
        assert_eq!(
            with("Chief=1", serde_json::json!({"failedPercent": 25})),
            vec![FieldError::new("spec.workerShares", "the job has no Worker replicas to count")]
        );
    }

    #[test]
    fn worker_zero_is_the_chief_of_a_job_without_chief() {
        // (replica sets, the errors of validation as (field, message), the Worker count planned)
        type Case = (&'static str, Vec<(&'static str, &'static str)>, i32);
        let floor = "must be at least 1 when the job has no Chief or Master: worker 0 is the chief, got 0";
        let cases: Vec<Case> = vec![
            ("PS=1,Worker=0", vec![("spec.tfReplicaSpecs.Worker.replicas", floor)], 1),
            ("PS=1,worker=0", vec![("spec.tfReplicaSpecs.worker.replicas", floor)], 1),
            ("PS=1,Worker=1", vec![], 1),
            ("Chief=1,Worker=0", vec![], 0),
            ("master=1,WORKER=0", vec![], 0),
            ("PS=1,Worker=-1", vec![("spec.tfReplicaSpecs.Worker.replicas", "must be >= 0, got -1")], 1),
        ];
        for (types, want, planned) in cases {
            let doc = job_of(types);
            let got: Vec<(String, String)> = match parse_and_validate(doc.clone()) {
                Ok(_) => vec![],
                Err(e) => e.0.into_iter().map(|e| (e.field, e.message)).collect(),
            };
            let want: Vec<(String, String)> = want.into_iter().map(|(f, m)| (f.to_string(), m.to_string())).collect();
            assert_eq!(got, want, "{types}");
            let mut j: TFJob = serde_json::from_value(doc).unwrap();
            apply_defaults(&mut j.spec);
            let rs = &j.spec.tf_replica_specs["Worker"];
            assert_eq!(planned_replicas(&j.spec, ReplicaType::Worker, rs), planned, "{types}");
        }
    }

    #[test]
    fn crd_serves_the_scale_subresource_of_the_workers() {
        let crd = serde_json::to_value(TFJob::crd()).unwrap();
        let version = &crd["spec"]["versions"][0];
        assert_eq!(
            version["subresources"],
            serde_json::json!({
                "status": {},
                "scale": {
                    "specReplicasPath": ".spec.tfReplicaSpecs.Worker.replicas",
                    "statusReplicasPath": ".status.replicaStatuses.Worker.replicas",
                    "labelSelectorPath": ".status.replicaStatuses.Worker.selector",
                },
            })
        );
        let schema = &version["schema"]["openAPIV3Schema"]["properties"];
        let rules = &schema["spec"]["properties"]["tfReplicaSpecs"]["x-kubernetes-validations"];
        assert!(rules.as_array().unwrap().iter().any(|r| r["message"] == WORKER_FLOOR_MESSAGE), "{rules}");
        let status = &schema["status"]["properties"]["replicaStatuses"]["additionalProperties"];
        assert_eq!(status["properties"]["replicas"]["type"], "integer", "{status}");
        assert_eq!(status["properties"]["selector"]["type"], "string", "{status}");
    }

    #[test]
    fn crd_has_the_admission_rules_with_bounds_for_their_cost() {
        let crd = serde_json::to_value(TFJob::crd()).unwrap();
        let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let messages = |node: &serde_json::Value| -> Vec<String> {
            node["x-kubernetes-validations"].as_array().into_iter().flatten().map(|r| r["message"].as_str().unwrap_or_default().to_string()).collect()
        };
        let root_rules = messages(root);
        assert_eq!(root_rules.len(), 2, "{root_rules:?}");
        assert!(root_rules[0].starts_with("metadata.name must be a DNS-1035 label"));
        assert!(root_rules[1].starts_with("metadata.name is too long"));
        let specs = &root["properties"]["spec"]["properties"]["tfReplicaSpecs"];
        assert_eq!(messages(specs).len(), 6);
        assert_eq!(specs["maxProperties"], 5);
        assert_eq!(specs["minProperties"], 1);
        assert_eq!(root["properties"]["spec"]["required"], serde_json::json!(["tfReplicaSpecs"]));
        let replica_set = &specs["additionalProperties"];
        assert_eq!(messages(replica_set), vec!["must contain a container named \"tensorflow\"".to_string()]);
        let containers = &replica_set["properties"]["template"]["properties"]["spec"]["properties"]["containers"];
        assert_eq!(containers["maxItems"], MAX_CONTAINERS);
        assert_eq!(containers["x-kubernetes-list-map-keys"], serde_json::json!(["name"]));
        assert_eq!(messages(&containers["items"]), vec!["must not be empty".to_string()]);
        let c = &containers["items"]["properties"];
        assert_eq!(c["name"]["maxLength"], 63);
        assert_eq!(c["image"]["maxLength"], MAX_IMAGE_LENGTH);
    }

    #[test]
    fn name_length_accounts_for_generated_names() {
        // 63 - len("-worker-") - len("9") = 54 characters is the longest name for 10 workers.
        let ok = "a".repeat(54);
        let too_long = "a".repeat(55);
        for (name, valid) in [(ok, true), (too_long, false)] {
            let y = format!(
                "apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {{name: {name}}}\nspec:\n  tfReplicaSpecs:\n    Worker: {{replicas: 10, template: {{spec: {{containers: [{{name: tensorflow, image: x}}]}}}}}}\n"
            );
            let r = parse_and_validate(job(&y));
            assert_eq!(r.is_ok(), valid, "{name}: {r:?}");
            if let Err(e) = r {
                assert_eq!(e.0[0].field, "metadata.name");
                assert!(e.0[0].message.contains("64 characters"), "{}", e.0[0].message);
            }
        }
    }

    #[test]
    fn managed_by_is_immutable() {
        let a = parse_and_validate(job(VALID)).unwrap();
        let mut b = a.clone();
        b.spec.run_policy.managed_by = Some(MANAGED_BY_MULTIKUEUE.into());
        assert!(validate_update(&a, &b).iter().any(|e| e.field == "spec.runPolicy.managedBy" && e.message == "is immutable"));
        assert!(validate_update(&a, &a).is_empty());
        assert!(b.managed_elsewhere());
        assert!(!a.managed_elsewhere());
    }

    #[test]
    fn which_jobs_each_claim_takes() {
        let cases = [
            (None, true, false),
            (Some(MANAGED_BY_THIS), true, false),
            (Some(MANAGED_BY_TFJOB_RS), true, true),
            (Some(MANAGED_BY_MULTIKUEUE), false, false),
            (Some("example.com/other"), false, false),
        ];
        for (managed_by, unmanaged, own_only) in cases {
            assert_eq!(Claim::Unmanaged.takes(managed_by), unmanaged, "{managed_by:?}");
            assert_eq!(Claim::OwnOnly.takes(managed_by), own_only, "{managed_by:?}");
        }
    }

    /// Checks the rules of a structural schema that a derive can break: every node has a type
    /// (or is int-or-string / preserve-unknown-fields), and `anyOf`/`oneOf`/`allOf` branches carry
    /// no type, description, default or nullable.
    fn check_structural(node: &serde_json::Value, path: &str, in_junctor: bool, problems: &mut Vec<String>) {
        let Some(o) = node.as_object() else { return };
        let int_or_string = o.get("x-kubernetes-int-or-string") == Some(&serde_json::Value::Bool(true));
        if in_junctor {
            for k in ["type", "description", "default", "nullable"] {
                if o.contains_key(k) && !(int_or_string && k == "type") {
                    problems.push(format!("{path}: {k} inside a junctor"));
                }
            }
        } else if !o.contains_key("type") && !int_or_string {
            problems.push(format!("{path}: no type"));
        }
        if let Some(props) = o.get("properties").and_then(|p| p.as_object()) {
            for (k, v) in props {
                check_structural(v, &format!("{path}.{k}"), false, problems);
            }
        }
        for k in ["items", "additionalProperties"] {
            if let Some(v) = o.get(k).filter(|v| v.is_object()) {
                check_structural(v, &format!("{path}[{k}]"), false, problems);
            }
        }
        for k in ["anyOf", "oneOf", "allOf"] {
            if let Some(arr) = o.get(k).and_then(|v| v.as_array()) {
                for (i, v) in arr.iter().enumerate() {
                    check_structural(v, &format!("{path}.{k}[{i}]"), true, problems);
                }
            }
        }
    }

    #[test]
    fn crd_schema_is_structural() {
        let crd = serde_json::to_value(TFJob::crd()).unwrap();
        let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let mut problems = Vec::new();
        check_structural(root, "", false, &mut problems);
        assert!(problems.is_empty(), "{problems:#?}");
        let mut bad = Vec::new();
        check_structural(&serde_json::json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}]}}}), "", false, &mut bad);
        assert_eq!(bad.len(), 2, "the checker itself catches violations: {bad:?}");
    }

    #[test]
    fn unsupported_enum_values_deserialise_and_are_rejected() {
        let rs: ReplicaSpec = serde_json::from_value(serde_json::json!({"restartPolicy": "Sometimes"})).unwrap();
        assert_eq!(rs.restart_policy, RestartPolicy::Unsupported("Sometimes".into()));
        let rs: ReplicaSpec = serde_json::from_value(serde_json::json!({"restartPolicy": "ExitCode"})).unwrap();
        assert_eq!(rs.restart_policy, RestartPolicy::ExitCode);
        let sp: TFJobSpec = serde_json::from_value(serde_json::json!({"successPolicy": ""})).unwrap();
        assert_eq!(sp.success_policy, Some(SuccessPolicy::Default));
    }

    #[test]
    fn a_template_that_is_no_pod_template_deserialises_and_is_rejected() {
        // The schema preserves any object under `template`; the API server stores this job.
        let doc = serde_json::json!({
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "metadata": {"name": "garbage", "namespace": "ns"},
            "spec": {"tfReplicaSpecs": {
                "Worker": {"replicas": 1, "template": {"spec": {"containers": "tensorflow"}}},
                "PS": {"template": {"spec": {"containers": [{"name": "tensorflow", "image": "i"}]}}},
            }},
        });
        // A list of such jobs (what the controller's watcher reads) still deserialises.
        let list = serde_json::json!({"items": [doc.clone()]});
        let jobs: Vec<TFJob> = serde_json::from_value(list["items"].clone()).unwrap();
        let job = &jobs[0];
        let worker = &job.spec.tf_replica_specs["Worker"];
        assert!(worker.template.is_empty());
        let why = worker.template_reading.error.clone().unwrap();
        assert_eq!(why.field, "spec.containers");
        assert!(why.message.contains("expected a sequence"), "{why}");
        assert_eq!(job.spec.tf_replica_specs["PS"].template_reading, Default::default());
        assert_eq!(job.spec.tf_replica_specs["PS"].replicas, 1);
        // Validation (the controller's) names the field, once.
        let errs = validate(job);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "spec.tfReplicaSpecs.Worker.template.spec.containers");
        assert!(errs[0].message.starts_with("cannot be decoded: invalid type: string \"tensorflow\""), "{errs:?}");
        // What reading found is not part of the API: serialising drops it.
        let back = serde_json::to_value(worker).unwrap();
        assert!(back.get("templateReading").is_none(), "{back}");
        // `tfjob validate` reports the problem once, with the path of the bad value.
        let errs = parse_and_validate(doc).unwrap_err().0;
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "spec.tfReplicaSpecs.Worker.template.spec.containers");
        // No template at all, or null, is an empty template (no container: invalid).
        let rs: ReplicaSpec = serde_json::from_value(serde_json::json!({"template": null})).unwrap();
        assert_eq!(rs.template_reading, Default::default());
        assert_eq!(rs.replicas, 1);
    }

    #[test]
    fn typos_and_bad_values_in_a_template_are_errors_with_their_paths() {
        let y = r#"
apiVersion: kubeflow.org/v1
kind: TFJob
metadata: {name: typo}
spec:
  tfReplicaSpecs:
    Worker:
      template:
        spec:
          containers:
          - name: tensorflow
            image: x
            imagePullPolicy: Sometimes
            resource: {limits: {cpu: "1"}}
            ports: [{name: tfjob_port, containerPort: 2222}]
"#;
        let errs = parse_and_validate(job(y)).unwrap_err().0;
        let got: Vec<(String, String)> = errs.into_iter().map(|e| (e.field, e.message)).collect();
        let c = "spec.tfReplicaSpecs.Worker.template.spec.containers[0]";
        let want: Vec<(String, String)> = vec![
            (format!("{c}.resource"), "unknown field; did you mean \"resources\"?".to_string()),
            (
                format!("{c}.imagePullPolicy"),
                "unsupported value \"Sometimes\"; supported values: \"Always\", \
                 \"IfNotPresent\", \"Never\""
                    .to_string(),
            ),
            (
                format!("{c}.ports[0].name"),
                "\"tfjob_port\" is not a valid port name (IANA_SVC_NAME): it may contain only \
                 lower case letters, digits and '-'"
                    .to_string(),
            ),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn crd_schema_has_defaults_and_preserves_template() {
        let crd = serde_json::to_value(TFJob::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let rs = &spec["properties"]["tfReplicaSpecs"]["additionalProperties"];
        assert_eq!(rs["properties"]["replicas"]["default"], 1);
        assert_eq!(rs["properties"]["restartPolicy"]["default"], "Never");
        assert_eq!(rs["properties"]["restartPolicy"]["enum"], serde_json::json!(["Always", "OnFailure", "Never", "ExitCode"]));
        assert_eq!(rs["properties"]["replicas"]["minimum"], 0.0);
        assert_eq!(rs["properties"]["template"]["x-kubernetes-preserve-unknown-fields"], true);
        let rp = &spec["properties"]["runPolicy"];
        assert_eq!(rp["properties"]["cleanPodPolicy"]["default"], "Running");
        assert_eq!(crd["spec"]["names"]["plural"], "tfjobs");
        assert_eq!(crd["spec"]["scope"], "Namespaced");
    }

    /// The YAML library (serde-saphyr) as manifests use it: several documents, empty ones and
    /// comment-only ones skipped, quoted numbers and booleans kept as strings, and a syntax
    /// error reported with its position.
    #[test]
    fn manifests_load_as_yaml_streams() {
        let job = |name: &str| {
            format!(
                "apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {{name: {name}}}\nspec:\n  \
                 tfReplicaSpecs:\n    Worker:\n      template:\n        spec:\n          \
                 containers: [{{name: tensorflow, image: img, args: ['on', \"yes\", '1']}}]\n"
            )
        };
        let cases: Vec<(String, Vec<&str>)> = vec![
            (job("a"), vec!["a"]),
            (format!("---\n{}---\n# only a comment\n---\n{}", job("a"), job("b")), vec!["a", "b"]),
            ("# nothing but a comment\n".into(), vec![]),
            ("".into(), vec![]),
        ];
        for (text, names) in cases {
            let jobs: Vec<TFJob> = load_manifest(&text).unwrap_or_else(|e| panic!("{text}: {e}")).into_iter().map(|j| j.unwrap()).collect();
            assert_eq!(jobs.iter().map(TFJob::name).collect::<Vec<_>>(), names, "{text}");
            for j in &jobs {
                let args = &j.spec.tf_replica_specs["Worker"].template.spec.as_ref().unwrap().containers[0].args;
                assert_eq!(args.as_deref(), Some(&["on".to_string(), "yes".into(), "1".into()][..]));
            }
        }
        let err = load_manifest("kind: TFJob\nmetadata: {name: [\n").unwrap_err();
        assert!(matches!(err, ManifestError::Yaml(_)), "{err}");
        assert!(err.to_string().contains("line"), "{err}");
        // What `tfjob render` writes reads back the same, strings that look like other types
        // included.
        let value = serde_json::json!({"a": "on", "b": "1", "c": "null", "d": "", "e": "x: y", "f": 1.5});
        let text = to_yaml(&value).unwrap();
        assert_eq!(serde_saphyr::from_str::<serde_json::Value>(&text).unwrap(), value, "{text}");
        let long = "x ".repeat(100);
        assert_eq!(to_yaml(&long).unwrap().lines().count(), 1);
        assert_eq!(to_yaml(&"a\nb").unwrap(), "|-\n  a\n  b\n");
    }
}
