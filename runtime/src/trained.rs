//! What a trained checkpoint is for: `export` writes its variables as NumPy
//! arrays (.npz) named as the model names them (`dense/kernel`, ...) in
//! their full shapes, a variable partitioned over several ps joined again;
//! `predict` and `evaluate` run a Keras model with them (a built-in model
//! as its Keras preset).
//!
//! The pure parts (joining partitions, putting variables in a model's
//! order, formatting predictions) are plain functions; the file I/O is at
//! the edges.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ndarray::{Array2, ArrayD, Axis};
use serde::Serialize;

use crate::checkpoint::{self, Checkpoint, CheckpointError, CheckpointStatus, NamedTensor};
use crate::data::{Batch, Targets};
use crate::model::keras::{Head, KerasModel};
use crate::model::{Model, VariableSpec};
use crate::storage::Location;

#[derive(Debug, thiserror::Error)]
pub enum TrainedError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("{dir}: no complete checkpoint")]
    NoCheckpoint { dir: String },
    #[error("checkpoint {path}: variable {variable}: {reason}")]
    Parts { path: String, variable: String, reason: String },
    #[error("checkpoint {path} has no variable {name} (it has: {})", have.join(", "))]
    MissingVariable { path: String, name: String, have: Vec<String> },
    #[error("checkpoint {path} holds variables the model does not have: {} (is it the model the checkpoint was trained as?)", extra.join(", "))]
    ExtraVariables { path: String, extra: Vec<String> },
    #[error("checkpoint {path}: variable {name} has shape {found:?} but the model's is {expected:?}")]
    ShapeMismatch { path: String, name: String, found: Vec<usize>, expected: Vec<usize> },
    #[error("{}: cannot write: {reason}", path.display())]
    Write { path: PathBuf, reason: String },
}

/// The newest complete checkpoint of `dir`, whatever its number of ps tasks.
pub fn latest_checkpoint(dir: &Location) -> Result<Checkpoint, TrainedError> {
    let listing = checkpoint::list(dir)?;
    listing
        .into_iter()
        .rev()
        .find_map(|l| match l.status {
            CheckpointStatus::Complete(c) => Some(c),
            _ => None,
        })
        .ok_or_else(|| TrainedError::NoCheckpoint { dir: dir.to_string() })
}

/// The variables of a complete checkpoint by name, partitions joined.
pub fn read_variables(ckpt: &Checkpoint) -> Result<BTreeMap<String, ArrayD<f32>>, TrainedError> {
    let data = checkpoint::read_all(ckpt)?;
    join_parts(&ckpt.path.to_string(), data.variables)
}

/// Joins the stored pieces `<name>/part_<k>` of a partitioned variable
/// along the first axis, in `k` order; other variables are kept whole.
/// The parts must be numbered `0..n` without gaps and agree on every axis
/// but the first.
pub fn join_parts(path: &str, stored: Vec<NamedTensor>) -> Result<BTreeMap<String, ArrayD<f32>>, TrainedError> {
    let parts_err = |variable: &str, reason: String| TrainedError::Parts { path: path.to_string(), variable: variable.to_string(), reason };
    let mut whole = BTreeMap::new();
    let mut parts: BTreeMap<String, BTreeMap<usize, ArrayD<f32>>> = BTreeMap::new();
    for (name, shape, values) in stored {
        let array = ArrayD::from_shape_vec(shape.clone(), values).map_err(|e| parts_err(&name, format!("shape {shape:?}: {e}")))?;
        let part = name.rsplit_once("/part_").and_then(|(base, k)| Some((base.to_string(), k.parse::<usize>().ok()?)));
        match part {
            Some((base, k)) => {
                parts.entry(base).or_default().insert(k, array);
            }
            None => {
                whole.insert(name, array);
            }
        }
    }
    for (name, pieces) in parts {
        if whole.contains_key(&name) {
            return Err(parts_err(&name, "stored both whole and in parts".into()));
        }
        if let Some((i, k)) = pieces.keys().enumerate().find(|(i, k)| i != *k) {
            return Err(parts_err(&name, format!("part_{i} is missing (found part_{k})")));
        }
        let views: Vec<_> = pieces.values().map(|a| a.view()).collect();
        let joined = ndarray::concatenate(Axis(0), &views).map_err(|e| parts_err(&name, format!("parts do not fit together: {e}")))?;
        whole.insert(name, joined);
    }
    Ok(whole)
}

/// Writes `arrays` as an uncompressed .npz (what `numpy.savez` writes),
/// each under its name: `numpy.load(path)["dense/kernel"]`. The file is
/// written to a temporary name and renamed.
pub fn write_npz(path: &Path, arrays: &BTreeMap<String, ArrayD<f32>>) -> Result<(), TrainedError> {
    let err = |reason: String| TrainedError::Write { path: path.to_path_buf(), reason };
    let tmp = path.with_file_name(format!(".{}.tmp-{}", path.file_name().and_then(|n| n.to_str()).unwrap_or("export"), std::process::id()));
    let file = std::fs::File::create(&tmp).map_err(|e| err(e.to_string()))?;
    let mut npz = ndarray_npy::NpzWriter::new(file);
    let result = arrays.iter().try_for_each(|(name, a)| npz.add_array(name.as_str(), a)).and_then(|()| npz.finish().map(drop));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e.to_string()));
    }
    std::fs::rename(&tmp, path).map_err(|e| err(e.to_string()))
}

/// What `export` wrote.
#[derive(Debug, Clone, Serialize)]
pub struct ExportReport {
    pub checkpoint: String,
    pub global_step: i64,
    pub out: String,
    /// Name and shape of every array.
    pub arrays: BTreeMap<String, Vec<usize>>,
}

/// `tfjob-runtime export`: the latest complete checkpoint of `dir` to `out`.
pub fn export(dir: &Location, out: &Path) -> Result<ExportReport, TrainedError> {
    let ckpt = latest_checkpoint(dir)?;
    let variables = read_variables(&ckpt)?;
    write_npz(out, &variables)?;
    Ok(ExportReport {
        checkpoint: ckpt.path.to_string(),
        global_step: ckpt.global_step,
        out: out.display().to_string(),
        arrays: variables.iter().map(|(n, a)| (n.clone(), a.shape().to_vec())).collect(),
    })
}

/// The variables a model declares, in its order, from `values`; names and
/// shapes must match, and `values` must hold no other variable (a
/// checkpoint of a bigger model is not this model's).
pub fn params_in_order(path: &str, specs: &[VariableSpec], values: &BTreeMap<String, ArrayD<f32>>) -> Result<Vec<ArrayD<f32>>, TrainedError> {
    let extra: Vec<String> = values.keys().filter(|k| !specs.iter().any(|s| &s.name == *k)).cloned().collect();
    if !extra.is_empty() {
        return Err(TrainedError::ExtraVariables { path: path.to_string(), extra });
    }
    specs
        .iter()
        .map(|s| {
            let v = values.get(&s.name).ok_or_else(|| TrainedError::MissingVariable {
                path: path.to_string(),
                name: s.name.clone(),
                have: values.keys().cloned().collect(),
            })?;
            if v.shape() != s.shape.as_slice() {
                return Err(TrainedError::ShapeMismatch { path: path.to_string(), name: s.name.clone(), found: v.shape().to_vec(), expected: s.shape.clone() });
            }
            Ok(v.clone())
        })
        .collect()
}

/// The latest complete checkpoint of `dir` and its variables by name.
pub fn latest_variables(dir: &Location) -> Result<(Checkpoint, BTreeMap<String, ArrayD<f32>>), TrainedError> {
    let ckpt = latest_checkpoint(dir)?;
    let values = read_variables(&ckpt)?;
    Ok((ckpt, values))
}

/// Examples per forward pass of `predict` and `evaluate`.
const CHUNK: usize = 1024;

/// Predictions as CSV: a header, then one line per example. Classifiers
/// (a softmax or sigmoid head) start with the predicted `class` (arg-max,
/// or probability > 0.5), then the outputs: `p_0, p_1, ...` for
/// probabilities, `output_0, ...` otherwise.
pub fn predictions_csv(model: &KerasModel, params: &[ArrayD<f32>], x: &Array2<f32>) -> String {
    let k = model.output_units();
    let (classes, prefix) = match model.head() {
        Head::Softmax | Head::Sigmoid => (true, "p"),
        Head::Identity => (false, "output"),
    };
    let mut header: Vec<String> = if classes { vec!["class".into()] } else { Vec::new() };
    header.extend((0..k).map(|j| format!("{prefix}_{j}")));
    let mut out = header.join(",") + "\n";
    for start in (0..x.nrows()).step_by(CHUNK) {
        let chunk = x.slice(ndarray::s![start..(start + CHUNK).min(x.nrows()), ..]);
        let y = model.predict(params, chunk);
        for row in y.rows() {
            let mut fields: Vec<String> = Vec::with_capacity(k + 1);
            if classes {
                let class = if k == 1 { usize::from(row[0] > 0.5) } else { row.iter().enumerate().fold(0, |b, (j, &v)| if v > row[b] { j } else { b }) };
                fields.push(class.to_string());
            }
            fields.extend(row.iter().map(|v| v.to_string()));
            out += &(fields.join(",") + "\n");
        }
    }
    out
}

/// Loss and accuracy of a labelled set.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Evaluation {
    pub examples: usize,
    pub loss: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
}

/// Evaluates `model` on all of `x` and `targets`, in chunks (the mean over
/// every example, like Keras's `model.evaluate`).
pub fn evaluate(model: &dyn Model, params: &[ArrayD<f32>], x: &Array2<f32>, targets: &Targets) -> Evaluation {
    let n = x.nrows();
    let (mut loss, mut correct, mut any_accuracy) = (0.0f64, 0.0f64, false);
    for start in (0..n).step_by(CHUNK) {
        let indices: Vec<usize> = (start..(start + CHUNK).min(n)).collect();
        let batch = Batch { x: crate::data::rows_at(x, &indices), targets: targets.select(&indices), sparse: None };
        let m = model.evaluate(params, &batch);
        loss += m.loss as f64 * m.examples as f64;
        if let Some(a) = m.accuracy {
            any_accuracy = true;
            // The chunk's count of correct predictions, exactly (the f32 fraction rounds).
            correct += (a as f64 * m.examples as f64).round();
        }
    }
    let per = |v: f64| if n == 0 { 0.0 } else { v / n as f64 };
    Evaluation { examples: n, loss: per(loss), accuracy: any_accuracy.then(|| per(correct)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, shape: &[usize], values: Vec<f32>) -> NamedTensor {
        (name.to_string(), shape.to_vec(), values)
    }

    #[test]
    fn joins_partitions_along_the_first_axis() {
        let p = "ckpt";
        let stored = vec![t("emb/part_1", &[1, 2], vec![5.0, 6.0]), t("dense/bias", &[2], vec![0.5, -0.5]), t("emb/part_0", &[2, 2], vec![1.0, 2.0, 3.0, 4.0])];
        let all = join_parts(p, stored).unwrap();
        assert_eq!(all.keys().collect::<Vec<_>>(), ["dense/bias", "emb"]);
        assert_eq!(all["emb"], ndarray::arr2(&[[1.0f32, 2.0], [3.0, 4.0], [5.0, 6.0]]).into_dyn());
        // (case, stored, words of the error)
        let cases = [
            ("gap", vec![t("e/part_0", &[1, 1], vec![1.0]), t("e/part_2", &[1, 1], vec![2.0])], "part_1 is missing"),
            ("no first part", vec![t("e/part_1", &[1, 1], vec![1.0])], "part_0 is missing"),
            ("widths differ", vec![t("e/part_0", &[1, 2], vec![1.0, 2.0]), t("e/part_1", &[1, 3], vec![1.0, 2.0, 3.0])], "do not fit"),
            ("whole and parts", vec![t("e", &[1], vec![1.0]), t("e/part_0", &[1], vec![1.0])], "both whole and in parts"),
            ("bad shape", vec![t("e", &[2, 2], vec![1.0])], "shape [2, 2]"),
        ];
        for (case, stored, words) in cases {
            let err = join_parts(p, stored).expect_err(case).to_string();
            assert!(err.contains(words) && err.contains("ckpt"), "{case}: {err}");
        }
    }

    #[test]
    fn params_come_in_the_model_order_with_their_shapes_checked() {
        use crate::init::Init;
        let specs = vec![VariableSpec::new("d/kernel", vec![2, 1], Init::Zeros), VariableSpec::new("d/bias", vec![1], Init::Zeros)];
        let mut values = BTreeMap::new();
        values.insert("d/bias".to_string(), ArrayD::from_elem(vec![1], 7.0f32));
        values.insert("d/kernel".to_string(), ArrayD::from_elem(vec![2, 1], 3.0f32));
        let p = params_in_order("c", &specs, &values).unwrap();
        assert_eq!((p[0].shape(), p[1][[0]]), (&[2usize, 1][..], 7.0));
        values.insert("d/kernel".to_string(), ArrayD::from_elem(vec![1, 2], 3.0f32));
        let err = params_in_order("c", &specs, &values).unwrap_err().to_string();
        assert!(err.contains("d/kernel has shape [1, 2] but the model's is [2, 1]"), "{err}");
        values.insert("d/kernel".to_string(), ArrayD::from_elem(vec![2, 1], 3.0f32));
        values.insert("e/kernel".to_string(), ArrayD::from_elem(vec![1, 1], 3.0f32));
        let err = params_in_order("c", &specs, &values).unwrap_err().to_string();
        assert!(err.contains("holds variables the model does not have: e/kernel"), "{err}");
        values.remove("e/kernel");
        values.remove("d/bias");
        let err = params_in_order("c", &specs, &values).unwrap_err().to_string();
        assert!(err.contains("no variable d/bias"), "{err}");
    }
}
