//! Embedding variables: tables of `rows × dim` too large to pull whole,
//! partitioned by row over the ps tasks (TensorFlow's partitioned variables
//! with `embedding_lookup`'s `partition_strategy`), whose rows exist on a ps
//! only once they were updated.
//!
//! An embedding is declared like any variable (name, shape `[rows, dim]`,
//! initializer) plus a partition strategy; each ps holds one partition as a
//! [`RowTable`]: the rows it materialised, their optimizer slots, and the
//! rule that gives any other row its initial value. A row's initial value
//! depends only on the variable's name, `--seed` and the row's id
//! ([`RowInit`]), so every task and every restart computes the same one: a
//! pull of a row never updated answers that value without storing it, and
//! a 2^24-row table costs memory only for the rows training touched.
//!
//! Pure and synchronous: the ps wraps the tables in its lock, the worker's
//! single-process mode uses them directly.

use std::collections::{HashMap, HashSet};

/// Maps and sets keyed by row id: foldhash's fixed-seed hasher, several times faster than the
/// standard SipHash on the millions of ids a large table holds (ids come from the job's own
/// tasks, so a hash-flooding-resistant seed buys nothing).
type RowHasher = foldhash::fast::FixedState;

use serde::{Deserialize, Serialize};

use crate::init::{Init, RowInit};
use crate::optimizer::{Optimizer, Slots};
use crate::placement::PartitionStrategy;
use crate::proto;

/// One partition of an embedding variable, as a ps holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingPart {
    /// The whole variable's name (its rows' initial values depend on it).
    pub variable: String,
    /// Rows of the whole variable.
    pub rows: u64,
    pub dim: usize,
    pub strategy: PartitionStrategy,
    pub partition: u64,
    pub num_partitions: u64,
    pub init: RowInit,
}

fn init_to_proto(init: &Init, seed: u64) -> proto::RowInitializer {
    use proto::row_initializer::Kind;
    let (kind, value) = match *init {
        Init::Zeros => (Kind::Zeros, 0.0),
        Init::Constant(c) => (Kind::Constant, c),
        Init::Normal { stddev } => (Kind::Normal, stddev),
        Init::TruncatedNormal { stddev } => (Kind::TruncatedNormal, stddev),
        Init::Uniform { limit } => (Kind::Uniform, limit),
    };
    proto::RowInitializer { kind: kind as i32, value, seed }
}

fn init_from_proto(p: &proto::RowInitializer) -> Result<Init, String> {
    use proto::row_initializer::Kind;
    let v = p.value;
    if !v.is_finite() {
        return Err(format!("initializer value {v} is not finite"));
    }
    Ok(match Kind::try_from(p.kind) {
        Ok(Kind::Zeros) => Init::Zeros,
        Ok(Kind::Constant) => Init::Constant(v),
        Ok(Kind::Normal) => Init::Normal { stddev: v },
        Ok(Kind::TruncatedNormal) => Init::TruncatedNormal { stddev: v },
        Ok(Kind::Uniform) => Init::Uniform { limit: v },
        _ => return Err(format!("unknown initializer kind {}", p.kind)),
    })
}

impl EmbeddingPart {
    /// Rows this partition holds.
    pub fn partition_rows(&self) -> u64 {
        self.strategy.partition_rows(self.rows, self.num_partitions, self.partition)
    }

    pub fn to_proto(&self) -> proto::EmbeddingSpec {
        proto::EmbeddingSpec {
            variable: self.variable.clone(),
            rows: self.rows,
            dim: self.dim as u32,
            partition_strategy: self.strategy.to_proto() as i32,
            partition: self.partition as u32,
            num_partitions: self.num_partitions as u32,
            initializer: Some(init_to_proto(&self.init.init, self.init.seed)),
        }
    }

    /// Checks a received partition spec against the stored piece's shape
    /// (`[partition rows, dim]`). The error names what is wrong.
    pub fn from_proto(name: &str, shape: &[i64], p: &proto::EmbeddingSpec) -> Result<Self, String> {
        let strategy = PartitionStrategy::from_proto(p.partition_strategy)
            .ok_or_else(|| format!("variables.{name}.embedding.partition_strategy: unknown strategy {}", p.partition_strategy))?;
        if p.variable.is_empty() {
            return Err(format!("variables.{name}.embedding.variable: empty"));
        }
        if p.rows == 0 || p.dim == 0 || p.num_partitions == 0 || u64::from(p.num_partitions) > p.rows {
            return Err(format!(
                "variables.{name}.embedding: {} rows of {} in {} partition(s) is not a table (each at least 1, no more partitions than rows)",
                p.rows, p.dim, p.num_partitions
            ));
        }
        if p.rows > i64::MAX as u64 {
            return Err(format!("variables.{name}.embedding.rows: {} is more than ids can name", p.rows));
        }
        if p.partition >= p.num_partitions {
            return Err(format!("variables.{name}.embedding.partition: {} is not in 0..{}", p.partition, p.num_partitions));
        }
        let init = p.initializer.as_ref().ok_or_else(|| format!("variables.{name}.embedding.initializer: missing"))?;
        let init = init_from_proto(init).map_err(|e| format!("variables.{name}.embedding.initializer: {e}"))?;
        let part = EmbeddingPart {
            variable: p.variable.clone(),
            rows: p.rows,
            dim: p.dim as usize,
            strategy,
            partition: p.partition.into(),
            num_partitions: p.num_partitions.into(),
            init: RowInit::new(&p.variable, init, p.initializer.as_ref().map_or(0, |i| i.seed)),
        };
        let want = [part.partition_rows() as i64, part.dim as i64];
        if shape != want {
            return Err(format!("variables.{name}: shape {shape:?}, but partition {} of {} rows holds {want:?}", part.partition, part.rows));
        }
        Ok(part)
    }
}

/// What can be wrong with the rows of a pull or a push.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowError {
    #[error("variable {name:?}: id {id} is outside the table (0..{rows})")]
    OutOfTable { name: String, id: i64, rows: u64 },
    #[error("variable {name:?}: id {id} belongs to partition {owner} ({strategy}), not {partition}")]
    WrongPartition { name: String, id: i64, owner: u64, partition: u64, strategy: PartitionStrategy },
    #[error("variable {name:?}: id {id} appears twice in one request")]
    Duplicate { name: String, id: i64 },
    #[error("variable {name:?}: {count} ids need {expected} bytes of ids and values (dim {dim}), the request carries {got}")]
    Length { name: String, count: u64, dim: usize, expected: u64, got: u64 },
}

/// Splits the content of a rows part (`count` ids, then `count * dim`
/// values) into ids and value bytes, checking the length.
pub fn split_rows<'a>(name: &str, count: u64, dim: usize, content: &'a [u8]) -> Result<(Vec<i64>, &'a [u8]), RowError> {
    let expected = count.checked_mul(8 + 4 * dim as u64);
    if expected != Some(content.len() as u64) {
        return Err(RowError::Length { name: name.into(), count, dim, expected: expected.unwrap_or(u64::MAX), got: content.len() as u64 });
    }
    let (ids, values) = content.split_at(count as usize * 8);
    Ok((crate::le::i64s(ids), values))
}

/// The materialised rows of one embedding partition, with their optimizer
/// slots.
#[derive(Debug, Clone, PartialEq)]
pub struct RowTable {
    /// The stored piece's name (`<variable>/part_<k>`).
    pub name: String,
    pub part: EmbeddingPart,
    /// Position of each materialised id in `ids`.
    index: HashMap<i64, usize, RowHasher>,
    ids: Vec<i64>,
    /// `ids.len() * dim` values, row after row.
    values: Vec<f32>,
    /// Per-row slots, laid out like `values`; `updates` counts the updates of
    /// the partition (Adam's t).
    slots: Slots,
}

impl RowTable {
    pub fn new(name: &str, part: EmbeddingPart) -> Self {
        RowTable { name: name.to_string(), part, index: HashMap::default(), ids: Vec::new(), values: Vec::new(), slots: Slots::default() }
    }

    /// The whole of an embedding in one partition (single-process training).
    pub fn whole(variable: &str, rows: usize, dim: usize, init: Init, seed: u64) -> Self {
        let part = EmbeddingPart {
            variable: variable.to_string(),
            rows: rows as u64,
            dim,
            strategy: PartitionStrategy::Mod,
            partition: 0,
            num_partitions: 1,
            init: RowInit::new(variable, init, seed),
        };
        RowTable::new(variable, part)
    }

    pub fn dim(&self) -> usize {
        self.part.dim
    }

    /// Rows materialised so far.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Bytes held: values, slots and ids.
    pub fn bytes(&self) -> u64 {
        ((self.values.len() + self.slots.first.len() + self.slots.second.len()) * 4 + self.ids.len() * 8) as u64
    }

    /// Checks that every id is in the table, belongs to this partition, and
    /// appears once.
    pub fn check_ids<'a, I>(&self, ids: I) -> Result<(), RowError>
    where
        I: IntoIterator<Item = &'a i64>,
        I::IntoIter: Clone,
    {
        let ids = ids.into_iter();
        let mut previous = None;
        let mut increasing = true;
        for &id in ids.clone() {
            self.check_id(id)?;
            increasing &= previous.is_none_or(|p| p < id);
            previous = Some(id);
        }
        if increasing {
            // A worker's rows come sorted: strictly increasing ids are unique. This set, grown
            // from empty for each request, and the tables' inserts were together about a
            // sixth of a sparse ps's time in a profile (BENCHMARKS.md).
            return Ok(());
        }
        let mut seen: HashSet<i64, RowHasher> = HashSet::with_capacity_and_hasher(ids.size_hint().0, RowHasher::default());
        for &id in ids {
            if !seen.insert(id) {
                return Err(RowError::Duplicate { name: self.name.clone(), id });
            }
        }
        Ok(())
    }

    /// Is `id` in the table and in this partition?
    fn check_id(&self, id: i64) -> Result<(), RowError> {
        let p = &self.part;
        if id < 0 || id as u64 >= p.rows {
            return Err(RowError::OutOfTable { name: self.name.clone(), id, rows: p.rows });
        }
        let owner = p.strategy.partition_of(p.rows, p.num_partitions, id as u64);
        if owner != p.partition {
            return Err(RowError::WrongPartition { name: self.name.clone(), id, owner, partition: p.partition, strategy: p.strategy });
        }
        Ok(())
    }

    /// Row `id`'s current value (its initial one when never updated) into
    /// `out` (`dim` values). The id must have been checked.
    pub fn row_into(&self, id: i64, out: &mut [f32]) {
        let dim = self.dim();
        match self.index.get(&id) {
            Some(&k) => out.copy_from_slice(&self.values[k * dim..(k + 1) * dim]),
            None => self.part.init.fill(id, out),
        }
    }

    /// The rows `ids` (checked), row after row.
    pub fn gather(&self, ids: &[i64], out: &mut Vec<f32>) {
        let dim = self.dim();
        let start = out.len();
        out.resize(start + ids.len() * dim, 0.0);
        for (k, &id) in ids.iter().enumerate() {
            let at = start + k * dim;
            self.row_into(id, &mut out[at..at + dim]);
        }
    }

    /// The row of `id`, created from its initial value (and fresh slots)
    /// when it is not there yet.
    fn materialise(&mut self, id: i64, fresh_slots: &[f32]) -> usize {
        if let Some(&k) = self.index.get(&id) {
            return k;
        }
        let dim = self.dim();
        let k = self.ids.len();
        self.ids.push(id);
        self.values.resize((k + 1) * dim, 0.0);
        self.part.init.fill(id, &mut self.values[k * dim..]);
        for (slot, &v) in [&mut self.slots.first, &mut self.slots.second].into_iter().zip(fresh_slots) {
            slot.resize((k + 1) * dim, v);
        }
        self.index.insert(id, k);
        k
    }

    /// Makes the slots those of `optimizer` (fresh ones when they are of
    /// another optimizer, or none were kept).
    pub fn use_optimizer(&mut self, optimizer: &Optimizer) {
        let fresh = optimizer.fresh_slot_values();
        let n = self.values.len();
        let want = |k: usize| if k < fresh.len() { n } else { 0 };
        if self.slots.first.len() != want(0) || self.slots.second.len() != want(1) {
            let updates = self.slots.updates;
            self.slots =
                Slots { first: vec![fresh.first().copied().unwrap_or(0.0); want(0)], second: vec![fresh.get(1).copied().unwrap_or(0.0); want(1)], updates };
        }
    }

    /// One update of the rows `ids` (checked) with gradients `grads` (`ids.len()
    /// * dim` values as little-endian bytes or f32): materialises the rows
    /// it touches and applies `optimizer` to each, with row-wise slots.
    pub fn apply(&mut self, optimizer: &Optimizer, ids: &[i64], grads: &[f32]) {
        self.use_optimizer(optimizer);
        let fresh = optimizer.fresh_slot_values();
        let dim = self.dim();
        self.slots.updates += 1;
        let t = self.slots.updates;
        for (k, &id) in ids.iter().enumerate() {
            let row = self.materialise(id, &fresh);
            optimizer.apply(&mut self.values, &mut self.slots, row * dim..(row + 1) * dim, &grads[k * dim..(k + 1) * dim], t);
        }
    }

    /// The materialised rows for a checkpoint: ids, values and slots (each
    /// `ids.len() * dim`, empty when the optimizer has no such slot), and the
    /// update count.
    pub fn saved(&self) -> (&[i64], &[f32], [&[f32]; 2], u64) {
        (&self.ids, &self.values, [&self.slots.first, &self.slots.second], self.slots.updates)
    }

    /// Puts back rows saved by [`saved`](Self::saved).
    pub fn restore(&mut self, ids: Vec<i64>, values: Vec<f32>, slots: [Vec<f32>; 2], updates: u64) -> Result<(), String> {
        let dim = self.dim();
        if values.len() != ids.len() * dim {
            return Err(format!("{}: {} ids but {} values of dim {dim}", self.name, ids.len(), values.len()));
        }
        for (k, s) in slots.iter().enumerate() {
            if !s.is_empty() && s.len() != values.len() {
                return Err(format!("{}: slot {k} has {} values for {} rows of dim {dim}", self.name, s.len(), ids.len()));
            }
        }
        // check_ids's checks, the duplicates found while the index is built (one pass of
        // hashing, not two: a moved partition has millions of rows).
        let mut index: HashMap<i64, usize, RowHasher> = HashMap::with_capacity_and_hasher(ids.len(), RowHasher::default());
        for (k, &id) in ids.iter().enumerate() {
            self.check_id(id).map_err(|e| e.to_string())?;
            if index.insert(id, k).is_some() {
                return Err(RowError::Duplicate { name: self.name.clone(), id }.to_string());
            }
        }
        self.index = index;
        self.ids = ids;
        self.values = values;
        let [first, second] = slots;
        self.slots = Slots { first, second, updates };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(strategy: PartitionStrategy, rows: u64, parts: u64, k: u64) -> EmbeddingPart {
        EmbeddingPart {
            variable: "emb".into(),
            rows,
            dim: 2,
            strategy,
            partition: k,
            num_partitions: parts,
            init: RowInit::new("emb", Init::Uniform { limit: 0.5 }, 7),
        }
    }

    /// Rows exist once updated; pulls of others answer their initial value;
    /// bad ids are named.
    #[test]
    fn rows_materialise_at_their_first_update() {
        let mut t = RowTable::new("emb/part_1", part(PartitionStrategy::Mod, 10, 2, 1));
        let opt = Optimizer::sgd(0.5);
        let mut before = Vec::new();
        t.gather(&[3, 7], &mut before);
        assert!(t.is_empty(), "a pull materialises nothing");
        t.apply(&opt, &[7], &[2.0, -2.0]);
        assert_eq!(t.len(), 1);
        let mut after = Vec::new();
        t.gather(&[3, 7], &mut after);
        assert_eq!(&after[..2], &before[..2], "row 3 untouched");
        assert_eq!(&after[2..], &[before[2] - 1.0, before[3] + 1.0], "row 7: sgd from its initial value");
        let cases: Vec<(Vec<i64>, RowError)> = vec![
            (vec![10], RowError::OutOfTable { name: "emb/part_1".into(), id: 10, rows: 10 }),
            (vec![-1], RowError::OutOfTable { name: "emb/part_1".into(), id: -1, rows: 10 }),
            (vec![4], RowError::WrongPartition { name: "emb/part_1".into(), id: 4, owner: 0, partition: 1, strategy: PartitionStrategy::Mod }),
            (vec![1, 3, 1], RowError::Duplicate { name: "emb/part_1".into(), id: 1 }),
            (vec![3, 3], RowError::Duplicate { name: "emb/part_1".into(), id: 3 }),
            (vec![9, 3, 5, 3], RowError::Duplicate { name: "emb/part_1".into(), id: 3 }),
            // Every id is checked against the table before any duplicate is looked for.
            (vec![1, 1, 4], RowError::WrongPartition { name: "emb/part_1".into(), id: 4, owner: 0, partition: 1, strategy: PartitionStrategy::Mod }),
        ];
        for (ids, want) in cases {
            assert_eq!(t.check_ids(&ids), Err(want.clone()), "{ids:?}");
            assert!(want.to_string().contains("emb/part_1"));
        }
        for ids in [&[1, 3, 9][..], &[9, 3, 1], &[5], &[]] {
            assert!(t.check_ids(ids).is_ok(), "{ids:?}");
        }
    }

    /// Row-wise optimizer state: a row's slots start fresh when it is
    /// materialised and move only with its own gradients; the update equals
    /// the dense optimizer's on that row.
    #[test]
    fn row_wise_optimizer_state_matches_the_dense_update() {
        for name in ["sgd", "adagrad", "ftrl", "momentum", "adam"] {
            let opt = Optimizer::from_name(name, 0.1, 0.9).unwrap();
            let mut t = RowTable::new("emb/part_0", part(PartitionStrategy::Div, 4, 1, 0));
            // The dense twin: the whole table, every row from its initial value.
            let mut dense = Vec::new();
            t.gather(&[0, 1, 2, 3], &mut dense);
            let mut dense_slots = opt.new_slots(8);
            let steps: [(Vec<i64>, Vec<f32>); 3] = [(vec![2], vec![1.0, -1.0]), (vec![0, 2], vec![0.5, 0.5, 2.0, 0.0]), (vec![2], vec![-1.0, 3.0])];
            for (ids, g) in &steps {
                t.apply(&opt, ids, g);
                // Dense: the rows of this step only (what a sparse update is).
                dense_slots.updates += 1;
                for (k, &id) in ids.iter().enumerate() {
                    let r = id as usize * 2..id as usize * 2 + 2;
                    let t = dense_slots.updates;
                    opt.apply(&mut dense, &mut dense_slots, r, &g[k * 2..k * 2 + 2], t);
                }
            }
            let mut got = Vec::new();
            t.gather(&[0, 1, 2, 3], &mut got);
            assert_eq!(got, dense, "{name}");
            assert_eq!(t.len(), 2, "{name}: rows 0 and 2 only");
            // Saved and restored: the same rows and slots.
            let (ids, values, [s0, s1], updates) = t.saved();
            let mut back = RowTable::new("emb/part_0", t.part.clone());
            back.restore(ids.to_vec(), values.to_vec(), [s0.to_vec(), s1.to_vec()], updates).unwrap();
            assert_eq!(back, t, "{name}");
        }
    }

    #[test]
    fn partition_specs_are_checked() {
        let good = part(PartitionStrategy::Mod, 10, 3, 1);
        let shape = [3i64, 2];
        assert_eq!(EmbeddingPart::from_proto("emb/part_1", &shape, &good.to_proto()).unwrap(), good);
        let bad = |f: &dyn Fn(&mut proto::EmbeddingSpec)| {
            let mut p = good.to_proto();
            f(&mut p);
            EmbeddingPart::from_proto("emb/part_1", &shape, &p).unwrap_err()
        };
        assert!(bad(&|p| p.partition = 3).contains("partition: 3 is not in 0..3"));
        assert!(bad(&|p| p.dim = 0).contains("is not a table"));
        assert!(bad(&|p| p.num_partitions = 11).contains("is not a table"));
        assert!(bad(&|p| p.partition_strategy = 9).contains("unknown strategy 9"));
        assert!(bad(&|p| p.rows = 12).contains("shape [3, 2], but partition 1 of 12 rows holds [4, 2]"));
        assert!(bad(&|p| p.initializer = None).contains("initializer: missing"));
        assert!(split_rows("e", 2, 3, &[0u8; 39]).unwrap_err().to_string().contains("2 ids need 40 bytes"));
        let mut content = crate::le::i64_bytes(&[4, -2]);
        content.extend_from_slice(&[0u8; 8]);
        let (ids, values) = split_rows("e", 2, 1, &content).unwrap();
        assert_eq!((ids, values.len()), (vec![4, -2], 8));
    }
}
