//! tfjob-operator: the Kubernetes controller for TFJobs.
//!
//! - [`kube`]: the controller that executes plans and status actions.
//! - [`metrics`]: the controller's Prometheus metrics and HTTP endpoints.
//!
//! The API types, planning and the status machine are [`tfjob_api`]'s.

pub mod kube;
pub mod metrics;
