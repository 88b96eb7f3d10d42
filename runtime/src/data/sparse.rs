//! Sparse examples, the click-through way: `--data_format libsvm`
//! (`label idx:val idx:val ...`) and `--data_format criteo` (a label, 13
//! integer and 26 categorical tab-separated fields). Features are hashed:
//! a feature's key is a 64-bit hash of its field and its text, and a model
//! takes `key % --hash_buckets` as the row of its tables.
//!
//! Pure: one line in, one example (or why not) out.

use std::fmt;
use std::str::FromStr;

use ndarray::Array2;

use super::batch::{Batch, SparseFeatures, Targets};
use crate::hash::{Fnv1a, derive_seed};

/// A sparse text format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SparseFormat {
    /// `label idx:val idx:val ... [# comment]`: the label is a click
    /// (`1`, `+1`) or not (`0`, `-1`), as binary classification files write
    /// it; any other label (a multi-class or regression file) is an error.
    /// Indices are non-negative integers, each at most once in a line;
    /// values are finite numbers. One field.
    Libsvm,
    /// Criteo's display-advertising layout: label (0/1), 13 integer fields
    /// (may be empty or negative; they enter as `ln(1 + max(v, 0))`), 26
    /// categorical fields (any text, may be empty: absent), tab-separated.
    Criteo,
}

/// Integer fields of a Criteo line.
pub const CRITEO_INTEGERS: usize = 13;
/// Categorical fields of a Criteo line.
pub const CRITEO_CATEGORICALS: usize = 26;

impl SparseFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            SparseFormat::Libsvm => "libsvm",
            SparseFormat::Criteo => "criteo",
        }
    }

    /// Fields of the categorical features (each a bag of features).
    pub fn fields(self) -> usize {
        match self {
            SparseFormat::Libsvm => 1,
            SparseFormat::Criteo => CRITEO_CATEGORICALS,
        }
    }

    /// Dense inputs per example.
    pub fn dense_dim(self) -> usize {
        match self {
            SparseFormat::Libsvm => 0,
            SparseFormat::Criteo => CRITEO_INTEGERS,
        }
    }

    /// One line: `Ok(None)` for a blank or comment line, else the example
    /// or what is wrong with it.
    pub fn parse(self, line: &str) -> Result<Option<SparseExample>, String> {
        match self {
            SparseFormat::Libsvm => parse_libsvm(line),
            SparseFormat::Criteo => parse_criteo(line),
        }
    }
}

impl fmt::Display for SparseFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SparseFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "libsvm" | "svmlight" => Ok(SparseFormat::Libsvm),
            "criteo" => Ok(SparseFormat::Criteo),
            _ => Err(format!("unknown sparse data format {s:?} (libsvm, criteo)")),
        }
    }
}

/// One feature of an example: its field, its hashed key, its value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Feature {
    pub field: u32,
    pub key: u64,
    pub value: f32,
}

/// A labelled sparse example.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SparseExample {
    /// 1 for a click (positive), 0 otherwise.
    pub label: u32,
    pub dense: Vec<f32>,
    pub features: Vec<Feature>,
}

/// The hashed key of a feature: FNV-1a of the field and the text, mixed
/// so that `key % buckets` spreads well for any number of buckets.
pub fn feature_key(field: u32, text: &[u8]) -> u64 {
    let mut h = Fnv1a::default();
    h.write(&field.to_le_bytes());
    h.write(text);
    derive_seed(h.0, 0x5350_4152_5345, 0)
}

fn parse_libsvm(line: &str) -> Result<Option<SparseExample>, String> {
    let line = line.split('#').next().unwrap_or("").trim();
    if line.is_empty() {
        return Ok(None);
    }
    let mut tokens = line.split_ascii_whitespace();
    let label_text = tokens.next().expect("not empty");
    let label: f64 = label_text.parse().map_err(|_| format!("label {label_text:?} is not a number"))?;
    let label = match label {
        1.0 => 1,
        0.0 | -1.0 => 0,
        _ => {
            return Err(format!(
                "label {label_text:?} is not binary: a click is 1 or +1, no click 0 or -1 (the sparse models are binary classifiers; a multi-class or regression file does not fit them)"
            ));
        }
    };
    // One allocation each: a feature per `:` (a `qid:` leaves one unused).
    let features = line.bytes().filter(|&b| b == b':').count();
    let mut example = SparseExample { label, dense: Vec::new(), features: Vec::with_capacity(features) };
    let (mut indices, mut ascending): (Vec<u64>, bool) = (Vec::with_capacity(features), true);
    for token in tokens {
        let (index, value) = token.split_once(':').ok_or_else(|| format!("feature {token:?} is not index:value"))?;
        if index == "qid" {
            continue;
        }
        let index: u64 = index.parse().map_err(|_| format!("feature {token:?}: index {index:?} is not a non-negative integer"))?;
        // While the indices ascend (as libsvm writes them) none can repeat.
        ascending = ascending && indices.last().is_none_or(|&last| index > last);
        if !ascending && indices.contains(&index) {
            return Err(format!("feature index {index} appears twice"));
        }
        indices.push(index);
        // One-hot files write `1` for nearly every value: read without the float parser.
        let value: f32 = if value == "1" {
            1.0
        } else {
            value.parse().ok().filter(|v: &f32| v.is_finite()).ok_or_else(|| format!("feature {token:?}: value {value:?} is not a finite number"))?
        };
        example.features.push(Feature { field: 0, key: feature_key(0, &index.to_le_bytes()), value });
    }
    Ok(Some(example))
}

fn parse_criteo(line: &str) -> Result<Option<SparseExample>, String> {
    let line = line.trim_end_matches(['\n', '\r']);
    if line.trim().is_empty() {
        return Ok(None);
    }
    let fields: Vec<&str> = line.split('\t').collect();
    let want = 1 + CRITEO_INTEGERS + CRITEO_CATEGORICALS;
    if fields.len() != want {
        return Err(format!("{} tab-separated fields, expected {want} (label, 13 integers, 26 categories)", fields.len()));
    }
    let label = match fields[0].trim() {
        "0" => 0,
        "1" => 1,
        other => return Err(format!("label {other:?} is neither 0 nor 1")),
    };
    let mut example = SparseExample { label, dense: Vec::with_capacity(CRITEO_INTEGERS), features: Vec::with_capacity(CRITEO_CATEGORICALS) };
    for (j, text) in fields[1..=CRITEO_INTEGERS].iter().enumerate() {
        let text = text.trim();
        let v: f64 = if text.is_empty() { 0.0 } else { text.parse::<i64>().map_err(|_| format!("integer field {} is {text:?}", j + 1))? as f64 };
        example.dense.push(v.max(0.0).ln_1p() as f32);
    }
    for (j, text) in fields[1 + CRITEO_INTEGERS..].iter().enumerate() {
        let text = text.trim();
        if !text.is_empty() {
            example.features.push(Feature { field: j as u32, key: feature_key(j as u32, text.as_bytes()), value: 1.0 });
        }
    }
    Ok(Some(example))
}

/// Examples as a batch: dense inputs in `x`, labels as classes 0/1, the
/// features in `sparse`.
pub fn sparse_batch(examples: &[SparseExample], format: SparseFormat) -> Batch {
    let dense_dim = format.dense_dim();
    let mut x = Array2::zeros((examples.len(), dense_dim));
    let total: usize = examples.iter().map(|e| e.features.len()).sum();
    let mut f = SparseFeatures {
        offsets: Vec::with_capacity(examples.len() + 1),
        fields: Vec::with_capacity(total),
        keys: Vec::with_capacity(total),
        values: Vec::with_capacity(total),
        num_fields: format.fields(),
        rows_memo: Default::default(),
    };
    f.offsets.push(0);
    for (i, e) in examples.iter().enumerate() {
        for (j, v) in e.dense.iter().take(dense_dim).enumerate() {
            x[[i, j]] = *v;
        }
        for feat in &e.features {
            f.fields.push(feat.field);
            f.keys.push(feat.key);
            f.values.push(feat.value);
        }
        f.offsets.push(f.keys.len());
    }
    Batch { x, targets: Targets::Labels(examples.iter().map(|e| e.label).collect()), sparse: Some(f) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libsvm_lines() {
        type Parsed = Option<(u32, Vec<(u64, f32)>)>;
        let ok: Vec<(&str, Parsed)> = vec![
            ("1 3:0.5 10:1", Some((1, vec![(3, 0.5), (10, 1.0)]))),
            ("-1 7:2", Some((0, vec![(7, 2.0)]))),
            ("+1 qid:4 2:1e-3 # a comment", Some((1, vec![(2, 0.001)]))),
            ("0", Some((0, vec![]))),
            ("1.0 9:1 2:1", Some((1, vec![(9, 1.0), (2, 1.0)]))),
            ("   ", None),
            ("# only a comment", None),
        ];
        for (line, want) in ok {
            let got = SparseFormat::Libsvm.parse(line).unwrap();
            let want = want.map(|(label, feats)| SparseExample {
                label,
                dense: vec![],
                features: feats.into_iter().map(|(i, v)| Feature { field: 0, key: feature_key(0, &i.to_le_bytes()), value: v }).collect(),
            });
            assert_eq!(got, want, "{line:?}");
        }
        let bad = [
            ("yes 1:1", "label \"yes\" is not a number"),
            ("1 1", "feature \"1\" is not index:value"),
            ("1 x:1", "index \"x\" is not a non-negative integer"),
            ("1 -2:1", "index \"-2\""),
            ("1 2:nan", "value \"nan\" is not a finite number"),
            ("1 2:", "value \"\""),
            ("2 1:1", "label \"2\" is not binary"),
            ("0.5 1:1", "label \"0.5\" is not binary"),
            ("inf 1:1", "label \"inf\" is not binary"),
            ("1 4:1 2:1 4:0.5", "feature index 4 appears twice"),
        ];
        for (line, want) in bad {
            let err = SparseFormat::Libsvm.parse(line).unwrap_err();
            assert!(err.contains(want), "{line:?}: {err}");
        }
    }

    #[test]
    fn criteo_lines() {
        let mut fields = vec!["1".to_string()];
        fields.extend((0..13).map(|j| {
            if j == 2 {
                String::new()
            } else if j == 3 {
                "-5".into()
            } else {
                (j * 10).to_string()
            }
        }));
        fields.extend((0..26).map(|j| if j == 25 { String::new() } else { format!("{:08x}", j * 7919) }));
        let line = fields.join("\t");
        let e = SparseFormat::Criteo.parse(&line).unwrap().unwrap();
        assert_eq!(e.label, 1);
        assert_eq!(e.dense.len(), 13);
        assert_eq!((e.dense[0], e.dense[1], e.dense[2], e.dense[3]), (0.0, (11f64).ln() as f32, 0.0, 0.0), "ln(1 + max(v, 0)); empty is 0");
        assert_eq!(e.features.len(), 25, "the empty category is absent");
        assert_eq!(e.features[1], Feature { field: 1, key: feature_key(1, b"00001eef"), value: 1.0 });
        assert_ne!(feature_key(0, b"00001eef"), feature_key(1, b"00001eef"), "the same text in two fields is two features");
        let bad = [
            (fields[..39].join("\t"), "39 tab-separated fields, expected 40"),
            ([&["2".to_string()], &fields[1..]].concat().join("\t"), "label \"2\" is neither 0 nor 1"),
            ([&fields[..5], &["1.5".to_string()], &fields[6..]].concat().join("\t"), "integer field 5 is \"1.5\""),
        ];
        for (line, want) in bad {
            let err = SparseFormat::Criteo.parse(&line).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
        assert_eq!(SparseFormat::Criteo.parse("\n").unwrap(), None);
        let b = sparse_batch(&[e.clone(), SparseExample { label: 0, ..e }], SparseFormat::Criteo);
        assert_eq!((b.x.dim(), b.sparse.as_ref().unwrap().offsets.clone()), ((2, 13), vec![0, 25, 50]));
        assert_eq!(b.targets, Targets::Labels(vec![1, 0]));
        assert_eq!("CRITEO".parse::<SparseFormat>(), Ok(SparseFormat::Criteo));
    }
}
