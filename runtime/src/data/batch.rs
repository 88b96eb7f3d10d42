//! What training sees of data: a [`Batch`] of dense inputs, their
//! [`Targets`], and the sparse features beside them.

use ndarray::{Array2, Axis};

/// What a batch is trained against.
#[derive(Debug, Clone, PartialEq)]
pub enum Targets {
    /// Regression targets, one row per example.
    Values(Array2<f32>),
    /// Class labels in `0..num_classes`.
    Labels(Vec<u32>),
}

/// A batch: one row of `x` per example.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub x: Array2<f32>,
    pub targets: Targets,
    /// Sparse features (libsvm, criteo), beside the dense inputs in `x`.
    pub sparse: Option<SparseFeatures>,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.x.nrows()
    }

    /// The examples at `indices`, in that order: what building a batch of those examples gives.
    pub fn select(&self, indices: &[usize]) -> Batch {
        Batch { x: rows_at(&self.x, indices), targets: self.targets.select(indices), sparse: self.sparse.as_ref().map(|f| f.select(indices)) }
    }
    pub fn is_empty(&self) -> bool {
        self.x.nrows() == 0
    }
}

/// The rows of `x` at `indices`, in that order (what `x.select(Axis(0),
/// indices)` gives). ndarray's `select` concatenates one view per row,
/// element by element: a batch of 100 MNIST rows took 11.6 % of a
/// single-process MLP step that way. A row of a standard-layout array is one
/// slice; copying the slices is a memcpy each.
///
/// # Panics
/// If an index is out of range.
pub fn rows_at(x: &Array2<f32>, indices: &[usize]) -> Array2<f32> {
    let Some(data) = x.as_slice() else {
        return x.select(Axis(0), indices);
    };
    let (rows, width) = x.dim();
    let mut out = Vec::with_capacity(indices.len() * width);
    for &i in indices {
        assert!(i < rows, "row {i} of an array of {rows} rows");
        out.extend_from_slice(&data[i * width..(i + 1) * width]);
    }
    Array2::from_shape_vec((indices.len(), width), out).expect("indices.len() rows of width values")
}

impl Targets {
    /// Number of examples.
    pub fn len(&self) -> usize {
        match self {
            Targets::Values(v) => v.nrows(),
            Targets::Labels(l) => l.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The targets of the examples at `indices`, in that order.
    ///
    /// # Panics
    /// If an index is out of range.
    pub fn select(&self, indices: &[usize]) -> Targets {
        match self {
            Targets::Values(v) => Targets::Values(rows_at(v, indices)),
            Targets::Labels(l) => Targets::Labels(indices.iter().map(|&i| l[i]).collect()),
        }
    }
}

/// How many examples ahead [`SparseFeatures::select`] asks for the features it copies next.
const PREFETCH_EXAMPLES: usize = 4;

/// The sparse features of a batch, row after row (compressed sparse rows).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SparseFeatures {
    /// `offsets[i]..offsets[i + 1]` are example `i`'s features.
    pub offsets: Vec<usize>,
    pub fields: Vec<u32>,
    pub keys: Vec<u64>,
    pub values: Vec<f32>,
    /// Fields of the format (the bags of a wide & deep model).
    pub num_fields: usize,
    /// [`SparseFeatures::batch_rows`] once computed.
    pub rows_memo: RowsMemo,
}

/// The rows of a batch's keys, kept with the bucket count they were computed for: a step needs
/// them twice (to pull or gather the rows, then in the model's pass), and sorting the keys was a
/// tenth of a sparse step. A clone starts empty (its keys may then change), and it is no part of
/// a batch's equality.
#[derive(Default)]
pub struct RowsMemo(std::sync::OnceLock<(u64, BatchRows)>);

impl Clone for RowsMemo {
    fn clone(&self) -> Self {
        RowsMemo::default()
    }
}

impl PartialEq for RowsMemo {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for RowsMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RowsMemo")
    }
}

/// The rows of a table of `buckets` rows that a batch's keys fall in (`key % buckets`): each
/// distinct row once, sorted (the rows a worker pulls and holds), and where each key's row is
/// among them (the key's slot in what was pulled).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchRows {
    /// The distinct rows, sorted.
    pub rows: Vec<i64>,
    /// Per key, in the batch's order: `rows[slots[j]]` is key `j`'s row.
    pub slots: Vec<usize>,
}

impl BatchRows {
    /// The rows of `keys` in a table of `buckets` rows.
    ///
    /// One sort of (row, key position) pairs gives both the distinct rows and every key's slot,
    /// where sorting the rows alone and then finding each key's row by binary search took a
    /// second pass of `log(rows)` probes per key. The pair is packed in one `u64` (row in the
    /// high half) whenever both fit in 32 bits, as they do for any table under 2^32 rows, and
    /// sorted by its row with a radix sort: a pass per byte in which rows differ (three for
    /// 2^20 buckets). Against a comparison sort of the pairs, single-process sparse_lr trained
    /// 1.16x faster (BENCHMARKS.md); 1 ps + 2 workers did not move.
    pub fn of(keys: &[u64], buckets: u64) -> BatchRows {
        let row = |k: u64| k % buckets;
        if buckets <= 1 << 32 && keys.len() <= 1 << 32 {
            let mut pairs: Vec<u64> = keys.iter().enumerate().map(|(j, &k)| (row(k) << 32) | j as u64).collect();
            radsort::sort_by_key(&mut pairs, |p| (p >> 32) as u32);
            BatchRows::number(keys.len(), pairs.into_iter().map(|p| ((p >> 32) as i64, (p & 0xffff_ffff) as usize)))
        } else {
            let mut pairs: Vec<(i64, usize)> = keys.iter().enumerate().map(|(j, &k)| (row(k) as i64, j)).collect();
            pairs.sort_unstable();
            BatchRows::number(keys.len(), pairs.into_iter())
        }
    }

    /// Numbers the distinct rows of (row, key position) pairs sorted by row.
    fn number(keys: usize, sorted: impl Iterator<Item = (i64, usize)>) -> BatchRows {
        let mut rows: Vec<i64> = Vec::new();
        let mut slots = vec![0; keys];
        for (row, j) in sorted {
            if rows.last() != Some(&row) {
                rows.push(row);
            }
            slots[j] = rows.len() - 1;
        }
        BatchRows { rows, slots }
    }
}

impl SparseFeatures {
    /// The rows the keys fall in, in a table of `buckets` rows. Computed once for the bucket
    /// count asked first; another count is computed each time.
    pub fn batch_rows(&self, buckets: u64) -> std::borrow::Cow<'_, BatchRows> {
        let (memo_buckets, rows) = self.rows_memo.0.get_or_init(|| (buckets, BatchRows::of(&self.keys, buckets)));
        if *memo_buckets == buckets { std::borrow::Cow::Borrowed(rows) } else { std::borrow::Cow::Owned(BatchRows::of(&self.keys, buckets)) }
    }

    /// The features of the examples at `indices`, in that order.
    pub fn select(&self, indices: &[usize]) -> SparseFeatures {
        let total = indices.iter().map(|&i| self.range(i).len()).sum();
        let mut out = SparseFeatures {
            offsets: Vec::with_capacity(indices.len() + 1),
            fields: Vec::with_capacity(total),
            keys: Vec::with_capacity(total),
            values: Vec::with_capacity(total),
            num_fields: self.num_fields,
            rows_memo: RowsMemo::default(),
        };
        out.offsets.push(0);
        for (n, &i) in indices.iter().enumerate() {
            if let Some(&ahead) = indices.get(n + PREFETCH_EXAMPLES) {
                self.prefetch(ahead);
            }
            let r = self.range(i);
            out.fields.extend_from_slice(&self.fields[r.clone()]);
            out.keys.extend_from_slice(&self.keys[r.clone()]);
            out.values.extend_from_slice(&self.values[r]);
            out.offsets.push(out.keys.len());
        }
        out
    }

    /// Asks the CPU to bring example `i`'s features into the cache (a hint; nothing elsewhere
    /// than x86-64). A batch picks its examples at random from a set larger than the cache, and
    /// copying them waited on memory three times an example (fields, keys, values).
    fn prefetch(&self, i: usize) {
        #[cfg(target_arch = "x86_64")]
        if let Some(&start) = self.offsets.get(i) {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            for p in [
                self.fields.as_ptr().wrapping_add(start).cast::<i8>(),
                self.keys.as_ptr().wrapping_add(start).cast(),
                self.values.as_ptr().wrapping_add(start).cast(),
            ] {
                // SAFETY: a prefetch only hints; it reads nothing and faults on no address.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = i;
    }

    /// The positions of example `i`'s features in `fields`, `keys` and `values`.
    pub fn range(&self, i: usize) -> std::ops::Range<usize> {
        self.offsets[i]..self.offsets[i + 1]
    }

    /// Example `i`'s features: (field, key, value).
    pub fn example(&self, i: usize) -> impl Iterator<Item = (u32, u64, f32)> + '_ {
        let r = self.range(i);
        self.fields[r.clone()].iter().zip(&self.keys[r.clone()]).zip(&self.values[r]).map(|((&f, &k), &v)| (f, k, v))
    }
}
