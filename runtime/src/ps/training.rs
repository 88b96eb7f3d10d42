//! The requests of the training agreement under the store's lock: the
//! handshake, the chief's initialisation, pushes and abstentions, shutdown.

use super::error::{StoreError, task_of};
use super::state::{Agreement, StoredVar, assemble, check_spec, check_training_config};
use super::store::ParameterStore;
use crate::cluster::TaskId;
use crate::proto::{self, RowsPart, TensorPart};
use crate::sync::StepCheck;

impl ParameterStore {
    /// Refuses a read cut for another layout than this ps serves.
    pub fn check_read_layout(&self, layout: u64) -> Result<(), StoreError> {
        self.lock().layout.check_read(layout)
    }

    /// The number of ps tasks (0 while unknown).
    pub fn num_ps(&self) -> usize {
        self.lock().training.num_ps
    }

    pub fn handshake(&self, req: &proto::HandshakeRequest) -> Result<proto::HandshakeReply, StoreError> {
        let task = task_of(&req.task, "task")?;
        let config = if req.observer {
            None
        } else {
            let c = req.config.ok_or_else(|| StoreError::InvalidArgument("config: missing".into()))?;
            check_training_config(&c)?;
            Some(c)
        };
        for v in &req.variables {
            check_spec(v)?;
        }
        let mut variables = req.variables.clone();
        variables.sort_by(|a, b| a.name.cmp(&b.name));
        let mut guard = self.lock();
        let state = &mut *guard;
        state.training.check_num_ps(self.config.ps_index, req.num_ps)?;
        self.recut_pending(state, req)?;
        state.training.agree(Agreement { fingerprint: req.placement_fingerprint, variables, config }, req.observer)?;
        state.training.configure_if_restored(&mut state.vars, state.members.live())?;
        self.note_own_pieces(state, req);
        if Some(&task) != self.config.chief.as_ref() && !state.training.progress.done {
            state.members.wait_for(&task);
        }
        if !req.observer {
            state.members.renew(&task);
        }
        let p = state.training.progress;
        Ok(proto::HandshakeReply {
            ps_index: self.config.ps_index as u32,
            initialized: p.initialized,
            step: p.step,
            done: p.done,
            chief: self.config.chief.as_ref().map(proto::TaskId::from),
            agreed: if p.initialized { state.training.agreement.as_ref().and_then(|a| a.config) } else { None },
        })
    }

    /// Initialises the variables from the chief's parts. The first
    /// initialisation wins; later ones change nothing.
    pub fn init(&self, messages: &[proto::InitVariablesRequest]) -> Result<proto::InitVariablesReply, StoreError> {
        let first = messages.first().ok_or_else(|| StoreError::InvalidArgument("empty InitVariables stream".into()))?;
        let task = task_of(&first.task, "task")?;
        self.check_chief(&task, "initialise variables")?;
        let config = first.config.ok_or_else(|| StoreError::InvalidArgument("config: missing".into()))?;
        let (mode, optimizer) = check_training_config(&config)?;
        if first.step < 0 {
            return Err(StoreError::InvalidArgument(format!("step: {} is negative", first.step)));
        }
        if let Some(done) = self.already_initialized() {
            return Ok(done);
        }
        // Assemble every variable before touching the state.
        let vars = assemble(messages, &first.embeddings, &optimizer)?;
        let specs: Vec<proto::VariableSpec> = vars.iter().map(StoredVar::spec).collect();

        let mut guard = self.lock();
        let state = &mut *guard;
        if state.training.progress.initialized {
            return Ok(proto::InitVariablesReply { already_initialized: true, step: state.training.progress.step });
        }
        let training = &mut state.training;
        training.agree(Agreement { fingerprint: first.placement_fingerprint, variables: specs, config: Some(config) }, false)?;
        // The chief decides how the job aggregates (a worker's handshake may
        // have come first with its own view).
        if let Some(a) = &mut training.agreement {
            a.config = Some(config);
        }
        state.vars.install(vars);
        training.progress.step = first.step;
        let required = if config.elastic { state.members.live() } else { config.replicas_to_aggregate as usize };
        training.configure(&config, mode, optimizer, &state.vars, required);
        training.progress.initialized = true;
        let p = training.progress;
        self.publish(p);
        drop(guard);
        Ok(proto::InitVariablesReply { already_initialized: false, step: p.step })
    }

    /// The reply to an initialisation that comes too late, if it does.
    fn already_initialized(&self) -> Option<proto::InitVariablesReply> {
        let state = self.lock();
        let p = state.training.progress;
        p.initialized.then_some(proto::InitVariablesReply { already_initialized: true, step: p.step })
    }

    /// Applies (async) or accumulates (sync) one push, all or nothing.
    pub fn push(&self, task: &TaskId, step: i64, push_id: u64, parts: &[TensorPart]) -> Result<proto::PushGradientsReply, StoreError> {
        self.push_with_rows(task, step, push_id, parts, &[])
    }

    /// [`push`](Self::push) with row-sparse gradients of embedding
    /// partitions besides the dense parts: every part and every row is
    /// checked before anything changes.
    pub fn push_with_rows(
        &self,
        task: &TaskId,
        step: i64,
        push_id: u64,
        parts: &[TensorPart],
        rows: &[RowsPart],
    ) -> Result<proto::PushGradientsReply, StoreError> {
        let header = proto::PushGradientsRequest { step, push_id, ..Default::default() };
        self.push_for_layout(&header, task, parts, rows)
    }

    /// [`push_with_rows`](Self::push_with_rows) of a push whose first
    /// message is `header`: refused unless this ps serves its layout and is
    /// not frozen for a move. A remainder (async only) may cover part of a
    /// variable and is not counted as a step.
    pub fn push_for_layout(
        &self,
        header: &proto::PushGradientsRequest,
        task: &TaskId,
        parts: &[TensorPart],
        rows: &[RowsPart],
    ) -> Result<proto::PushGradientsReply, StoreError> {
        let (step, push_id) = (header.step, header.push_id);
        let mut guard = self.lock();
        let state = &mut *guard;
        state.layout.check(header.layout_version)?;
        state.members.renew(task);
        if !state.training.check_push_step(step)? {
            return Ok(proto::PushGradientsReply { accepted: false, stale: false, step: state.training.progress.step, done: true });
        }
        if header.remainder && state.training.accumulator.is_some() {
            return Err(StoreError::InvalidArgument("remainder: only async training takes the rest of a push cut by a move".into()));
        }
        let groups = state.vars.group_parts(parts, !header.remainder)?;
        let row_groups = if rows.is_empty() { Vec::new() } else { state.vars.group_rows(rows)? };
        let worker = task.to_string();
        if !state.members.first_push(&worker, push_id) {
            return Ok(proto::PushGradientsReply { accepted: false, stale: false, step: state.training.progress.step, done: false });
        }
        state.vars.count_received(parts, rows);
        let optimizer = state.training.optimizer()?;
        let mut reply = if header.remainder {
            state.vars.apply(&optimizer, groups, &row_groups);
            proto::PushGradientsReply { accepted: true, ..Default::default() }
        } else {
            state.training.take_push(&mut state.vars, &optimizer, step, &worker, groups, &row_groups)?
        };
        state.training.finish_ready_step(&mut state.vars, state.members.live());
        reply.step = state.training.progress.step;
        self.publish(state.training.progress);
        drop(guard);
        Ok(reply)
    }

    /// `task` has nothing to train at `step` (sync training: it waits for a
    /// shard of the data): it counts towards the step without a gradient.
    /// Does nothing in async training or for a step already completed.
    pub fn abstain(&self, task: &TaskId, step: i64) -> Result<proto::PushGradientsReply, StoreError> {
        self.abstain_for_layout(0, task, step)
    }

    /// [`abstain`](Self::abstain) for layout `layout`.
    pub fn abstain_for_layout(&self, layout: u64, task: &TaskId, step: i64) -> Result<proto::PushGradientsReply, StoreError> {
        let mut guard = self.lock();
        let state = &mut *guard;
        state.layout.check(layout)?;
        state.members.renew(task);
        let training = &mut state.training;
        let mut reply = proto::PushGradientsReply { step: training.progress.step, done: training.progress.done, ..Default::default() };
        if training.progress.done {
            return Ok(reply);
        }
        training.check_initialized()?;
        if step < 0 || step > training.progress.step {
            return Err(StoreError::InvalidArgument(format!("step: {step} is not a step of this ps (at step {})", training.progress.step)));
        }
        if let Some(acc) = &mut training.accumulator
            && acc.check_step(step) == StepCheck::Current
        {
            reply.accepted = acc.abstain(&task.to_string());
        }
        training.finish_ready_step(&mut state.vars, state.members.live());
        reply.step = training.progress.step;
        self.publish(training.progress);
        Ok(reply)
    }

    pub fn shutdown(&self, req: &proto::ShutdownRequest) -> Result<proto::ShutdownReply, StoreError> {
        let task = task_of(&req.task, "task")?;
        self.check_chief(&task, "end training")?;
        let mut state = self.lock();
        state.training.progress.done = true;
        let p = state.training.progress;
        self.publish(p);
        drop(state);
        tracing::info!("ps:{}: training is over at step {} ({task}: {})", self.config.ps_index, p.step, req.reason);
        Ok(proto::ShutdownReply { step: p.step })
    }
}
