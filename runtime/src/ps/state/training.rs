//! The training agreement: the view of the variables and the training
//! configuration every task must share, the optimizer and the sync
//! accumulator that follow from it, the step, and the end of training. The
//! handshake, the chief's initialisation, pushes and abstentions, shutdown.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::variables::{DenseGroups, RowPieces, Variables};
use crate::optimizer::Optimizer;
use crate::proto::{self, UpdateMode};
use crate::ps::error::StoreError;
use crate::sync::{Averaged, StepCheck, SyncAccumulator};

/// Step, initialisation and end of training, published to waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    pub step: i64,
    pub initialized: bool,
    pub done: bool,
    /// Frozen for a move of the job's layout: a pull waiting for a later
    /// step is answered "layout changed".
    pub frozen: bool,
}

/// The view that workers and the chief must agree on.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::ps) struct Agreement {
    pub(in crate::ps) fingerprint: u64,
    pub(in crate::ps) variables: Vec<proto::VariableSpec>,
    pub(in crate::ps) config: Option<proto::TrainingConfig>,
}

#[derive(Debug, Default)]
pub(in crate::ps) struct Training {
    pub(in crate::ps) agreement: Option<Agreement>,
    /// From the agreed configuration (after a restore: once a handshake
    /// brought it).
    optimizer: Option<Optimizer>,
    mode: Option<UpdateMode>,
    /// Sync training: the gradients of the current step.
    pub(in crate::ps) accumulator: Option<SyncAccumulator>,
    /// Elastic sync: a step waits for the tasks alive.
    elastic: bool,
    pub(in crate::ps) progress: Progress,
    /// The number of ps tasks, once known (see [`super::PsConfig::num_ps`]).
    pub(in crate::ps) num_ps: usize,
}

/// Checks a training configuration on its own.
pub fn check_training_config(c: &proto::TrainingConfig) -> Result<(UpdateMode, Optimizer), StoreError> {
    let mode = match UpdateMode::try_from(c.mode) {
        Ok(m @ (UpdateMode::Async | UpdateMode::Sync)) => m,
        _ => {
            return Err(StoreError::InvalidArgument(format!("config.mode: unknown update mode {}", c.mode)));
        }
    };
    let opt = c.optimizer.as_ref().ok_or_else(|| StoreError::InvalidArgument("config.optimizer: missing".into()))?;
    let optimizer = Optimizer::from_proto(opt).map_err(|e| StoreError::InvalidArgument(format!("config.{e}")))?;
    if mode == UpdateMode::Sync && !c.elastic {
        if c.replicas_to_aggregate == 0 {
            return Err(StoreError::InvalidArgument("config.replicas_to_aggregate: must be at least 1".into()));
        }
        if c.total_num_replicas > 0 && c.replicas_to_aggregate > c.total_num_replicas {
            return Err(StoreError::InvalidArgument(format!(
                "config.replicas_to_aggregate: {} exceeds total_num_replicas {}: the step could never complete",
                c.replicas_to_aggregate, c.total_num_replicas
            )));
        }
    }
    Ok((mode, optimizer))
}

/// Does a caller (`theirs`) train like the job (`ours`)? Update mode and
/// optimizer must match. A caller that left `--replicas_to_aggregate` to the
/// chief takes the job's aggregation; one that gave it must agree with the
/// job's count (or `auto`). The number of training tasks each sees is never
/// compared: a worker added later sees more.
fn same_training(ours: &proto::TrainingConfig, theirs: &proto::TrainingConfig) -> bool {
    ours.mode == theirs.mode
        && ours.optimizer == theirs.optimizer
        && (theirs.follow_chief_aggregation || (ours.replicas_to_aggregate == theirs.replicas_to_aggregate && ours.elastic == theirs.elastic))
}

/// What to do when two tasks count the gradients of a sync step differently.
fn aggregation_hint(a: &proto::TrainingConfig, b: &proto::TrainingConfig) -> &'static str {
    let aggregation = |c: &proto::TrainingConfig| (c.replicas_to_aggregate, c.total_num_replicas, c.elastic);
    if a.mode == b.mode && a.optimizer == b.optimizer && aggregation(a) != aggregation(b) {
        " (the tasks count a sync step's gradients differently: give every task the same --replicas_to_aggregate, \
         or `auto` for a job whose workers come and go)"
    } else {
        ""
    }
}

/// Explains the first difference between two views of the variables.
fn describe_difference(ours: &[proto::VariableSpec], theirs: &[proto::VariableSpec]) -> String {
    let a: BTreeMap<&str, &proto::VariableSpec> = ours.iter().map(|v| (v.name.as_str(), v)).collect();
    let b: BTreeMap<&str, &proto::VariableSpec> = theirs.iter().map(|v| (v.name.as_str(), v)).collect();
    for (name, v) in &b {
        match a.get(name) {
            None => return format!("variable {name:?} is not placed on this ps"),
            Some(o) if o.shape != v.shape || o.dtype != v.dtype => {
                return format!("variable {name:?}: this ps holds shape {:?}, the caller expects {:?}", o.shape, v.shape);
            }
            _ => {}
        }
    }
    if let Some(name) = a.keys().find(|n| !b.contains_key(*n)) {
        return format!("variable {name:?} of this ps is missing from the caller's placement");
    }
    "the placement fingerprints differ (ps tasks disagree on where variables live)".into()
}

fn not_initialized() -> StoreError {
    StoreError::FailedPrecondition("variables are not initialised yet".into())
}

impl Training {
    /// Nothing agreed yet; `num_ps` ps tasks (0: unknown).
    pub(in crate::ps) fn new(num_ps: usize) -> Self {
        Training { num_ps, ..Default::default() }
    }

    /// Takes the state a move staged: the new view at `step`, with the
    /// optimizer and the sync accumulator set up again from the agreed
    /// configuration (at the next handshake when there is none yet).
    pub(in crate::ps) fn take_over(&mut self, agreement: Agreement, step: i64, num_ps: usize) {
        self.agreement = Some(agreement);
        self.optimizer = None;
        self.mode = None;
        self.accumulator = None;
        self.progress.step = step;
        self.progress.initialized = true;
        self.num_ps = num_ps;
    }

    pub(in crate::ps) fn check_initialized(&self) -> Result<(), StoreError> {
        if self.progress.initialized { Ok(()) } else { Err(not_initialized()) }
    }

    /// Compares a caller's view with the agreed one, or makes it the agreed
    /// one when it is the first.
    pub(in crate::ps) fn agree(&mut self, theirs: Agreement, observer: bool) -> Result<(), StoreError> {
        let Some(ours) = &mut self.agreement else {
            self.agreement = Some(theirs);
            return Ok(());
        };
        if ours.fingerprint == 0 && ours.variables == theirs.variables {
            ours.fingerprint = theirs.fingerprint;
        }
        if ours.fingerprint != theirs.fingerprint || ours.variables != theirs.variables {
            return Err(StoreError::FailedPrecondition(format!("placement mismatch: {}", describe_difference(&ours.variables, &theirs.variables))));
        }
        match (&ours.config, &theirs.config) {
            (_, _) if observer => Ok(()),
            (None, Some(c)) => {
                ours.config = Some(*c);
                Ok(())
            }
            (Some(a), Some(b)) if !same_training(a, b) => Err(StoreError::FailedPrecondition(format!(
                "training configuration mismatch: this ps trains with {a:?}, the caller with {b:?}{}",
                aggregation_hint(a, b)
            ))),
            _ => Ok(()),
        }
    }

    /// Checks the caller's count of ps tasks; when this ps does not know
    /// its own (a sparse cluster spec), the first count seen is the job's.
    pub(in crate::ps) fn check_num_ps(&mut self, ps_index: usize, theirs: u32) -> Result<(), StoreError> {
        let theirs = theirs as usize;
        if self.num_ps == 0 && theirs > ps_index {
            tracing::info!("ps:{ps_index}: the cluster has {theirs} ps task(s) (from the first caller)");
            self.num_ps = theirs;
        }
        if theirs != self.num_ps {
            return Err(StoreError::FailedPrecondition(format!("num_ps: the caller sees {theirs} ps task(s), this ps is one of {}", self.num_ps)));
        }
        Ok(())
    }

    /// Sets up the optimizer and the accumulator of `config` over `vars` at
    /// the current step.
    pub(in crate::ps) fn configure(&mut self, config: &proto::TrainingConfig, mode: UpdateMode, optimizer: Optimizer, vars: &Variables, required: usize) {
        self.accumulator = (mode == UpdateMode::Sync).then(|| SyncAccumulator::with_kinds(&vars.kinds(), required, self.progress.step));
        self.optimizer = Some(optimizer);
        self.mode = Some(mode);
        self.elastic = config.elastic;
    }

    /// After a restore, the first configuration seen sets up the optimizer
    /// and the accumulator.
    pub(in crate::ps) fn configure_if_restored(&mut self, vars: &mut Variables, live: usize) -> Result<(), StoreError> {
        if self.optimizer.is_some() || !self.progress.initialized {
            return Ok(());
        }
        let Some(config) = self.agreement.as_ref().and_then(|a| a.config) else {
            return Ok(());
        };
        let (mode, optimizer) = check_training_config(&config)?;
        for v in vars.all_mut() {
            if let Some(t) = &mut v.table {
                t.use_optimizer(&optimizer);
                continue;
            }
            let fresh = optimizer.new_slots(v.values.len());
            // Slots of a different optimizer (or none saved) start afresh.
            if v.slots.first.len() != fresh.first.len() || v.slots.second.len() != fresh.second.len() {
                let updates = v.slots.updates;
                v.slots = fresh;
                v.slots.updates = updates;
            }
        }
        let required = if config.elastic { live } else { config.replicas_to_aggregate as usize };
        self.configure(&config, mode, optimizer, vars, required);
        Ok(())
    }

    /// Can a push (or an abstention) of `step` be taken? `Ok(false)`:
    /// training is over (the caller is told so).
    pub(in crate::ps) fn check_push_step(&self, step: i64) -> Result<bool, StoreError> {
        if self.progress.done {
            return Ok(false);
        }
        self.check_initialized()?;
        if step < 0 {
            return Err(StoreError::InvalidArgument(format!("step: {step} is negative")));
        }
        if step > self.progress.step {
            return Err(StoreError::FailedPrecondition(format!("step {step} is from the future: this ps is at step {}", self.progress.step)));
        }
        Ok(true)
    }

    pub(in crate::ps) fn optimizer(&self) -> Result<Optimizer, StoreError> {
        self.optimizer
            .ok_or_else(|| StoreError::FailedPrecondition("restored from a checkpoint: waiting for a handshake that brings the training configuration".into()))
    }

    /// Takes one checked push of `worker` at `step`: applied at once
    /// (async), or counted towards the sync step (dropped when stale).
    pub(in crate::ps) fn take_push(
        &mut self,
        vars: &mut Variables,
        optimizer: &Optimizer,
        step: i64,
        worker: &str,
        groups: DenseGroups<'_>,
        row_groups: &RowPieces<'_>,
    ) -> Result<proto::PushGradientsReply, StoreError> {
        let mut reply = proto::PushGradientsReply { accepted: true, ..Default::default() };
        let Some(acc) = &mut self.accumulator else {
            vars.apply(optimizer, groups, row_groups);
            self.progress.step += 1;
            vars.counters.pushes_applied += 1;
            return Ok(reply);
        };
        match acc.check_step(step) {
            StepCheck::Stale => {
                acc.record_stale();
                reply.accepted = false;
                reply.stale = true;
            }
            StepCheck::Future => {
                return Err(StoreError::FailedPrecondition(format!("step {step} is from the future")));
            }
            StepCheck::Current => {
                let mut counted = false;
                for (i, group) in &groups {
                    counted |= acc.add(*i, worker, group);
                }
                for (i, pieces) in row_groups {
                    let pieces: Vec<(&[i64], &[u8])> = pieces.iter().map(|(ids, v)| (ids.as_slice(), *v)).collect();
                    counted |= acc.add_rows(*i, worker, &pieces);
                }
                reply.accepted = counted || (groups.is_empty() && row_groups.is_empty());
                acc.mark_pushed(worker);
            }
        }
        Ok(reply)
    }

    /// Applies the averaged gradients when the sync step has enough of them
    /// (`live`: the training tasks alive, what an elastic step waits for).
    pub(in crate::ps) fn finish_ready_step(&mut self, vars: &mut Variables, live: usize) {
        let (Some(acc), Some(optimizer)) = (&mut self.accumulator, self.optimizer) else {
            return;
        };
        if self.elastic {
            acc.set_required(live);
        }
        if !acc.ready() {
            return;
        }
        let stored = vars.all_mut();
        acc.finish_step_rows(|i, avg| {
            let v = &mut stored[i];
            match avg {
                Averaged::Dense(avg) => optimizer.apply_all(Arc::make_mut(&mut v.values).as_mut_slice(), &mut v.slots, avg),
                Averaged::Rows(ids, values) => v.table.as_mut().expect("a table").apply(&optimizer, ids, values),
            }
            v.changed();
        });
        self.progress.step = acc.step();
        vars.counters.pushes_applied += 1;
    }
}
