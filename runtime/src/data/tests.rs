use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;
use ndarray::{Array2, arr2};
use proptest::prelude::*;

use super::*;
use crate::dispatch::{ShardId, ShardPlan};

// ------------------------------------------------------------- IDX files

/// An unsigned-byte IDX file with `dims` and `data`.
fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `n` images of 2x3 pixels, pixel j of image i = (40 i + j) mod 256.
fn images(n: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..n * 6).map(|k| ((k / 6) * 40 + k % 6) as u8).collect();
    idx(&[n as u32, 2, 3], &data)
}

fn labels(values: &[u8]) -> Vec<u8> {
    idx(&[values.len() as u32], values)
}

#[test]
fn reads_plain_and_gzipped_idx_files_alike() {
    let dir = tempfile::tempdir().unwrap();
    let img = images(4);
    // Names do not decide: a gzipped file without .gz and a plain one with it.
    let plain = write(dir.path(), "images.gz", &img);
    let zipped = write(dir.path(), "images", &gzip(&img));
    let a = read_idx_images(&plain).unwrap();
    let b = read_idx_images(&zipped).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.dim(), (4, 6));
    assert_eq!(a[[0, 0]], 0.0);
    assert_eq!(a[[1, 2]], 42.0 / 255.0);
    let full = write(dir.path(), "full", &idx(&[1, 1, 2], &[255, 128]));
    assert_eq!(read_idx_images(&full).unwrap(), arr2(&[[1.0, 128.0 / 255.0]]));

    let lab = write(dir.path(), "labels", &gzip(&labels(&[3, 0, 9, 1])));
    assert_eq!(read_idx_labels(&lab, 10).unwrap(), vec![3, 0, 9, 1]);
    let ds = read_mnist_pair(&plain, &lab).unwrap();
    assert_eq!((ds.len(), ds.input_dim(), ds.num_classes()), (4, 6, Some(10)));
    assert_eq!(ds.targets(), &Targets::Labels(vec![3, 0, 9, 1]));
}

#[test]
fn load_mnist_finds_plain_and_gzipped_files() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "train-images-idx3-ubyte.gz", &gzip(&images(5)));
    write(dir.path(), "train-labels-idx1-ubyte", &labels(&[0, 1, 2, 3, 4]));
    write(dir.path(), "t10k-images-idx3-ubyte", &images(2));
    write(dir.path(), "t10k-labels-idx1-ubyte.gz", &gzip(&labels(&[7, 8])));
    let m = load_mnist(dir.path()).unwrap();
    assert_eq!((m.train.len(), m.test.len(), m.train.input_dim()), (5, 2, 6));
    assert_eq!(m.test.targets(), &Targets::Labels(vec![7, 8]));
    assert_eq!(m.test.x(), &read_idx_images(dir.path().join("t10k-images-idx3-ubyte")).unwrap());
}

/// What a bad file must produce.
type Check = fn(&DataError) -> bool;

#[test]
fn bad_idx_files_give_errors_naming_the_file() {
    let truncated_gz = {
        let g = gzip(&images(3));
        g[..g.len() - 10].to_vec()
    };
    let mut wrong_type = images(1);
    wrong_type[2] = 0x0D; // float data
    // (case, image file bytes, label file bytes, the error, the file it must name)
    type Case = (&'static str, Vec<u8>, Vec<u8>, Check, &'static str);
    let cases: Vec<Case> = vec![
        ("labels as images", labels(&[1, 2]), labels(&[1, 2]), |e| matches!(e, DataError::BadMagic { found: 0x801, expected: 0x803, .. }), "img"),
        ("images as labels", images(2), images(2), |e| matches!(e, DataError::BadMagic { found: 0x803, expected: 0x801, .. }), "lab"),
        ("float images", wrong_type, labels(&[1]), |e| matches!(e, DataError::BadMagic { found: 0x0D03, .. }), "img"),
        ("text file", b"hello, world".to_vec(), labels(&[1]), |e| matches!(e, DataError::BadMagic { .. }), "img"),
        ("empty file", vec![], labels(&[1]), |e| matches!(e, DataError::Truncated { part: "header", expected: 4, found: 0, .. }), "img"),
        ("short header", images(2)[..9].to_vec(), labels(&[1, 2]), |e| matches!(e, DataError::Truncated { part: "header", expected: 16, found: 9, .. }), "img"),
        ("short data", images(2)[..20].to_vec(), labels(&[1, 2]), |e| matches!(e, DataError::Truncated { part: "data", expected: 12, found: 4, .. }), "img"),
        (
            "short labels",
            images(3),
            labels(&[1, 2, 3])[..10].to_vec(),
            |e| matches!(e, DataError::Truncated { part: "data", expected: 3, found: 2, .. }),
            "lab",
        ),
        ("trailing bytes", [images(2), vec![0, 0]].concat(), labels(&[1, 2]), |e| matches!(e, DataError::TrailingBytes { extra: 2, .. }), "img"),
        ("zero-size images", idx(&[2, 0, 28], &[]), labels(&[1, 2]), |e| matches!(e, DataError::BadHeader { .. }), "img"),
        (
            "huge dimensions",
            idx(&[u32::MAX, u32::MAX, u32::MAX], &[]),
            labels(&[1]),
            |e| matches!(e, DataError::BadHeader { .. } | DataError::Truncated { .. }),
            "img",
        ),
        ("label out of range", images(3), labels(&[1, 10, 2]), |e| matches!(e, DataError::LabelOutOfRange { index: 1, label: 10, num_classes: 10, .. }), "lab"),
        ("more labels than images", images(2), labels(&[1, 2, 3]), |e| matches!(e, DataError::CountMismatch { images: 2, labels: 3, .. }), "img"),
        ("truncated gzip", truncated_gz, labels(&[1, 2, 3]), |e| matches!(e, DataError::Gzip { .. }), "img"),
        ("corrupt gzip", vec![0x1f, 0x8b, 8, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9], labels(&[1]), |e| matches!(e, DataError::Gzip { .. }), "img"),
    ];
    for (case, img, lab, check, names) in cases {
        let dir = tempfile::tempdir().unwrap();
        let img_path = write(dir.path(), "img", &img);
        let lab_path = write(dir.path(), "lab", &lab);
        let err = read_mnist_pair(&img_path, &lab_path).expect_err(case);
        assert!(check(&err), "{case}: unexpected error {err:?}");
        let named = if names == "img" { &img_path } else { &lab_path };
        let msg = err.to_string();
        assert!(msg.contains(&named.display().to_string()), "{case}: {msg:?} does not name {}", named.display());
    }
}

#[test]
fn load_mnist_reports_missing_files_and_mismatched_sets() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "train-images-idx3-ubyte", &images(2));
    write(dir.path(), "train-labels-idx1-ubyte", &labels(&[0, 1]));
    write(dir.path(), "t10k-images-idx3-ubyte.gz", &gzip(&idx(&[1, 3, 3], &[0; 9])));
    let err = load_mnist(dir.path()).unwrap_err();
    assert!(matches!(err, DataError::Missing { name: "t10k-labels-idx1-ubyte", .. }), "{err:?}");
    assert!(err.to_string().contains("t10k-labels-idx1-ubyte.gz"), "{err}");

    write(dir.path(), "t10k-labels-idx1-ubyte", &labels(&[5]));
    let err = load_mnist(dir.path()).unwrap_err();
    assert!(matches!(err, DataError::ImageSizeMismatch { found: 9, expected: 6, .. }), "{err:?}");
    assert!(err.to_string().contains("t10k-images-idx3-ubyte.gz"), "{err}");

    let err = load_mnist(dir.path().join("nowhere")).unwrap_err();
    assert!(matches!(err, DataError::Missing { name: "train-images-idx3-ubyte", .. }), "{err:?}");
    let err = read_idx_labels(dir.path().join("nowhere"), 10).unwrap_err();
    assert!(matches!(err, DataError::Io { .. }) && err.to_string().contains("nowhere"), "{err:?}");
}

#[test]
fn reads_the_shared_synthetic_mnist() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/synthetic-mnist");
    if !dir.is_dir() {
        println!("skipped: {} is absent", dir.display());
        return;
    }
    let m = load_mnist(&dir).unwrap();
    assert_eq!((m.train.len(), m.train.input_dim()), (60_000, 784));
    assert_eq!((m.test.len(), m.test.input_dim()), (10_000, 784));
    let Targets::Labels(train_labels) = m.train.targets() else { panic!("labels") };
    let mut counts = [0usize; 10];
    for &l in train_labels {
        counts[l as usize] += 1;
    }
    // The class counts its README gives.
    assert_eq!(counts, [5158, 5348, 7959, 6379, 5104, 6111, 6276, 5338, 4620, 7707]);
    assert!(m.train.x().iter().all(|&p| (0.0..=1.0).contains(&p)));
    let nonzero = m.train.x().iter().filter(|&&p| p > 0.0).count() as f64 / (60_000.0 * 784.0);
    assert!((0.1..0.3).contains(&nonzero), "about 20% non-zero pixels, got {nonzero}");
}

// -------------------------------------------------------- generated data

#[test]
fn synthetic_line_is_the_classic_example() {
    let d = synthetic_line(3);
    assert_eq!((d.len(), d.input_dim()), (LINE_POINTS, 1));
    assert_eq!(d.x()[[0, 0]], -1.0);
    assert_eq!(d.x()[[50, 0]], 0.0);
    assert_eq!(d.x()[[100, 0]], 1.0);
    assert!((d.x()[[1, 0]] - (-0.98)).abs() < 1e-6);
    let Targets::Values(y) = d.targets() else { panic!("values") };
    assert_eq!(y.dim(), (101, 1));
    let residuals: Vec<f64> = (0..101).map(|i| (y[[i, 0]] - (2.0 * d.x()[[i, 0]] + 10.0)) as f64).collect();
    let mean = residuals.iter().sum::<f64>() / 101.0;
    let sd = (residuals.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / 100.0).sqrt();
    assert!(mean.abs() < 0.1 && (0.25..0.42).contains(&sd), "noise mean {mean}, sd {sd}");
    assert_eq!(synthetic_line(3), d);
    assert_ne!(synthetic_line(4), d);
}

#[test]
fn synthetic_classification_table() {
    // (input_dim, classes, train, test)
    for (d, c, n_train, n_test) in [(1, 1, 10, 5), (2, 3, 100, 40), (20, 4, 1000, 0), (784, 10, 300, 100)] {
        let (train, test) = synthetic_classification(d, c, n_train, n_test, 5);
        assert_eq!((train.len(), train.input_dim(), test.len(), test.input_dim()), (n_train, d, n_test, d));
        for set in [&train, &test] {
            let Targets::Labels(l) = set.targets() else { panic!("labels") };
            assert!(l.iter().all(|&l| (l as usize) < c));
            assert!(set.x().iter().all(|&v| (0.0..1.0).contains(&v)));
        }
        if n_train >= 100 {
            // Every class shows up.
            assert_eq!(train.num_classes(), Some(c), "d={d} c={c}");
            let Targets::Labels(l) = train.targets() else { unreachable!() };
            assert_eq!(l.iter().collect::<BTreeSet<_>>().len(), c);
        }
        assert_eq!(synthetic_classification(d, c, n_train, n_test, 5), (train.clone(), test.clone()));
        assert_ne!(synthetic_classification(d, c, n_train, n_test, 6).0, train);
        if n_test > 0 {
            assert_ne!(test.head(1), train.head(1), "train and test are different draws");
        }
    }
}

#[test]
fn synthetic_labels_are_a_linear_function_of_the_inputs() {
    // A nearest-neighbour check that labels are not noise: close inputs
    // mostly share labels (random labels would agree 1/c of the time).
    let (train, _) = synthetic_classification(2, 3, 400, 0, 9);
    let Targets::Labels(l) = train.targets() else { unreachable!() };
    let x = train.x();
    let mut agree = 0;
    for i in 0..400 {
        let nearest = (0..400)
            .filter(|&j| j != i)
            .min_by(|&a, &b| {
                let da = (x[[a, 0]] - x[[i, 0]]).powi(2) + (x[[a, 1]] - x[[i, 1]]).powi(2);
                let db = (x[[b, 0]] - x[[i, 0]]).powi(2) + (x[[b, 1]] - x[[i, 1]]).powi(2);
                da.partial_cmp(&db).unwrap()
            })
            .unwrap();
        agree += (l[nearest] == l[i]) as usize;
    }
    assert!(agree > 360, "{agree} of 400 nearest neighbours agree");
}

// -------------------------------------------------- datasets and batches

/// Example `i` has input [i, -i] and label i (or value 10 i).
fn numbered(n: usize, values: bool) -> Dataset {
    let x = Array2::from_shape_fn((n, 2), |(i, j)| if j == 0 { i as f32 } else { -(i as f32) });
    let targets = if values { Targets::Values(Array2::from_shape_fn((n, 1), |(i, _)| 10.0 * i as f32)) } else { Targets::Labels((0..n as u32).collect()) };
    Dataset::new(x, targets).unwrap()
}

/// The example ids of a batch of `numbered` data, checking that inputs and
/// targets stayed together.
fn ids(b: &Batch) -> Vec<usize> {
    let ids: Vec<usize> = b.x.column(0).iter().map(|&v| v as usize).collect();
    for (r, &i) in ids.iter().enumerate() {
        assert_eq!(b.x[[r, 1]], -(i as f32));
    }
    match &b.targets {
        Targets::Labels(l) => assert_eq!(l.iter().map(|&l| l as usize).collect::<Vec<_>>(), ids),
        Targets::Values(v) => assert_eq!(v.column(0).iter().map(|&v| (v / 10.0) as usize).collect::<Vec<_>>(), ids),
    }
    ids
}

#[test]
fn dataset_new_rejects_mismatched_lengths() {
    let err = Dataset::new(Array2::zeros((3, 2)), Targets::Labels(vec![0, 1])).unwrap_err();
    assert!(matches!(err, DataError::LengthMismatch { inputs: 3, targets: 2 }), "{err:?}");
    assert!(err.to_string().contains("3 input rows but 2 targets"));
}

/// Every shard of an epoch, as the dispatcher would hand them out.
fn epoch_ids(set: &InMemoryTrainingSet, plan: &ShardPlan, epoch: u64, batch: usize) -> Vec<usize> {
    let mut all = Vec::new();
    for index in plan.epoch_order(epoch) {
        let batches: Vec<Batch> = set.shard_batches(plan, ShardId { epoch, index }, batch).collect();
        let sizes: Vec<usize> = batches.iter().map(Batch::len).collect();
        let n = plan.shard_examples(index) as usize;
        assert_eq!(sizes.iter().sum::<usize>(), n, "shard {index} holds its examples");
        assert!(sizes.iter().rev().skip(1).all(|&s| s == batch), "only a shard's last batch may be short: {sizes:?}");
        for b in &batches {
            all.extend(ids(b));
        }
    }
    all
}

#[test]
fn an_epoch_of_shards_visits_every_example_once() {
    // (examples, shard_size, batch_size)
    for (n, size, batch) in [(1, 1, 1), (10, 3, 2), (101, 10, 1), (100, 100, 7), (7, 10, 3), (60, 20, 20)] {
        let set = InMemoryTrainingSet::new(numbered(n, n % 2 == 0));
        assert_eq!(set.num_examples(), n);
        let plan = ShardPlan::new(n as u64, size, 3, None).unwrap();
        let first = epoch_ids(&set, &plan, 0, batch);
        let mut sorted = first.clone();
        sorted.sort();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n={n} size={size} batch={batch}");
        assert_eq!(first, epoch_ids(&set, &plan, 0, batch), "deterministic");
        if n > 5 {
            assert_ne!(first, epoch_ids(&set, &plan, 1, batch), "every epoch in a new order");
            assert_ne!(first, (0..n).collect::<Vec<_>>(), "shuffled");
        }
    }
}

#[test]
fn head_and_to_batch() {
    let d = numbered(5, true);
    assert_eq!(ids(&d.head(3)), [0, 1, 2]);
    assert_eq!(ids(&d.head(50)), [0, 1, 2, 3, 4]);
    assert!(d.head(0).is_empty());
    assert_eq!(d.to_batch().x, *d.x());
    assert_eq!(ids(&d.select(&[4, 0, 4])), [4, 0, 4]);
}

#[test]
fn sampler_epochs_visit_every_example_once_in_a_new_order() {
    let d = numbered(12, false);
    let mut s = Sampler::new(d, 4, 1);
    let epoch = |s: &mut Sampler| -> Vec<usize> { (0..3).flat_map(|_| ids(&s.next_batch())).collect() };
    let e1 = epoch(&mut s);
    assert_eq!(s.epochs(), 0);
    let e2 = epoch(&mut s);
    assert_eq!(s.epochs(), 1);
    for e in [&e1, &e2] {
        let mut sorted = e.clone();
        sorted.sort();
        assert_eq!(sorted, (0..12).collect::<Vec<_>>());
    }
    assert_ne!(e1, (0..12).collect::<Vec<_>>(), "shuffled");
    assert_ne!(e1, e2, "reshuffled each epoch");
}

#[test]
fn sampler_is_deterministic_given_the_seed() {
    let take = |seed| Sampler::new(numbered(50, true), 7, seed).take(20).map(|b| ids(&b)).collect::<Vec<_>>();
    assert_eq!(take(5), take(5));
    assert_ne!(take(5), take(6));
}

#[test]
fn sampler_batches_are_always_full() {
    // (examples, batch size)
    for (n, b) in [(10, 3), (10, 10), (3, 8), (1, 1), (1, 5)] {
        let mut s = Sampler::new(numbered(n, false), b, 2);
        let mut counts = vec![0usize; n];
        let batches = 3 * n;
        for _ in 0..batches {
            let batch = s.next_batch();
            assert_eq!(batch.len(), b, "n={n} b={b}");
            for i in ids(&batch) {
                counts[i] += 1;
            }
        }
        // Every example is used as often as every other, give or take the partial epoch.
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(max - min <= 1, "n={n} b={b}: {counts:?}");
    }
}

#[test]
fn a_sampler_over_nothing_yields_empty_batches() {
    let mut s = Sampler::new(numbered(0, false), 4, 0);
    let b = s.next_batch();
    assert!(b.is_empty());
    assert_eq!(b.x.ncols(), 2);
}

proptest! {
    #[test]
    fn shards_partition_any_dataset(n in 1usize..300, size in 1u64..40, batch in 1usize..20, epoch in 0u64..5) {
        let set = InMemoryTrainingSet::new(numbered(n, false));
        let plan = ShardPlan::new(n as u64, size, epoch * 7, None).unwrap();
        let mut seen = vec![0u8; n];
        for i in epoch_ids(&set, &plan, epoch, batch) {
            seen[i] += 1;
        }
        prop_assert!(seen.iter().all(|&c| c == 1));
    }

    #[test]
    fn one_epoch_of_any_size_is_a_permutation(n in 1usize..200, batch in 1usize..50, seed in any::<u64>()) {
        let mut s = Sampler::new(numbered(n, false), batch, seed);
        let mut all: Vec<usize> = Vec::new();
        while all.len() < n {
            all.extend(ids(&s.next_batch()));
        }
        all.truncate(n);
        all.sort();
        prop_assert_eq!(all, (0..n).collect::<Vec<_>>());
    }
}

// ------------------------------------------------------------- sparse rows

#[test]
fn a_batchs_rows_are_sorted_unique_with_each_keys_slot_computed_once_per_bucket_count() {
    let f = SparseFeatures { offsets: vec![0, 3, 5], fields: vec![0; 5], keys: vec![7, 3, 17, 3, 10], values: vec![1.0; 5], ..Default::default() };
    // (buckets) -> (rows, slot of each key)
    let cases: [(u64, &[i64], &[usize]); 4] = [
        (100, &[3, 7, 10, 17], &[1, 0, 3, 0, 2]),
        (10, &[0, 3, 7], &[2, 1, 2, 1, 0]),
        (5, &[0, 2, 3], &[1, 2, 1, 2, 0]),
        (100, &[3, 7, 10, 17], &[1, 0, 3, 0, 2]),
    ];
    for (buckets, rows, slots) in cases {
        let got = f.batch_rows(buckets);
        assert_eq!((&got.rows[..], &got.slots[..]), (rows, slots), "{buckets} buckets");
    }
    // The first count asked is kept, borrowed; another is computed each time.
    assert!(matches!(f.batch_rows(100), std::borrow::Cow::Borrowed(_)));
    assert!(matches!(f.batch_rows(10), std::borrow::Cow::Owned(_)));
    // A clone whose keys change computes its own rows, and memos never make batches unequal.
    let mut other = f.clone();
    assert_eq!(other, f);
    other.keys[0] = 55;
    assert_eq!(other.batch_rows(100).rows, [3, 10, 17, 55]);
    assert_eq!(f.batch_rows(100).rows, [3, 7, 10, 17]);
    // No keys, no rows.
    assert_eq!(BatchRows::of(&[], 100), BatchRows::default());
}

proptest! {
    /// The one sort of (row, position) pairs gives what sorting the distinct rows and a binary
    /// search per key give; also for tables too large for the packed pairs.
    #[test]
    fn batch_rows_are_the_sorted_distinct_rows_and_each_keys_place_among_them(
        keys in proptest::collection::vec(any::<u64>(), 0..300),
        buckets in prop_oneof![1u64..50, 1u64..(1 << 20), Just(1u64 << 32), (1u64 << 32) + 1..u64::MAX],
    ) {
        let got = BatchRows::of(&keys, buckets);
        let mut rows: Vec<i64> = keys.iter().map(|&k| (k % buckets) as i64).collect();
        rows.sort_unstable();
        rows.dedup();
        let slots: Vec<usize> = keys.iter().map(|&k| rows.binary_search(&((k % buckets) as i64)).unwrap()).collect();
        prop_assert_eq!(got, BatchRows { rows, slots });
    }
}

#[test]
fn libsvm_values_of_one_read_as_the_float_parser_reads_them() {
    for line in ["1 3:1 5:1.0 9:1e0 12:0.5", "0 1:1 2:10 3:-1"] {
        let e = SparseFormat::Libsvm.parse(line).unwrap().unwrap();
        let want: Vec<f32> = line.split_ascii_whitespace().skip(1).map(|t| t.split_once(':').unwrap().1.parse().unwrap()).collect();
        assert_eq!(e.features.iter().map(|f| f.value).collect::<Vec<_>>(), want, "{line}");
        assert_eq!(e.features.capacity(), want.len(), "{line}: one allocation");
    }
}

#[test]
fn rows_at_gives_what_select_gives() {
    let x = ndarray::Array2::from_shape_fn((5, 3), |(r, c)| (r * 10 + c) as f32);
    let mut transposed = ndarray::Array2::<f32>::zeros(ndarray::ShapeBuilder::f((5, 3))); // same values, column-major
    transposed.assign(&x);
    assert!(transposed.as_slice().is_none());
    let cases: [&[usize]; 5] = [&[], &[0], &[4, 0, 4], &[1, 2, 3, 4, 0], &[3, 3, 3]];
    for indices in cases {
        for a in [&x, &transposed] {
            assert_eq!(crate::data::rows_at(a, indices), a.select(ndarray::Axis(0), indices), "{indices:?}");
        }
    }
    let empty = ndarray::Array2::<f32>::zeros((4, 0));
    assert_eq!(crate::data::rows_at(&empty, &[3, 1]).dim(), (2, 0));
}

#[test]
#[should_panic(expected = "row 5 of an array of 5 rows")]
fn rows_at_refuses_a_row_past_the_end() {
    let x = ndarray::Array2::<f32>::zeros((5, 2));
    crate::data::rows_at(&x, &[0, 5]);
}

/// `select` copies each picked example's (field, key, value) in order, also over batches longer
/// than the distance it asks the cache ahead, with repeats and examples without features.
#[test]
fn sparse_select_copies_the_picked_examples_in_order() {
    // Example i has i % 4 features: (i, 100 i + j, i + j / 10).
    let mut f = SparseFeatures { offsets: vec![0], num_fields: 3, ..Default::default() };
    for i in 0..40usize {
        for j in 0..i % 4 {
            f.fields.push(i as u32);
            f.keys.push((100 * i + j) as u64);
            f.values.push(i as f32 + j as f32 / 10.0);
        }
        f.offsets.push(f.keys.len());
    }
    let cases: [&[usize]; 5] = [&[], &[0], &[39, 4, 0, 4], &[3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 2, 1], &[1; 20]];
    for picked in cases {
        let s = f.select(picked);
        assert_eq!(s.offsets.len(), picked.len() + 1, "{picked:?}");
        assert_eq!(s.num_fields, 3);
        for (n, &i) in picked.iter().enumerate() {
            assert_eq!(s.example(n).collect::<Vec<_>>(), f.example(i).collect::<Vec<_>>(), "{picked:?}: example {n} is {i}");
        }
    }
}
