//! The state of a job re-cut for another placement: which fragments of the
//! pieces a ps holds under the new placement each holder of the old one
//! supplies ([`fragments`]), and the new pieces put together from them
//! ([`assemble`]). A checkpoint written by M ps tasks restored into a job of
//! N ([`recut`]) is the case where one source holds every old piece.
//!
//! Pure: shard data and pieces in, shard data out, in the form
//! [`super::checkpointing`] restores from. A dense piece is the rows
//! `row_offset ..` of its variable: a source supplies the rows its own
//! pieces and the target share, slots alike. An embedding's materialised
//! rows go to the partition the target's strategy gives them, with their
//! slots. Update counts (Adam's `t`) take the largest of the sources'.
//! Nothing is made up: a target piece whose variable no source holds, or
//! holds with another shape, or whose rows are not all supplied exactly
//! once, is an error naming it.

use std::collections::BTreeMap;

use crate::checkpoint::{NamedTensor, SavedRows, ShardData};
use crate::embedding::EmbeddingPart;

/// A dense piece this ps holds: rows `row_offset ..` of `variable` (as many
/// as `shape[0]`; a scalar is one row), stored as `stored_name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DensePiece {
    pub stored_name: String,
    pub variable: String,
    pub row_offset: usize,
    /// Rows of the whole variable.
    pub variable_rows: usize,
    pub shape: Vec<usize>,
}

/// An embedding partition this ps holds.
#[derive(Debug, Clone, PartialEq)]
pub struct RowsPiece {
    pub stored_name: String,
    pub part: EmbeddingPart,
}

/// A checkpoint of another ps count, every shard of it merged, waiting for
/// the first handshake to say which pieces this ps holds.
#[derive(Debug)]
pub struct PendingRecut {
    pub merged: ShardData,
    pub step: i64,
    /// The ps tasks that wrote it.
    pub written_by: usize,
    /// Where it is, for the log.
    pub path: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecutError {
    #[error("the checkpoint has no variable {0:?} (was it written by another model?)")]
    Missing(String),
    #[error("variable {variable:?}: {reason}")]
    Mismatch { variable: String, reason: String },
}

fn mismatch(variable: &str, reason: impl Into<String>) -> RecutError {
    RecutError::Mismatch { variable: variable.to_string(), reason: reason.into() }
}

/// The pieces of this ps cut out of `merged` (every shard of a checkpoint).
/// `dispatcher`: whether this ps keeps the shard dispatcher's state (ps 0).
pub fn recut(merged: &ShardData, dense: &[DensePiece], rows: &[RowsPiece], dispatcher: bool) -> Result<ShardData, RecutError> {
    let supplied = fragments(&StoredPieces::of(merged), &stored_dense_pieces(merged), dense, rows)?;
    let mut out = assemble(dense, rows, vec![supplied])?;
    if dispatcher {
        out.dispatcher = merged.dispatcher.clone();
    }
    Ok(out)
}

/// Where the dense pieces of merged checkpoint shards sit: a variable
/// stored whole, or as `<name>/part_0..` in row order.
fn stored_dense_pieces(merged: &ShardData) -> Vec<DensePiece> {
    let is_rows = |n: &str| merged.row_ids.iter().any(|(r, _)| r == n);
    let mut by_variable: BTreeMap<&str, BTreeMap<usize, &NamedTensor>> = BTreeMap::new();
    for t in merged.variables.iter().filter(|t| !is_rows(&t.0)) {
        let (variable, k) = match t.0.rsplit_once("/part_").and_then(|(v, k)| Some((v, k.parse().ok()?))) {
            Some((v, k)) => (v, k),
            None => (t.0.as_str(), 0),
        };
        by_variable.entry(variable).or_default().insert(k, t);
    }
    let mut pieces = Vec::new();
    for (variable, parts) in by_variable {
        let variable_rows = parts.values().map(|t| rows_of(&t.1)).sum();
        let mut row_offset = 0;
        for t in parts.values() {
            pieces.push(DensePiece { stored_name: t.0.clone(), variable: variable.to_string(), row_offset, variable_rows, shape: t.1.clone() });
            row_offset += rows_of(&t.1);
        }
    }
    pieces
}

/// Rows along the first axis (a scalar is one row).
fn rows_of(shape: &[usize]) -> usize {
    shape.first().copied().unwrap_or(1)
}

/// Elements of one row.
fn row_len(shape: &[usize]) -> usize {
    shape.get(1..).unwrap_or(&[]).iter().product()
}

/// Rows `row_offset .. row_offset + rows` of target piece `piece`'s
/// variable, with their slots, from one source.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseFragment {
    pub piece: String,
    pub row_offset: usize,
    pub rows: usize,
    pub values: Vec<f32>,
    /// Empty where the optimizer keeps no such slot.
    pub slots: [Vec<f32>; 2],
    pub updates: u64,
}

/// Materialised rows of target partition `piece`, with their slots, from one source.
#[derive(Debug, Clone, PartialEq)]
pub struct RowsFragment {
    pub piece: String,
    /// The partition of the source, of how many: every one of them must
    /// supply its fragment (empty if none of its rows go there), or rows
    /// would silently fall back to their initial values.
    pub source: (u64, u64),
    pub ids: Vec<i64>,
    pub values: Vec<f32>,
    pub slots: [Vec<f32>; 2],
    pub updates: u64,
}

/// What one source supplies.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Fragments {
    pub dense: Vec<DenseFragment>,
    pub rows: Vec<RowsFragment>,
}

/// Bytes for a log line: `812 B`, `41.3 kB`, `77.0 MB`, `1.2 GB`.
pub fn bytes_text(bytes: u64) -> String {
    match bytes {
        b if b < 1_000 => format!("{b} B"),
        b if b < 1_000_000 => format!("{:.1} kB", b as f64 / 1e3),
        b if b < 1_000_000_000 => format!("{:.1} MB", b as f64 / 1e6),
        b => format!("{:.1} GB", b as f64 / 1e9),
    }
}

impl Fragments {
    /// Bytes of values and slots.
    pub fn bytes(&self) -> usize {
        let dense = self.dense.iter().map(|f| f.values.len() + f.slots[0].len() + f.slots[1].len());
        let rows = self.rows.iter().map(|f| f.values.len() + f.slots[0].len() + f.slots[1].len());
        (dense.sum::<usize>() + rows.sum::<usize>()) * 4
    }

    /// Embedding rows.
    pub fn rows(&self) -> usize {
        self.rows.iter().map(|f| f.ids.len()).sum()
    }
}

/// What a source holding `stored` (its dense pieces at `own_dense`)
/// supplies of the target pieces `dense` and `rows`.
pub fn fragments(stored: &StoredPieces<'_>, own_dense: &[DensePiece], dense: &[DensePiece], rows: &[RowsPiece]) -> Result<Fragments, RecutError> {
    let mut out = Fragments::default();
    for target in dense {
        for have in own_dense.iter().filter(|h| h.variable == target.variable) {
            out.dense.extend(dense_fragment(stored, have, target)?);
        }
    }
    for target in rows {
        for (name, part) in stored.embeddings.iter().filter(|(_, p)| p.variable == target.part.variable) {
            out.rows.push(rows_fragment(stored, name, part, target)?);
        }
    }
    Ok(out)
}

/// A source's tensors by stored name, borrowed: from a checkpoint's shard
/// ([`of`](Self::of)) or from a ps's live variables (no copy of its state).
#[derive(Default)]
pub struct StoredPieces<'a> {
    /// Shape and values.
    variables: BTreeMap<&'a str, (&'a [usize], &'a [f32])>,
    /// The optimizer's two slots (empty where it keeps none).
    slots: BTreeMap<&'a str, [&'a [f32]; 2]>,
    updates: BTreeMap<&'a str, u64>,
    row_ids: BTreeMap<&'a str, &'a [i64]>,
    /// Each embedding partition's description (stored name, part).
    embeddings: Vec<(&'a str, EmbeddingPart)>,
}

impl<'a> StoredPieces<'a> {
    pub fn of(merged: &'a ShardData) -> Self {
        let mut slots: BTreeMap<&'a str, [&'a [f32]; 2]> = BTreeMap::new();
        for (name, _, values) in &merged.slots {
            for (k, suffix) in [":slot0", ":slot1"].into_iter().enumerate() {
                if let Some(var) = name.strip_suffix(suffix) {
                    slots.entry(var).or_default()[k] = values;
                }
            }
        }
        StoredPieces {
            variables: merged.variables.iter().map(|t| (t.0.as_str(), (t.1.as_slice(), t.2.as_slice()))).collect(),
            slots,
            updates: merged.updates.iter().map(|(n, u)| (n.as_str(), *u)).collect(),
            row_ids: merged.row_ids.iter().map(|(n, ids)| (n.as_str(), ids.as_slice())).collect(),
            embeddings: merged.embeddings.iter().filter_map(|(n, json)| Some((n.as_str(), serde_json::from_str(json).ok()?))).collect(),
        }
    }

    /// Adds a dense variable (as a checkpoint would hold it).
    pub fn add_dense(&mut self, name: &'a str, shape: &'a [usize], values: &'a [f32], slots: [&'a [f32]; 2], updates: u64) {
        self.variables.insert(name, (shape, values));
        self.slots.insert(name, slots);
        self.updates.insert(name, updates);
    }

    /// Adds an embedding partition's materialised rows.
    pub fn add_rows(&mut self, name: &'a str, part: EmbeddingPart, (ids, values, slots, updates): SavedRows<'a>) {
        const NO_SHAPE: &[usize] = &[];
        self.add_dense(name, NO_SHAPE, values, slots, updates);
        self.row_ids.insert(name, ids);
        self.embeddings.push((name, part));
    }

    fn slot(&self, name: &str, k: usize) -> &'a [f32] {
        self.slots.get(name).map_or(&[], |s| s[k])
    }
}

/// The rows source piece `have` and target piece `target` share, if any.
fn dense_fragment(stored: &StoredPieces<'_>, have: &DensePiece, target: &DensePiece) -> Result<Option<DenseFragment>, RecutError> {
    let var = target.variable.as_str();
    let values = stored.variables.get(have.stored_name.as_str()).ok_or_else(|| RecutError::Missing(have.stored_name.clone()))?;
    if have.variable_rows != target.variable_rows {
        return Err(mismatch(var, format!("{} rows stored, {} in the model", have.variable_rows, target.variable_rows)));
    }
    if values.0.get(1..).unwrap_or(&[]) != target.shape.get(1..).unwrap_or(&[]) {
        return Err(mismatch(var, format!("stored as {:?}, rows of {:?} in the model", values.0, target.shape.get(1..).unwrap_or(&[]))));
    }
    let start = have.row_offset.max(target.row_offset);
    let end = (have.row_offset + rows_of(&have.shape)).min(target.row_offset + rows_of(&target.shape));
    if start >= end {
        return Ok(None);
    }
    let len = row_len(&target.shape);
    let cut = |all: &[f32]| if all.is_empty() { Vec::new() } else { all[(start - have.row_offset) * len..(end - have.row_offset) * len].to_vec() };
    Ok(Some(DenseFragment {
        piece: target.stored_name.clone(),
        row_offset: start,
        rows: end - start,
        values: cut(values.1),
        slots: [cut(stored.slot(&have.stored_name, 0)), cut(stored.slot(&have.stored_name, 1))],
        updates: stored.updates.get(have.stored_name.as_str()).copied().unwrap_or(0),
    }))
}

/// The rows of source partition `name` that target partition `target` holds.
fn rows_fragment(stored: &StoredPieces<'_>, name: &str, have: &EmbeddingPart, target: &RowsPiece) -> Result<RowsFragment, RecutError> {
    let new = &target.part;
    if have.rows != new.rows || have.dim != new.dim {
        return Err(mismatch(&new.variable, format!("{}x{} stored, {}x{} in the model", have.rows, have.dim, new.rows, new.dim)));
    }
    let ids = stored.row_ids.get(name).copied().unwrap_or_default();
    let values = stored.variables.get(name).map(|t| t.1).unwrap_or_default();
    let slots = [stored.slot(name, 0), stored.slot(name, 1)];
    let dim = new.dim;
    let fits = |v: &[f32]| v.len() == ids.len() * dim;
    if !fits(values) || slots.iter().any(|s| !s.is_empty() && !fits(s)) {
        return Err(mismatch(name, format!("{} row ids but {} values (or slot values) of dim {dim}", ids.len(), values.len())));
    }
    let source = (have.partition, have.num_partitions);
    let mut out = RowsFragment { piece: target.stored_name.clone(), source, ids: Vec::new(), values: Vec::new(), slots: Default::default(), updates: 0 };
    out.updates = stored.updates.get(name).copied().unwrap_or(0);
    for (i, &id) in ids.iter().enumerate() {
        if new.strategy.partition_of(new.rows, new.num_partitions, id as u64) != new.partition {
            continue;
        }
        out.ids.push(id);
        out.values.extend_from_slice(&values[i * dim..(i + 1) * dim]);
        for (k, slot) in slots.iter().enumerate().filter(|(_, s)| !s.is_empty()) {
            out.slots[k].extend_from_slice(&slot[i * dim..(i + 1) * dim]);
        }
    }
    Ok(out)
}

/// The target pieces put together from what every source supplied: each
/// dense row exactly once, embedding rows in id order, none twice.
pub fn assemble(dense: &[DensePiece], rows: &[RowsPiece], supplied: Vec<Fragments>) -> Result<ShardData, RecutError> {
    let mut dense_by_piece: BTreeMap<String, Vec<DenseFragment>> = BTreeMap::new();
    let mut rows_by_piece: BTreeMap<String, Vec<RowsFragment>> = BTreeMap::new();
    for f in supplied {
        for d in f.dense {
            dense_by_piece.entry(d.piece.clone()).or_default().push(d);
        }
        for r in f.rows {
            rows_by_piece.entry(r.piece.clone()).or_default().push(r);
        }
    }
    let mut out = ShardData::default();
    for target in dense {
        assemble_dense(target, dense_by_piece.remove(&target.stored_name).unwrap_or_default(), &mut out)?;
    }
    for target in rows {
        let Some(fragments) = rows_by_piece.remove(&target.stored_name) else {
            return Err(RecutError::Missing(target.part.variable.clone()));
        };
        assemble_rows(target, fragments, &mut out)?;
    }
    Ok(out)
}

fn assemble_dense(target: &DensePiece, fragments: Vec<DenseFragment>, out: &mut ShardData) -> Result<(), RecutError> {
    let var = target.variable.as_str();
    if fragments.is_empty() {
        return Err(RecutError::Missing(var.to_string()));
    }
    let (n, len) = (rows_of(&target.shape), row_len(&target.shape));
    let mut covered = vec![0u8; n];
    let mut values = vec![0f32; n * len];
    let has_slot = |k: usize| fragments.iter().any(|f| !f.slots[k].is_empty());
    let mut slots = [if has_slot(0) { vec![0f32; n * len] } else { Vec::new() }, if has_slot(1) { vec![0f32; n * len] } else { Vec::new() }];
    for f in &fragments {
        let at = (f.row_offset - target.row_offset) * len..(f.row_offset - target.row_offset + f.rows) * len;
        for c in &mut covered[f.row_offset - target.row_offset..][..f.rows] {
            *c += 1;
        }
        values[at.clone()].copy_from_slice(&f.values);
        for (k, slot) in slots.iter_mut().enumerate().filter(|(_, s)| !s.is_empty()) {
            if f.slots[k].len() != f.values.len() {
                return Err(mismatch(var, "an optimizer slot is stored for some of its parts only"));
            }
            slot[at.clone()].copy_from_slice(&f.slots[k]);
        }
    }
    if let Some(row) = covered.iter().position(|&c| c != 1) {
        let how = if covered[row] == 0 { "came from no ps" } else { "came twice" };
        return Err(mismatch(var, format!("row {} of piece {:?} {how}", target.row_offset + row, target.stored_name)));
    }
    let updates = fragments.iter().map(|f| f.updates).max().unwrap_or(0);
    out.push_dense_owned(&target.stored_name, &target.shape, values, slots, updates);
    Ok(())
}

/// A target partition's rows: each source's fragment after the other, in
/// the order of their partitions, each in the order its source held them
/// (no sort: a row's place is its index's business, and a moved partition
/// has millions of rows). A fragment that is the partition's only one is
/// taken whole. A row supplied twice is found when the partition's index is
/// built ([`crate::embedding::RowTable::restore`]).
fn assemble_rows(target: &RowsPiece, mut fragments: Vec<RowsFragment>, out: &mut ShardData) -> Result<(), RecutError> {
    let dim = target.part.dim;
    fragments.sort_unstable_by_key(|f| f.source);
    let sources: Vec<(u64, u64)> = fragments.iter().map(|f| f.source).collect();
    let count = sources[0].1;
    if let Some(k) = (0..count).find(|&k| sources.binary_search(&(k, count)).is_err()) {
        return Err(mismatch(&target.part.variable, format!("the rows of its partition {k} of {count} came from no ps")));
    }
    if sources.len() as u64 != count || sources.iter().any(|s| s.1 != count) {
        return Err(mismatch(&target.part.variable, format!("rows came twice (from partitions {sources:?})")));
    }
    // Each of values and slots: held for every row (of every fragment that has rows) or for none.
    let with_rows: Vec<&RowsFragment> = fragments.iter().filter(|f| !f.ids.is_empty()).collect();
    let held = |of: fn(&RowsFragment) -> &Vec<f32>| -> Result<bool, RecutError> {
        if with_rows.iter().all(|f| of(f).is_empty()) {
            return Ok(false);
        }
        if with_rows.iter().any(|f| of(f).len() != f.ids.len() * dim) {
            return Err(mismatch(&target.part.variable, "values or an optimizer slot are stored for some of its rows only"));
        }
        Ok(true)
    };
    let held = [held(|f| &f.values)?, held(|f| &f.slots[0])?, held(|f| &f.slots[1])?];
    let updates = fragments.iter().map(|f| f.updates).max().unwrap_or(0);
    fragments.retain(|f| !f.ids.is_empty());
    let rows = if fragments.len() == 1 {
        let f = fragments.pop().expect("one fragment");
        (f.ids, f.values, f.slots, updates)
    } else {
        let n: usize = fragments.iter().map(|f| f.ids.len()).sum();
        let joined = |of: fn(&RowsFragment) -> &Vec<f32>, held: bool| -> Vec<f32> {
            if !held {
                return Vec::new();
            }
            let mut all = Vec::with_capacity(n * dim);
            fragments.iter().for_each(|f| all.extend_from_slice(of(f)));
            all
        };
        let ids = fragments.iter().flat_map(|f| f.ids.iter().copied()).collect();
        (ids, joined(|f| &f.values, held[0]), [joined(|f| &f.slots[0], held[1]), joined(|f| &f.slots[1], held[2])], updates)
    };
    let json = serde_json::to_string(&target.part).map_err(|e| mismatch(&target.part.variable, e.to_string()))?;
    out.push_rows_owned(&target.stored_name, dim, rows, json);
    Ok(())
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod bytes_tests {
    #[test]
    fn bytes_for_people() {
        let cases = [(0, "0 B"), (812, "812 B"), (41_300, "41.3 kB"), (77_000_000, "77.0 MB"), (1_200_000_000, "1.2 GB")];
        for (b, want) in cases {
            assert_eq!(super::bytes_text(b), want);
        }
    }
}
