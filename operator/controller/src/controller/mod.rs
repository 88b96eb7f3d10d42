//! The Kubernetes controller: watches TFJobs and the pods and Services they own (into watch
//! caches, see [`cache`]), executes the plan ([`tfjob_api::plan`]) and the status state machine
//! ([`tfjob_api::status`]), writes status through the status subresource and emits Events.
//!
//! Light on the API server: a reconcile reads nothing from it. The job comes from the
//! controller's own watch, its pods and Service from the watch caches; it writes only what
//! changes: a pod created or deleted, the Service when it is missing or differs, the status when
//! it changed, the token Secret once per job (it never reads or watches Secrets), each Event
//! once (queued, and written by a task of its own: [`event_queue`]).
//!
//! A reconcile is a pipeline ([`reconcile`]): gate -> decide (pure) -> execute ([`execute`], one
//! function per kind of action) -> commit ([`commit`]: status, events, metrics).
//!
//! Layers, lowest first (a module imports only modules before it): [`error`], [`cache`],
//! [`observe`], [`target`], [`watch`], [`event_queue`] -> [`context`] -> [`events`] -> [`admission`] -> [`execute`]
//! -> [`kueue_group`] -> [`commit`]
//! -> [`reconcile`]. This file only declares and re-exports.

pub mod admission;
pub mod cache;
pub mod commit;
pub mod context;
pub mod error;
pub mod event_queue;
pub mod events;
pub mod execute;
pub mod kueue_group;
pub mod observe;
pub mod pod_index;
pub mod reconcile;
pub mod target;
pub mod watch;

pub use commit::{status_changed, status_patch};
pub use context::{Context, FIELD_MANAGER};
pub use error::Error;
pub use reconcile::{error_policy, reconcile};
pub use watch::build_controller;
