//! The sparse models' workloads: `--model sparse_lr` and `--model
//! wide_deep` on `--train_files` / `--eval_files` in `--data_format libsvm`
//! or `criteo`, or on generated learnable data when no file is given.

use std::sync::Arc;

use super::spec::{SparseOptions, WorkloadError, WorkloadSpec, flag};
use crate::data::{self, FileSet, GENERATED_EVAL_BASE, GeneratedTrainingSet, Generator, SparseFormat, StreamedTrainingSet, TrainingSet};
use crate::model::{SparseModel, SparseModelConfig};
use crate::train::Workload;

/// A sparse model with its (streamed or generated) data.
pub fn build(spec: &WorkloadSpec) -> Result<Workload, WorkloadError> {
    let o = &spec.sparse;
    let name = spec.model.to_ascii_lowercase();
    check_flags(spec, &name)?;
    let format = o.format.unwrap_or(if name == "wide_deep" { SparseFormat::Criteo } else { SparseFormat::Libsvm });
    let eval_n = spec.eval_examples.max(1);
    let (train, eval) = match &o.train_files {
        Some(list) => read_files(o, list, format, eval_n)?,
        None => generated(o, spec.seed, format, eval_n),
    };
    let cfg = SparseModelConfig {
        hash_buckets: o.hash_buckets,
        embedding_dim: o.embedding_dim,
        hidden_units: spec.hidden_units.clone().unwrap_or_else(|| vec![100]),
        dense_dim: format.dense_dim(),
        fields: format.fields(),
        partition: o.partition,
        sparse_embeddings: !o.dense_embeddings,
    };
    let model = if name == "wide_deep" {
        if cfg.hidden_units.contains(&0) {
            return Err(flag("hidden_units", "every layer needs at least 1 unit"));
        }
        SparseModel::wide_deep(cfg)
    } else {
        SparseModel::sparse_lr(cfg)
    };
    let batch_size = spec.batch_size.unwrap_or(100);
    if batch_size == 0 {
        return Err(flag("batch_size", "must be at least 1"));
    }
    Ok(Workload { model: Box::new(model), train, batch_size, eval: Some(data::sparse_batch(&eval, format)) })
}

/// The flags a sparse model does not use, or takes only together.
fn check_flags(spec: &WorkloadSpec, name: &str) -> Result<(), WorkloadError> {
    let o = &spec.sparse;
    let unused = [
        ("activation", spec.activation.is_some()),
        ("weight_init", spec.weight_init.is_some()),
        ("hidden_units", name == "sparse_lr" && spec.hidden_units.is_some()),
    ];
    if let Some((field, _)) = unused.iter().find(|(_, given)| *given) {
        return Err(flag(field, format!("the {name} model does not use it (--hidden_units shapes wide_deep's deep part)")));
    }
    if spec.data_dir.is_some() {
        return Err(flag("data_dir", "the sparse models read --train_files and --eval_files"));
    }
    if o.hash_buckets == 0 || o.embedding_dim == 0 {
        return Err(flag(if o.hash_buckets == 0 { "hash_buckets" } else { "embedding_dim" }, "must be at least 1"));
    }
    if o.eval_files.is_some() && o.train_files.is_none() {
        return Err(flag("eval_files", "goes with --train_files (without them the data are generated, held-out examples included)"));
    }
    Ok(())
}

/// A sparse workload's training set and held-out examples.
type SparseData = (Arc<dyn TrainingSet>, Vec<data::SparseExample>);

/// `--train_files` streamed, held-out examples from `--eval_files` (else
/// the first training examples).
fn read_files(o: &SparseOptions, list: &str, format: SparseFormat, eval_n: usize) -> Result<SparseData, WorkloadError> {
    let files = data::expand_files(list)?;
    let set = FileSet::index(&files, format, o.skip_bad_lines)?;
    tracing::info!("indexed {} {format} training example(s) in {} file(s)", set.len(), files.len());
    let eval = match &o.eval_files {
        Some(list) => data::read_head(&data::expand_files(list)?, format, eval_n, o.skip_bad_lines)?,
        None => {
            tracing::info!("no --eval_files: evaluating on the first {eval_n} training examples");
            set.read(0..(eval_n as u64).min(set.len()))?
        }
    };
    Ok((Arc::new(StreamedTrainingSet::new(set)), eval))
}

/// Learnable examples generated from the seed, held-out ones apart.
fn generated(o: &SparseOptions, seed: u64, format: SparseFormat, eval_n: usize) -> SparseData {
    let generator = Generator::new(format, seed);
    tracing::info!(
        "no --train_files given: generating {} learnable {format} examples (seed {seed}); the true model's AUC on the {eval_n} held-out ones is {:.4}",
        o.generated_examples,
        generator.achievable_auc(eval_n as u64)
    );
    let eval = (0..eval_n as u64).map(|i| generator.example(GENERATED_EVAL_BASE + i).0).collect();
    (Arc::new(GeneratedTrainingSet::new(generator, o.generated_examples.max(1))), eval)
}
