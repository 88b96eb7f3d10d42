//! The sync accumulator: SyncReplicasOptimizer's aggregation rules as plain
//! data, one per ps task.
//!
//! - Gradients are tagged with the step they were computed at. Gradients
//!   older than the current step are dropped and counted (not an error);
//!   gradients from a future step are refused.
//! - A worker counts at most once per variable per step, so a retried push
//!   never counts twice.
//! - The step is ready once every variable has gradients from at least
//!   `replicas_to_aggregate` workers (and that many workers pushed at all,
//!   which matters for a ps that holds no variable). With more workers than
//!   that, the extra ones are backup workers: whatever they send after the
//!   step advanced is stale.
//! - A task with nothing to train at a step (it waits for a shard of the
//!   data) abstains: it counts towards `replicas_to_aggregate` without a
//!   gradient and adds nothing to the average, so the step waits neither for
//!   it nor for a gradient it will never send. A step still needs at least
//!   one gradient, and `replicas_to_aggregate` minus the abstentions of every
//!   variable: abstentions can only stand in for tasks with nothing to do.
//! - When ready, the average of the gradients received for each variable is
//!   applied (by the caller) and the step advances.
//! - An embedding partition's gradients are row-sparse: they are summed per
//!   row, and each row's sum is divided by the number of gradients that held
//!   that row (TensorFlow's `SparseConditionalAccumulator`), not by the
//!   number of workers: a row that one worker of three touched moves by that
//!   worker's gradient. A worker counts for the partition even when its
//!   gradient holds no row of it.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

use crate::tensor::add_f32_from_le;

/// What a variable's gradients are summed into.
#[derive(Debug, Clone, PartialEq)]
pub enum VarKind {
    /// A dense variable of this many elements.
    Dense(usize),
    /// An embedding partition with rows of this width.
    Rows(usize),
}

/// The sums of one step's row-sparse gradients, per row.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RowSums {
    dim: usize,
    /// Position of each id in `ids`.
    index: HashMap<i64, usize>,
    ids: Vec<i64>,
    sums: Vec<f32>,
    counts: Vec<u32>,
}

impl RowSums {
    pub fn new(dim: usize) -> Self {
        RowSums { dim, ..Default::default() }
    }

    /// Adds rows `ids` with their values (little-endian f32, `ids.len() *
    /// dim` of them). The caller checked the ids (each once) and the length.
    pub fn add(&mut self, ids: &[i64], values: &[u8]) {
        let row_bytes = self.dim * 4;
        for (k, &id) in ids.iter().enumerate() {
            let pos = *self.index.entry(id).or_insert_with(|| {
                self.ids.push(id);
                self.sums.resize(self.sums.len() + self.dim, 0.0);
                self.counts.push(0);
                self.ids.len() - 1
            });
            add_f32_from_le(&mut self.sums[pos * self.dim..(pos + 1) * self.dim], &values[k * row_bytes..(k + 1) * row_bytes]);
            self.counts[pos] += 1;
        }
    }

    /// Turns each row's sum into its average over the gradients that held
    /// it and returns (ids, values), rows in the order they first came.
    pub fn average(&mut self) -> (&[i64], &[f32]) {
        let dim = self.dim;
        for (row, &n) in self.sums.chunks_mut(dim.max(1)).zip(&self.counts) {
            let scale = 1.0 / n as f32;
            row.iter_mut().for_each(|x| *x *= scale);
        }
        (&self.ids, &self.sums)
    }

    fn clear(&mut self) {
        self.index.clear();
        self.ids.clear();
        self.sums.clear();
        self.counts.clear();
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Sums {
    Dense(Vec<f32>),
    Rows(RowSums),
}

/// A variable's averaged gradient at the end of a step.
#[derive(Debug)]
pub enum Averaged<'a> {
    Dense(&'a [f32]),
    /// Ids and their rows' values (`ids.len() * dim`).
    Rows(&'a [i64], &'a [f32]),
}

/// Where a push's step stands relative to the accumulator's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepCheck {
    Current,
    /// Older than the current step: drop and count.
    Stale,
    /// Newer than the current step: refuse.
    Future,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SyncAccumulator {
    step: i64,
    required: usize,
    sums: Vec<Sums>,
    contributors: Vec<BTreeSet<String>>,
    round: BTreeSet<String>,
    /// Tasks of `round` that abstained (no gradient at this step).
    abstained: BTreeSet<String>,
    pub stale_dropped: u64,
    pub duplicates_dropped: u64,
}

impl SyncAccumulator {
    /// An accumulator for variables of the given sizes (in elements),
    /// starting at `step`, averaging `required` gradients per step.
    pub fn new(sizes: &[usize], required: usize, step: i64) -> Self {
        let kinds: Vec<VarKind> = sizes.iter().map(|&n| VarKind::Dense(n)).collect();
        Self::with_kinds(&kinds, required, step)
    }

    /// An accumulator for dense variables and embedding partitions.
    pub fn with_kinds(kinds: &[VarKind], required: usize, step: i64) -> Self {
        SyncAccumulator {
            step,
            required: required.max(1),
            sums: kinds
                .iter()
                .map(|k| match k {
                    VarKind::Dense(n) => Sums::Dense(vec![0.0; *n]),
                    VarKind::Rows(dim) => Sums::Rows(RowSums::new(*dim)),
                })
                .collect(),
            contributors: vec![BTreeSet::new(); kinds.len()],
            round: BTreeSet::new(),
            abstained: BTreeSet::new(),
            stale_dropped: 0,
            duplicates_dropped: 0,
        }
    }

    pub fn step(&self) -> i64 {
        self.step
    }
    pub fn required(&self) -> usize {
        self.required
    }
    /// Changes how many gradients a step needs (elastic training); takes
    /// effect for the step being accumulated.
    pub fn set_required(&mut self, required: usize) {
        self.required = required.max(1);
    }

    pub fn check_step(&self, step: i64) -> StepCheck {
        match step.cmp(&self.step) {
            std::cmp::Ordering::Less => StepCheck::Stale,
            std::cmp::Ordering::Equal => StepCheck::Current,
            std::cmp::Ordering::Greater => StepCheck::Future,
        }
    }

    /// Counts a dropped stale push.
    pub fn record_stale(&mut self) {
        self.stale_dropped += 1;
    }

    /// Adds one worker's gradient for variable `var`, given as parts (element
    /// range, little-endian f32 bytes) that together cover the variable.
    /// Returns false, changing nothing but the duplicate counter, when this
    /// worker already counted for this variable at this step.
    pub fn add(&mut self, var: usize, worker: &str, parts: &[(Range<usize>, &[u8])]) -> bool {
        if self.contributors[var].contains(worker) {
            self.duplicates_dropped += 1;
            return false;
        }
        let Sums::Dense(sum) = &mut self.sums[var] else { panic!("variable {var} is an embedding partition: add_rows") };
        for (range, bytes) in parts {
            add_f32_from_le(&mut sum[range.clone()], bytes);
        }
        self.contributors[var].insert(worker.to_string());
        true
    }

    /// Adds one worker's row-sparse gradient for embedding partition `var`:
    /// pieces of (ids, their values as little-endian f32), each id once
    /// over all pieces (checked by the caller). Returns false, changing
    /// nothing but the duplicate counter, when this worker already counted
    /// for this partition at this step.
    pub fn add_rows(&mut self, var: usize, worker: &str, pieces: &[(&[i64], &[u8])]) -> bool {
        if self.contributors[var].contains(worker) {
            self.duplicates_dropped += 1;
            return false;
        }
        let Sums::Rows(rows) = &mut self.sums[var] else { panic!("variable {var} is dense: add") };
        for (ids, values) in pieces {
            rows.add(ids, values);
        }
        self.contributors[var].insert(worker.to_string());
        true
    }

    /// Records that `worker` pushed (anything) at the current step.
    pub fn mark_pushed(&mut self, worker: &str) {
        self.abstained.remove(worker);
        self.round.insert(worker.to_string());
    }

    /// `worker` has nothing to train at the current step. Returns false,
    /// changing nothing, when it already pushed or abstained at this step.
    pub fn abstain(&mut self, worker: &str) -> bool {
        if !self.round.insert(worker.to_string()) {
            return false;
        }
        self.abstained.insert(worker.to_string());
        true
    }

    /// Workers counted so far for variable `var` at the current step.
    pub fn count(&self, var: usize) -> usize {
        self.contributors[var].len()
    }

    pub fn ready(&self) -> bool {
        let gradients = self.required.saturating_sub(self.abstained.len()).max(1);
        self.round.len() >= self.required && self.round.len() > self.abstained.len() && self.contributors.iter().all(|c| c.len() >= gradients)
    }

    /// Turns every sum into the average of the gradients received, hands
    /// each to `apply(var, average)`, then clears everything and advances
    /// the step. Call only when [`ready`](Self::ready).
    pub fn finish_step(&mut self, mut apply: impl FnMut(usize, &[f32])) {
        self.finish_step_rows(|var, avg| match avg {
            Averaged::Dense(a) => apply(var, a),
            Averaged::Rows(..) => {
                panic!("variable {var} is an embedding partition: finish_step_rows")
            }
        })
    }

    /// [`finish_step`](Self::finish_step) for dense variables and
    /// embedding partitions alike (rows averaged per row).
    pub fn finish_step_rows(&mut self, mut apply: impl FnMut(usize, Averaged<'_>)) {
        for (var, (sum, who)) in self.sums.iter_mut().zip(&mut self.contributors).enumerate() {
            if who.is_empty() {
                continue;
            }
            match sum {
                Sums::Dense(sum) => {
                    let scale = 1.0 / who.len() as f32;
                    for x in sum.iter_mut() {
                        *x *= scale;
                    }
                    apply(var, Averaged::Dense(sum));
                    sum.fill(0.0);
                }
                Sums::Rows(rows) => {
                    let (ids, values) = rows.average();
                    apply(var, Averaged::Rows(ids, values));
                    rows.clear();
                }
            }
            who.clear();
        }
        self.round.clear();
        self.abstained.clear();
        self.step += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    enum Op {
        /// (worker, step, gradient of var 0, gradient of var 1)
        Push(&'static str, i64, [f32; 2], [f32; 1]),
        /// (worker, step): nothing to train at that step.
        Abstain(&'static str, i64),
    }

    struct Case {
        name: &'static str,
        required: usize,
        ops: Vec<Op>,
        /// Averages applied, per finished step: (var0, var1).
        applied: Vec<([f32; 2], [f32; 1])>,
        step: i64,
        stale: u64,
        duplicates: u64,
        future_refused: usize,
    }

    /// Drives the accumulator as the ps does: check the step, add each
    /// variable, mark the push, finish when ready.
    fn run(case: &Case) {
        let mut acc = SyncAccumulator::new(&[2, 1], case.required, 0);
        let mut applied = Vec::new();
        let mut future = 0;
        for op in &case.ops {
            let step = match op {
                Op::Push(_, step, _, _) | Op::Abstain(_, step) => step,
            };
            match acc.check_step(*step) {
                StepCheck::Stale => {
                    // A late abstention is no gradient: nothing was dropped.
                    if matches!(op, Op::Push(..)) {
                        acc.record_stale();
                    }
                    continue;
                }
                StepCheck::Future => {
                    future += 1;
                    continue;
                }
                StepCheck::Current => {}
            }
            match op {
                Op::Push(worker, _, g0, g1) => {
                    let (b0, b1) = (le(g0), le(g1));
                    acc.add(0, worker, &[(0..1, &b0[0..4]), (1..2, &b0[4..8])]);
                    acc.add(1, worker, &[(0..1, &b1[..])]);
                    acc.mark_pushed(worker);
                }
                Op::Abstain(worker, _) => {
                    acc.abstain(worker);
                }
            }
            if acc.ready() {
                let mut got = ([0.0; 2], [0.0; 1]);
                acc.finish_step(|v, avg| if v == 0 { got.0.copy_from_slice(avg) } else { got.1.copy_from_slice(avg) });
                applied.push(got);
            }
        }
        assert_eq!(applied, case.applied, "{}: applied", case.name);
        assert_eq!(acc.step(), case.step, "{}: step", case.name);
        assert_eq!(acc.stale_dropped, case.stale, "{}: stale", case.name);
        assert_eq!(acc.duplicates_dropped, case.duplicates, "{}: duplicates", case.name);
        assert_eq!(future, case.future_refused, "{}: future", case.name);
    }

    #[test]
    fn aggregation_rules() {
        use Op::{Abstain, Push};
        let cases = vec![
            Case {
                name: "two workers, averaged",
                required: 2,
                ops: vec![Push("w0", 0, [1.0, 2.0], [4.0]), Push("w1", 0, [3.0, 6.0], [0.0])],
                applied: vec![([2.0, 4.0], [2.0])],
                step: 1,
                stale: 0,
                duplicates: 0,
                future_refused: 0,
            },
            Case {
                name: "not ready with one of two",
                required: 2,
                ops: vec![Push("w0", 0, [1.0, 2.0], [4.0])],
                applied: vec![],
                step: 0,
                stale: 0,
                duplicates: 0,
                future_refused: 0,
            },
            Case {
                name: "a retried push never counts twice",
                required: 2,
                ops: vec![Push("w0", 0, [1.0, 1.0], [1.0]), Push("w0", 0, [9.0, 9.0], [9.0]), Push("w1", 0, [3.0, 3.0], [3.0])],
                applied: vec![([2.0, 2.0], [2.0])],
                step: 1,
                stale: 0,
                duplicates: 2,
                future_refused: 0,
            },
            Case {
                name: "backup worker: third push of the step is stale",
                required: 2,
                ops: vec![
                    Push("w0", 0, [1.0, 1.0], [1.0]),
                    Push("w2", 0, [3.0, 3.0], [3.0]),
                    Push("w1", 0, [100.0, 100.0], [100.0]),
                    Push("w1", 1, [2.0, 2.0], [2.0]),
                    Push("w0", 1, [4.0, 4.0], [4.0]),
                ],
                applied: vec![([2.0, 2.0], [2.0]), ([3.0, 3.0], [3.0])],
                step: 2,
                stale: 1,
                duplicates: 0,
                future_refused: 0,
            },
            Case {
                name: "gradients from the future are refused",
                required: 1,
                ops: vec![Push("w0", 3, [1.0, 1.0], [1.0]), Push("w0", 0, [1.0, 1.0], [1.0])],
                applied: vec![([1.0, 1.0], [1.0])],
                step: 1,
                stale: 0,
                duplicates: 0,
                future_refused: 1,
            },
            Case {
                name: "an idle worker abstains: the step averages the gradients that came",
                required: 3,
                ops: vec![Push("w0", 0, [1.0, 1.0], [1.0]), Abstain("w2", 0), Push("w1", 0, [3.0, 3.0], [5.0])],
                applied: vec![([2.0, 2.0], [3.0])],
                step: 1,
                stale: 0,
                duplicates: 0,
                future_refused: 0,
            },
            Case {
                name: "abstentions alone never make a step",
                required: 2,
                ops: vec![Abstain("w0", 0), Abstain("w1", 0), Abstain("w1", 0), Push("w2", 0, [4.0, 4.0], [4.0])],
                applied: vec![([4.0, 4.0], [4.0])],
                step: 1,
                stale: 0,
                duplicates: 0,
                future_refused: 0,
            },
            Case {
                name: "backup workers: an abstention does not let a step finish before the gradients it needs",
                required: 2,
                ops: vec![Abstain("w2", 0), Push("w0", 0, [1.0, 1.0], [1.0]), Push("w1", 0, [3.0, 3.0], [3.0])],
                // w2 abstained and w0 pushed: 2 of 2, with the one gradient needed.
                applied: vec![([1.0, 1.0], [1.0])],
                step: 1,
                stale: 1,
                duplicates: 0,
                future_refused: 0,
            },
            Case {
                name: "a worker that abstained and then got data counts with its gradient",
                required: 2,
                ops: vec![Abstain("w1", 0), Push("w1", 0, [2.0, 2.0], [2.0]), Push("w0", 0, [4.0, 4.0], [4.0])],
                applied: vec![([3.0, 3.0], [3.0])],
                step: 1,
                stale: 0,
                duplicates: 0,
                future_refused: 0,
            },
            Case {
                name: "stale abstentions are dropped like stale gradients",
                required: 1,
                ops: vec![Push("w0", 0, [1.0, 1.0], [1.0]), Abstain("w1", 0), Push("w0", 1, [2.0, 2.0], [2.0])],
                applied: vec![([1.0, 1.0], [1.0]), ([2.0, 2.0], [2.0])],
                step: 2,
                stale: 0,
                duplicates: 0,
                future_refused: 0,
            },
            Case {
                name: "one replica to aggregate: every push is a step",
                required: 1,
                ops: vec![Push("w0", 0, [1.0, 1.0], [1.0]), Push("w1", 0, [5.0, 5.0], [5.0]), Push("w1", 1, [2.0, 2.0], [2.0])],
                applied: vec![([1.0, 1.0], [1.0]), ([2.0, 2.0], [2.0])],
                step: 2,
                stale: 1,
                duplicates: 0,
                future_refused: 0,
            },
        ];
        for case in &cases {
            run(case);
        }
    }

    #[test]
    fn ps_without_variables_counts_pushes() {
        let mut acc = SyncAccumulator::new(&[], 2, 5);
        acc.mark_pushed("w0");
        assert!(!acc.ready());
        acc.mark_pushed("w0");
        assert!(!acc.ready());
        acc.mark_pushed("w1");
        assert!(acc.ready());
        acc.finish_step(|_, _| unreachable!());
        assert_eq!(acc.step(), 6);
    }

    #[test]
    fn ps_without_variables_needs_one_push_with_data() {
        let mut acc = SyncAccumulator::new(&[], 2, 0);
        assert!(acc.abstain("w0"));
        assert!(!acc.abstain("w0"), "once per step");
        acc.mark_pushed("w0");
        assert!(!acc.ready(), "w0 pushed after abstaining: one of two");
        assert!(acc.abstain("w1"));
        assert!(acc.ready());
        acc.finish_step(|_, _| unreachable!());
        assert!(acc.abstain("w0") && acc.abstain("w1"));
        assert!(!acc.ready(), "every task idle: no step");
    }

    /// Row-sparse gradients of several workers: each row averaged over the
    /// gradients that held it (TensorFlow's SparseConditionalAccumulator);
    /// a worker whose gradient holds no row still counts for the partition;
    /// a retried push does not count twice; dense variables beside it keep
    /// their average over the workers.
    #[test]
    fn rows_are_averaged_per_row() {
        type Push = (&'static str, Vec<i64>, Vec<f32>);
        struct RowCase {
            name: &'static str,
            required: usize,
            /// Per worker: ids and their values (dim 2).
            pushes: Vec<Push>,
            /// Ready after the pushes?
            ready: bool,
            /// (id, averaged row), sorted by id.
            want: Vec<(i64, [f32; 2])>,
            duplicates: u64,
        }
        let cases = vec![
            RowCase {
                name: "two workers, one shared row",
                required: 2,
                pushes: vec![("w0", vec![7, 3], vec![1.0, 2.0, 10.0, 20.0]), ("w1", vec![3, 9], vec![30.0, 40.0, 5.0, 6.0])],
                ready: true,
                // row 3: (10 + 30) / 2, (20 + 40) / 2; rows 7 and 9: one gradient each.
                want: vec![(3, [20.0, 30.0]), (7, [1.0, 2.0]), (9, [5.0, 6.0])],
                duplicates: 0,
            },
            RowCase {
                name: "three workers, a row in all three, one gradient without rows",
                required: 4,
                pushes: vec![
                    ("w0", vec![1], vec![3.0, 3.0]),
                    ("w1", vec![1, 2], vec![6.0, 6.0, 1.0, -1.0]),
                    ("w2", vec![1], vec![0.0, 0.0]),
                    ("w3", vec![], vec![]),
                ],
                ready: true,
                want: vec![(1, [3.0, 3.0]), (2, [1.0, -1.0])],
                duplicates: 0,
            },
            RowCase {
                name: "a retried push of the step does not count twice",
                required: 2,
                pushes: vec![("w0", vec![4], vec![2.0, 2.0]), ("w0", vec![4], vec![100.0, 100.0]), ("w1", vec![4], vec![4.0, 4.0])],
                ready: true,
                want: vec![(4, [3.0, 3.0])],
                duplicates: 1,
            },
            RowCase {
                name: "not ready with one of two",
                required: 2,
                pushes: vec![("w0", vec![4], vec![2.0, 2.0])],
                ready: false,
                want: vec![],
                duplicates: 0,
            },
        ];
        for case in cases {
            let mut acc = SyncAccumulator::with_kinds(&[VarKind::Rows(2), VarKind::Dense(1)], case.required, 0);
            for (worker, ids, values) in &case.pushes {
                let bytes = le(values);
                acc.add_rows(0, worker, &[(ids, &bytes)]);
                let dense = le(&[ids.len() as f32]);
                acc.add(1, worker, &[(0..1, &dense[..])]);
                acc.mark_pushed(worker);
            }
            assert_eq!(acc.ready(), case.ready, "{}: ready", case.name);
            assert_eq!(acc.duplicates_dropped, case.duplicates * 2, "{}: duplicates (rows and dense)", case.name);
            if !case.ready {
                continue;
            }
            let mut rows = Vec::new();
            let mut dense = Vec::new();
            acc.finish_step_rows(|_, avg| match avg {
                Averaged::Rows(ids, values) => {
                    rows = ids.iter().enumerate().map(|(k, &id)| (id, [values[2 * k], values[2 * k + 1]])).collect();
                }
                Averaged::Dense(d) => dense = d.to_vec(),
            });
            rows.sort_by_key(|r| r.0);
            assert_eq!(rows, case.want, "{}", case.name);
            let workers: BTreeSet<&str> = case.pushes.iter().map(|p| p.0).collect();
            let first: Vec<f32> = workers.iter().map(|w| case.pushes.iter().find(|p| p.0 == *w).unwrap().1.len() as f32).collect();
            assert_eq!(dense, vec![first.iter().sum::<f32>() / first.len() as f32], "{}: dense average over the workers", case.name);
            assert_eq!(acc.step(), 1);
            // Cleared for the next step: a row of the last step is gone.
            let worker_count = workers.len();
            for w in &workers {
                acc.add_rows(0, w, &[(&[5], &le(&[2.0, 4.0]))]);
                acc.add(1, w, &[(0..1, &le(&[0.0])[..])]);
                acc.mark_pushed(w);
            }
            assert!(acc.ready(), "{}: {worker_count} workers", case.name);
            let mut next = Vec::new();
            acc.finish_step_rows(|_, avg| {
                if let Averaged::Rows(ids, values) = avg {
                    next = vec![(ids.to_vec(), values.to_vec())];
                }
            });
            assert_eq!(next, vec![(vec![5], vec![2.0, 4.0])], "{}: the next step", case.name);
        }
    }

    #[test]
    fn unaligned_bytes_accumulate() {
        let mut acc = SyncAccumulator::new(&[3], 1, 0);
        let mut buf = [0u8; 13];
        buf[1..13].copy_from_slice(&le(&[1.0, 2.0, 3.0]));
        assert!(acc.add(0, "w", &[(0..3, &buf[1..13])]));
        let mut got = vec![];
        acc.mark_pushed("w");
        acc.finish_step(|_, avg| got = avg.to_vec());
        assert_eq!(got, vec![1.0, 2.0, 3.0]);
    }
}
