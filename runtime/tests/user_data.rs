//! No panic on user data: CSV, IDX, libsvm and Criteo files made of
//! random (mostly near-valid) contents go through the whole path a task
//! takes (reading the files, building the model, a few training steps, the
//! final evaluation) and `predict`'s reading of `--input`. Each either works
//! or stops with an error; none panics.

use std::path::Path;

use proptest::prelude::*;
use tfjob_runtime::data::{DataFormat, DataOptions, LabelKind, SparseFormat, read_input};
use tfjob_runtime::train::{TrainSettings, train_single_process};
use tfjob_runtime::workload::{self, KerasOptions, SparseOptions, WorkloadSpec};

/// Builds the workload of `spec` and, when that works, trains it for a few
/// steps (the final evaluation included). Errors are fine; a panic fails
/// the property.
fn train_briefly(spec: &WorkloadSpec) {
    let Ok(mut w) = workload::build(spec) else { return };
    let settings = TrainSettings { train_steps: Some(3), log_every_steps: 1, ..Default::default() };
    let _ = train_single_process(&mut w, &settings, |_, _, _, _| {});
}

/// The Keras model of the fixture `name` (a Keras 3 `model.to_json()`);
/// none for a built-in model.
fn keras(name: &str) -> KerasOptions {
    let file = match name {
        "tabular" | "regression" | "binary" | "cnn" => name,
        "mlp.keras" => "mlp",
        _ => return KerasOptions::default(),
    };
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/keras/{file}.keras3.json"));
    KerasOptions { model_file: Some(file), ..Default::default() }
}

fn spec(model: &str, dir: &Path) -> WorkloadSpec {
    let model = if keras(model).model_file.is_some() { "linear" } else { model };
    WorkloadSpec { model: model.into(), batch_size: Some(4), data_dir: Some(dir.to_path_buf()), seed: 3, eval_examples: 50, ..Default::default() }
}

/// A CSV cell: mostly a class number or a number, sometimes not.
fn cell() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0u8..4).prop_map(|c| c.to_string()),
        6 => (-1e3f32..1e3).prop_map(|v| v.to_string()),
        1 => prop::sample::select(vec!["", "nan", "inf", "-inf", "1e39", "-0", "2.5", "x", "\"1\"", " 1 ", "1e", "4294967296", "-1"]).prop_map(String::from),
    ]
}

/// A CSV header: mostly the label and a few features in any order,
/// sometimes without the label, with a repeat or a blank name.
fn csv_header() -> impl Strategy<Value = Vec<String>> {
    let usual = Just(vec!["label", "a", "b", "c"]).prop_shuffle().prop_flat_map(|cols| (1usize..=4).prop_map(move |n| cols[..n].to_vec()));
    let odd = prop::collection::vec(prop::sample::select(vec!["label", "a", "b", "", "a b", "\"label\""]), 0..5);
    prop_oneof![8 => usual, 1 => odd].prop_map(|cols| cols.into_iter().map(String::from).collect())
}

/// A CSV file: a header, then rows of its width (a few of another).
fn csv_file(header: impl Strategy<Value = Vec<String>>) -> impl Strategy<Value = String> {
    (header, any::<bool>())
        .prop_flat_map(|(names, crlf)| {
            let width = names.len();
            let row = prop_oneof![12 => prop::collection::vec(cell(), width..=width), 1 => prop::collection::vec(cell(), 0..6)];
            (Just(names), prop::collection::vec(row, 0..16), Just(crlf))
        })
        .prop_map(|(names, rows, crlf)| {
            let end = if crlf { "\r\n" } else { "\n" };
            let mut out = names.join(",") + end;
            for row in rows {
                out += &(row.join(",") + end);
            }
            out
        })
}

/// A train.csv and, mostly, a test.csv: with the same columns (reordered
/// or not), other columns, or none.
fn csv_files() -> impl Strategy<Value = (String, Option<String>)> {
    csv_header()
        .prop_flat_map(|names| {
            let same = Just(names.clone()).prop_shuffle();
            let test = prop_oneof![4 => same.prop_map(Some), 1 => csv_header().prop_map(Some), 1 => Just(None)];
            (csv_file(Just(names)), test)
        })
        .prop_flat_map(|(train, test)| {
            (
                Just(train),
                match test {
                    Some(h) => csv_file(Just(h)).prop_map(Some).boxed(),
                    None => Just(None).boxed(),
                },
            )
        })
}

/// An IDX file of `count` examples of `shape` (none for labels): mostly
/// well-formed, sometimes with a wrong magic, a count off by one, a byte
/// too many or too few; labels mostly below 10.
fn idx_file(count: u32, shape: Vec<u32>) -> impl Strategy<Value = Vec<u8>> {
    let flaw = prop_oneof![8 => Just(0u8), 1 => 1u8..5];
    (flaw, prop::collection::vec(prop_oneof![9 => 0u8..10, 1 => any::<u8>()], 0..1)).prop_flat_map(move |(flaw, _)| {
        let mut dims = vec![if flaw == 2 { count + 1 } else { count }];
        dims.extend(&shape);
        let ndim = dims.len() as u8;
        let size = dims.iter().map(|&d| d as usize).product::<usize>();
        let bytes = if shape.is_empty() { prop_oneof![9 => 0u8..10, 1 => any::<u8>()].boxed() } else { any::<u8>().boxed() };
        prop::collection::vec(bytes, size..=size).prop_map(move |data| {
            let mut out = vec![0, 0, 8, if flaw == 1 { ndim + 1 } else { ndim }];
            dims.iter().for_each(|d| out.extend(d.to_be_bytes()));
            out.extend(data);
            match flaw {
                3 => out.push(0),
                4 => drop(out.pop()),
                _ => {}
            }
            out
        })
    })
}

/// The four files of an IDX data directory: train and test images (of
/// the same shape, or not) and their labels.
fn idx_dir() -> impl Strategy<Value = [Vec<u8>; 4]> {
    let shape = prop::collection::vec(1u32..5, 1..=3);
    (shape.clone(), prop_oneof![4 => Just(None), 1 => shape.prop_map(Some)], 0u32..12, 0u32..6).prop_flat_map(|(shape, test_shape, n, m)| {
        let test_shape = test_shape.unwrap_or_else(|| shape.clone());
        (idx_file(n, shape), idx_file(n, vec![]), idx_file(m, test_shape), idx_file(m, vec![])).prop_map(|(a, b, c, d)| [a, b, c, d])
    })
}

/// A libsvm line: a label and index:value tokens, now and then a wrong one.
fn libsvm_line() -> impl Strategy<Value = String> {
    let label = prop_oneof![8 => prop::sample::select(vec!["1", "0", "-1", "+1"]), 1 => prop::sample::select(vec!["2", "0.5", "x", "", "nan"])];
    let token = prop_oneof![
        12 => (0u64..20, -5f32..5.0).prop_map(|(i, v)| format!("{i}:{v}")),
        1 => prop::sample::select(vec!["qid:3", "1", ":", "x:1", "-1:1", "3:nan", "3:", "# comment", "18446744073709551615:1"]).prop_map(String::from),
    ];
    (label, prop::collection::vec(token, 0..6)).prop_map(|(l, t)| format!("{l} {}", t.join(" ")))
}

/// A Criteo line: 40 tab-separated fields, now and then a few more or fewer.
fn criteo_line() -> impl Strategy<Value = String> {
    let field = prop::sample::select(vec!["", "0", "1", "-3", "12", "1.5", "abc", "68fd1e64", "x y"]);
    let label = prop_oneof![8 => prop::sample::select(vec!["0", "1"]), 1 => prop::sample::select(vec!["2", ""])];
    let fields = prop_oneof![8 => prop::collection::vec(field.clone(), 39..=39), 1 => prop::collection::vec(field, 36..43)];
    (label, fields).prop_map(|(l, f)| format!("{l}\t{}", f.join("\t")))
}

fn write(dir: &Path, name: &str, bytes: impl AsRef<[u8]>) {
    std::fs::write(dir.join(name), bytes).expect("write");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn csv_files_never_panic((train, test) in csv_files(), model in prop::sample::select(vec!["softmax", "mlp", "tabular", "regression", "binary"])) {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "train.csv", &train);
        if let Some(test) = &test {
            write(dir.path(), "test.csv", test);
        }
        let data = DataOptions { format: Some(DataFormat::Csv), ..Default::default() };
        train_briefly(&WorkloadSpec { data: data.clone(), keras: keras(model), ..spec(model, dir.path()) });
        let _ = read_input(&dir.path().join("train.csv"), None, &data, LabelKind::Classes, false);
    }

    #[test]
    fn idx_files_never_panic(
        [images, labels, test_images, test_labels] in idx_dir(), model in prop::sample::select(vec!["softmax", "mlp", "cnn", "mlp.keras"]),
    ) {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "train-images-idx3-ubyte", &images);
        write(dir.path(), "train-labels-idx1-ubyte", &labels);
        write(dir.path(), "t10k-images-idx3-ubyte", &test_images);
        write(dir.path(), "t10k-labels-idx1-ubyte", &test_labels);
        train_briefly(&WorkloadSpec { keras: keras(model), ..spec(model, dir.path()) });
        let images = dir.path().join("t10k-images-idx3-ubyte");
        let _ = read_input(&images, Some(&dir.path().join("t10k-labels-idx1-ubyte")), &DataOptions::default(), LabelKind::Classes, true);
    }

    #[test]
    fn sparse_files_never_panic(
        criteo in any::<bool>(), libsvm in prop::collection::vec(libsvm_line(), 0..12),
        criteos in prop::collection::vec(criteo_line(), 0..12), skip_bad_lines in any::<bool>(),
    ) {
        let lines = if criteo { criteos } else { libsvm };
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "train.txt", lines.join("\n"));
        write(dir.path(), "eval.txt", lines.iter().rev().cloned().collect::<Vec<_>>().join("\n"));
        let format = if criteo { SparseFormat::Criteo } else { SparseFormat::Libsvm };
        let sparse = SparseOptions {
            format: Some(format),
            train_files: Some(dir.path().join("train.txt").display().to_string()),
            eval_files: Some(dir.path().join("eval.txt").display().to_string()),
            skip_bad_lines,
            hash_buckets: 64,
            ..Default::default()
        };
        let model = if criteo { "wide_deep" } else { "sparse_lr" };
        train_briefly(&WorkloadSpec { sparse, data_dir: None, ..spec(model, dir.path()) });
    }
}
