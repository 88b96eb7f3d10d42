//! Where a task's data comes from: `--data_format` (`idx` or `csv`) and the
//! files of `--data_dir`, or one `--input` file for `predict`/`evaluate`.
//!
//! - `idx`: the four files named as MNIST's ([`MNIST_FILES`](super::idx::MNIST_FILES)),
//!   images of any size, labels `0..=255`.
//! - `csv`: `train.csv` and, if present, `test.csv` (each plain or `.gz`);
//!   without `test.csv`, evaluation uses the training set (and says so).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::batch::Targets;
use super::csv::{CsvData, CsvOptions, LabelKind, read_csv};
use super::dataset::{DataError, Dataset};
use super::idx::{find, load_idx_dir, read_bytes, read_idx_examples, read_idx_labels};

/// `--data_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataFormat {
    #[default]
    Idx,
    Csv,
}

impl DataFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            DataFormat::Idx => "idx",
            DataFormat::Csv => "csv",
        }
    }

    /// IDX when the (gunzipped) content starts with an unsigned-byte IDX
    /// magic number, else CSV.
    pub fn detect(path: &Path) -> Result<DataFormat, DataError> {
        let bytes = read_bytes(path)?;
        Ok(if bytes.len() >= 4 && bytes[..3] == [0, 0, 0x08] { DataFormat::Idx } else { DataFormat::Csv })
    }
}

impl fmt::Display for DataFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DataFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "idx" => Ok(DataFormat::Idx),
            "csv" => Ok(DataFormat::Csv),
            _ => Err(format!("unknown data format {s:?} (idx, csv)")),
        }
    }
}

/// The data flags besides `--data_dir`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DataOptions {
    /// `None`: IDX for `--data_dir`, detected from the content for `--input`.
    pub format: Option<DataFormat>,
    /// CSV only.
    pub label_column: Option<String>,
    /// CSV only.
    pub feature_columns: Option<Vec<String>>,
    /// Labels must be below it; `None`: the classes come from the data.
    pub num_classes: Option<usize>,
}

impl DataOptions {
    fn csv(&self, labels: LabelKind, labels_required: bool) -> CsvOptions {
        CsvOptions {
            label_column: self.label_column.clone(),
            feature_columns: self.feature_columns.clone(),
            labels,
            num_classes: self.num_classes,
            labels_required,
        }
    }

    fn idx_classes(&self) -> Option<u32> {
        self.num_classes.map(|n| n.min(u32::MAX as usize) as u32)
    }
}

/// A training set and a held-out set.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingData {
    pub train: Dataset,
    pub test: Dataset,
    /// The file the training set came from (for messages).
    pub train_file: PathBuf,
    pub test_file: PathBuf,
    /// One example's shape when the files know it (IDX images: `[rows, cols]`).
    pub example_shape: Option<Vec<usize>>,
}

impl TrainingData {
    /// The number of classes of labelled data: `--num_classes` if given,
    /// else the largest label of either set plus one.
    pub fn num_classes(&self, opts: &DataOptions) -> Option<usize> {
        opts.num_classes.or_else(|| self.train.num_classes().max(self.test.num_classes()))
    }
}

/// Reads the training and held-out sets of `dir` in the format of `opts`.
pub fn load_training_data(dir: &Path, opts: &DataOptions, labels: LabelKind) -> Result<TrainingData, DataError> {
    let data = match opts.format.unwrap_or_default() {
        DataFormat::Idx => {
            let sets = load_idx_dir(dir, opts.idx_classes())?;
            let [train_file, _, test_file, _] = sets.files;
            let (train, test) = match labels {
                LabelKind::Classes => (sets.train, sets.test),
                LabelKind::Values => (dataset_with_values(sets.train), dataset_with_values(sets.test)),
            };
            TrainingData { train, test, train_file, test_file, example_shape: Some(sets.example_shape) }
        }
        DataFormat::Csv => {
            let csv_opts = opts.csv(labels, true);
            let train_file = find(dir, "train.csv")?;
            let train = read_csv(&train_file, &csv_opts)?;
            if train.x.nrows() == 0 {
                return Err(DataError::NoExamples { path: train_file });
            }
            let (test, test_file) = match find(dir, "test.csv") {
                Ok(file) => (held_out_like(&train, &train_file, read_csv(&file, &csv_opts)?, &file, opts.num_classes)?, file),
                Err(DataError::Missing { .. }) => {
                    tracing::info!("{}: no test.csv: evaluating on the training set", dir.display());
                    (csv_dataset(train.clone())?, train_file.clone())
                }
                Err(e) => return Err(e),
            };
            TrainingData { train: csv_dataset(train)?, test, train_file, test_file, example_shape: None }
        }
    };
    if data.train.is_empty() {
        return Err(DataError::NoExamples { path: data.train_file });
    }
    Ok(data)
}

fn csv_dataset(data: CsvData) -> Result<Dataset, DataError> {
    Dataset::new(data.x, data.targets.expect("labels_required"))
}

/// The held-out set of `test.csv` as the model trained on `train.csv` sees
/// it: its feature columns matched to the training set's by name (in the
/// training set's order), and its labels among the training set's classes
/// unless `--num_classes` says how many there are. A column one file has
/// and the other lacks is an error naming it.
fn held_out_like(train: &CsvData, train_file: &Path, test: CsvData, test_file: &Path, num_classes: Option<usize>) -> Result<Dataset, DataError> {
    let header_err = |reason: String| DataError::CsvHeader { path: test_file.to_path_buf(), reason };
    let missing: Vec<&str> = train.feature_columns.iter().filter(|c| !test.feature_columns.contains(c)).map(String::as_str).collect();
    let extra: Vec<&str> = test.feature_columns.iter().filter(|c| !train.feature_columns.contains(c)).map(String::as_str).collect();
    if !missing.is_empty() || !extra.is_empty() {
        let list = |v: &[&str]| if v.is_empty() { "none".to_string() } else { v.join(", ") };
        return Err(header_err(format!(
            "its feature columns must be those of {} (matched by name): missing {}; not in {}: {}",
            train_file.display(),
            list(&missing),
            train_file.display(),
            list(&extra)
        )));
    }
    let order: Vec<usize> = train.feature_columns.iter().map(|c| test.feature_columns.iter().position(|t| t == c).expect("checked above")).collect();
    let x = test.x.select(ndarray::Axis(1), &order);
    let targets = test.targets.expect("labels_required");
    if let (Targets::Labels(test_labels), Some(Targets::Labels(train_labels)), None) = (&targets, &train.targets, num_classes) {
        let classes = train_labels.iter().max().map_or(0, |&m| m + 1);
        if let Some((index, &label)) = test_labels.iter().enumerate().find(|&(_, &l)| l >= classes) {
            // Not among the classes the model is trained for (give --num_classes if train.csv lacks some).
            return Err(DataError::LabelOutOfRange { path: test_file.to_path_buf(), index, label, num_classes: classes });
        }
    }
    Dataset::new(x, targets)
}

/// IDX labels as one column of values (for mse).
fn labels_as_values(t: Targets) -> Targets {
    match t {
        Targets::Labels(l) => Targets::Values(ndarray::Array2::from_shape_fn((l.len(), 1), |(i, _)| l[i] as f32)),
        values => values,
    }
}

fn dataset_with_values(d: Dataset) -> Dataset {
    let (x, targets) = d.into_parts();
    Dataset::new(x, labels_as_values(targets)).expect("same examples")
}

/// The examples of one input file for `predict` or `evaluate`.
#[derive(Debug, Clone, PartialEq)]
pub struct InputData {
    pub x: ndarray::Array2<f32>,
    /// From the CSV's label column or the IDX `labels` file, when there are some.
    pub targets: Option<Targets>,
    pub example_shape: Option<Vec<usize>>,
}

/// Reads `--input` (and, for IDX, the `labels` file): CSV or IDX images,
/// per `opts.format` or the content. With `labels_required` (`evaluate`), a
/// file without labels is an error; without it (`predict`), a labels file is.
/// A flag the input's format does not use is an error: `--labels` with CSV
/// (the labels are a column), `--label_column` and `--feature_columns` with
/// IDX.
pub fn read_input(path: &Path, labels_file: Option<&Path>, opts: &DataOptions, kind: LabelKind, labels_required: bool) -> Result<InputData, DataError> {
    let format = match opts.format {
        Some(f) => f,
        None => DataFormat::detect(path)?,
    };
    check_input_flags(path, format, labels_file.is_some(), opts, labels_required)?;
    match format {
        DataFormat::Csv => {
            let data = read_csv(path, &opts.csv(kind, labels_required))?;
            Ok(InputData { x: data.x, targets: data.targets, example_shape: None })
        }
        DataFormat::Idx => {
            let (x, shape) = read_idx_examples(path)?;
            let targets = match labels_file {
                Some(l) => {
                    let labels = read_idx_labels(l, opts.idx_classes().unwrap_or(u32::MAX))?;
                    if labels.len() != x.nrows() {
                        return Err(DataError::CountMismatch {
                            images_path: path.to_path_buf(),
                            labels_path: l.to_path_buf(),
                            images: x.nrows(),
                            labels: labels.len(),
                        });
                    }
                    let labels = Targets::Labels(labels);
                    Some(if kind == LabelKind::Values { labels_as_values(labels) } else { labels })
                }
                None if labels_required => return Err(DataError::NoLabels { path: path.to_path_buf() }),
                None => None,
            };
            Ok(InputData { x, targets, example_shape: Some(shape) })
        }
    }
}

/// The flags [`read_input`] rejects for `format` (see there).
fn check_input_flags(path: &Path, format: DataFormat, labels_file: bool, opts: &DataOptions, labels_required: bool) -> Result<(), DataError> {
    let unused = |flag: &'static str, reason: String| Err(DataError::UnusedFlag { flag, reason });
    if labels_file && !labels_required {
        return unused("labels", "goes with evaluate: predict reads no labels".into());
    }
    match format {
        DataFormat::Csv if labels_file => unused("labels", format!("goes with IDX images; {} is CSV, whose labels are its --label_column", path.display())),
        DataFormat::Idx if opts.label_column.is_some() => {
            unused("label_column", format!("goes with CSV; {} is IDX (labels come from --labels)", path.display()))
        }
        DataFormat::Idx if opts.feature_columns.is_some() => unused("feature_columns", format!("goes with CSV; {} is IDX images", path.display())),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_flags_the_format_does_not_use_are_errors() {
        let p = Path::new("in");
        let col = DataOptions { label_column: Some("y".into()), ..Default::default() };
        let feats = DataOptions { feature_columns: Some(vec!["a".into()]), ..Default::default() };
        let none = DataOptions::default();
        // (format, labels file, options, evaluate, Ok or the flag named)
        let cases: Vec<(DataFormat, bool, &DataOptions, bool, Option<&str>)> = vec![
            (DataFormat::Idx, true, &none, true, None),
            (DataFormat::Idx, false, &none, false, None),
            (DataFormat::Csv, false, &col, true, None),
            (DataFormat::Csv, false, &feats, false, None),
            (DataFormat::Csv, true, &none, true, Some("labels")),
            (DataFormat::Idx, true, &none, false, Some("labels")),
            (DataFormat::Csv, true, &none, false, Some("labels")),
            (DataFormat::Idx, true, &col, true, Some("label_column")),
            (DataFormat::Idx, false, &feats, false, Some("feature_columns")),
        ];
        for (format, labels, opts, evaluate, want) in cases {
            let got = check_input_flags(p, format, labels, opts, evaluate);
            match (got, want) {
                (Ok(()), None) => {}
                (Err(DataError::UnusedFlag { flag, .. }), Some(w)) => assert_eq!(flag, w, "{format} {labels} {opts:?} {evaluate}"),
                (got, want) => panic!("{format} {labels} {opts:?} {evaluate}: got {got:?}, want {want:?}"),
            }
        }
    }

    fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut out = vec![0, 0, 0x08, dims.len() as u8];
        dims.iter().for_each(|d| out.extend_from_slice(&d.to_be_bytes()));
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn idx_of_any_size_with_classes_from_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let w = |name: &str, bytes: Vec<u8>| std::fs::write(dir.path().join(name), bytes).unwrap();
        // 3 images of 2x5 pixels, 2 channels (idx4); labels up to 13.
        w("train-images-idx3-ubyte", idx(&[3, 2, 5, 2], &[7; 60]));
        w("train-labels-idx1-ubyte", idx(&[3], &[0, 13, 4]));
        w("t10k-images-idx3-ubyte", idx(&[1, 2, 5, 2], &[9; 20]));
        w("t10k-labels-idx1-ubyte", idx(&[1], &[2]));
        let opts = DataOptions::default();
        let d = load_training_data(dir.path(), &opts, LabelKind::Classes).unwrap();
        assert_eq!((d.train.len(), d.train.input_dim(), d.example_shape.as_deref()), (3, 20, Some(&[2, 5, 2][..])));
        assert_eq!(d.num_classes(&opts), Some(14));
        assert_eq!(d.num_classes(&DataOptions { num_classes: Some(20), ..opts.clone() }), Some(20));
        let err = load_training_data(dir.path(), &DataOptions { num_classes: Some(10), ..opts.clone() }, LabelKind::Classes).unwrap_err();
        assert!(err.to_string().contains("label 13 of example 1 is out of range 0..10"), "{err}");
        // For mse the labels are values.
        let d = load_training_data(dir.path(), &opts, LabelKind::Values).unwrap();
        assert_eq!(d.test.targets(), &Targets::Values(ndarray::arr2(&[[2.0f32]])));
        // --input: the format is detected from the content, labels from their own file.
        let images = dir.path().join("t10k-images-idx3-ubyte");
        let input = read_input(&images, Some(&dir.path().join("t10k-labels-idx1-ubyte")), &opts, LabelKind::Classes, true).unwrap();
        assert_eq!((input.x.dim(), input.targets), ((1, 20), Some(Targets::Labels(vec![2]))));
        assert!(read_input(&images, None, &opts, LabelKind::Classes, true).unwrap_err().to_string().contains("without labels"));
        assert_eq!(read_input(&images, None, &opts, LabelKind::Classes, false).unwrap().targets, None);
    }

    #[test]
    fn csv_train_and_optional_test_files() {
        let dir = tempfile::tempdir().unwrap();
        let opts = DataOptions { format: Some(DataFormat::Csv), ..Default::default() };
        let err = load_training_data(dir.path(), &opts, LabelKind::Classes).unwrap_err();
        assert!(err.to_string().contains("no train.csv"), "{err}");
        std::fs::write(dir.path().join("train.csv"), "x,label\n1,0\n2,1\n3,2\n").unwrap();
        let d = load_training_data(dir.path(), &opts, LabelKind::Classes).unwrap();
        assert_eq!(d.test, d.train, "without test.csv, evaluation uses the training set");
        assert_eq!(d.num_classes(&opts), Some(3));
        // A held-out label the training set does not have is an error, unless --num_classes
        // says how many classes there are.
        std::fs::write(dir.path().join("test.csv"), "x,label\n1,4\n").unwrap();
        let err = load_training_data(dir.path(), &opts, LabelKind::Classes).unwrap_err();
        assert!(err.to_string().contains("test.csv: label 4 of example 0 is out of range 0..3"), "{err}");
        let five = DataOptions { num_classes: Some(5), ..opts.clone() };
        let d = load_training_data(dir.path(), &five, LabelKind::Classes).unwrap();
        assert_eq!((d.test.len(), d.num_classes(&five)), (1, Some(5)));
        std::fs::write(dir.path().join("train.csv"), "x,label\n").unwrap();
        let err = load_training_data(dir.path(), &opts, LabelKind::Classes).unwrap_err();
        assert!(err.to_string().contains("train.csv: no examples"), "{err}");
        let input = dir.path().join("test.csv");
        assert_eq!(DataFormat::detect(&input).unwrap(), DataFormat::Csv);
        assert_eq!("CSV".parse::<DataFormat>(), Ok(DataFormat::Csv));
        assert!("parquet".parse::<DataFormat>().unwrap_err().contains("idx, csv"));
    }

    /// (case, train.csv, test.csv, Ok(held-out inputs) or what the error says)
    #[test]
    fn test_csv_columns_match_train_csv_by_name() {
        let train = "a,b,label\n1,10,0\n2,20,1\n";
        type HeldOut = Result<[[f32; 2]; 1], &'static str>;
        let cases: [(&str, &str, HeldOut); 5] = [
            ("same columns", "a,b,label\n3,30,1\n", Ok([[3.0, 30.0]])),
            ("reordered columns, matched by name", "label,b,a\n1,30,3\n", Ok([[3.0, 30.0]])),
            ("an extra column", "a,b,c,label\n3,30,300,1\n", Err("missing none; not in")),
            ("a missing column", "a,label\n3,1\n", Err("missing b;")),
            ("a renamed column", "a,B,label\n3,30,1\n", Err("missing b; not in")),
        ];
        let opts = DataOptions { format: Some(DataFormat::Csv), ..Default::default() };
        for (case, test_csv, want) in cases {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("train.csv"), train).unwrap();
            std::fs::write(dir.path().join("test.csv"), test_csv).unwrap();
            match (load_training_data(dir.path(), &opts, LabelKind::Classes), want) {
                (Ok(d), Ok(x)) => assert_eq!(d.test.x(), &ndarray::arr2(&x), "{case}"),
                (Err(e), Err(says)) => {
                    let e = e.to_string();
                    assert!(e.contains("test.csv: header: its feature columns must be those of") && e.contains(says), "{case}: {e}");
                }
                (got, want) => panic!("{case}: got {:?}, want {want:?}", got.map(|d| d.test)),
            }
        }
    }
}
