//! The variables a ps holds: dense ones with their optimizer slots and their
//! encoded parts, embedding partitions as row tables, and the traffic they
//! saw. Checks every part and row of a request before anything is read or
//! changed.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Arc;

use crate::embedding::{self, EmbeddingPart, RowTable};
use crate::optimizer::{Optimizer, Slots};
use crate::proto::{self, RowsPart, TensorPart};
use crate::ps::error::StoreError;
use crate::sync::VarKind;
use crate::tensor::{self, PartAssembler};

/// The traffic a ps saw: pushes applied, bytes received and sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub pushes_applied: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
}

/// What a pull over the tensor channel takes: dense variables shared, rows copied.
pub type SharedPull = (Vec<SharedVariable>, Vec<PulledRows>);

/// Most bytes of rows one push may carry (a batch's rows of every embedding
/// partition of a ps): far beyond any batch, short of exhausting memory.
pub const MAX_PUSH_ROWS_BYTES: usize = 256 << 20;

#[derive(Debug)]
pub(in crate::ps) struct StoredVar {
    pub(in crate::ps) name: String,
    pub(in crate::ps) shape: Vec<usize>,
    /// Shared with the tensor channel's pulls in flight, which write it to
    /// their sockets without the lock; an update while one does copies it
    /// first (`Arc::make_mut`), otherwise it is changed in place.
    pub(in crate::ps) values: Arc<Vec<f32>>,
    pub(in crate::ps) slots: Slots,
    /// Encoded values of the current step as parts (and the part size they
    /// were cut at), shared by every pull until the next update (all workers
    /// of a sync step pull the same bytes).
    encoded: Option<(usize, Vec<TensorPart>)>,
    /// The parts of an earlier step, whose buffers the next encoding reuses
    /// when no pull holds them any more (a fresh 100 MB of buffers per
    /// update is page faults and zeroing every time).
    spare: Vec<TensorPart>,
    /// A partition of an embedding: its rows live here (`values` and
    /// `slots` stay empty), pulled and pushed by id.
    pub(in crate::ps) table: Option<RowTable>,
}

impl StoredVar {
    pub(in crate::ps) fn dense(name: String, shape: Vec<usize>, values: Vec<f32>, slots: Slots) -> Self {
        StoredVar { name, shape, values: Arc::new(values), slots, encoded: None, spare: Vec::new(), table: None }
    }

    pub(in crate::ps) fn rows(name: String, shape: Vec<usize>, table: RowTable) -> Self {
        StoredVar { name, shape, values: Arc::new(Vec::new()), slots: Slots::default(), encoded: None, spare: Vec::new(), table: Some(table) }
    }

    fn kind(&self) -> VarKind {
        match &self.table {
            Some(t) => VarKind::Rows(t.dim()),
            None => VarKind::Dense(self.values.len()),
        }
    }

    pub(in crate::ps) fn spec(&self) -> proto::VariableSpec {
        proto::VariableSpec {
            name: self.name.clone(),
            dtype: proto::DataType::DtFloat as i32,
            shape: tensor::wire_shape(&self.shape),
            embedding: self.table.as_ref().map(|t| t.part.to_proto()),
        }
    }

    /// The values changed: the encoded parts are stale.
    pub(in crate::ps) fn changed(&mut self) {
        if let Some((_, parts)) = self.encoded.take() {
            self.spare = parts;
        }
    }

    fn table(&self) -> &RowTable {
        self.table.as_ref().expect("a table")
    }
}

/// A variable's current values as a pull of the tensor channel takes them.
#[derive(Debug, Clone)]
pub struct SharedVariable {
    pub name: String,
    pub shape: Vec<i64>,
    pub values: Arc<Vec<f32>>,
}

/// Rows of an embedding partition, as a pull takes them: the ids asked for,
/// in that order, and their values (`ids.len() * dim`).
#[derive(Debug, Clone, PartialEq)]
pub struct PulledRows {
    pub name: String,
    pub dim: usize,
    pub ids: Vec<i64>,
    pub values: Vec<f32>,
}

impl PulledRows {
    /// As gRPC messages carry them: parts of at most `part_bytes` (at least
    /// one row each; one empty part when there is no row, so the receiver
    /// learns the partition answered).
    pub fn encode(&self, part_bytes: usize) -> Vec<RowsPart> {
        let per_part = (part_bytes / (8 + 4 * self.dim)).max(1);
        let part = |ids: &[i64], values: &[f32]| {
            let mut content = crate::le::i64_bytes(ids);
            content.extend_from_slice(&tensor::f32_to_bytes(values));
            RowsPart { name: self.name.clone(), count: ids.len() as u64, content: content.into() }
        };
        if self.ids.is_empty() {
            return vec![part(&[], &[])];
        }
        self.ids.chunks(per_part).zip(self.values.chunks(per_part * self.dim)).map(|(i, v)| part(i, v)).collect()
    }
}

/// What a pull over gRPC takes: dense variables encoded as parts, rows.
pub type GrpcPull = (Vec<TensorPart>, Vec<PulledRows>);

/// One piece of a push's rows: ids and their values' bytes.
pub(in crate::ps) type RowPiece<'a> = (Vec<i64>, &'a [u8]);

/// The rows of a push, by variable: the pieces of each.
pub(in crate::ps) type RowPieces<'a> = Vec<(usize, Vec<RowPiece<'a>>)>;

/// Parts of one variable's gradient: element range and little-endian bytes.
pub(in crate::ps) type Ranges<'a> = Vec<(Range<usize>, &'a [u8])>;

/// The dense parts of a push, by variable.
pub(in crate::ps) type DenseGroups<'a> = Vec<(usize, Ranges<'a>)>;

/// A push's rows of one partition as one list of ids and one of value
/// bytes (borrowed when the push sent them in one piece).
fn concat_rows<'a>(pieces: &'a [RowPiece<'a>]) -> (Cow<'a, [i64]>, Cow<'a, [u8]>) {
    match pieces {
        [(ids, values)] => (Cow::Borrowed(ids.as_slice()), Cow::Borrowed(*values)),
        _ => (
            Cow::Owned(pieces.iter().flat_map(|(ids, _)| ids.iter().copied()).collect()),
            Cow::Owned(pieces.iter().flat_map(|(_, v)| v.iter().copied()).collect()),
        ),
    }
}

/// Checks a variable as a caller declares it (an embedding partition's
/// spec included).
pub(in crate::ps) fn check_spec(v: &proto::VariableSpec) -> Result<Option<EmbeddingPart>, StoreError> {
    if v.dtype != proto::DataType::DtFloat as i32 {
        return Err(StoreError::InvalidArgument(format!("variables.{}: only DT_FLOAT variables are supported", v.name)));
    }
    shape_usize(&v.name, &v.shape)?;
    v.embedding.as_ref().map(|e| EmbeddingPart::from_proto(&v.name, &v.shape, e).map_err(StoreError::InvalidArgument)).transpose()
}

/// The pieces a ps holds as a caller declares them: dense ones with where
/// they sit in their variables, embedding partitions.
pub(in crate::ps) fn pieces_of(
    variables: &[proto::VariableSpec],
    dense_pieces: &[proto::DensePiece],
) -> Result<(Vec<crate::ps::recut::DensePiece>, Vec<crate::ps::recut::RowsPiece>), StoreError> {
    let (mut dense, mut rows) = (Vec::new(), Vec::new());
    for v in variables {
        match check_spec(v)? {
            Some(part) => rows.push(crate::ps::recut::RowsPiece { stored_name: v.name.clone(), part }),
            None => {
                let p = dense_pieces.iter().find(|p| p.name == v.name).ok_or_else(|| {
                    StoreError::FailedPrecondition(format!(
                        "dense_pieces: the caller does not say where {:?} sits in its variable (a worker older than this ps?)",
                        v.name
                    ))
                })?;
                dense.push(crate::ps::recut::DensePiece {
                    stored_name: v.name.clone(),
                    variable: p.variable.clone(),
                    row_offset: p.row_offset as usize,
                    variable_rows: p.variable_rows as usize,
                    shape: v.shape.iter().map(|&d| d as usize).collect(),
                });
            }
        }
    }
    Ok((dense, rows))
}

fn shape_usize(name: &str, shape: &[i64]) -> Result<Vec<usize>, StoreError> {
    tensor::num_elements(name, shape)?;
    Ok(shape.iter().map(|&d| d as usize).collect())
}

/// The chief's initial values as stored variables, sorted by name: every
/// dense variable assembled from its parts, every embedding partition from
/// its spec, each with fresh slots of `optimizer`. Checked whole before
/// anything is stored.
pub(in crate::ps) fn assemble(
    messages: &[proto::InitVariablesRequest],
    embeddings: &[proto::VariableSpec],
    optimizer: &Optimizer,
) -> Result<Vec<StoredVar>, StoreError> {
    let mut assemblers: BTreeMap<String, PartAssembler> = BTreeMap::new();
    for (i, m) in messages.iter().enumerate() {
        let Some(part) = &m.part else { continue };
        if part.name.is_empty() {
            return Err(StoreError::InvalidArgument(format!("message {i}: part.name is empty")));
        }
        let asm = match assemblers.get_mut(&part.name) {
            Some(a) => a,
            None => assemblers.entry(part.name.clone()).or_insert(PartAssembler::from_part(part)?),
        };
        asm.add(part)?;
    }
    let mut vars = Vec::new();
    for (name, asm) in assemblers {
        let (shape, values) = asm.finish()?;
        vars.push(StoredVar::dense(name, shape, values, optimizer.new_slots(0)));
    }
    for e in embeddings {
        let part = check_spec(e)?.ok_or_else(|| StoreError::InvalidArgument(format!("embeddings.{}: no embedding spec", e.name)))?;
        if vars.iter().any(|v| v.name == e.name) {
            return Err(StoreError::InvalidArgument(format!("embeddings.{}: also sent as a dense variable", e.name)));
        }
        let mut table = RowTable::new(&e.name, part);
        table.use_optimizer(optimizer);
        vars.push(StoredVar::rows(e.name.clone(), shape_usize(&e.name, &e.shape)?, table));
    }
    for v in &mut vars {
        if v.table.is_none() {
            v.slots = optimizer.new_slots(v.values.len());
        }
    }
    vars.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(vars)
}

/// The variables of a ps, by position and by name, and what moved in and out.
#[derive(Debug, Default)]
pub(in crate::ps) struct Variables {
    vars: Vec<StoredVar>,
    by_name: BTreeMap<String, usize>,
    pub(in crate::ps) counters: Counters,
    /// Where unaligned gradient bytes are decoded.
    scratch: Vec<f32>,
}

impl Variables {
    /// Takes `vars` (sorted by name) as the variables.
    pub(in crate::ps) fn install(&mut self, vars: Vec<StoredVar>) {
        self.by_name = vars.iter().enumerate().map(|(i, v)| (v.name.clone(), i)).collect();
        self.vars = vars;
    }

    pub(in crate::ps) fn all(&self) -> &[StoredVar] {
        &self.vars
    }

    pub(in crate::ps) fn all_mut(&mut self) -> &mut [StoredVar] {
        &mut self.vars
    }

    /// How the sync accumulator sees each variable, in order.
    pub(in crate::ps) fn kinds(&self) -> Vec<VarKind> {
        self.vars.iter().map(StoredVar::kind).collect()
    }

    /// The index of embedding partition `name`.
    fn table_index(&self, name: &str) -> Result<usize, StoreError> {
        let &i = self.by_name.get(name).ok_or_else(|| StoreError::NotFound(format!("variable {name:?} is not on this ps")))?;
        if self.vars[i].table.is_none() {
            return Err(StoreError::InvalidArgument(format!("variable {name:?} is not an embedding: it has no rows to pull or push by id")));
        }
        Ok(i)
    }

    /// The dense variables named (all of them when `names` is empty).
    fn indices(&self, names: &[String]) -> Result<Vec<usize>, StoreError> {
        if names.is_empty() {
            return Ok((0..self.vars.len()).filter(|&i| self.vars[i].table.is_none()).collect());
        }
        names
            .iter()
            .map(|n| {
                let &i = self.by_name.get(n).ok_or_else(|| StoreError::NotFound(format!("variable {n:?} is not on this ps")))?;
                if self.vars[i].table.is_some() {
                    return Err(StoreError::InvalidArgument(format!("variable {n:?} is an embedding partition: pull its rows by id")));
                }
                Ok(i)
            })
            .collect()
    }

    /// The rows asked for, checked all before any is read.
    pub(in crate::ps) fn gather_rows(&mut self, requests: &[proto::RowsRequest]) -> Result<Vec<PulledRows>, StoreError> {
        let mut asked = Vec::with_capacity(requests.len());
        let mut seen = BTreeSet::new();
        for r in requests {
            let i = self.table_index(&r.name)?;
            if !seen.insert(i) {
                return Err(StoreError::InvalidArgument(format!("rows: {:?} is asked for twice", r.name)));
            }
            if r.ids.len() % 8 != 0 {
                return Err(StoreError::InvalidArgument(format!("rows.{}: {} bytes of ids is not a whole number of 8-byte ids", r.name, r.ids.len())));
            }
            let ids = crate::le::i64s(&r.ids);
            self.vars[i].table().check_ids(&ids)?;
            asked.push((i, ids));
        }
        let mut out = Vec::with_capacity(asked.len());
        for (i, ids) in asked {
            let table = self.vars[i].table();
            let mut values = Vec::new();
            table.gather(&ids, &mut values);
            self.counters.bytes_sent += (ids.len() * 8 + values.len() * 4) as u64;
            out.push(PulledRows { name: table.name.clone(), dim: table.dim(), ids, values });
        }
        Ok(out)
    }

    /// Encoded values of the named dense variables (all when `names` is
    /// empty), as parts of at most `part_bytes`, shared between the pulls of
    /// one step.
    pub(in crate::ps) fn encoded(&mut self, names: &[String], part_bytes: usize) -> Result<Vec<TensorPart>, StoreError> {
        let indices = self.indices(names)?;
        let mut out = Vec::with_capacity(indices.len());
        let mut sent = 0u64;
        for i in indices {
            let v = &mut self.vars[i];
            if v.encoded.as_ref().is_none_or(|(size, _)| *size != part_bytes) {
                let spare = std::mem::take(&mut v.spare);
                let parts = tensor::encode_parts_reusing(&v.name, &tensor::wire_shape(&v.shape), &v.values, part_bytes, spare);
                v.encoded = Some((part_bytes, parts));
            }
            let parts = &v.encoded.as_ref().expect("just encoded").1;
            sent += parts.iter().map(|p| p.content.len() as u64).sum::<u64>();
            out.extend(parts.iter().cloned());
        }
        self.counters.bytes_sent += sent;
        Ok(out)
    }

    /// The named dense variables (all when `names` is empty) as they are,
    /// shared rather than encoded: for the tensor channel, which writes them raw.
    pub(in crate::ps) fn shared(&mut self, names: &[String]) -> Result<Vec<SharedVariable>, StoreError> {
        let indices = self.indices(names)?;
        let out: Vec<SharedVariable> = indices
            .into_iter()
            .map(|i| {
                let v = &self.vars[i];
                SharedVariable { name: v.name.clone(), shape: tensor::wire_shape(&v.shape), values: v.values.clone() }
            })
            .collect();
        self.counters.bytes_sent += out.iter().map(|v| v.values.len() as u64 * 4).sum::<u64>();
        Ok(out)
    }

    /// Checks every part of a push against the stored variables and groups
    /// them by variable, requiring each variable to be covered exactly once.
    pub(in crate::ps) fn group_parts<'a>(&self, parts: &'a [TensorPart], whole: bool) -> Result<DenseGroups<'a>, StoreError> {
        let mut groups: BTreeMap<usize, Ranges<'a>> = BTreeMap::new();
        for p in parts {
            let &i = self.by_name.get(&p.name).ok_or_else(|| StoreError::NotFound(format!("variable {:?} is not on this ps", p.name)))?;
            if self.vars[i].table.is_some() {
                return Err(StoreError::InvalidArgument(format!("variable {:?} is an embedding partition: push its rows by id", p.name)));
            }
            let range = tensor::check_part(p, &self.vars[i].shape)?;
            groups.entry(i).or_default().push((range, &p.content[..]));
        }
        let mut out = Vec::with_capacity(groups.len());
        for (i, mut g) in groups {
            g.sort_by_key(|(r, _)| r.start);
            let total = self.vars[i].values.len();
            if !(if whole { covers_once(&g, total) } else { no_overlap(&g) }) {
                let how = if whole { format!("do not cover its {total} elements exactly once") } else { "overlap".to_string() };
                return Err(StoreError::InvalidArgument(format!("variable {:?}: the gradient's parts {how}", self.vars[i].name)));
            }
            out.push((i, g));
        }
        Ok(out)
    }

    /// Checks the rows of a push and groups them by embedding partition:
    /// each piece's length fits its partition's row width, every id is in
    /// the table and in this partition, and appears once in the push.
    pub(in crate::ps) fn group_rows<'a>(&self, rows: &'a [RowsPart]) -> Result<RowPieces<'a>, StoreError> {
        let mut groups: BTreeMap<usize, Vec<RowPiece<'a>>> = BTreeMap::new();
        for r in rows {
            let i = self.table_index(&r.name)?;
            let (ids, values) = embedding::split_rows(&r.name, r.count, self.vars[i].table().dim(), &r.content)?;
            groups.entry(i).or_default().push((ids, values));
        }
        for (i, pieces) in &groups {
            self.vars[*i].table().check_ids(pieces.iter().flat_map(|(ids, _)| ids))?;
        }
        Ok(groups.into_iter().collect())
    }

    /// Counts the bytes of a push's parts and rows as received.
    pub(in crate::ps) fn count_received(&mut self, parts: &[TensorPart], rows: &[RowsPart]) {
        self.counters.bytes_received += parts.iter().map(|p| p.content.len() as u64).sum::<u64>();
        self.counters.bytes_received += rows.iter().map(|r| r.content.len() as u64).sum::<u64>();
    }

    /// Applies one checked push at once (async training): each variable's
    /// parts straight from the received bytes when aligned, each partition's
    /// rows.
    pub(in crate::ps) fn apply(&mut self, optimizer: &Optimizer, groups: DenseGroups<'_>, row_groups: &RowPieces<'_>) {
        for (i, group) in groups {
            let v = &mut self.vars[i];
            v.slots.updates += 1;
            let t = v.slots.updates;
            for (range, bytes) in group {
                let grad = tensor::f32_view(bytes, &mut self.scratch);
                optimizer.apply(Arc::make_mut(&mut v.values).as_mut_slice(), &mut v.slots, range, grad, t);
            }
            v.changed();
        }
        for (i, pieces) in row_groups {
            let table = self.vars[*i].table.as_mut().expect("a table");
            let (ids, values) = concat_rows(pieces);
            let grads = tensor::f32_view(&values, &mut self.scratch);
            table.apply(optimizer, &ids, grads);
        }
    }

    /// Values of a variable, for tests and checkpoints.
    pub(in crate::ps) fn values(&self, name: &str) -> Option<Vec<f32>> {
        self.by_name.get(name).map(|&i| self.vars[i].values.to_vec())
    }

    /// Rows `ids` of embedding partition `name` (their initial values when
    /// never updated), and the number of rows it materialised.
    pub(in crate::ps) fn rows(&self, name: &str, ids: &[i64]) -> Option<(Vec<f32>, usize)> {
        let table = self.vars[*self.by_name.get(name)?].table.as_ref()?;
        let mut out = Vec::new();
        table.gather(ids, &mut out);
        Some((out, table.len()))
    }

    /// Most bytes a push may carry: every dense variable once, rows up to
    /// [`MAX_PUSH_ROWS_BYTES`] when there are embedding partitions, plus
    /// room for message overhead.
    pub(in crate::ps) fn max_push_bytes(&self) -> usize {
        let rows = if self.vars.iter().any(|v| v.table.is_some()) { MAX_PUSH_ROWS_BYTES } else { 0 };
        self.vars.iter().map(|v| v.values.len() * 4).sum::<usize>() + rows + (1 << 20)
    }

    /// Every variable's size, for the stats.
    pub(in crate::ps) fn stats(&self) -> Vec<proto::VariableStats> {
        self.vars
            .iter()
            .map(|v| proto::VariableStats {
                name: v.name.clone(),
                shape: tensor::wire_shape(&v.shape),
                bytes: v.table.as_ref().map_or(v.values.len() as u64 * 4, |t| t.bytes()),
                rows: v.table.as_ref().map_or(0, |t| t.len() as u64),
            })
            .collect()
    }
}

/// Do the sorted ranges `g` cover `0..total`, each element once?
/// Ranges sorted by start: none overlaps the next.
fn no_overlap(g: &Ranges<'_>) -> bool {
    g.windows(2).all(|w| w[0].0.end <= w[1].0.start)
}

fn covers_once(g: &Ranges<'_>, total: usize) -> bool {
    let mut next = 0;
    for (r, _) in g {
        if r.start != next {
            break;
        }
        next = r.end;
    }
    next == total && g.iter().map(|(r, _)| r.len()).sum::<usize>() == total
}
