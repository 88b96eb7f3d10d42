//! The layout this ps serves (its version; on ps 0 also the ps set and a
//! set proposed), and a move in progress: frozen, staged, committed.

use crate::checkpoint::ShardData;
use crate::proto;
use crate::ps::error::StoreError;
use crate::ps::recut::DensePiece;

/// The pieces a ps holds under the next layout, put together and waiting
/// for the commit.
#[derive(Debug)]
pub(in crate::ps) struct Staged {
    pub(in crate::ps) version: u64,
    pub(in crate::ps) data: ShardData,
    pub(in crate::ps) step: i64,
    pub(in crate::ps) fingerprint: u64,
    pub(in crate::ps) variables: Vec<proto::VariableSpec>,
    pub(in crate::ps) dense: Vec<DensePiece>,
    pub(in crate::ps) num_ps: usize,
    pub(in crate::ps) live_tasks: Vec<String>,
}

#[derive(Debug)]
pub(in crate::ps) struct LayoutState {
    /// 1 at the start of a job.
    pub(in crate::ps) version: u64,
    /// Every ps task's address (ps 0 keeps them; others may not know).
    pub(in crate::ps) addresses: Vec<String>,
    pub(in crate::ps) proposed: Option<Vec<String>>,
    /// Frozen for the move to this version: no push is taken.
    pub(in crate::ps) frozen: Option<u64>,
    pub(in crate::ps) staged: Option<Staged>,
    /// Not part of the layout any more: every request is refused.
    pub(in crate::ps) retired: bool,
    /// Where this ps's dense pieces sit in their variables (from the
    /// handshake that agreed, or the move that staged them).
    pub(in crate::ps) own_dense: Vec<DensePiece>,
}

impl LayoutState {
    pub(in crate::ps) fn new(addresses: Vec<String>) -> Self {
        LayoutState { version: 1, addresses, proposed: None, frozen: None, staged: None, retired: false, own_dense: Vec::new() }
    }

    /// A request cut for layout `theirs` (0: the first): refused when this
    /// ps serves another one, is frozen for a move, or left the layout.
    pub(in crate::ps) fn check(&self, theirs: u64) -> Result<(), StoreError> {
        if self.retired {
            return Err(StoreError::LayoutChanged(format!("this ps left the job's layout at version {}", self.version)));
        }
        if let Some(next) = self.frozen {
            return Err(StoreError::LayoutChanged(format!("moving from version {} to {next}", self.version)));
        }
        if theirs.max(1) != self.version {
            return Err(StoreError::LayoutChanged(format!("the request is for version {}, this ps serves version {}", theirs.max(1), self.version)));
        }
        Ok(())
    }

    /// A read cut for layout `theirs`: as [`check`](Self::check), but a
    /// frozen ps still answers (its values do not change until the commit).
    pub(in crate::ps) fn check_read(&self, theirs: u64) -> Result<(), StoreError> {
        if self.frozen.is_some() && !self.retired && theirs.max(1) == self.version {
            return Ok(());
        }
        self.check(theirs)
    }

    pub(in crate::ps) fn reply(&self, initialized: bool) -> proto::LayoutReply {
        proto::LayoutReply {
            version: self.version,
            ps_addresses: self.addresses.clone(),
            proposed: self.proposed.clone().unwrap_or_default(),
            moving: self.frozen.is_some(),
            initialized,
        }
    }
}
