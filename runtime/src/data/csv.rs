//! Tabular data: CSV with a header line, plain or gzipped (told apart by
//! the first bytes), read with the `csv` crate. One column holds the label
//! (`--label_column`, `label` by default); the features are the other
//! columns or those `--feature_columns` names, all numeric. Errors name the
//! file, the line and the column.

use std::path::Path;

use ndarray::Array2;

use super::batch::Targets;
use super::dataset::DataError;
use super::idx::read_bytes;

/// The label column when `--label_column` is not given.
pub const DEFAULT_LABEL_COLUMN: &str = "label";

/// What the label column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelKind {
    /// Class numbers `0, 1, 2, ...` (`3.0` is read as 3).
    Classes,
    /// Numbers, for regression.
    Values,
}

/// How to read a CSV file.
#[derive(Debug, Clone, PartialEq)]
pub struct CsvOptions {
    /// `None`: [`DEFAULT_LABEL_COLUMN`].
    pub label_column: Option<String>,
    /// `None`: every column but the label.
    pub feature_columns: Option<Vec<String>>,
    pub labels: LabelKind,
    /// Classes must be below this.
    pub num_classes: Option<usize>,
    /// Whether a file without the label column is an error (training,
    /// evaluation) or has no targets (prediction: the label column is
    /// then not a feature either when present).
    pub labels_required: bool,
}

/// The examples of a CSV file.
#[derive(Debug, Clone, PartialEq)]
pub struct CsvData {
    pub x: Array2<f32>,
    /// `None` when the file has no label column and none was required.
    pub targets: Option<Targets>,
    /// The feature columns, in the order of `x`'s columns.
    pub feature_columns: Vec<String>,
}

fn csv_err(path: &Path, line: u64, reason: impl Into<String>) -> DataError {
    DataError::Csv { path: path.to_path_buf(), line, reason: reason.into() }
}

/// Reads `path` per `opts`.
pub fn read_csv(path: impl AsRef<Path>, opts: &CsvOptions) -> Result<CsvData, DataError> {
    let path = path.as_ref();
    let bytes = read_bytes(path)?;
    let mut reader = csv::ReaderBuilder::new().has_headers(true).trim(csv::Trim::All).from_reader(bytes.as_slice());
    let header: Vec<String> = reader.headers().map_err(|e| csv_err(path, 1, e.to_string()))?.iter().map(str::to_string).collect();
    let (features, label) = columns(path, &header, opts)?;
    let mut values = Vec::new();
    let mut labels = Vec::new();
    let mut targets = Vec::new();
    let mut rows = 0usize;
    for record in reader.records() {
        let record = record.map_err(|e| csv_err(path, e.position().map_or(0, |p| p.line()), e.to_string()))?;
        let line = record.position().map_or(0, |p| p.line());
        if record.len() != header.len() {
            return Err(csv_err(path, line, format!("{} fields, the header has {}", record.len(), header.len())));
        }
        for &c in &features {
            values.push(number(path, line, &header[c], &record[c])?);
        }
        if let Some(c) = label {
            let cell = &record[c];
            match opts.labels {
                LabelKind::Values => targets.push(number(path, line, &header[c], cell)?),
                LabelKind::Classes => labels.push(class(path, line, &header[c], cell, opts.num_classes)?),
            }
        }
        rows += 1;
    }
    let x = Array2::from_shape_vec((rows, features.len()), values).expect("one value per feature per row");
    let targets = label.map(|_| match opts.labels {
        LabelKind::Classes => Targets::Labels(labels),
        LabelKind::Values => Targets::Values(Array2::from_shape_vec((rows, 1), targets).expect("one target per row")),
    });
    Ok(CsvData { x, targets, feature_columns: features.iter().map(|&c| header[c].clone()).collect() })
}

/// The indices of the feature columns and of the label column.
fn columns(path: &Path, header: &[String], opts: &CsvOptions) -> Result<(Vec<usize>, Option<usize>), DataError> {
    let header_err = |reason: String| DataError::CsvHeader { path: path.to_path_buf(), reason };
    if header.iter().all(|h| h.is_empty()) {
        return Err(header_err("the file is empty or its first line is blank".into()));
    }
    if let Some((i, h)) = header.iter().enumerate().find(|(i, h)| header[..*i].contains(*h)) {
        return Err(header_err(format!("column {} is named {h:?} like an earlier one", i + 1)));
    }
    let find = |name: &str| header.iter().position(|h| h == name);
    let listing = || header.join(", ");
    let label_name = opts.label_column.as_deref().unwrap_or(DEFAULT_LABEL_COLUMN);
    let label = match find(label_name) {
        Some(i) => Some(i),
        None if opts.labels_required => {
            return Err(header_err(format!("no label column {label_name:?} (--label_column; the columns are {})", listing())));
        }
        None => None,
    };
    let features = match &opts.feature_columns {
        Some(names) => names
            .iter()
            .map(|n| match find(n) {
                Some(i) if Some(i) == label => Err(header_err(format!("--feature_columns names the label column {n:?}"))),
                Some(i) => Ok(i),
                None => Err(header_err(format!("--feature_columns: no column {n:?} (the columns are {})", listing()))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => (0..header.len()).filter(|&i| Some(i) != label).collect(),
    };
    if features.is_empty() {
        return Err(header_err(format!("no feature columns besides the label {label_name:?}")));
    }
    Ok((features, label))
}

fn number(path: &Path, line: u64, column: &str, cell: &str) -> Result<f32, DataError> {
    match cell.parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(csv_err(path, line, format!("column {column:?}: {cell:?} is not a finite number"))),
    }
}

fn class(path: &Path, line: u64, column: &str, cell: &str, num_classes: Option<usize>) -> Result<u32, DataError> {
    let c = cell.parse::<f64>().ok().filter(|v| *v >= 0.0 && v.fract() == 0.0 && *v <= u32::MAX as f64);
    let Some(c) = c else {
        return Err(csv_err(path, line, format!("column {column:?}: {cell:?} is not a class number (0, 1, 2, ...)")));
    };
    if let Some(n) = num_classes.filter(|&n| c as usize >= n) {
        return Err(csv_err(path, line, format!("column {column:?}: class {c} is out of range 0..{n} (--num_classes)")));
    }
    Ok(c as u32)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn file(dir: &Path, name: &str, text: &str, gzip: bool) -> std::path::PathBuf {
        let path = dir.join(name);
        let bytes = if gzip {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            enc.write_all(text.as_bytes()).unwrap();
            enc.finish().unwrap()
        } else {
            text.as_bytes().to_vec()
        };
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn opts() -> CsvOptions {
        CsvOptions { label_column: None, feature_columns: None, labels: LabelKind::Classes, num_classes: None, labels_required: true }
    }

    #[test]
    fn reads_features_and_labels_plain_or_gzipped() {
        let dir = tempfile::tempdir().unwrap();
        let text = "a, label ,b\n1,2,3.5\n-4,0,5e-1\n7,1.0,8\n";
        for gzip in [false, true] {
            let path = file(dir.path(), if gzip { "x.csv.gz" } else { "x.csv" }, text, gzip);
            let d = read_csv(&path, &opts()).unwrap();
            assert_eq!(d.x, ndarray::arr2(&[[1.0f32, 3.5], [-4.0, 0.5], [7.0, 8.0]]));
            assert_eq!(d.targets, Some(Targets::Labels(vec![2, 0, 1])));
            assert_eq!(d.feature_columns, ["a", "b"]);
        }
        let path = file(dir.path(), "y.csv", text, false);
        // Chosen feature columns, in the order given; the label as a value.
        let o = CsvOptions { feature_columns: Some(vec!["b".into()]), labels: LabelKind::Values, ..opts() };
        let d = read_csv(&path, &o).unwrap();
        assert_eq!(d.x, ndarray::arr2(&[[3.5f32], [0.5], [8.0]]));
        assert_eq!(d.targets, Some(Targets::Values(ndarray::arr2(&[[2.0f32], [0.0], [1.0]]))));
        // Another label column; without labels required, a file without the column has none.
        let o = CsvOptions { label_column: Some("a".into()), labels: LabelKind::Values, ..opts() };
        assert_eq!(read_csv(&path, &o).unwrap().feature_columns, ["label", "b"]);
        let unlabelled = file(dir.path(), "u.csv", "p,q\n1,2\n", false);
        let d = read_csv(&unlabelled, &CsvOptions { labels_required: false, ..opts() }).unwrap();
        assert_eq!((d.x.dim(), d.targets), ((1, 2), None));
    }

    #[test]
    fn errors_name_the_file_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        // (case, text, options, words of the error)
        let cases: Vec<(&str, &str, CsvOptions, &str)> = vec![
            ("not a number", "a,label\n1,0\nx,1\n", opts(), "line 3: column \"a\": \"x\" is not a finite number"),
            ("empty cell", "a,label\n1,0\n,1\n", opts(), "line 3: column \"a\": \"\""),
            ("infinite", "a,label\ninf,0\n", opts(), "line 2: column \"a\": \"inf\""),
            ("not a class", "a,label\n1,setosa\n", opts(), "line 2: column \"label\": \"setosa\" is not a class number"),
            ("negative class", "a,label\n1,-1\n", opts(), "\"-1\" is not a class number"),
            ("fractional class", "a,label\n1,0.5\n", opts(), "\"0.5\" is not a class number"),
            (
                "class out of range",
                "a,label\n1,0\n1,3\n",
                CsvOptions { num_classes: Some(3), ..opts() },
                "line 3: column \"label\": class 3 is out of range 0..3",
            ),
            ("short row", "a,b,label\n1,2,0\n1,0\n", opts(), "line 3"),
            ("no label column", "a,b\n1,2\n", opts(), "header: no label column \"label\" (--label_column; the columns are a, b)"),
            ("named label column missing", "a,b\n1,2\n", CsvOptions { label_column: Some("y".into()), ..opts() }, "no label column \"y\""),
            ("unknown feature", "a,label\n1,2\n", CsvOptions { feature_columns: Some(vec!["z".into()]), ..opts() }, "--feature_columns: no column \"z\""),
            ("feature is the label", "a,label\n1,2\n", CsvOptions { feature_columns: Some(vec!["label".into()]), ..opts() }, "names the label column"),
            ("only a label", "label\n1\n", opts(), "no feature columns"),
            ("duplicate column", "a,a,label\n1,2,0\n", opts(), "column 2 is named \"a\""),
            ("empty file", "", opts(), "header"),
        ];
        for (case, text, o, words) in cases {
            let path = file(dir.path(), "bad.csv", text, false);
            let err = read_csv(&path, &o).expect_err(case).to_string();
            assert!(err.contains(words), "{case}: {err:?} lacks {words:?}");
            assert!(err.contains(&path.display().to_string()), "{case}: {err} names the file");
        }
    }
}
