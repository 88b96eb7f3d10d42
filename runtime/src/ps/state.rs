//! What the store's lock guards, by owner: each part owns its state and
//! the checks on it, and knows nothing of the lock or of the other requests
//! ([`super::ParameterStore`] composes them).

mod dispatching;
mod layout;
mod membership;
mod reports;
mod training;
mod variables;

pub(super) use dispatching::Dispatching;
pub(super) use layout::{LEAVE_REMEMBERED, LayoutState, Staged, staying};
pub(super) use membership::Membership;
pub(super) use reports::Reports;
pub(super) use training::{Agreement, Training};
pub use training::{Progress, check_training_config};
pub use variables::{Counters, GrpcPull, MAX_PUSH_ROWS_BYTES, PulledRows, SharedPull, SharedVariable};
pub(super) use variables::{StoredVar, Variables, assemble, check_spec, pieces_of};

/// Everything the lock guards, by owner.
#[derive(Debug)]
pub(super) struct State {
    pub(super) vars: Variables,
    pub(super) members: Membership,
    pub(super) training: Training,
    pub(super) dispatch: Dispatching,
    /// A checkpoint of another ps count, kept until the first handshake
    /// says which pieces this ps holds now.
    pub(super) pending_recut: Option<super::recut::PendingRecut>,
    pub(super) layout: LayoutState,
    /// What the tasks reported of their training by heartbeat.
    pub(super) reports: Reports,
}
