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
//! - [`crd`]: the CustomResourceDefinition as this project ships it.

pub mod api;
pub mod crd;
pub mod field;
pub mod plan;
pub mod status;
pub mod template;
