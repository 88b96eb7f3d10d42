//! tfjob-api: the TFJob API (`kubeflow.org/v1`) and the pure code around it.
//!
//! - [`api`]: the `TFJob` custom resource, defaulting and validation.
//! - [`field`]: validation problems naming their field, and the DNS name rules.
//! - [`template`]: pod templates read strictly (unknown fields, wrongly typed values) and
//!   checked for the values the API server would refuse.
//! - [`plan`]: pure planning: the replicas, pods, Service, Secret and `TF_CONFIG` of a job
//!   (entry points: [`plan::ReplicaPlanner`] for every backend, [`plan::PodPlanner`] for the
//!   controller).
//! - [`status`]: pure state machine: observed replicas in, new status and actions out
//!   (entry point: [`status::reconcile_status`]).
//! - [`progress`]: a job's training progress (`status.trainingProgress`) from ps 0's metrics.
//! - [`autoscale`]: `spec.elasticPolicy` and the built-in throughput autoscaler, pure.
//! - [`gang`]: gangs and queues: the PodGroup of a job (Volcano, scheduler-plugins), and what
//!   lets the controller create its pods now (a Volcano gang taken in, a Kueue admission).
//! - [`crd`]: the CustomResourceDefinition as this project ships it.
//!
//! Everything here is plain data and plain functions: no async runtime, no Kubernetes client,
//! no I/O. The operator (crate `tfjob-operator`) and `tfjob run` (crate `tfjob`) both plan with
//! it; so can any program that wants to write, check or plan TFJobs.
//!
//! # Example
//!
//! A TFJob built in Rust (one ps, two workers), validated, defaulted and planned; each replica
//! gets the `TF_CONFIG` TensorFlow reads (the repository's `examples/build_tfjob.rs` does the
//! same and prints them):
//!
//! ```
//! use std::collections::BTreeMap;
//!
//! use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
//! use tfjob_api::api::{self, ReplicaSpec, TFJob, TFJobSpec};
//! use tfjob_api::plan::{self, ClusterDns};
//!
//! let replicas = |replicas| {
//!     let container = Container { name: "tensorflow".into(), image: Some("tfjob-runtime:0.1.0".into()), ..Default::default() };
//!     let template = PodTemplateSpec { spec: Some(PodSpec { containers: vec![container], ..Default::default() }), ..Default::default() };
//!     ReplicaSpec { replicas, template: template.into(), ..Default::default() }
//! };
//! let spec = TFJobSpec { tf_replica_specs: BTreeMap::from([("PS".into(), replicas(1)), ("Worker".into(), replicas(2))]), ..Default::default() };
//! let mut job = TFJob::new("linear", spec);
//! job.metadata.namespace = Some("team".into());
//!
//! // Every problem at once, each naming its field; none here.
//! assert_eq!(api::validate(&job), vec![]);
//! api::apply_defaults(&mut job.spec);
//!
//! let dns = ClusterDns { job: "linear".into(), namespace: "team".into(), cluster_domain: None };
//! let planned = plan::plan_replicas("linear", &job.spec, &dns);
//! let worker1 = planned.iter().find(|r| r.pod_name == "linear-worker-1").unwrap();
//! assert_eq!(
//!     worker1.tf_config.as_deref(),
//!     Some(concat!(
//!         r#"{"cluster":{"ps":["linear-ps-0.linear.team.svc:2222"],"#,
//!         r#""worker":["linear-worker-0.linear.team.svc:2222","linear-worker-1.linear.team.svc:2222"]},"#,
//!         r#""environment":"cloud","task":{"index":1,"type":"worker"}}"#
//!     ))
//! );
//! ```

#![warn(missing_docs)]

pub mod api;
pub mod autoscale;
pub mod crd;
pub mod field;
pub mod gang;
pub mod pki;
pub mod plan;
pub mod progress;
pub mod status;
pub mod template;
pub mod tls;
