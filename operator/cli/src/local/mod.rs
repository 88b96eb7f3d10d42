//! `tfjob run`: one TFJob on one machine, no cluster.
//!
//! The [`driver`] is the controller's loop without Kubernetes: it plans the
//! job with [`tfjob_api::plan`], observes the replicas through a [`Backend`]
//! (child processes by default, containers with `--backend container`),
//! feeds the observations to the same pure state machine
//! ([`tfjob_api::status::reconcile_status`]) and executes the actions it
//! returns. A backend plays the kubelet: it starts replicas, restarts them in
//! place per the pod restart policy, and reports phases and exit codes; its
//! contract with the driver is [`backend`]. `tfjob scale` changes the spec of
//! a running job through [`control`]; the next pass creates or deletes the
//! difference like the controller does.
//!
//! Layers, lowest first (a module imports only modules above it in this list): [`expand`],
//! [`training`], [`outcome`], [`volumes`], [`control`], [`progress`] -> [`console`], [`logs`] -> [`backend`]
//! -> [`process`], [`container`] -> [`driver`]. This file only declares and re-exports.

pub mod backend;
pub mod console;
pub mod container;
pub mod control;
pub mod driver;
pub mod expand;
pub mod logs;
pub mod outcome;
pub mod process;
pub mod progress;
pub mod tls;
pub mod training;
pub mod volumes;

pub use backend::{Backend, Observed, RunError};
pub use driver::{BackendKind, RunOptions, load_job, run_file, run_job};
pub use outcome::RunResult;
