//! What a pull does under the store's lock: the variables and rows asked
//! for, encoded or shared, with the progress they were read at.

use super::error::StoreError;
use super::state::Progress;
use super::state::{GrpcPull, SharedPull, SharedVariable};
use super::store::ParameterStore;
use crate::proto::{self, TensorPart};

impl ParameterStore {
    /// Encoded values of the named variables (all when `names` is empty), as
    /// parts of at most `part_bytes`, and the step they belong to. The bytes
    /// are shared, not copied, between pulls of the same step.
    pub fn snapshot(&self, names: &[String], part_bytes: usize) -> Result<(Progress, Vec<TensorPart>), StoreError> {
        let mut state = self.lock();
        state.training.check_initialized()?;
        let parts = state.vars.encoded(names, part_bytes)?;
        Ok((state.training.progress, parts))
    }

    /// A pull over gRPC: the named dense variables (all when `names` is
    /// empty) as parts of at most `part_bytes`, and the rows asked for, at
    /// one step.
    pub fn pull_snapshot(&self, names: &[String], rows: &[proto::RowsRequest], part_bytes: usize) -> Result<(Progress, GrpcPull), StoreError> {
        let mut state = self.lock();
        state.training.check_initialized()?;
        let pulled_rows = state.vars.gather_rows(rows)?;
        let parts = state.vars.encoded(names, part_bytes)?;
        Ok((state.training.progress, (parts, pulled_rows)))
    }

    /// A pull over the tensor channel: the named dense variables (all when
    /// `names` is empty) shared rather than encoded, and the rows asked for,
    /// at one step.
    pub fn shared_pull(&self, names: &[String], rows: &[proto::RowsRequest]) -> Result<(Progress, SharedPull), StoreError> {
        let mut state = self.lock();
        state.training.check_initialized()?;
        let pulled_rows = state.vars.gather_rows(rows)?;
        let shared = state.vars.shared(names)?;
        Ok((state.training.progress, (shared, pulled_rows)))
    }

    /// The named variables (all when `names` is empty) as they are, shared
    /// rather than encoded: for the tensor channel, which writes them raw.
    pub fn shared_snapshot(&self, names: &[String]) -> Result<(Progress, Vec<SharedVariable>), StoreError> {
        let mut state = self.lock();
        state.training.check_initialized()?;
        let shared = state.vars.shared(names)?;
        Ok((state.training.progress, shared))
    }

    /// Values of a variable, for tests and checkpoints.
    pub fn values(&self, name: &str) -> Option<Vec<f32>> {
        self.lock().vars.values(name)
    }

    /// Rows `ids` of embedding partition `name` (their initial values when
    /// never updated), and the number of rows it materialised; for tests.
    pub fn rows(&self, name: &str, ids: &[i64]) -> Option<(Vec<f32>, usize)> {
        self.lock().vars.rows(name, ids)
    }

    /// Most bytes a push may carry: every dense variable of this ps once,
    /// rows up to [`MAX_PUSH_ROWS_BYTES`] when it holds embedding
    /// partitions, plus room for message overhead.
    pub fn max_push_bytes(&self) -> usize {
        self.lock().vars.max_push_bytes()
    }
}
