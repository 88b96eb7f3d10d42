//! The layout this ps serves (its version; on ps 0 also the ps set and a
//! set proposed), and a move in progress: frozen, staged, committed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::proto;
use crate::ps::error::StoreError;
use crate::ps::recut::DensePiece;
use crate::ps::state::StoredVar;

/// The pieces a ps holds under the next layout, put together and waiting
/// for the commit.
#[derive(Debug)]
pub(in crate::ps) struct Staged {
    pub(in crate::ps) version: u64,
    /// The variables as the store will hold them at the commit.
    pub(in crate::ps) vars: Vec<StoredVar>,
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
    /// ps 0: the ps tasks (by index) that asked to leave, and when; cleared
    /// by a move, forgotten after [`LEAVE_REMEMBERED`].
    pub(in crate::ps) leaving: BTreeMap<u32, Instant>,
}

/// How long ps 0 remembers a ps's wish to leave: longer than any grace
/// period a leaving ps waits in, short enough that a ps that gave up and
/// was started again is not removed by a later scale-down.
pub(in crate::ps) const LEAVE_REMEMBERED: Duration = Duration::from_secs(300);

/// How many of `ps_count` ps tasks stay when those in `leaving` go: only
/// the highest can (a ps's index is its place in the layout), ps 0 never.
pub(in crate::ps) fn staying(ps_count: usize, leaving: impl Fn(u32) -> bool) -> usize {
    let mut keep = ps_count;
    while keep > 1 && leaving(keep as u32 - 1) {
        keep -= 1;
    }
    keep
}

impl LayoutState {
    pub(in crate::ps) fn new(addresses: Vec<String>) -> Self {
        LayoutState { version: 1, addresses, proposed: None, frozen: None, staged: None, retired: false, own_dense: Vec::new(), leaving: BTreeMap::new() }
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

#[cfg(test)]
mod tests {
    /// How many ps tasks stay: only the highest that asked leave, ps 0 never.
    #[test]
    fn only_the_highest_ps_tasks_leave() {
        // (ps count, indices that asked to leave, ps tasks that stay)
        let cases: [(usize, &[u32], usize); 7] = [(3, &[], 3), (3, &[2], 2), (3, &[1, 2], 1), (3, &[1], 3), (3, &[0, 1, 2], 1), (1, &[0], 1), (4, &[1, 3], 3)];
        for (count, leaving, want) in cases {
            assert_eq!(super::staying(count, |k| leaving.contains(&k)), want, "{count} ps, {leaving:?} leaving");
        }
    }
}
