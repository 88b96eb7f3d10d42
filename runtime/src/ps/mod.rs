//! The parameter server: a variable store with optimizers applied in place,
//! the sync accumulator, and the gRPC service around them.
//!
//! [`ParameterStore`] is synchronous and does all the checking; the gRPC
//! service only collects streams, waits on the sync barrier and maps errors
//! to status codes. Nothing received from the network can panic the store
//! or change a variable unless the whole request is valid.
//!
//! One lock guards the store's state (every public method takes it once,
//! none across an await; the push and pull paths hold it for one request).
//! The state is composed of parts that each own theirs and know nothing of
//! the lock (`state/`):
//! - `variables`: the variables and embedding partitions, their encoded
//!   parts, the traffic counters.
//! - `membership`: leases of the training tasks, the tasks waited for at
//!   the end, push ids.
//! - `training`: the training agreement (view, configuration, optimizer,
//!   sync accumulator, step, end of training).
//! - `dispatching`: the shard dispatcher of ps 0.
//! - `reports`: what the tasks report of their training by heartbeat (the
//!   latest loss, `--train_steps`, the latest evaluation), for ps 0's
//!   metrics; not checkpointed.
//!
//! `store.rs` is the [`ParameterStore`] over them: configuration, lock,
//! published progress. What a request does under the lock is in the file
//! named after the part it concerns: `variables.rs` (pulls),
//! `membership.rs` (leases and heartbeats; a task leaving or lost, [`ParameterStore::leave`]
//! and [`ParameterStore::expire_leases`], ends in one `forget_task`),
//! `training.rs` (handshake, initialisation, pushes, abstentions,
//! shutdown), `dispatching.rs`, `checkpointing.rs` (a ps's checkpoint shard,
//! written and restored; `recut.rs` cuts a checkpoint of another ps count
//! for this ps). `service.rs` is the gRPC service and the tensor
//! channel's entry; `error.rs` the refusals. This file only declares and
//! re-exports.

mod checkpointing;
mod dispatching;
mod error;
mod membership;
mod moving;
pub mod recut;
mod service;
mod state;
mod store;
mod training;
mod variables;

#[cfg(test)]
mod tests;

pub use error::StoreError;
pub use membership::ReplyOnItsWay;
pub use moving::add_message;
pub use service::{FragmentSource, PsService, Pulled};
pub use state::{Counters, GrpcPull, MAX_PUSH_ROWS_BYTES, Progress, PulledRows, SharedPull, SharedVariable, check_training_config};
pub use store::{ParameterStore, PsConfig};
