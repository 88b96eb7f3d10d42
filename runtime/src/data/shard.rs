//! [`ShardBatches`]: the batches of one shard, each made when it is first needed, so that a
//! worker can make the batch after next while its step's round trip is on the wire instead of
//! making a whole shard's batches between two steps (as tf.data's `prefetch` overlaps input
//! with training).

use std::collections::VecDeque;
use std::sync::Arc;

use super::batch::Batch;

/// Examples a shard's batches are picked from, by index.
pub trait PickExamples: Send + Sync {
    /// The examples at `indices`, in that order, as one batch.
    fn pick(&self, indices: &[usize]) -> Batch;
}

impl PickExamples for Batch {
    fn pick(&self, indices: &[usize]) -> Batch {
        self.select(indices)
    }
}

/// The batches of one shard in training order: those made ahead, then those still to pick.
pub struct ShardBatches {
    made: VecDeque<Batch>,
    from: Arc<dyn PickExamples>,
    /// The indices into `from` of the examples not made into batches yet, in training order.
    order: Vec<usize>,
    next: usize,
    batch_size: usize,
}

impl ShardBatches {
    /// The batches of `order`'s examples of `from`, `batch_size` at a time (the last may hold
    /// fewer), each made when it is first needed.
    ///
    /// # Panics
    /// If `batch_size` is 0 (a bug of the caller).
    pub fn picked(from: Arc<dyn PickExamples>, order: Vec<usize>, batch_size: usize) -> Self {
        assert!(batch_size > 0, "batch_size must be at least 1");
        ShardBatches { made: VecDeque::new(), from, order, next: 0, batch_size }
    }

    /// Makes batches until `n` are made ahead (or none is left to make).
    pub fn make_ahead(&mut self, n: usize) {
        while self.made.len() < n {
            let Some(batch) = self.pick_next() else { return };
            self.made.push_back(batch);
        }
    }

    /// The `i`-th batch not taken yet (0: the next), when made ahead.
    pub fn ahead(&self, i: usize) -> Option<&Batch> {
        self.made.get(i)
    }

    /// The next batch, without taking it.
    pub fn peek(&mut self) -> Option<&Batch> {
        self.make_ahead(1);
        self.made.front()
    }

    /// Every batch was taken.
    pub fn is_empty(&self) -> bool {
        self.made.is_empty() && self.next >= self.order.len()
    }

    fn pick_next(&mut self) -> Option<Batch> {
        let end = (self.next + self.batch_size).min(self.order.len());
        if self.next >= end {
            return None;
        }
        let batch = self.from.pick(&self.order[self.next..end]);
        self.next = end;
        Some(batch)
    }
}

impl Iterator for ShardBatches {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        self.made.pop_front().or_else(|| self.pick_next())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.order.len() - self.next;
        let n = self.made.len() + left.div_ceil(self.batch_size);
        (n, Some(n))
    }
}

impl ExactSizeIterator for ShardBatches {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Dataset, Targets};
    use ndarray::Array2;

    fn numbered(n: usize) -> Arc<Dataset> {
        let x = Array2::from_shape_fn((n, 1), |(i, _)| i as f32);
        Arc::new(Dataset::new(x, Targets::Labels((0..n as u32).collect())).unwrap())
    }

    fn ids(b: &Batch) -> Vec<usize> {
        b.x.column(0).iter().map(|&v| v as usize).collect()
    }

    #[test]
    fn batches_made_ahead_or_when_taken_are_the_same_in_the_same_order() {
        // (examples, order, batch_size, made ahead before each take)
        let cases: &[(usize, &[usize], usize, usize)] = &[
            (10, &[3, 1, 4, 0, 5, 9, 2], 3, 0),
            (10, &[3, 1, 4, 0, 5, 9, 2], 3, 2),
            (10, &[3, 1, 4, 0, 5, 9, 2], 3, 9),
            (4, &[0, 1, 2, 3], 4, 1),
            (4, &[2], 5, 2),
            (4, &[], 2, 2),
        ];
        for &(n, order, batch_size, ahead) in cases {
            let want: Vec<Vec<usize>> = order.chunks(batch_size).map(<[usize]>::to_vec).collect();
            let mut batches = ShardBatches::picked(numbered(n), order.to_vec(), batch_size);
            assert_eq!(batches.len(), want.len(), "{order:?} by {batch_size}");
            let mut got = vec![];
            loop {
                batches.make_ahead(ahead);
                let left = batches.len();
                for i in 0..ahead.min(left) {
                    assert_eq!(ids(batches.ahead(i).unwrap()), want[got.len() + i], "{order:?} by {batch_size}, {i} ahead");
                }
                assert_eq!(batches.peek().map(ids), want.get(got.len()).cloned());
                let Some(b) = batches.next() else { break };
                got.push(ids(&b));
                assert_eq!(batches.is_empty(), got.len() == want.len());
            }
            assert_eq!(got, want, "{order:?} by {batch_size}, {ahead} ahead");
            assert!(batches.is_empty());
        }
    }
}
