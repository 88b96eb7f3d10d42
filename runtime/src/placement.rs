//! Placement of variables on ps tasks (TensorFlow's `replica_device_setter`,
//! with a byte-balancing strategy and a partitioner for large variables).
//!
//! Pure and deterministic: the answer depends only on the set of variables
//! (sorted by size and name), never on the order they were created in, so
//! every task computes the same placement.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::hash::Fnv1a;
use crate::proto;

/// How the rows of an embedding are cut over its partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum PartitionStrategy {
    /// Row `id` lives in partition `id % parts` (TensorFlow's default).
    #[default]
    Mod,
    /// Contiguous runs: the first `rows % parts` partitions hold one row
    /// more than the others.
    Div,
    /// Jump consistent hashing ([`crate::hash::row_owner`]): a ps added
    /// to a running job takes about 1/(N+1) of the rows, a ps removed gives
    /// up only its own (`mod` and `div` move most rows).
    Consistent,
}

impl PartitionStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            PartitionStrategy::Mod => "mod",
            PartitionStrategy::Div => "div",
            PartitionStrategy::Consistent => "consistent",
        }
    }

    pub fn to_proto(self) -> proto::PartitionStrategy {
        match self {
            PartitionStrategy::Mod => proto::PartitionStrategy::PartitionMod,
            PartitionStrategy::Div => proto::PartitionStrategy::PartitionDiv,
            PartitionStrategy::Consistent => proto::PartitionStrategy::PartitionConsistent,
        }
    }

    pub fn from_proto(v: i32) -> Option<Self> {
        match proto::PartitionStrategy::try_from(v).ok()? {
            proto::PartitionStrategy::PartitionMod => Some(PartitionStrategy::Mod),
            proto::PartitionStrategy::PartitionDiv => Some(PartitionStrategy::Div),
            proto::PartitionStrategy::PartitionConsistent => Some(PartitionStrategy::Consistent),
            proto::PartitionStrategy::PartitionUnspecified => None,
        }
    }

    /// The partition of row `id` of a table of `rows` rows cut into `parts`.
    pub fn partition_of(self, rows: u64, parts: u64, id: u64) -> u64 {
        match self {
            PartitionStrategy::Mod => id % parts,
            PartitionStrategy::Div => {
                let (base, extra) = (rows / parts, rows % parts);
                let big = extra * (base + 1);
                if id < big { id / (base + 1) } else { extra + (id - big) / base.max(1) }
            }
            PartitionStrategy::Consistent => crate::hash::row_owner(id, parts as usize) as u64,
        }
    }

    /// Rows held by partition `k`: exact for `mod` and `div`; for
    /// `consistent` the even share (`rows / parts`, the first `rows % parts`
    /// one more), which the hash holds to within a fraction of a percent on
    /// large tables. It is the nominal first dimension of the stored piece
    /// (rows are materialised when first updated, so nothing is allocated
    /// by it); counting the hash's exact share would cost a pass over every
    /// row of a 2^24-row table at every placement.
    pub fn partition_rows(self, rows: u64, parts: u64, k: u64) -> u64 {
        rows / parts + u64::from(k < rows % parts)
    }
}

impl fmt::Display for PartitionStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PartitionStrategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "mod" => Ok(PartitionStrategy::Mod),
            "div" => Ok(PartitionStrategy::Div),
            "consistent" => Ok(PartitionStrategy::Consistent),
            _ => Err(format!("unknown partition strategy {s:?} (consistent, mod, div)")),
        }
    }
}

/// A variable to place: name and shape (f32 elements).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementInput {
    pub name: String,
    pub shape: Vec<usize>,
    /// A sparse embedding (`shape` `[rows, dim]`): cut by row over every ps
    /// task with this strategy, one partition per ps.
    pub embedding: Option<PartitionStrategy>,
}

impl PlacementInput {
    pub fn dense(name: impl Into<String>, shape: Vec<usize>) -> Self {
        PlacementInput { name: name.into(), shape, embedding: None }
    }
}

/// Which rows of an embedding a shard holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowPartition {
    pub strategy: PartitionStrategy,
    /// This partition, of `count`.
    pub index: u64,
    pub count: u64,
    /// Rows of the whole embedding.
    pub rows: u64,
}

/// One stored piece of a variable: the rows `rows` (along the first axis) of
/// variable `variable`, stored on ps task `ps` under the name `stored_name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub variable: String,
    pub stored_name: String,
    pub ps: usize,
    pub rows: std::ops::Range<usize>,
    /// Shape of the stored piece.
    pub shape: Vec<usize>,
    /// A partition of a sparse embedding: its rows are those `strategy`
    /// gives it (not `rows`), and only the ones updated are stored.
    pub partition: Option<RowPartition>,
}

impl Shard {
    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn bytes(&self) -> usize {
        self.num_elements() * 4
    }
}

/// Where every variable lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub num_ps: usize,
    /// Per variable (by name), its shards in row order.
    pub variables: BTreeMap<String, Vec<Shard>>,
}

/// Default size above which a variable is partitioned over several ps
/// tasks: 16 MiB.
pub const DEFAULT_PARTITION_THRESHOLD_BYTES: usize = 16 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlacementError {
    #[error("placement needs at least one ps task")]
    NoPs,
    #[error("variable {0:?} is declared twice")]
    DuplicateVariable(String),
    #[error("variable name {0:?} is reserved for partitions (names ending in /part_N)")]
    ReservedName(String),
}

/// Places variables over `num_ps` tasks. A sparse embedding is cut by row
/// into `min(num_ps, rows)` partitions `<name>/part_<k>` on ps `k` (its
/// rows are spread evenly, whatever their number, so it does not enter the
/// balance). A variable larger than
/// `partition_threshold_bytes` (and with at least two rows) is cut along its
/// first axis into `min(num_ps, ceil(bytes / threshold), rows)` parts of
/// nearly equal rows, stored as `<name>/part_<k>` on distinct ps tasks. Then
/// every piece, largest first (ties by name), goes to the ps holding the
/// fewest bytes so far (ties: lowest index).
pub fn place(inputs: &[PlacementInput], num_ps: usize, partition_threshold_bytes: usize) -> Result<Placement, PlacementError> {
    if num_ps == 0 {
        return Err(PlacementError::NoPs);
    }
    let sorted = checked_by_name(inputs)?;
    // Cut into pieces (ps not chosen yet).
    let mut pieces: Vec<Shard> = Vec::new();
    let mut partitions: Vec<Shard> = Vec::new();
    for v in &sorted {
        match v.embedding {
            Some(strategy) => embedding_partitions(v, strategy, num_ps, &mut partitions),
            None => dense_pieces(v, num_ps, partition_threshold_bytes, &mut pieces),
        }
    }
    balance(&mut pieces, num_ps);
    let mut variables: BTreeMap<String, Vec<Shard>> = BTreeMap::new();
    for p in pieces.into_iter().chain(partitions) {
        variables.entry(p.variable.clone()).or_default().push(p);
    }
    Ok(Placement { num_ps, variables })
}

/// The inputs sorted by name, each name once and none a partition's.
fn checked_by_name(inputs: &[PlacementInput]) -> Result<Vec<&PlacementInput>, PlacementError> {
    let mut sorted: Vec<&PlacementInput> = inputs.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for w in sorted.windows(2) {
        if w[0].name == w[1].name {
            return Err(PlacementError::DuplicateVariable(w[0].name.clone()));
        }
    }
    if let Some(v) = sorted.iter().find(|v| is_partition_name(&v.name)) {
        return Err(PlacementError::ReservedName(v.name.clone()));
    }
    Ok(sorted)
}

/// A sparse embedding's partitions, added to `out`: `min(num_ps, rows)` of
/// them, partition `k` on ps `k`.
fn embedding_partitions(v: &PlacementInput, strategy: PartitionStrategy, num_ps: usize, out: &mut Vec<Shard>) {
    let rows = v.shape.first().copied().unwrap_or(0) as u64;
    let count = (num_ps as u64).min(rows).max(1);
    for k in 0..count {
        let n = strategy.partition_rows(rows, count, k) as usize;
        out.push(Shard {
            variable: v.name.clone(),
            stored_name: format!("{}/part_{k}", v.name),
            ps: k as usize,
            rows: 0..n,
            shape: vec![n, v.shape.get(1).copied().unwrap_or(1)],
            partition: Some(RowPartition { strategy, index: k, count, rows }),
        });
    }
}

/// A dense variable whole, or cut along its first axis into parts of nearly
/// equal rows when it is larger than the threshold (ps not chosen yet),
/// added to `out`.
fn dense_pieces(v: &PlacementInput, num_ps: usize, partition_threshold_bytes: usize, out: &mut Vec<Shard>) {
    let elements: usize = v.shape.iter().product();
    let bytes = elements * 4;
    let rows = v.shape.first().copied().unwrap_or(1);
    let threshold = partition_threshold_bytes.max(1);
    let parts = if num_ps > 1 && bytes > threshold && !v.shape.is_empty() && rows >= 2 { bytes.div_ceil(threshold).min(num_ps).min(rows) } else { 1 };
    if parts == 1 {
        out.push(Shard { variable: v.name.clone(), stored_name: v.name.clone(), ps: 0, rows: 0..rows, shape: v.shape.clone(), partition: None });
        return;
    }
    let (base, extra) = (rows / parts, rows % parts);
    let mut start = 0;
    for k in 0..parts {
        let n = base + usize::from(k < extra);
        let mut shape = v.shape.clone();
        shape[0] = n;
        out.push(Shard { variable: v.name.clone(), stored_name: format!("{}/part_{k}", v.name), ps: 0, rows: start..start + n, shape, partition: None });
        start += n;
    }
}

/// Gives every piece, largest first (ties by stored name: independent of
/// input order), the ps holding the fewest bytes so far (ties: lowest
/// index) among those holding no other piece of its variable.
fn balance(pieces: &mut [Shard], num_ps: usize) {
    let mut order: Vec<usize> = (0..pieces.len()).collect();
    order.sort_by(|&a, &b| pieces[b].bytes().cmp(&pieces[a].bytes()).then_with(|| pieces[a].stored_name.cmp(&pieces[b].stored_name)));
    let mut load = vec![0usize; num_ps];
    let mut used_by: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for i in order {
        let taken = used_by.entry(pieces[i].variable.clone()).or_default();
        let ps = (0..num_ps).filter(|p| !taken.contains(p)).min_by_key(|&p| (load[p], p)).expect("a variable has at most num_ps parts");
        taken.push(ps);
        load[ps] += pieces[i].bytes();
        pieces[i].ps = ps;
    }
}

fn is_partition_name(name: &str) -> bool {
    name.rsplit_once("/part_").is_some_and(|(_, k)| !k.is_empty() && k.chars().all(|c| c.is_ascii_digit()))
}

impl Placement {
    /// The shards stored on one ps, ordered by stored name.
    pub fn shards_on(&self, ps: usize) -> Vec<&Shard> {
        let mut v: Vec<&Shard> = self.variables.values().flatten().filter(|s| s.ps == ps).collect();
        v.sort_by(|a, b| a.stored_name.cmp(&b.stored_name));
        v
    }
    /// Bytes stored on each ps.
    pub fn bytes_per_ps(&self) -> Vec<usize> {
        let mut load = vec![0; self.num_ps];
        // An embedding partition holds the rows updated so far: not known here.
        for s in self.variables.values().flatten().filter(|s| s.partition.is_none()) {
            load[s.ps] += s.bytes();
        }
        load
    }
    /// A stable 64-bit fingerprint (FNV-1a) of the whole placement: two
    /// tasks with different views of the variables get different values.
    pub fn fingerprint(&self) -> u64 {
        let mut h = Fnv1a::default();
        h.write(&(self.num_ps as u64).to_le_bytes());
        for shards in self.variables.values() {
            for s in shards {
                h.write(s.stored_name.as_bytes());
                h.write(&[0]);
                h.write(&(s.ps as u64).to_le_bytes());
                for d in &s.shape {
                    h.write(&(*d as u64).to_le_bytes());
                }
                if let Some(p) = &s.partition {
                    h.write(p.strategy.as_str().as_bytes());
                    for x in [p.index, p.count, p.rows] {
                        h.write(&x.to_le_bytes());
                    }
                }
                h.write(&[0xff]);
            }
        }
        h.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Changing the partition count by one under each strategy: the share of
    /// a table's rows that change partition (consistent: about 1/(N+1), all
    /// to or from the last partition; mod and div: most rows).
    #[test]
    fn rows_moved_by_one_partition_more_or_less() {
        use PartitionStrategy::{Consistent, Div, Mod};
        let rows = 200_000u64;
        // (strategy, from, to, lowest share moved, highest)
        let cases = [
            (Consistent, 1, 2, 0.49, 0.51),
            (Consistent, 2, 3, 0.32, 0.35),
            (Consistent, 3, 2, 0.32, 0.35),
            (Consistent, 4, 5, 0.19, 0.21),
            (Consistent, 8, 7, 0.115, 0.135),
            (Mod, 2, 3, 0.6, 0.7),
            (Mod, 4, 5, 0.75, 0.85),
            (Div, 2, 3, 0.45, 0.55),
            (Div, 4, 5, 0.45, 0.55),
        ];
        for (s, from, to, low, high) in cases {
            let mut moved = 0u64;
            for id in 0..rows {
                let (a, b) = (s.partition_of(rows, from, id), s.partition_of(rows, to, id));
                if a != b {
                    moved += 1;
                    if s == Consistent {
                        assert_eq!(a.max(b), from.max(to) - 1, "{s} {from}->{to}: row {id} moved between old partitions");
                    }
                }
            }
            let share = moved as f64 / rows as f64;
            assert!((low..=high).contains(&share), "{s} {from}->{to}: {share:.3} of the rows moved, want {low}..{high}");
        }
        // Its partitions hold about the even share partition_rows names.
        let mut held = [0u64; 3];
        for id in 0..rows {
            held[Consistent.partition_of(rows, 3, id) as usize] += 1;
        }
        for (k, n) in held.iter().enumerate() {
            let nominal = Consistent.partition_rows(rows, 3, k as u64) as f64;
            assert!((*n as f64 - nominal).abs() / nominal < 0.02, "partition {k}: {n} rows, nominal {nominal}");
        }
        assert_eq!("consistent".parse::<PartitionStrategy>(), Ok(Consistent));
        assert_eq!(PartitionStrategy::from_proto(Consistent.to_proto() as i32), Some(Consistent));
    }

    /// TensorFlow's partition strategies: which partition holds each row,
    /// and how many rows each holds.
    #[test]
    fn partition_strategies() {
        use PartitionStrategy::{Div, Mod};
        // (strategy, rows, parts, owner of rows 0.., rows per partition)
        type Case = (PartitionStrategy, u64, u64, Vec<u64>, Vec<u64>);
        let cases: Vec<Case> = vec![
            (Mod, 7, 3, vec![0, 1, 2, 0, 1, 2, 0], vec![3, 2, 2]),
            (Div, 7, 3, vec![0, 0, 0, 1, 1, 2, 2], vec![3, 2, 2]),
            (Div, 6, 3, vec![0, 0, 1, 1, 2, 2], vec![2, 2, 2]),
            (Mod, 5, 1, vec![0; 5], vec![5]),
            (Div, 5, 1, vec![0; 5], vec![5]),
            (Div, 2, 2, vec![0, 1], vec![1, 1]),
        ];
        for (s, rows, parts, owners, sizes) in cases {
            let got: Vec<u64> = (0..rows).map(|id| s.partition_of(rows, parts, id)).collect();
            assert_eq!(got, owners, "{s} {rows}/{parts}");
            let got: Vec<u64> = (0..parts).map(|k| s.partition_rows(rows, parts, k)).collect();
            assert_eq!(got, sizes, "{s} {rows}/{parts}");
            for k in 0..parts {
                assert_eq!(owners.iter().filter(|&&o| o == k).count() as u64, sizes[k as usize]);
            }
        }
        assert_eq!("DIV".parse::<PartitionStrategy>(), Ok(Div));
        assert!("range".parse::<PartitionStrategy>().unwrap_err().contains("mod, div"));
    }

    fn var(name: &str, shape: &[usize]) -> PlacementInput {
        PlacementInput::dense(name, shape.to_vec())
    }

    fn mlp() -> Vec<PlacementInput> {
        vec![var("hid_w", &[784, 100]), var("hid_b", &[100]), var("sm_w", &[100, 10]), var("sm_b", &[10])]
    }

    /// Every element of every variable is stored exactly once.
    fn assert_covers(p: &Placement, inputs: &[PlacementInput]) {
        assert_eq!(p.variables.len(), inputs.len());
        for v in inputs {
            let shards = &p.variables[&v.name];
            let rows = v.shape.first().copied().unwrap_or(1);
            let mut next = 0;
            for s in shards {
                assert_eq!(s.rows.start, next, "{}: rows are contiguous", v.name);
                assert_eq!(s.shape[1..], v.shape.get(1..).unwrap_or(&[])[..]);
                next = s.rows.end;
                assert!(s.ps < p.num_ps);
            }
            assert_eq!(next, rows, "{}: all rows placed", v.name);
            let total: usize = shards.iter().map(Shard::num_elements).sum();
            assert_eq!(total, v.shape.iter().product::<usize>());
        }
    }

    #[test]
    fn independent_of_creation_order() {
        let a = mlp();
        let mut b = mlp();
        b.reverse();
        b.swap(0, 2);
        for num_ps in 1..5 {
            let pa = place(&a, num_ps, 64 << 10).unwrap();
            let pb = place(&b, num_ps, 64 << 10).unwrap();
            assert_eq!(pa, pb);
            assert_eq!(pa.fingerprint(), pb.fingerprint());
            assert_covers(&pa, &a);
        }
    }

    #[test]
    fn mlp_spreads_over_two_ps() {
        let p = place(&mlp(), 2, DEFAULT_PARTITION_THRESHOLD_BYTES).unwrap();
        assert_eq!(p.variables["hid_w"][0].ps, 0);
        for v in ["hid_b", "sm_w", "sm_b"] {
            assert_eq!(p.variables[v][0].ps, 1, "{v}");
        }
        assert!(!p.shards_on(0).is_empty() && !p.shards_on(1).is_empty());
    }

    #[test]
    fn balances_bytes() {
        // 40 variables of varied sizes over 4 ps: greedy largest-first keeps
        // the heaviest ps within one largest variable of the lightest.
        let inputs: Vec<_> = (0..40).map(|i| var(&format!("v{i:02}"), &[1 + (i * 37) % 101, 8])).collect();
        let p = place(&inputs, 4, usize::MAX).unwrap();
        let load = p.bytes_per_ps();
        let largest = inputs.iter().map(|v| v.shape.iter().product::<usize>() * 4).max().unwrap();
        assert!(load.iter().max().unwrap() - load.iter().min().unwrap() <= largest, "{load:?}");
        assert_covers(&p, &inputs);
    }

    #[test]
    fn partitions_large_variables_along_first_axis() {
        let cases = [
            // (rows, cols, num_ps, threshold, expected parts)
            (1000, 250, 4, 250_000, 4), // 1 MB / 250 kB = 4 parts
            (1000, 250, 4, 400_000, 3), // ceil(1e6/4e5) = 3
            (1000, 250, 2, 100_000, 2), // capped by num_ps
            (3, 100_000, 8, 1000, 3),   // capped by rows
            (1000, 250, 1, 1, 1),       // one ps: never partitioned
            (1, 1_000_000, 4, 1000, 1), // one row: cannot be cut
            (10, 10, 4, 1 << 20, 1),    // under the threshold
        ];
        for (rows, cols, num_ps, threshold, parts) in cases {
            let inputs = vec![var("emb", &[rows, cols]), var("b", &[cols])];
            let p = place(&inputs, num_ps, threshold).unwrap();
            let shards = &p.variables["emb"];
            assert_eq!(shards.len(), parts, "{rows}x{cols} over {num_ps} ps, threshold {threshold}");
            let mut ps: Vec<_> = shards.iter().map(|s| s.ps).collect();
            ps.sort();
            ps.dedup();
            assert_eq!(ps.len(), parts, "parts of one variable go to distinct ps");
            if parts > 1 {
                assert_eq!(shards[0].stored_name, "emb/part_0");
                let sizes: Vec<_> = shards.iter().map(|s| s.rows.len()).collect();
                assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "{sizes:?}");
            }
            assert_covers(&p, &inputs);
        }
    }

    #[test]
    fn fingerprint_sees_differences() {
        let base = place(&mlp(), 2, DEFAULT_PARTITION_THRESHOLD_BYTES).unwrap().fingerprint();
        let mut other = mlp();
        other[3].shape = vec![11];
        assert_ne!(base, place(&other, 2, DEFAULT_PARTITION_THRESHOLD_BYTES).unwrap().fingerprint());
        assert_ne!(base, place(&mlp(), 3, DEFAULT_PARTITION_THRESHOLD_BYTES).unwrap().fingerprint());
    }

    #[test]
    fn bad_inputs() {
        assert_eq!(place(&mlp(), 0, 1), Err(PlacementError::NoPs));
        let dup = vec![var("a", &[1]), var("a", &[2])];
        assert_eq!(place(&dup, 1, 1), Err(PlacementError::DuplicateVariable("a".into())));
        let reserved = vec![var("a/part_0", &[1])];
        assert!(matches!(place(&reserved, 1, 1), Err(PlacementError::ReservedName(_))));
    }

    #[test]
    fn ten_thousand_variables() {
        let inputs: Vec<_> = (0..10_000).map(|i| var(&format!("layer{i}/w"), &[1 + i % 97, 16])).collect();
        let p = place(&inputs, 7, DEFAULT_PARTITION_THRESHOLD_BYTES).unwrap();
        assert_covers(&p, &inputs);
        let load = p.bytes_per_ps();
        let (max, min) = (*load.iter().max().unwrap() as f64, *load.iter().min().unwrap() as f64);
        assert!(max / min < 1.01, "{load:?}");
    }

    /// A sparse embedding: one partition per ps (fewer when it has fewer
    /// rows), on ps k, outside the balance of the dense variables.
    #[test]
    fn embeddings_are_partitioned_by_row_over_every_ps() {
        let emb = |name: &str, rows: usize, s| PlacementInput { name: name.into(), shape: vec![rows, 8], embedding: Some(s) };
        let inputs = vec![emb("emb", 1 << 24, PartitionStrategy::Mod), emb("tiny", 2, PartitionStrategy::Div), var("w", &[100]), var("b", &[1])];
        let p = place(&inputs, 3, DEFAULT_PARTITION_THRESHOLD_BYTES).unwrap();
        let e = &p.variables["emb"];
        assert_eq!(e.iter().map(|s| (s.stored_name.as_str(), s.ps)).collect::<Vec<_>>(), [("emb/part_0", 0), ("emb/part_1", 1), ("emb/part_2", 2)]);
        assert_eq!(e[0].shape, vec![5_592_406, 8]);
        assert_eq!(e[2].partition, Some(RowPartition { strategy: PartitionStrategy::Mod, index: 2, count: 3, rows: 1 << 24 }));
        let t = &p.variables["tiny"];
        assert_eq!(t.len(), 2, "no more partitions than rows");
        assert_eq!(t.iter().map(|s| s.shape[0]).sum::<usize>(), 2);
        // The dense variables are balanced as if the embeddings were not there.
        assert_eq!(p.bytes_per_ps(), vec![400, 4, 0]);
        // The strategy is part of the fingerprint.
        let other = vec![emb("emb", 1 << 24, PartitionStrategy::Div), emb("tiny", 2, PartitionStrategy::Div), var("w", &[100]), var("b", &[1])];
        assert_ne!(place(&other, 3, DEFAULT_PARTITION_THRESHOLD_BYTES).unwrap().fingerprint(), p.fingerprint());
    }
}
