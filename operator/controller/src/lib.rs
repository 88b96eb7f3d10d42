//! tfjob-operator: the Kubernetes controller for TFJobs, and the binary of the operator image.
//!
//! - [`controller`]: watches, caches and the reconcile pipeline that executes plans and status
//!   actions.
//! - [`leader`]: leader election on a Lease.
//! - [`metrics`]: the controller's Prometheus metrics and HTTP endpoints.
//! - [`progress`]: reads each running job's progress from ps 0 into its status, and runs the
//!   built-in throughput autoscaler.
//! - [`startup`]: the flags ([`OperatorArgs`]), logging, the CRD check and the run until a
//!   signal ([`run_operator`]).
//! - [`api_errors`]: what the API server's error answers mean to a caller.
//!
//! The API types, planning and the status machine are [`tfjob_api`]'s; this crate imports
//! nothing of the `tfjob` command.

pub mod api_errors;
pub mod controller;
pub mod leader;
pub mod metrics;
pub mod progress;
pub mod seed;
pub mod startup;

pub use startup::{OperatorArgs, run_operator};
