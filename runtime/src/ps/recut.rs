//! A checkpoint written by M ps tasks, cut for one ps of a job that now has
//! N: the pieces this ps holds under the job's current placement, cut out of
//! the checkpoint's merged shards (every shard of it, read once).
//!
//! Pure: merged shard data and the pieces in, this ps's shard data out, in
//! the form [`super::checkpointing`] restores from. A dense variable's
//! stored parts (`<name>/part_<k>`, or the whole) are joined along the first
//! axis and the new piece's rows sliced out, slots alike; an embedding's
//! materialised rows, from every old partition, go to the new partition the
//! new strategy gives them, with their slots. Update counts (Adam's `t`)
//! take the largest of the old parts'. Nothing is made up: a piece whose
//! variable the checkpoint does not hold, or holds with another shape, is an
//! error naming it (the model changed since the checkpoint was written).

use std::collections::BTreeMap;

use crate::checkpoint::{NamedTensor, ShardData};
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
    let stored = StoredPieces::of(merged);
    let mut out = ShardData::default();
    for piece in dense {
        cut_dense(&stored, piece, &mut out)?;
    }
    for piece in rows {
        cut_rows(&stored, piece, &mut out)?;
    }
    if dispatcher {
        out.dispatcher = merged.dispatcher.clone();
    }
    Ok(out)
}

/// The checkpoint's tensors by stored name.
struct StoredPieces<'a> {
    variables: BTreeMap<&'a str, &'a NamedTensor>,
    slots: BTreeMap<&'a str, &'a NamedTensor>,
    updates: BTreeMap<&'a str, u64>,
    row_ids: BTreeMap<&'a str, &'a [i64]>,
    /// Each embedding partition's description (stored name, part).
    embeddings: Vec<(&'a str, EmbeddingPart)>,
}

impl<'a> StoredPieces<'a> {
    fn of(merged: &'a ShardData) -> Self {
        StoredPieces {
            variables: merged.variables.iter().map(|t| (t.0.as_str(), t)).collect(),
            slots: merged.slots.iter().map(|t| (t.0.as_str(), t)).collect(),
            updates: merged.updates.iter().map(|(n, u)| (n.as_str(), *u)).collect(),
            row_ids: merged.row_ids.iter().map(|(n, ids)| (n.as_str(), ids.as_slice())).collect(),
            embeddings: merged.embeddings.iter().filter_map(|(n, json)| Some((n.as_str(), serde_json::from_str(json).ok()?))).collect(),
        }
    }

    /// The stored parts of dense variable `variable` in row order: the
    /// whole, or `<variable>/part_0..`.
    fn dense_parts(&self, variable: &str) -> Result<Vec<&'a NamedTensor>, RecutError> {
        if let Some(whole) = self.variables.get(variable).filter(|_| !self.row_ids.contains_key(variable)) {
            return Ok(vec![whole]);
        }
        let mut parts = Vec::new();
        while let Some(p) = self.variables.get(format!("{variable}/part_{}", parts.len()).as_str()) {
            if self.row_ids.contains_key(p.0.as_str()) {
                return Err(mismatch(variable, "the checkpoint holds it as an embedding's rows, the model as a dense variable"));
            }
            parts.push(*p);
        }
        if parts.is_empty() {
            return Err(RecutError::Missing(variable.to_string()));
        }
        Ok(parts)
    }

    fn slot(&self, name: &str, k: usize) -> Option<&'a NamedTensor> {
        self.slots.get(format!("{name}:slot{k}").as_str()).copied()
    }
}

/// The values of `parts` (whole or a slot, by `pick`) joined along the
/// first axis; `None` when no part has that tensor.
fn joined<'a>(variable: &str, parts: &[&'a NamedTensor], pick: impl Fn(&'a NamedTensor) -> Option<&'a NamedTensor>) -> Result<Option<Vec<f32>>, RecutError> {
    let picked: Vec<Option<&NamedTensor>> = parts.iter().map(|p| pick(p)).collect();
    match picked.iter().filter(|p| p.is_some()).count() {
        0 => Ok(None),
        n if n < picked.len() => Err(mismatch(variable, "an optimizer slot is stored for some of its parts only")),
        _ => Ok(Some(picked.into_iter().flatten().flat_map(|t| t.2.iter().copied()).collect())),
    }
}

/// Adds dense piece `piece`, cut out of its variable's stored parts.
fn cut_dense(stored: &StoredPieces<'_>, piece: &DensePiece, out: &mut ShardData) -> Result<(), RecutError> {
    let var = piece.variable.as_str();
    let parts = stored.dense_parts(var)?;
    let row_shape = piece.shape.get(1..).unwrap_or(&[]);
    let row_len: usize = row_shape.iter().product();
    let rows: usize = parts.iter().map(|p| p.1.first().copied().unwrap_or(1)).sum();
    if let Some(p) = parts.iter().find(|p| p.1.get(1..).unwrap_or(&[]) != row_shape) {
        return Err(mismatch(var, format!("stored as {:?} in the checkpoint, rows of {row_shape:?} in the model", p.1)));
    }
    if rows != piece.variable_rows {
        return Err(mismatch(var, format!("{rows} rows in the checkpoint, {} in the model", piece.variable_rows)));
    }
    let n = piece.shape.first().copied().unwrap_or(1);
    if piece.row_offset + n > rows {
        return Err(mismatch(var, format!("piece {:?} asks rows {}..{} of {rows}", piece.stored_name, piece.row_offset, piece.row_offset + n)));
    }
    let cut = |all: Vec<f32>| all[piece.row_offset * row_len..(piece.row_offset + n) * row_len].to_vec();
    let values = cut(joined(var, &parts, Some)?.unwrap_or_default());
    let slot = |k| Ok::<_, RecutError>(joined(var, &parts, |p| stored.slot(&p.0, k))?.map(cut).unwrap_or_default());
    let slots = [slot(0)?, slot(1)?];
    let updates = parts.iter().filter_map(|p| stored.updates.get(p.0.as_str())).copied().max().unwrap_or(0);
    out.push_dense(&piece.stored_name, &piece.shape, &values, [&slots[0], &slots[1]], updates);
    Ok(())
}

/// One materialised row: id, values, the two slots' rows.
type Row = (i64, Vec<f32>, [Vec<f32>; 2]);

/// Adds embedding partition `piece`: the rows of every old partition of its
/// variable that the new partition holds, in id order.
fn cut_rows(stored: &StoredPieces<'_>, piece: &RowsPiece, out: &mut ShardData) -> Result<(), RecutError> {
    let new = &piece.part;
    let old: Vec<&(&str, EmbeddingPart)> = stored.embeddings.iter().filter(|(_, p)| p.variable == new.variable).collect();
    if old.is_empty() {
        return Err(RecutError::Missing(new.variable.clone()));
    }
    let mut rows: Vec<Row> = Vec::new();
    let mut updates = 0;
    for (name, part) in old {
        if part.rows != new.rows || part.dim != new.dim {
            return Err(mismatch(&new.variable, format!("{}x{} in the checkpoint, {}x{} in the model", part.rows, part.dim, new.rows, new.dim)));
        }
        updates = updates.max(stored.updates.get(name).copied().unwrap_or(0));
        rows.extend(
            old_rows(stored, name, new.dim)?
                .into_iter()
                .filter(|(id, _, _)| new.strategy.partition_of(new.rows, new.num_partitions, *id as u64) == new.partition),
        );
    }
    rows.sort_by_key(|r| r.0);
    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let values: Vec<f32> = rows.iter().flat_map(|r| r.1.iter().copied()).collect();
    let slot = |k: usize| -> Vec<f32> { rows.iter().flat_map(|r| r.2[k].iter().copied()).collect() };
    let slots = [slot(0), slot(1)];
    let json = serde_json::to_string(new).map_err(|e| mismatch(&new.variable, e.to_string()))?;
    out.push_rows(&piece.stored_name, new.dim, (&ids, &values, [&slots[0], &slots[1]], updates), json);
    Ok(())
}

/// The rows an old partition `name` materialised, each with its slots.
fn old_rows(stored: &StoredPieces<'_>, name: &str, dim: usize) -> Result<Vec<Row>, RecutError> {
    let ids = stored.row_ids.get(name).copied().unwrap_or_default();
    let values = stored.variables.get(name).map(|t| t.2.as_slice()).unwrap_or_default();
    let slot = |k: usize| stored.slot(name, k).map(|t| t.2.as_slice());
    let slots = [slot(0), slot(1)];
    let fits = |v: &[f32]| v.len() == ids.len() * dim;
    if !fits(values) || slots.iter().flatten().any(|s| !fits(s)) {
        return Err(mismatch(name, format!("{} row ids but {} values (or slot values) of dim {dim}", ids.len(), values.len())));
    }
    let row = |v: Option<&[f32]>, i: usize| v.map(|v| v[i * dim..(i + 1) * dim].to_vec()).unwrap_or_default();
    Ok(ids.iter().enumerate().map(|(i, &id)| (id, row(Some(values), i), [row(slots[0], i), row(slots[1], i)])).collect())
}

#[cfg(test)]
mod tests;
