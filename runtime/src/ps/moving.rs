//! Elastic parameter servers, what a request does under the lock: the
//! layout ps 0 keeps (asked, proposed), and a move of the state to the next
//! layout (freeze, the fragments a source supplies, the pieces a target
//! stages, the commit). The chief drives a move; the streams and the calls
//! to other ps tasks are in [`super::service`].

use super::error::{StoreError, task_of};
use super::recut::{self, DenseFragment, Fragments, RowsFragment, StoredPieces};
use super::state::{Agreement, LEAVE_REMEMBERED, Staged, StoredVar, pieces_of, staying};
use super::store::ParameterStore;
use crate::le;
use crate::proto;
use crate::tensor;

impl ParameterStore {
    /// The job's layout as this ps knows it (ps 0 is the authority).
    pub fn get_layout(&self) -> proto::LayoutReply {
        let state = self.lock();
        state.layout.reply(state.training.progress.initialized)
    }

    /// A ps set proposed for the job (ps 0 only): kept until the chief moves
    /// the state to it. ps 0 stays ps 0.
    pub fn propose_layout(&self, req: &proto::ProposeLayoutRequest) -> Result<proto::LayoutReply, StoreError> {
        let task = task_of(&req.task, "task")?;
        if self.config.ps_index != 0 {
            return Err(StoreError::FailedPrecondition("only ps 0 keeps the job's layout".into()));
        }
        let mut state = self.lock();
        if req.leave {
            return leave(&mut state, &task);
        }
        let current = &state.layout.addresses;
        let proposed = &req.ps_addresses;
        if proposed.is_empty() || current.first() != proposed.first() {
            return Err(StoreError::InvalidArgument(format!("ps_addresses: ps 0 is {:?} and stays; {task} proposed {proposed:?}", current.first())));
        }
        // A ps already in the layout that names more ps tasks was started
        // again with its old cluster spec (a ps scaled away since): only a
        // ps started into the job proposes a larger set, for itself.
        if (task.index as usize) < current.len() && proposed.len() > current.len() {
            tracing::info!("ps:0: {task} names {} ps task(s) but is one of the job's {}: the job stays on {}", proposed.len(), current.len(), current.len());
            return Ok(state.layout.reply(state.training.progress.initialized));
        }
        if proposed != current && state.layout.proposed.as_ref() != Some(proposed) {
            tracing::info!("ps:0: {task} proposes {} ps task(s) (now {}): {proposed:?}", proposed.len(), current.len());
            state.layout.proposed = Some(proposed.clone());
        }
        Ok(state.layout.reply(state.training.progress.initialized))
    }

    /// Has a move left this ps out of the job's layout (its state handed over)?
    pub fn retired(&self) -> bool {
        self.lock().layout.retired
    }

    /// Freezes this ps for the move to `req.version`: no push is taken, and
    /// pulls waiting for a later step are told the layout changed. Sync
    /// (`at_step` >= 0): only at that step (a ps past it refuses).
    pub fn freeze(&self, req: &proto::FreezeRequest) -> Result<proto::FreezeReply, StoreError> {
        self.check_chief(&task_of(&req.task, "task")?, "move the job's state")?;
        let mut guard = self.lock();
        let state = &mut *guard;
        state.training.check_initialized()?;
        let step = state.training.progress.step;
        if req.at_step >= 0 && step != req.at_step {
            return Err(StoreError::FailedPrecondition(format!("this ps is at step {step}, not {}: not a step boundary", req.at_step)));
        }
        if req.version <= state.layout.version {
            return Err(StoreError::InvalidArgument(format!("version: {} is not after {}", req.version, state.layout.version)));
        }
        state.layout.frozen = Some(req.version);
        state.training.progress.frozen = true;
        self.publish(state.training.progress);
        Ok(proto::FreezeReply { step, live_tasks: state.members.live_tasks() })
    }

    /// What this ps supplies of the pieces another ps holds under the next
    /// layout (only while frozen for it: its state no longer changes), cut
    /// from its live variables under the lock (no copy of the whole state).
    pub fn fragments_for(&self, req: &proto::FetchFragmentsRequest) -> Result<Fragments, StoreError> {
        let (dense, rows) = pieces_of(&req.variables, &req.dense_pieces)?;
        let state = self.lock();
        if state.layout.frozen != Some(req.version) {
            return Err(StoreError::FailedPrecondition(format!("not frozen for the move to version {}", req.version)));
        }
        let mut stored = StoredPieces::default();
        for v in state.vars.all() {
            match &v.table {
                Some(t) => stored.add_rows(&t.name, t.part.clone(), t.saved()),
                None => stored.add_dense(&v.name, &v.shape, &v.values, [&v.slots.first, &v.slots.second], v.slots.updates),
            }
        }
        recut::fragments(&stored, &state.layout.own_dense, &dense, &rows).map_err(|e| StoreError::FailedPrecondition(e.to_string()))
    }

    /// Serves layout `version` of `ps_addresses` (restored from a checkpoint).
    pub fn adopt_layout(&self, version: u64, ps_addresses: Vec<String>) {
        let mut state = self.lock();
        state.training.num_ps = ps_addresses.len();
        state.layout.version = version;
        state.layout.addresses = ps_addresses;
    }

    /// Keeps the pieces of the next layout until the commit.
    pub(super) fn stage(&self, staged: Staged) {
        self.lock().layout.staged = Some(staged);
    }

    /// Ends a move on this ps: the staged pieces (if any) become its state
    /// and the layout is `req.version`; a ps left out of the new set retires.
    /// Aborted: the freeze is undone and the staged pieces dropped.
    pub fn commit(&self, req: &proto::CommitMoveRequest) -> Result<proto::CommitMoveReply, StoreError> {
        self.check_chief(&task_of(&req.task, "task")?, "move the job's state")?;
        let mut guard = self.lock();
        let state = &mut *guard;
        let staged = state.layout.staged.take();
        state.layout.frozen = None;
        state.training.progress.frozen = false;
        if req.abort {
            self.publish(state.training.progress);
            return Ok(proto::CommitMoveReply {});
        }
        if let Some(staged) = staged.filter(|s| s.version == req.version) {
            let vars = staged.vars;
            let config = state.training.agreement.as_ref().and_then(|a| a.config);
            state.vars.install(vars);
            state.training.take_over(Agreement { fingerprint: staged.fingerprint, variables: staged.variables, config }, staged.step, staged.num_ps);
            state.training.configure_if_restored(&mut state.vars, state.members.live())?;
            state.layout.own_dense = staged.dense;
            state.members.renew_named(&staged.live_tasks);
            state.pending_recut = None;
            state.layout.leaving.clear();
        } else if self.config.ps_index >= req.ps_addresses.len() {
            state.layout.retired = true;
        }
        state.layout.version = req.version;
        state.layout.addresses = req.ps_addresses.clone();
        if state.layout.proposed.as_ref() == Some(&req.ps_addresses) {
            state.layout.proposed = None;
        }
        self.publish(state.training.progress);
        drop(guard);
        release_freed_memory();
        Ok(proto::CommitMoveReply {})
    }

    /// Remembers where this ps's dense pieces sit (from a handshake that agreed).
    pub(super) fn note_own_pieces(&self, state: &mut super::state::State, req: &proto::HandshakeRequest) {
        if let Ok((dense, _)) = pieces_of(&req.variables, &req.dense_pieces)
            && !req.observer
        {
            state.layout.own_dense = dense;
        }
    }
}

/// Gives the pages a move freed (the pieces given up, the fetched
/// fragments and messages) back to the system. glibc keeps freed blocks
/// below its mmap threshold (32 MiB: [`crate::tune_allocator`]) in its
/// arenas and trims a heap only past 256 MiB free, so a ps that handed over
/// half its rows would keep its peak RSS without this.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of the allocator's arenas to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// ps 0 hears that ps `task` is stopped on purpose (a scale-down): the set
/// without the highest ps tasks that asked to leave is proposed (a ps
/// below one that stays waits, and is forgotten after a while). A ps only
/// proposed (never moved to) is dropped from the proposal.
fn leave(state: &mut super::state::State, task: &crate::cluster::TaskId) -> Result<proto::LayoutReply, StoreError> {
    if task.job != "ps" || task.index == 0 {
        return Err(StoreError::InvalidArgument(format!("{task} asked to leave: only a ps other than ps 0 can (ps 0 keeps the layout)")));
    }
    let layout = &mut state.layout;
    let now = std::time::Instant::now();
    layout.leaving.retain(|_, asked| now.duration_since(*asked) < LEAVE_REMEMBERED);
    layout.leaving.insert(task.index, now);
    if let Some(proposed) = layout.proposed.as_mut() {
        proposed.truncate(staying(proposed.len(), |k| layout.leaving.contains_key(&k)));
    }
    let keep = staying(layout.addresses.len(), |k| layout.leaving.contains_key(&k));
    if keep < layout.addresses.len() {
        let next = layout.addresses[..keep].to_vec();
        tracing::info!("ps:0: {task} leaves; the job goes on with {keep} ps task(s) at the chief's next step");
        layout.proposed = Some(next);
    } else if (task.index as usize) < layout.addresses.len() {
        tracing::info!("ps:0: {task} asks to leave; it waits for the ps tasks above it (only the highest can leave)");
    }
    if layout.proposed.as_ref().is_some_and(|p| *p == layout.addresses) {
        layout.proposed = None;
    }
    Ok(layout.reply(state.training.progress.initialized))
}

/// The staged state of a target from the fragments every source supplied.
pub(super) fn staged(req: &proto::StageMoveRequest, supplied: Vec<Fragments>) -> Result<Staged, StoreError> {
    let (dense, rows) = pieces_of(&req.variables, &req.dense_pieces)?;
    let data = recut::assemble(&dense, &rows, supplied).map_err(|e| StoreError::FailedPrecondition(e.to_string()))?;
    let vars = super::checkpointing::restored_variables(data)?;
    if vars.len() != req.variables.len() {
        let names = |v: Vec<&str>| v.join(", ");
        return Err(StoreError::FailedPrecondition(format!(
            "the move put together [{}], the next layout places [{}] here",
            names(vars.iter().map(|v| v.name.as_str()).collect()),
            names(req.variables.iter().map(|v| v.name.as_str()).collect())
        )));
    }
    // The specs as the store holds them: what a handshake compares.
    let variables = vars.iter().map(StoredVar::spec).collect();
    Ok(Staged {
        version: req.version,
        vars,
        step: req.step,
        fingerprint: req.placement_fingerprint,
        variables,
        dense,
        num_ps: req.num_ps as usize,
        live_tasks: req.live_tasks.clone(),
    })
}

/// One cut of a fragment: rows `start .. end` of dense fragment or rows
/// fragment `index`.
#[derive(Debug, Clone, Copy)]
enum Cut {
    Dense { index: usize, start: usize, end: usize },
    Rows { index: usize, start: usize, end: usize },
}

/// Fragments as stream messages of about `max_bytes` each (a large piece's
/// rows cut over several), built one at a time as the stream is read: only
/// the messages in flight are encoded copies, not the whole move.
pub(super) fn to_messages(f: Fragments, max_bytes: usize) -> impl Iterator<Item = proto::FragmentsReply> + Send + 'static {
    let mut messages: Vec<Vec<Cut>> = vec![Vec::new()];
    let mut size = 0;
    let mut add = |cut: Cut, bytes: usize| {
        if size + bytes > max_bytes && size > 0 {
            messages.push(Vec::new());
            size = 0;
        }
        size += bytes;
        messages.last_mut().expect("one message at least").push(cut);
    };
    for (index, d) in f.dense.iter().enumerate() {
        let row = d.values.len() / d.rows.max(1);
        let per = (max_bytes / (row.max(1) * 12)).max(1);
        for start in (0..d.rows).step_by(per) {
            let end = (start + per).min(d.rows);
            add(Cut::Dense { index, start, end }, (end - start) * row * 12);
        }
    }
    for (index, r) in f.rows.iter().enumerate() {
        let dim = r.values.len() / r.ids.len().max(1);
        let per = (max_bytes / (dim.max(1) * 12 + 8)).max(1);
        for c in 0..r.ids.len().div_ceil(per).max(1) {
            let (start, end) = (c * per, ((c + 1) * per).min(r.ids.len()));
            add(Cut::Rows { index, start, end }, (end - start) * (dim * 12 + 8));
        }
    }
    messages.into_iter().map(move |cuts| message(&f, &cuts))
}

/// The message of `cuts` of `f`.
fn message(f: &Fragments, cuts: &[Cut]) -> proto::FragmentsReply {
    let bytes = |v: &[f32], row: usize, start: usize, end: usize| -> bytes::Bytes {
        if v.is_empty() { bytes::Bytes::new() } else { tensor::f32_to_bytes(&v[start * row..end * row]) }
    };
    let mut m = proto::FragmentsReply::default();
    for &cut in cuts {
        match cut {
            Cut::Dense { index, start, end } => {
                let d = &f.dense[index];
                let row = d.values.len() / d.rows.max(1);
                m.dense.push(proto::DenseFragment {
                    piece: d.piece.clone(),
                    row_offset: (d.row_offset + start) as u64,
                    rows: (end - start) as u64,
                    values: bytes(&d.values, row, start, end),
                    slot0: bytes(&d.slots[0], row, start, end),
                    slot1: bytes(&d.slots[1], row, start, end),
                    updates: d.updates,
                });
            }
            Cut::Rows { index, start, end } => {
                let r = &f.rows[index];
                let dim = r.values.len() / r.ids.len().max(1);
                m.rows.push(proto::RowsFragment {
                    piece: r.piece.clone(),
                    source_partition: r.source.0 as u32,
                    source_partitions: r.source.1 as u32,
                    ids: r.ids[start..end].to_vec(),
                    values: bytes(&r.values, dim, start, end),
                    slot0: bytes(&r.slots[0], dim, start, end),
                    slot1: bytes(&r.slots[1], dim, start, end),
                    updates: r.updates,
                });
            }
        }
    }
    m
}

/// Adds one message of a source's stream to its fragments (a partition's
/// rows cut over several messages joined again), as the messages arrive.
pub fn add_message(f: &mut Fragments, m: proto::FragmentsReply) {
    f.dense.extend(m.dense.into_iter().map(|d| DenseFragment {
        piece: d.piece,
        row_offset: d.row_offset as usize,
        rows: d.rows as usize,
        values: le::f32s(&d.values),
        slots: [le::f32s(&d.slot0), le::f32s(&d.slot1)],
        updates: d.updates,
    }));
    for r in m.rows {
        let source = (u64::from(r.source_partition), u64::from(r.source_partitions));
        let at = match f.rows.iter().position(|x| x.piece == r.piece && x.source == source) {
            Some(i) => i,
            None => {
                f.rows.push(RowsFragment {
                    piece: r.piece.clone(),
                    source,
                    ids: Vec::new(),
                    values: Vec::new(),
                    slots: Default::default(),
                    updates: r.updates,
                });
                f.rows.len() - 1
            }
        };
        let x = &mut f.rows[at];
        x.ids.extend(r.ids);
        extend_from_le(&mut x.values, &r.values);
        extend_from_le(&mut x.slots[0], &r.slot0);
        extend_from_le(&mut x.slots[1], &r.slot1);
    }
}

/// Appends the little-endian f32s of `bytes` to `out` (cast without a
/// per-element decode where the buffer allows: [`tensor::copy_f32_from_le`]).
fn extend_from_le(out: &mut Vec<f32>, bytes: &[u8]) {
    let at = out.len();
    out.resize(at + bytes.len() / 4, 0.0);
    tensor::copy_f32_from_le(&mut out[at..], &bytes[..bytes.len() / 4 * 4]);
}
