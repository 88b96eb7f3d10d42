//! tfjob-operator: the TFJob API, its planning code and its controller.
//!
//! - [`api`]: the `TFJob` custom resource (`kubeflow.org/v1`), defaulting and validation.
//! - [`field`]: validation problems naming their field, and the DNS name rules.
//! - [`plan`]: pure planning: the replicas, pods, Service, Secret and `TF_CONFIG` of a job
//!   (entry points: [`plan::ReplicaPlanner`] for every backend, [`plan::PodPlanner`] for the
//!   controller).
//! - [`template`]: pod templates read strictly (unknown fields, wrongly typed values) and
//!   checked for the values the API server would refuse.
//! - [`status`]: pure state machine: observed replicas in, new status and actions out
//!   (entry point: [`status::reconcile_status`]).
//! - [`kube`]: the Kubernetes controller that executes plans and status actions.
//! - [`metrics`]: the controller's Prometheus metrics and HTTP endpoints.
//! - [`cli`]: the `tfjob` command.
//! - [`plot`]: every picture the project draws (training under `tfjob run`, the benchmark's).

pub mod api;
pub mod cli;
pub mod field;
pub mod kube;
pub mod local;
pub mod metrics;
pub mod plan;
pub mod plot;
pub mod status;
pub mod template;
