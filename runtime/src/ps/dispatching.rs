//! `NextShard` under the store's lock: the shard dispatcher of ps 0.

use super::error::{StoreError, task_of};
use super::store::ParameterStore;
use crate::dispatch::{ShardId, ShardPlan};
use crate::proto;

impl ParameterStore {
    /// The shard dispatcher (ps 0 only): counts the shard `task` finished,
    /// when it names one, and hands out the next when it asks for one. The
    /// first plan presented becomes the job's (unless a checkpoint brought
    /// one); every later one must be the same.
    pub fn next_shard(&self, req: &proto::NextShardRequest) -> Result<proto::NextShardReply, StoreError> {
        let ps = self.config.ps_index;
        if ps != 0 {
            return Err(StoreError::FailedPrecondition(format!("the shard dispatcher runs on ps 0; this is ps {ps}")));
        }
        let task = task_of(&req.task, "task")?;
        let p = req.plan.ok_or_else(|| StoreError::InvalidArgument("plan: missing".into()))?;
        let plan = ShardPlan::try_from(p).map_err(|e| StoreError::InvalidArgument(format!("plan: {e}")))?;
        let mut guard = self.lock();
        let state = &mut *guard;
        let finished = state.dispatch.finished(ps, &task, req);
        state.members.renew(&task);
        state.dispatch.next(ps, &task, plan, finished, req.keep.map(ShardId::from), req.want)
    }
}
