//! A ps's shard of a checkpoint: its variables, slots, update counts, the
//! rows of its embedding partitions and the shard dispatcher's state, copied
//! under the lock and written outside it; and back, before serving.

use std::collections::HashMap;

use super::error::StoreError;
use super::recut::{PendingRecut, recut};
use super::state::{Agreement, State, StoredVar, Variables, pieces_of};
use super::store::ParameterStore;
use crate::checkpoint::{self, OwnedRows, ShardData};
use crate::cluster::TaskId;
use crate::embedding::{EmbeddingPart, RowTable};
use crate::optimizer::Slots;
use crate::proto;

/// Adds an embedding partition's materialised rows to a checkpoint shard:
/// its values (`[rows, dim]`) and slots under the partition's name, the ids
/// under `<name>:ids`, and the partition's description.
fn save_rows(data: &mut ShardData, t: &RowTable) -> Result<(), serde_json::Error> {
    data.push_rows(&t.name, t.dim(), t.saved(), serde_json::to_string(&t.part)?);
    Ok(())
}

/// Every variable's values, slots and update count, in a checkpoint shard.
pub(super) fn save_variables(data: &mut ShardData, vars: &Variables) -> Result<(), StoreError> {
    for v in vars.all() {
        match &v.table {
            Some(t) => save_rows(data, t).map_err(|e| StoreError::FailedPrecondition(e.to_string()))?,
            None => data.push_dense(&v.name, &v.shape, &v.values, [&v.slots.first, &v.slots.second], v.slots.updates),
        }
    }
    Ok(())
}

/// An embedding partition of a checkpoint shard, with its rows (taken, not copied).
fn restored_rows(embeddings: &[(String, String)], name: String, (ids, values, slots, updates): OwnedRows) -> Result<StoredVar, StoreError> {
    let json = embeddings
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, j)| j.as_str())
        .ok_or_else(|| StoreError::InvalidArgument(format!("checkpoint: embedding partition {name:?} has rows but no description")))?;
    let part: EmbeddingPart = serde_json::from_str(json).map_err(|e| StoreError::InvalidArgument(format!("checkpoint: embedding partition {name:?}: {e}")))?;
    let stored_shape = vec![part.partition_rows() as usize, part.dim];
    let mut table = RowTable::new(&name, part);
    table.restore(ids, values, slots, updates).map_err(|e| StoreError::InvalidArgument(format!("checkpoint: {e}")))?;
    Ok(StoredVar::rows(name, stored_shape, table))
}

/// The variables of a checkpoint shard, sorted by name. The shard's
/// vectors become the variables' (a moved partition has millions of rows:
/// no copy).
pub(super) fn restored_variables(data: ShardData) -> Result<Vec<StoredVar>, StoreError> {
    let ShardData { variables, slots, updates, row_ids, embeddings, .. } = data;
    let mut slots: HashMap<String, Vec<f32>> = slots.into_iter().rev().map(|(n, _, v)| (n, v)).collect();
    let mut row_ids: HashMap<String, Vec<i64>> = row_ids.into_iter().rev().collect();
    let updates: HashMap<String, u64> = updates.into_iter().rev().collect();
    let mut vars = Vec::new();
    for (name, shape, values) in variables {
        if shape.iter().product::<usize>() != values.len() {
            return Err(StoreError::InvalidArgument(format!("checkpoint variable {name:?}: shape {shape:?} and {} values", values.len())));
        }
        let mut slot = |k: usize| slots.remove(&format!("{name}:slot{k}")).unwrap_or_default();
        let (first, second) = (slot(0), slot(1));
        let updates = updates.get(&name).copied().unwrap_or(0);
        match row_ids.remove(&name) {
            Some(ids) => vars.push(restored_rows(&embeddings, name, (ids, values, [first, second], updates))?),
            None => vars.push(StoredVar::dense(name, shape, values, Slots { first, second, updates })),
        }
    }
    vars.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(vars)
}

impl ParameterStore {
    /// Writes this ps's shard of the checkpoint of `req.step` (values, slots
    /// and update counts copied under the lock, written outside it).
    pub fn save_checkpoint(&self, task: &TaskId, req: &proto::SaveCheckpointRequest) -> Result<proto::SaveCheckpointReply, StoreError> {
        self.check_chief(task, "save checkpoints")?;
        if req.directory.is_empty() {
            return Err(StoreError::InvalidArgument("directory: empty".into()));
        }
        if req.step < 0 {
            return Err(StoreError::InvalidArgument(format!("step: {} is negative", req.step)));
        }
        let (data, own_step, num_ps) = {
            let state = self.lock();
            state.training.check_initialized()?;
            let mut data = ShardData::default();
            save_variables(&mut data, &state.vars)?;
            data.dispatcher = state.dispatch.saved().map_err(|e| StoreError::FailedPrecondition(e.to_string()))?;
            if state.training.num_ps == 0 {
                return Err(StoreError::FailedPrecondition("the number of ps tasks is not known yet (no worker has joined)".into()));
            }
            (data, state.training.progress.step, state.training.num_ps)
        };
        let dir = crate::storage::Location::parse(&req.directory).map_err(|e| StoreError::InvalidArgument(format!("directory: {e}")))?;
        let info = checkpoint::write_shard(&dir, req.step, self.config.ps_index, num_ps, &data)
            .map_err(|e| if e.is_transient() { StoreError::Unavailable(e.to_string()) } else { StoreError::FailedPrecondition(e.to_string()) })?;
        let json = serde_json::to_string(&info).map_err(|e| StoreError::FailedPrecondition(e.to_string()))?;
        Ok(proto::SaveCheckpointReply { step: own_step, shard_info_json: json })
    }

    /// Restores this ps from a checkpoint shard (of a checkpoint written by
    /// `num_ps` ps tasks) before serving: the values, the step and the shard
    /// dispatcher's state are back; the training configuration (and so the
    /// optimizer) comes with the first worker's handshake.
    pub fn restore(&self, data: ShardData, step: i64, num_ps: usize) -> Result<(), StoreError> {
        let mut guard = self.lock();
        let state = &mut *guard;
        check_fresh(state)?;
        if state.training.num_ps == 0 {
            state.training.num_ps = num_ps;
        }
        self.install_restored(state, data, step)
    }

    /// Restores this ps from a checkpoint written by another number of ps
    /// tasks (`merged`: every shard of it): kept until the first handshake,
    /// which says which pieces this ps holds under the job's placement now;
    /// they are cut out of it then ([`super::recut`]). Until then the ps is
    /// not initialised, so nothing trains on a half-restored job.
    pub fn restore_recut(&self, pending: PendingRecut) -> Result<(), StoreError> {
        let mut state = self.lock();
        check_fresh(&state)?;
        state.pending_recut = Some(pending);
        Ok(())
    }

    /// At a handshake: the pending checkpoint of another ps count cut for
    /// this ps with the caller's placement, and restored. A caller whose
    /// view does not fit the checkpoint is refused and the checkpoint kept.
    pub(super) fn recut_pending(&self, state: &mut State, req: &proto::HandshakeRequest) -> Result<(), StoreError> {
        let Some(pending) = &state.pending_recut else { return Ok(()) };
        let (dense, rows) = pieces_of(&req.variables, &req.dense_pieces)?;
        let data = recut(&pending.merged, &dense, &rows, self.config.ps_index == 0)
            .map_err(|e| StoreError::FailedPrecondition(format!("checkpoint {} (written by {} ps task(s)): {e}", pending.path, pending.written_by)))?;
        let Some(pending) = state.pending_recut.take() else { return Ok(()) };
        let materialised: usize = data.row_ids.iter().map(|(_, ids)| ids.len()).sum();
        let bytes: usize = data.variables.iter().chain(&data.slots).map(|t| t.2.len() * 4).sum();
        let restored = data.variables.len();
        self.install_restored(state, data, pending.step)?;
        tracing::info!(
            "ps:{}: restored {restored} variable(s) ({materialised} embedding rows, {:.1} MB with slots) cut out of {} written by {} ps task(s), for {} now (global_step={})",
            self.config.ps_index,
            bytes as f64 / 1e6,
            pending.path,
            pending.written_by,
            state.training.num_ps,
            pending.step
        );
        Ok(())
    }

    /// Puts a checkpoint shard's variables and dispatcher state in place, at `step`.
    fn install_restored(&self, state: &mut State, mut data: ShardData, step: i64) -> Result<(), StoreError> {
        let dispatcher = data.dispatcher.take();
        let vars = restored_variables(data)?;
        let variables = vars.iter().map(StoredVar::spec).collect();
        if let Some(json) = &dispatcher {
            state.dispatch.restore(self.config.ps_index, json)?;
        }
        // Fingerprint 0: adopted from the first handshake whose variables match.
        state.training.agreement = Some(Agreement { fingerprint: 0, variables, config: None });
        state.vars.install(vars);
        state.training.progress.initialized = true;
        state.training.progress.step = step;
        self.publish(state.training.progress);
        Ok(())
    }
}

fn check_fresh(state: &State) -> Result<(), StoreError> {
    if state.training.progress.initialized || state.pending_recut.is_some() {
        return Err(StoreError::FailedPrecondition("already initialised".into()));
    }
    Ok(())
}
