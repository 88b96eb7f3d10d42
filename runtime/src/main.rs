//! `tfjob-runtime`: runs the task given by `TF_CONFIG` or the classic
//! distributed-TensorFlow flags (ps, worker, chief or evaluator), or trains
//! in a single process when there is no cluster.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser, Subcommand};
use tfjob_runtime::auth::TOKEN_ENV;
use tfjob_runtime::auth::{Credentials, TlsFiles};
use tfjob_runtime::client::channel;
use tfjob_runtime::cluster::{self, ClusterConfig, ClusterFlags, ClusterSource, Role};
use tfjob_runtime::dispatch::ShardPlan;
use tfjob_runtime::metrics::TrainingMetrics;
use tfjob_runtime::optimizer::Optimizer;
use tfjob_runtime::proto::{self, run_session_request::Fetch, session_event::Event, worker_client::WorkerClient};
use tfjob_runtime::ps::{ParameterStore, PsConfig, PsService};
use tfjob_runtime::server::{self, WorkerService, WorkloadFactory};
use tfjob_runtime::status::TaskStatus;
use tfjob_runtime::storage::Location;
use tfjob_runtime::tensor;
use tfjob_runtime::train::{self, Aggregate, CheckpointSettings, TrainError, TrainSettings};
use tfjob_runtime::workload::{self, WorkloadSpec};

#[derive(Parser, Debug)]
#[command(
    name = "tfjob-runtime",
    version,
    about = "Parameter-server training over gRPC: the program inside every replica of a TFJob",
    long_about = "Runs the task named by TF_CONFIG (or --ps_hosts/--worker_hosts/--job_name/--task_index): \
a ps serves variables, workers train between-graph (async, or sync with --sync_replicas), the chief \
(or worker 0) initialises the variables and ends training after --train_steps global steps, an evaluator \
evaluates on held-out data. Without a cluster it trains in this process alone.",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    task: TaskArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// A standalone server for sessions (TensorFlow's `create_local_server`).
    Server {
        #[arg(long, default_value_t = 2222)]
        port: u16,
        #[arg(long, default_value = "0.0.0.0")]
        bind: IpAddr,
    },
    /// Submits work to a task, like `tf.Session("grpc://host:port")`.
    Client(Box<ClientArgs>),
    /// Checkpoints written with --checkpoint_dir.
    #[command(subcommand)]
    Checkpoint(CheckpointCommand),
    /// Writes the variables of the latest complete checkpoint as NumPy arrays (.npz) named
    /// <layer name>/<weight name> in Keras's shapes (partitioned variables joined), for
    /// `layer.set_weights([w[f"{layer.name}/kernel"], w[f"{layer.name}/bias"]])`.
    Export {
        #[arg(long = "checkpoint_dir", visible_alias = "checkpoint-dir", value_parser = parse_location)]
        checkpoint_dir: Location,
        /// The .npz file to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Predictions of a Keras model (or a built-in one, --model) with the latest complete
    /// checkpoint's weights for the examples of --input (CSV or IDX images), as CSV on stdout:
    /// the class (classifiers), then the outputs.
    Predict(Box<InferenceArgs>),
    /// Loss and accuracy of a Keras model (or a built-in one, --model) with the latest complete
    /// checkpoint's weights on a labelled set (--input: CSV with its label column, or IDX images
    /// with --labels), as JSON.
    Evaluate(Box<InferenceArgs>),
    /// Writes learnable click-through data with known weights (libsvm or criteo) and prints the
    /// AUC the true model reaches on the held-out file: what --model=sparse_lr or wide_deep can hope for.
    Generate(GenerateArgs),
}

#[derive(Args, Debug)]
struct GenerateArgs {
    /// libsvm or criteo.
    #[arg(long = "data_format", visible_alias = "data-format", default_value = "criteo")]
    data_format: String,
    /// Directory to write train.txt and eval.txt into (.gz with --gzip).
    #[arg(long)]
    out: PathBuf,
    #[arg(long = "train_examples", visible_alias = "train-examples", default_value_t = 20_000)]
    train_examples: u64,
    #[arg(long = "eval_examples", visible_alias = "eval-examples", default_value_t = 5_000)]
    eval_examples: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long)]
    gzip: bool,
}

#[derive(Args, Debug)]
struct InferenceArgs {
    #[arg(long = "checkpoint_dir", visible_alias = "checkpoint-dir", value_parser = parse_location)]
    checkpoint_dir: Location,
    /// The examples: a CSV file with a header, or an IDX image file (plain or gzipped).
    #[arg(long)]
    input: PathBuf,
    /// The IDX label file of --input's images (evaluate).
    #[arg(long)]
    labels: Option<PathBuf>,
    /// A built-in model instead of --keras_model: linear, softmax or mlp, with --hidden_units and
    /// --activation as in training (the input size and the classes come from the checkpoint).
    #[arg(long)]
    model: Option<String>,
    #[command(flatten)]
    mlp: MlpArgs,
    #[command(flatten)]
    keras: KerasArgs,
    #[command(flatten)]
    data: DataArgs,
}

/// The hidden layers of --model=mlp (an error with any other model).
#[derive(Args, Debug, Clone)]
struct MlpArgs {
    /// Hidden layer widths of the mlp, comma separated (default 100: the classic 784-100-10).
    #[arg(long = "hidden_units", visible_alias = "hidden-units")]
    hidden_units: Option<String>,
    /// Activation of the mlp's hidden layers: sigmoid (the default), relu or tanh.
    #[arg(long)]
    activation: Option<String>,
}

impl MlpArgs {
    fn hidden_units(&self) -> Result<Option<Vec<usize>>, String> {
        let Some(list) = &self.hidden_units else { return Ok(None) };
        let widths = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<usize>().map_err(|_| format!("--hidden_units: {s:?} is not a number")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(widths))
    }
}

/// A Keras model to train instead of --model.
#[derive(Args, Debug, Clone)]
struct KerasArgs {
    /// The JSON that Keras's model.to_json() writes (Keras 2 or 3), of a Sequential or plain
    /// functional stack; on Kubernetes a file of a ConfigMap volume.
    #[arg(long = "keras_model", visible_alias = "keras-model")]
    keras_model: Option<PathBuf>,
    /// sparse_categorical_crossentropy, categorical_crossentropy, binary_crossentropy or mse
    /// (default: from the model's last activation: softmax, sigmoid, else mse).
    #[arg(long)]
    loss: Option<String>,
    /// The model's outputs are logits (Keras's from_logits=True); without it a cross-entropy
    /// needs a model ending in softmax (or sigmoid).
    #[arg(long = "from_logits", visible_alias = "from-logits", num_args = 0..=1, default_value = "false",
          default_missing_value = "true", value_parser = BoolishValueParser::new(), action = ArgAction::Set)]
    from_logits: bool,
}

/// How --data_dir (or --input) is read.
#[derive(Args, Debug, Clone)]
struct DataArgs {
    /// idx (the four MNIST-named files, images of any size) or csv (train.csv and test.csv
    /// with a header, plain or .gz). Default: idx for --data_dir, detected for --input.
    #[arg(long = "data_format", visible_alias = "data-format")]
    data_format: Option<String>,
    /// CSV: the label column (default: label).
    #[arg(long = "label_column", visible_alias = "label-column")]
    label_column: Option<String>,
    /// CSV: the feature columns, comma separated (default: every column but the label).
    #[arg(long = "feature_columns", visible_alias = "feature-columns")]
    feature_columns: Option<String>,
    /// Classes of the labels (default: the largest label in the data plus one).
    #[arg(long = "num_classes", visible_alias = "num-classes")]
    num_classes: Option<usize>,
}

impl DataArgs {
    fn options(&self) -> Result<tfjob_runtime::data::DataOptions, String> {
        Ok(tfjob_runtime::data::DataOptions {
            format: self.data_format.as_deref().map(str::parse).transpose().map_err(|e| format!("--data_format: {e}"))?,
            label_column: self.label_column.clone(),
            feature_columns: self.feature_columns.as_ref().map(|f| f.split(',').map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).collect()),
            num_classes: self.num_classes,
        })
    }

    fn given(&self) -> bool {
        self.data_format.is_some() || self.label_column.is_some() || self.feature_columns.is_some() || self.num_classes.is_some()
    }
}

impl KerasArgs {
    fn options(&self) -> workload::KerasOptions {
        workload::KerasOptions { model_file: self.keras_model.clone(), loss: self.loss.clone(), from_logits: self.from_logits }
    }
}

#[derive(Subcommand, Debug)]
enum CheckpointCommand {
    /// Lists the checkpoints of a directory (a path, or an s3://, gs:// or az:// URL): step,
    /// state (complete, incomplete, damaged), variables.
    Inspect {
        #[arg(value_parser = parse_location)]
        dir: Location,
    },
}

#[derive(Args, Debug)]
struct ClientArgs {
    /// The task to talk to: grpc://host:port.
    #[arg(long)]
    target: String,
    /// Print the task's status instead of running anything.
    #[arg(long)]
    status: bool,
    /// Ask the standard gRPC health service (no token needed) and print SERVING or NOT_SERVING.
    #[arg(long)]
    health: bool,
    /// Submit a training run (model flags below) and stream its progress.
    #[arg(long)]
    train: bool,
    #[command(flatten)]
    model: ModelArgs,
    /// A constant to evaluate remotely: the task sends it back.
    message: Option<String>,
}

/// A path or an object-store URL, checked when the flags are read.
fn parse_location(s: &str) -> Result<Location, String> {
    Location::parse(s).map_err(|e| e.to_string())
}

/// Model, data and optimizer flags, named as in TensorFlow's distributed examples.
#[derive(Args, Debug, Clone)]
struct ModelArgs {
    /// linear (y = 2x + 10, the classic example), softmax, mlp, sparse_lr or wide_deep.
    #[arg(long, default_value = "linear")]
    model: String,
    #[command(flatten)]
    mlp: MlpArgs,
    /// Weight initialisation of the mlp: truncated_normal (1/sqrt(fan_in), the classic example;
    /// the default) or normal (N(0,1)).
    #[arg(long = "weight_init", visible_alias = "weight-init")]
    weight_init: Option<String>,
    /// sgd, momentum, nesterov, adagrad, adam or ftrl.
    #[arg(long, default_value = "sgd")]
    optimizer: String,
    #[arg(long = "learning_rate", visible_alias = "learning-rate", default_value_t = 0.01)]
    learning_rate: f32,
    #[arg(long, default_value_t = 0.9)]
    momentum: f32,
    /// Examples per step (default: 1 for linear, as in the classic example; 100 otherwise).
    #[arg(long = "batch_size", visible_alias = "batch-size")]
    batch_size: Option<usize>,
    /// Global steps to train (default 1000; without it, --num_epochs alone decides).
    #[arg(long = "train_steps", visible_alias = "train-steps")]
    train_steps: Option<u64>,
    /// Epochs of the training set to train: training ends when every shard of every epoch is
    /// done (with --train_steps too: whichever comes first).
    #[arg(long = "num_epochs", visible_alias = "num-epochs")]
    num_epochs: Option<u64>,
    /// Examples per shard of the training set (default: 10 batches). Ps task 0 hands shards
    /// to the workers as they ask; a lost worker's shard is handed out again.
    #[arg(long = "shard_size", visible_alias = "shard-size")]
    shard_size: Option<u64>,
    /// Directory of the data (see --data_format), a path or an s3://, gs:// or az:// URL:
    /// MNIST-named IDX files by default; without it, softmax, mlp and softmax Keras classifiers
    /// use a synthetic set.
    #[arg(long = "data_dir", visible_alias = "data-dir")]
    data_dir: Option<PathBuf>,
    /// Log every N local steps (0: never).
    #[arg(long = "log_every_steps", visible_aliases = ["log-every-steps", "log_interval", "log-interval"], default_value_t = 100)]
    log_every_steps: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Held-out examples used by the evaluator and for the final figures.
    #[arg(long = "eval_examples", visible_alias = "eval-examples", default_value_t = 10_000)]
    eval_examples: usize,
    /// sparse_lr, wide_deep: training files, comma-separated paths or globs, plain or gzipped
    /// (--data_format libsvm or criteo); without them learnable data are generated.
    #[arg(long = "train_files", visible_alias = "train-files")]
    train_files: Option<String>,
    /// sparse_lr, wide_deep: held-out files (the first --eval_examples examples are read).
    #[arg(long = "eval_files", visible_alias = "eval-files")]
    eval_files: Option<String>,
    /// Leave out malformed lines of --train_files/--eval_files (counted and logged) instead of failing.
    #[arg(long = "skip_bad_lines", visible_alias = "skip-bad-lines")]
    skip_bad_lines: bool,
    /// wide_deep: width of the categorical fields' embeddings.
    #[arg(long = "embedding_dim", visible_alias = "embedding-dim", default_value_t = 8)]
    embedding_dim: usize,
    /// sparse_lr, wide_deep: rows of the tables; a feature's row is hash(feature) % hash_buckets.
    #[arg(long = "hash_buckets", visible_alias = "hash-buckets", default_value_t = 1 << 20)]
    hash_buckets: usize,
    /// How embedding rows are cut over the ps tasks: mod (row id % ps) or div (contiguous runs).
    #[arg(long = "partition_strategy", visible_alias = "partition-strategy", default_value = "mod")]
    partition_strategy: String,
    /// Pull and push the embeddings whole, as dense variables (the baseline of sparse training).
    #[arg(long = "dense_embeddings", visible_alias = "dense-embeddings")]
    dense_embeddings: bool,
    /// Training examples generated when no --train_files is given.
    #[arg(long = "generated_examples", visible_alias = "generated-examples", default_value_t = 20_000)]
    generated_examples: u64,
    /// ftrl: L1 regularization strength.
    #[arg(long = "l1_regularization_strength", visible_alias = "l1-regularization-strength", default_value_t = 0.0)]
    l1_regularization_strength: f32,
    /// ftrl: L2 regularization strength.
    #[arg(long = "l2_regularization_strength", visible_alias = "l2-regularization-strength", default_value_t = 0.0)]
    l2_regularization_strength: f32,
    #[command(flatten)]
    keras: KerasArgs,
    #[command(flatten)]
    data: DataArgs,
}

#[derive(Args, Debug)]
struct TaskArgs {
    /// Comma-separated host:port of the ps tasks.
    #[arg(long = "ps_hosts", visible_alias = "ps-hosts")]
    ps_hosts: Option<String>,
    /// Comma-separated host:port of the worker tasks.
    #[arg(long = "worker_hosts", visible_alias = "worker-hosts")]
    worker_hosts: Option<String>,
    #[arg(long = "chief_hosts", visible_alias = "chief-hosts")]
    chief_hosts: Option<String>,
    #[arg(long = "evaluator_hosts", visible_alias = "evaluator-hosts")]
    evaluator_hosts: Option<String>,
    /// ps, worker, chief or evaluator.
    #[arg(long = "job_name", visible_alias = "job-name")]
    job_name: Option<String>,
    #[arg(long = "task_index", visible_alias = "task-index")]
    task_index: Option<u32>,
    /// Address to listen on (the port comes from this task's host:port).
    #[arg(long, env = "TFJOB_BIND", default_value = "0.0.0.0")]
    bind: IpAddr,
    /// Synchronous training with SyncReplicasOptimizer semantics.
    #[arg(long = "sync_replicas", visible_alias = "sync-replicas", num_args = 0..=1, default_value = "false",
          default_missing_value = "true", value_parser = BoolishValueParser::new(), action = ArgAction::Set)]
    sync_replicas: bool,
    /// Sync: gradients averaged per step: a number (default: every training task; fewer makes
    /// backup workers) or `auto` (elastic: the workers alive, which may come and go).
    #[arg(long = "replicas_to_aggregate", visible_alias = "replicas-to-aggregate")]
    replicas_to_aggregate: Option<String>,
    /// Directory of checkpoints (shared by the chief and the ps tasks): a path, or an s3://,
    /// gs:// or az:// URL (credentials and endpoint from the environment: AWS_*, GOOGLE_*,
    /// AZURE_*); the ps tasks restore the latest complete one at start.
    #[arg(long = "checkpoint_dir", visible_alias = "checkpoint-dir", value_parser = parse_location)]
    checkpoint_dir: Option<Location>,
    /// Checkpoint every N global steps.
    #[arg(long = "save_checkpoint_steps", visible_alias = "save-checkpoint-steps")]
    save_checkpoint_steps: Option<u64>,
    /// Checkpoint every N seconds (default 600 when --checkpoint_dir is given without --save_checkpoint_steps).
    #[arg(long = "save_checkpoint_secs", visible_alias = "save-checkpoint-secs")]
    save_checkpoint_secs: Option<f64>,
    /// Complete checkpoints kept.
    #[arg(long = "keep_checkpoint_max", visible_alias = "keep-checkpoint-max", default_value_t = 5)]
    keep_checkpoint_max: usize,
    /// TensorBoard event files go here (a path or a URL, as --checkpoint_dir): the chief's
    /// in the directory itself, the evaluator's in <log_dir>/eval.
    #[arg(long = "log_dir", visible_alias = "log-dir", value_parser = parse_location)]
    log_dir: Option<Location>,
    /// Serve Prometheus metrics on this port (/metrics).
    #[arg(long = "metrics_port", visible_alias = "metrics-port")]
    metrics_port: Option<u16>,
    /// A training task not heard from for this long no longer counts as live (elastic sync).
    #[arg(long = "lease_secs", visible_alias = "lease-secs", default_value_t = 10.0)]
    lease_secs: f64,
    /// How often training tasks renew their lease.
    #[arg(long = "heartbeat_secs", visible_alias = "heartbeat-secs", default_value_t = 2.0)]
    heartbeat_secs: f64,
    /// TLS between tasks: this task's certificate (PEM).
    #[arg(long = "tls_cert", visible_alias = "tls-cert", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// TLS: this task's private key (PEM).
    #[arg(long = "tls_key", visible_alias = "tls-key", requires_all = ["tls_cert", "tls_ca"])]
    tls_key: Option<PathBuf>,
    /// TLS: the CA that signed every task's certificate (PEM).
    #[arg(long = "tls_ca", visible_alias = "tls-ca", requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    #[arg(long = "init_timeout_secs", visible_alias = "init-timeout-secs", default_value_t = 300)]
    init_timeout_secs: u64,
    #[arg(long = "connect_timeout_secs", visible_alias = "connect-timeout-secs", default_value_t = 120)]
    connect_timeout_secs: u64,
    #[arg(long = "step_timeout_secs", visible_alias = "step-timeout-secs", default_value_t = 300)]
    step_timeout_secs: u64,
    /// Seconds between two evaluations of the evaluator.
    #[arg(long = "eval_interval_secs", visible_alias = "eval-interval-secs", default_value_t = 5.0)]
    eval_interval_secs: f64,
    /// After the chief ends training, how long a ps waits for the other tasks to notice, and the
    /// chief for the evaluator's final evaluation.
    #[arg(long = "shutdown_grace_secs", visible_alias = "shutdown-grace-secs", default_value_t = 30)]
    shutdown_grace_secs: u64,
    /// Pulls and pushes over the tensor channel (raw TCP on the ps's port,
    /// no copies beyond the kernel's) instead of gRPC. Ignored with TLS
    /// (always gRPC).
    #[arg(long = "tensor_channel", visible_alias = "tensor-channel", default_value = "true", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new(), action = ArgAction::Set)]
    tensor_channel: bool,
    /// Variables larger than this are partitioned over several ps tasks.
    #[arg(long = "partition_threshold_bytes", visible_alias = "partition-threshold-bytes",
          default_value_t = tfjob_runtime::placement::DEFAULT_PARTITION_THRESHOLD_BYTES)]
    partition_threshold_bytes: usize,
    /// text or json.
    #[arg(long = "log_format", visible_alias = "log-format", default_value = "text")]
    log_format: String,
    #[command(flatten)]
    model: ModelArgs,
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,h2=warn,tower=warn".into());
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal()).with_target(false);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn workload_spec(m: &ModelArgs) -> Result<WorkloadSpec, String> {
    let sparse_format = match m.data.data_format.as_deref().map(str::parse::<tfjob_runtime::data::SparseFormat>) {
        Some(Ok(f)) => Some(f),
        _ => None,
    };
    let mut data = if sparse_format.is_some() { DataArgs { data_format: None, ..m.data.clone() }.options()? } else { m.data.options()? };
    if sparse_format.is_none() && m.data.data_format.is_some() && workload::is_sparse_model(&m.model) {
        return Err("--data_format: the sparse models read libsvm or criteo".into());
    }
    data.format = data.format.filter(|_| sparse_format.is_none());
    let sparse = workload::SparseOptions {
        format: sparse_format,
        train_files: m.train_files.clone(),
        eval_files: m.eval_files.clone(),
        skip_bad_lines: m.skip_bad_lines,
        embedding_dim: m.embedding_dim,
        hash_buckets: m.hash_buckets,
        partition: m.partition_strategy.parse().map_err(|e| format!("--partition_strategy: {e}"))?,
        dense_embeddings: m.dense_embeddings,
        generated_examples: m.generated_examples,
    };
    Ok(WorkloadSpec {
        sparse,
        model: m.model.clone(),
        hidden_units: m.mlp.hidden_units()?,
        activation: m.mlp.activation.clone(),
        weight_init: m.weight_init.clone(),
        batch_size: m.batch_size,
        data_dir: check_data_dir(m.data_dir.as_ref())?,
        seed: m.seed,
        eval_examples: m.eval_examples,
        keras: m.keras.options(),
        data,
    })
}

/// `--data_dir`, a path or an object-store URL (checked here, read later).
fn check_data_dir(dir: Option<&PathBuf>) -> Result<Option<PathBuf>, String> {
    if let Some(url) = dir.and_then(|d| d.to_str()).filter(|d| tfjob_runtime::storage::is_url(d)) {
        Location::parse(url).map_err(|e| format!("--data_dir: {e}"))?;
    }
    Ok(dir.cloned())
}

fn settings(a: &TaskArgs) -> Result<TrainSettings, String> {
    let m = &a.model;
    let optimizer = Optimizer::from_name(&m.optimizer, m.learning_rate, m.momentum)
        .map_err(|e| format!("--{e}"))?
        .with_regularization(m.l1_regularization_strength, m.l2_regularization_strength)
        .map_err(|e| e.to_string())?;
    for (flag, v) in [("eval_interval_secs", a.eval_interval_secs), ("lease_secs", a.lease_secs), ("heartbeat_secs", a.heartbeat_secs)] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(format!("--{flag}: must be a non-negative number"));
        }
    }
    let replicas_to_aggregate = match a.replicas_to_aggregate.as_deref().map(str::trim) {
        None | Some("") => Aggregate::AllWorkers,
        Some(s) if s.eq_ignore_ascii_case("auto") => Aggregate::Auto,
        Some(s) => Aggregate::Count(s.parse().map_err(|_| format!("--replicas_to_aggregate: {s:?} is neither a number nor auto"))?),
    };
    if matches!(a.save_checkpoint_secs, Some(v) if !(v.is_finite() && v > 0.0)) {
        return Err("--save_checkpoint_secs: must be a positive number".into());
    }
    let checkpoints = CheckpointSettings {
        directory: a.checkpoint_dir.clone(),
        every_steps: a.save_checkpoint_steps,
        every_secs: a.save_checkpoint_secs.or(if a.save_checkpoint_steps.is_none() { Some(600.0) } else { None }),
        keep: a.keep_checkpoint_max.max(1),
    };
    ShardPlan::check_num_epochs(m.num_epochs).map_err(|e| e.to_string())?;
    ShardPlan::check_shard_size(m.shard_size).map_err(|e| e.to_string())?;
    Ok(TrainSettings {
        train_steps: train_steps(m),
        num_epochs: m.num_epochs,
        shard_size: m.shard_size,
        optimizer,
        sync_replicas: a.sync_replicas,
        replicas_to_aggregate,
        log_every_steps: m.log_every_steps,
        init_timeout: Duration::from_secs(a.init_timeout_secs),
        connect_timeout: Duration::from_secs(a.connect_timeout_secs),
        step_timeout: Duration::from_secs(a.step_timeout_secs),
        eval_interval: Duration::from_secs_f64(a.eval_interval_secs),
        partition_threshold_bytes: a.partition_threshold_bytes,
        tensor_channel: a.tensor_channel,
        seed: m.seed,
        checkpoints,
        log_dir: a.log_dir.clone(),
        heartbeat: Duration::from_secs_f64(a.heartbeat_secs.max(0.05)),
        shutdown_grace: Duration::from_secs(a.shutdown_grace_secs),
    })
}

/// Global steps to train: `--train_steps`, else 1000 unless `--num_epochs`
/// decides alone.
fn train_steps(m: &ModelArgs) -> Option<u64> {
    match (m.train_steps, m.num_epochs) {
        (Some(n), _) => Some(n),
        (None, Some(_)) => None,
        (None, None) => Some(1000),
    }
}

fn session_factory() -> WorkloadFactory {
    Arc::new(|run: &proto::TrainRun| {
        let spec = WorkloadSpec {
            model: if run.model.is_empty() { "linear".into() } else { run.model.clone() },
            // A session's run names one hidden layer, used by the mlp only.
            hidden_units: (run.model.eq_ignore_ascii_case("mlp") && run.hidden_units > 0).then(|| vec![run.hidden_units as usize]),
            activation: None,
            weight_init: None,
            batch_size: (run.batch_size > 0).then_some(run.batch_size as usize),
            data_dir: (!run.data_dir.is_empty()).then(|| PathBuf::from(&run.data_dir)),
            seed: run.seed.max(1),
            eval_examples: 10_000,
            keras: Default::default(),
            data: Default::default(),
            sparse: Default::default(),
        };
        let optimizer = Optimizer::from_name(
            if run.optimizer.is_empty() { "sgd" } else { &run.optimizer },
            if run.learning_rate > 0.0 { run.learning_rate } else { 0.01 },
            0.9,
        )
        .map_err(|e| e.to_string())?;
        let workload = workload::build(&spec).map_err(|e| e.to_string())?;
        let settings = TrainSettings {
            train_steps: Some(if run.train_steps == 0 { 1000 } else { run.train_steps }),
            optimizer,
            log_every_steps: if run.log_every_steps == 0 { 100 } else { run.log_every_steps as u64 },
            seed: spec.seed,
            ..Default::default()
        };
        Ok((workload, settings))
    })
}

/// Resolves with the exit code a signal asks for: 130 for Ctrl-C, 143 for
/// SIGTERM (transient: >= 128 under the ExitCode restart policy).
async fn termination() -> u8 {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => 130,
            _ = term.recv() => 143,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        130
    }
}

/// Prints a task's final figures as one JSON line, with the process's peak
/// resident memory (`peak_rss_mib`, Linux's VmHWM) when it is known.
fn print_report(report: &impl serde::Serialize) {
    let mut value = serde_json::to_value(report).expect("report serialises");
    if let (Some(map), Some(kib)) = (value.as_object_mut(), peak_rss_kib()) {
        map.insert("peak_rss_mib".into(), serde_json::json!(kib as f64 / 1024.0));
    }
    println!("{value}");
}

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()
}

fn main() -> ExitCode {
    tfjob_runtime::process_age();
    tfjob_runtime::tune_allocator();
    let cli = Cli::parse();
    let format = cli.task.log_format.clone();
    init_logging(&format);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let code = runtime.block_on(async move {
        match cli.command {
            Some(Command::Server { port, bind }) => run_server(SocketAddr::new(bind, port)).await,
            Some(Command::Client(args)) => run_client(*args).await,
            Some(Command::Checkpoint(CheckpointCommand::Inspect { dir })) => match tfjob_runtime::checkpoint::inspect(&dir) {
                Ok(text) => {
                    print!("{text}");
                    0
                }
                Err(e) => fail(2, e),
            },
            Some(Command::Export { checkpoint_dir, out }) => match tfjob_runtime::trained::export(&checkpoint_dir, &out) {
                Ok(report) => {
                    print_report(&report);
                    0
                }
                Err(e) => fail(2, e),
            },
            Some(Command::Predict(args)) => run_inference(&args, false),
            Some(Command::Generate(args)) => run_generate(&args),
            Some(Command::Evaluate(args)) => run_inference(&args, true),
            None => run_task(cli.task).await,
        }
    });
    // Do not wait for lingering connections of peers.
    runtime.shutdown_timeout(Duration::from_millis(200));
    ExitCode::from(code)
}

fn fail(code: u8, message: impl std::fmt::Display) -> u8 {
    tracing::error!("{message}");
    eprintln!("tfjob-runtime: {message}");
    code
}

async fn run_task(args: TaskArgs) -> u8 {
    let flags = ClusterFlags {
        ps_hosts: args.ps_hosts.clone(),
        worker_hosts: args.worker_hosts.clone(),
        chief_hosts: args.chief_hosts.clone(),
        evaluator_hosts: args.evaluator_hosts.clone(),
        job_name: args.job_name.clone(),
        task_index: args.task_index,
    };
    let tf_config = std::env::var("TF_CONFIG").ok();
    let source = cluster::source(&flags, tf_config.as_deref());
    let cluster = match cluster::resolve(&flags, tf_config.as_deref()) {
        Ok(c) => c,
        Err(e) => return fail(2, format_args!("{}{e}", if source == Some(ClusterSource::TfConfig) { "TF_CONFIG: " } else { "" })),
    };
    if let Some(c) = &cluster {
        let ignored = if c.source == ClusterSource::Flags && tf_config.is_some() { "; TF_CONFIG is set and ignored" } else { "" };
        tracing::info!("{}: cluster from {}{ignored}: {}", c.task, c.source, describe_cluster(&c.cluster));
    }
    // One training task and no ps (a one-replica TFJob run with the classic
    // flags): nothing to share variables with, it trains alone.
    let cluster = cluster.filter(|c| {
        let alone = c.role() == Role::Worker && c.cluster.num_tasks("ps") == 0 && c.cluster.training_tasks().len() == 1;
        if alone {
            tracing::info!("{}: the cluster has no ps task and no other training task: training in this process", c.task);
        }
        !alone
    });
    let settings = match settings(&args) {
        Ok(s) => s,
        Err(e) => return fail(2, e),
    };
    let spec = match workload_spec(&args.model) {
        Ok(s) => s,
        Err(e) => return fail(2, e),
    };
    let credentials = Credentials {
        token: std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()),
        tls: match (&args.tls_cert, &args.tls_key, &args.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => Some(TlsFiles { cert: cert.clone(), key: key.clone(), ca: ca.clone() }),
            _ => None,
        },
    };
    let Some(cluster) = cluster else {
        if source.is_none() {
            tracing::info!("no cluster (TF_CONFIG or --ps_hosts/--worker_hosts)");
        }
        return run_single_process(&spec, &settings).await;
    };
    let status = Arc::new(TaskStatus::new(cluster.task.clone()));
    let metrics = Arc::new(TrainingMetrics::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let ps = if cluster.role() == Role::Ps {
        // A ps listed sparsely (Kubeflow's enableDynamicWorker gives a ps only
        // itself) does not know how many ps tasks there are: 0 learns it from
        // the first caller.
        let num_ps = if cluster.cluster.is_sparse("ps") { 0 } else { cluster.cluster.num_tasks("ps") };
        let mut config = PsConfig::new(cluster.task.index as usize, num_ps, cluster.cluster.chief());
        config.lease = Duration::from_secs_f64(args.lease_secs.max(0.1));
        let store = Arc::new(ParameterStore::new(config));
        // The evaluators too: each evaluates the final variables before it leaves.
        let mut expected = cluster.cluster.training_tasks();
        expected.extend(cluster.cluster.tasks("evaluator").into_iter().map(|(i, _)| cluster::TaskId::new("evaluator", i)));
        store.expect(&expected);
        if let Some(dir) = &settings.checkpoints.directory
            && let Err(e) = restore(&store, dir, &cluster)
        {
            return fail(e.0, e.1);
        }
        Some((store.clone(), PsService::new(store)))
    } else {
        None
    };
    let mut background = Vec::new();
    if let Some((store, _)) = &ps {
        let store = store.clone();
        background.push(tfjob_runtime::metrics::every(Duration::from_millis(200), move || {
            let store = store.clone();
            async move {
                store.expire_leases(std::time::Instant::now());
            }
        }));
    }
    if let Some(port) = args.metrics_port {
        use tfjob_runtime::metrics::{PsMetrics, TaskMetrics};
        let task = cluster.task.to_string();
        let exposition = Arc::new(match &ps {
            Some((store, _)) => TaskMetrics::new(&task, PsMetrics(store.clone())),
            None => TaskMetrics::new(&task, metrics.clone()),
        });
        match tfjob_runtime::metrics::serve(SocketAddr::new(args.bind, port), exposition).await {
            Ok(h) => background.push(h),
            Err(e) => return fail(3, e),
        }
    }
    let server = match cluster.own_address().and_then(cluster::port_of) {
        Some(port) => {
            let worker = WorkerService::new(status.clone(), None);
            let addr = SocketAddr::new(args.bind, port);
            match server::serve(addr, ps.as_ref().map(|(_, s)| s.clone()), worker, &credentials, async {
                let _ = stop_rx.await;
            })
            .await
            {
                Ok(handle) => {
                    tracing::info!("{}: serving on {addr}", cluster.task);
                    Some(handle)
                }
                Err(e) => return fail(3, e),
            }
        }
        None => None,
    };
    // A worker stopped on a signal is told to leave, and given the time to
    // say so over the connections it trains on.
    let (leave_tx, leave_rx) = tokio::sync::watch::channel(false);
    let role = run_role(&cluster, &spec, &settings, &credentials, status, metrics, ps.map(|(s, _)| s), args.shutdown_grace_secs, leave_rx);
    tokio::pin!(role);
    let code = tokio::select! {
        code = &mut role => code,
        code = termination() => {
            tracing::warn!("{}: stopping on signal", cluster.task);
            if cluster.role() == Role::Worker {
                let _ = leave_tx.send(true);
                let _ = tokio::time::timeout(tfjob_runtime::client::LEAVE_DEADLINE + Duration::from_millis(500), &mut role).await;
            }
            code
        }
    };
    for h in background {
        h.abort();
    }
    let _ = stop_tx.send(());
    if let Some(handle) = server {
        let _ = tokio::time::timeout(Duration::from_secs(2), handle).await;
    }
    code
}

/// Restores a ps from the latest complete checkpoint, if there is one.
fn restore(store: &ParameterStore, dir: &Location, cluster: &ClusterConfig) -> Result<(), (u8, String)> {
    use tfjob_runtime::checkpoint;
    // 0 when this ps does not know how many ps tasks there are: the
    // checkpoint's count is then taken.
    let num_ps = store.num_ps();
    // Storage that cannot be reached may come back: a transient exit code.
    let code = |e: &checkpoint::CheckpointError| if matches!(e, checkpoint::CheckpointError::Io(_)) { 138 } else { 2 };
    let latest = checkpoint::latest_complete(dir, num_ps).map_err(|e| (code(&e), e.to_string()))?;
    let Some(ckpt) = latest else {
        tracing::info!("{}: no complete checkpoint in {dir}: starting fresh", cluster.task);
        return Ok(());
    };
    let data = checkpoint::read_shard(&ckpt, cluster.task.index as usize).map_err(|e| (code(&e), e.to_string()))?;
    store.restore(&data, ckpt.global_step, ckpt.num_ps).map_err(|e| (2, e.to_string()))?;
    tracing::info!("{}: restored {} variable(s) from {} (global_step={})", cluster.task, data.variables.len(), ckpt.path, ckpt.global_step);
    Ok(())
}

/// `ps=[a:1] worker=[b:1,c:1]` (a long job: its first addresses and its size).
fn describe_cluster(spec: &cluster::ClusterSpec) -> String {
    let job = |job: &str| {
        let all = spec.addresses(job);
        match all.len() {
            0..=4 => format!("{job}=[{}]", all.join(",")),
            n => format!("{job}=[{},... {n} tasks]", all[..3].join(",")),
        }
    };
    spec.jobs().map(job).collect::<Vec<_>>().join(" ")
}

#[allow(clippy::too_many_arguments)]
async fn run_role(
    cluster: &ClusterConfig,
    spec: &WorkloadSpec,
    settings: &TrainSettings,
    credentials: &Credentials,
    status: Arc<TaskStatus>,
    metrics: Arc<TrainingMetrics>,
    store: Option<Arc<ParameterStore>>,
    grace_secs: u64,
    mut leave: tokio::sync::watch::Receiver<bool>,
) -> u8 {
    match cluster.role() {
        Role::Ps => run_ps(cluster, store.expect("ps store"), status, Duration::from_secs(grace_secs)).await,
        Role::Worker | Role::Evaluator => {
            let mut workload = match workload::build(spec) {
                Ok(w) => w,
                Err(e) => return fail(2, e),
            };
            let result = if cluster.role() == Role::Evaluator {
                train::run_evaluator(cluster, &mut workload, settings, credentials, status, metrics).await
            } else {
                // Resolves once told to leave; never when the sender is gone
                // without a word.
                let told_to_leave = async move {
                    if leave.wait_for(|l| *l).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                };
                tfjob_runtime::worker::run_worker(cluster, &mut workload, settings, credentials, status, metrics, told_to_leave).await
            };
            match result {
                Ok(report) => {
                    print_report(&report);
                    0
                }
                Err(TrainError::Stopped { ps_heard, ps_total }) if ps_heard == ps_total => {
                    tracing::info!("{}: left the job", cluster.task);
                    143
                }
                Err(TrainError::Stopped { ps_heard, ps_total }) => {
                    tracing::warn!(
                        "{}: stopping; {} of {ps_total} ps task(s) did not hear it leave (gone, or training is over)",
                        cluster.task,
                        ps_total - ps_heard
                    );
                    143
                }
                Err(e) => fail(e.exit_code().clamp(1, 255) as u8, format_args!("{}: {e}", cluster.task)),
            }
        }
    }
}

/// A ps serves until the chief ends training, then waits (up to the grace
/// period) for the other tasks to notice, and exits 0.
async fn run_ps(cluster: &ClusterConfig, store: Arc<ParameterStore>, status: Arc<TaskStatus>, grace: Duration) -> u8 {
    let task = &cluster.task;
    status.set(proto::TaskState::Serving, 0, 0, "serving variables");
    let started = Instant::now();
    let mut progress = store.subscribe();
    if progress.wait_for(|p| p.done).await.is_err() {
        return fail(1, "the parameter store closed unexpectedly");
    }
    let step = store.progress().step;
    status.set(proto::TaskState::Done, 0, step, "training is over");
    let deadline = Instant::now() + grace;
    while !store.pending().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pending = store.pending();
    if !pending.is_empty() {
        tracing::warn!("{task}: exiting after {grace:?} without word from {}", pending.join(", "));
    }
    let stats = store.stats();
    tracing::info!("{task}: training over at step {}; exiting", stats.step);
    print_report(&serde_json::json!({
        "task": task.to_string(),
        "role": "ps",
        "global_step": stats.step,
        "pushes_applied": stats.pushes_applied,
        "stale_gradients_dropped": stats.stale_gradients_dropped,
        "duplicate_gradients_dropped": stats.duplicate_gradients_dropped,
        "bytes_received": stats.bytes_received,
        "bytes_sent": stats.bytes_sent,
        "variables": stats.variables.iter().map(|v| v.name.clone()).collect::<Vec<_>>(),
        "elapsed_secs": started.elapsed().as_secs_f64(),
    }));
    0
}

async fn run_single_process(spec: &WorkloadSpec, settings: &TrainSettings) -> u8 {
    let mut workload = match workload::build(spec) {
        Ok(w) => w,
        Err(e) => return fail(2, e),
    };
    tracing::info!("training {} in this process", workload.model.name());
    let settings = settings.clone();
    let report = tokio::task::spawn_blocking(move || {
        train::train_single_process(&mut workload, &settings, |step, loss, model, params| {
            let summary: String = model.summary(params).iter().map(|(k, v)| format!(" {k}={v:.4}")).collect();
            tracing::info!("local: step={step} loss={loss:.4}{summary}");
        })
    })
    .await
    .expect("training thread");
    match report {
        Ok(report) => {
            print_report(&report);
            0
        }
        Err(e) => fail(e.exit_code().clamp(1, 255) as u8, format_args!("local: {e}")),
    }
}

async fn run_server(addr: SocketAddr) -> u8 {
    let status = Arc::new(TaskStatus::new(cluster::TaskId::new("localhost", 0)));
    status.set(proto::TaskState::Serving, 0, 0, "serving sessions");
    let credentials = Credentials { token: std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()), tls: None };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let handle = match server::serve(addr, None, WorkerService::new(status, Some(session_factory())), &credentials, async {
        let _ = stop_rx.await;
    })
    .await
    {
        Ok(h) => h,
        Err(e) => return fail(3, e),
    };
    tracing::info!("serving sessions on grpc://{addr}");
    let code = termination().await;
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(2), handle).await;
    code
}

async fn run_client(args: ClientArgs) -> u8 {
    let address = args.target.strip_prefix("grpc://").unwrap_or(&args.target).to_string();
    if let Err(e) = cluster::check_address("--target", &address) {
        return fail(2, e);
    }
    let token = std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty());
    let attach = match tfjob_runtime::auth::TokenAttach::new(token.as_deref()) {
        Ok(a) => a,
        Err(e) => return fail(2, e.message()),
    };
    let channel = match channel(&address, Duration::from_secs(5), &Credentials::default()) {
        Ok(c) => c,
        Err(e) => return fail(2, e),
    };
    if args.health {
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        return match health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await {
            Ok(r) => {
                let status = tonic_health::pb::health_check_response::ServingStatus::try_from(r.into_inner().status)
                    .unwrap_or(tonic_health::pb::health_check_response::ServingStatus::Unknown);
                println!("{}", status.as_str_name());
                u8::from(status != tonic_health::pb::health_check_response::ServingStatus::Serving)
            }
            Err(e) => fail(1, format_args!("{}: {}", args.target, e.message())),
        };
    }
    let mut client = WorkerClient::with_interceptor(channel, attach)
        .max_decoding_message_size(tensor::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(tensor::MAX_MESSAGE_BYTES);
    if args.status {
        return match client.get_status(proto::GetStatusRequest {}).await {
            Ok(s) => {
                let s = s.into_inner();
                let task = s.task.map(|t| format!("{}:{}", t.job, t.index)).unwrap_or_default();
                println!(
                    "{task} {:?} local_step={} global_step={} {}",
                    proto::TaskState::try_from(s.state).unwrap_or(proto::TaskState::Unspecified),
                    s.local_step,
                    s.global_step,
                    s.message
                );
                0
            }
            Err(e) => fail(1, format_args!("{}: {}", args.target, e.message())),
        };
    }
    let fetch = if args.train {
        let m = &args.model;
        if m.keras.keras_model.is_some() || m.data.given() {
            return fail(2, "--train: a session runs the built-in models only (--keras_model and the data format flags are for tasks)");
        }
        Fetch::Train(proto::TrainRun {
            model: m.model.clone(),
            hidden_units: m.mlp.hidden_units.as_deref().and_then(|h| h.split(',').next()).and_then(|s| s.trim().parse().ok()).unwrap_or(100),
            train_steps: m.train_steps.unwrap_or(0),
            batch_size: m.batch_size.unwrap_or(0) as u32,
            learning_rate: m.learning_rate,
            optimizer: m.optimizer.clone(),
            log_every_steps: m.log_every_steps as u32,
            data_dir: m.data_dir.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            seed: m.seed,
        })
    } else {
        let text = args.message.clone().unwrap_or_else(|| "Hello, distributed TensorFlow!".into());
        Fetch::Constant(tensor::tensor_from_str(&text))
    };
    let mut stream = match client.run_session(proto::RunSessionRequest { fetch: Some(fetch) }).await {
        Ok(s) => s.into_inner(),
        Err(e) => return fail(1, format_args!("{}: {}", args.target, e.message())),
    };
    loop {
        match stream.message().await {
            Ok(Some(ev)) => match ev.event {
                Some(Event::Value(t)) => println!("{}", String::from_utf8_lossy(&t.content)),
                Some(Event::Progress(p)) => println!("step={} loss={:.4}{}", p.step, p.loss, metrics_line(&p.metrics)),
                Some(Event::Finished(p)) => println!("finished: steps={} loss={:.4}{}", p.step, p.loss, metrics_line(&p.metrics)),
                Some(Event::Log(l)) => eprintln!("{l}"),
                None => {}
            },
            Ok(None) => return 0,
            Err(e) => return fail(1, format_args!("{}: {}", args.target, e.message())),
        }
    }
}

fn metrics_line(m: &std::collections::HashMap<String, f64>) -> String {
    let mut keys: Vec<_> = m.keys().collect();
    keys.sort();
    keys.into_iter().map(|k| format!(" {k}={:.4}", m[k])).collect()
}

/// `predict` (CSV on stdout) or `evaluate` (one JSON line): the Keras model
/// (or the built-in model's preset) with the latest complete checkpoint's
/// weights on --input.
fn run_inference(args: &InferenceArgs, evaluate: bool) -> u8 {
    match inference(args, evaluate) {
        Ok(out) => {
            print!("{out}");
            0
        }
        Err(e) => fail(2, e),
    }
}

fn message(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// What `predict` or `evaluate` prints.
fn inference(args: &InferenceArgs, evaluate: bool) -> Result<String, String> {
    use tfjob_runtime::data::{self, LabelKind};
    use tfjob_runtime::model::Model as _;
    use tfjob_runtime::trained;
    let spec = workload::InferenceSpec {
        model: args.model.clone(),
        hidden_units: args.mlp.hidden_units()?,
        activation: args.mlp.activation.clone(),
        keras: args.keras.options(),
        data: args.data.options()?,
    };
    spec.check().map_err(message)?;
    // A Keras model is read before anything else; a built-in one needs the checkpoint's sizes.
    let keras = match &spec.keras.model_file {
        Some(file) => {
            let model = spec.keras.build(file, 1).map_err(message)?;
            workload::check_num_classes(&model, spec.data.num_classes).map_err(message)?;
            Some(model)
        }
        None => None,
    };
    let kind = if spec.is_classifier(keras.as_ref()) { LabelKind::Classes } else { LabelKind::Values };
    let input = data::read_input(&args.input, args.labels.as_deref(), &spec.data, kind, evaluate).map_err(message)?;
    let (ckpt, values) = trained::latest_variables(&args.checkpoint_dir).map_err(message)?;
    let model = match keras {
        Some(m) => m,
        None => {
            let model = workload::inference_model(&spec, &ckpt.path.to_string(), &values).map_err(message)?;
            workload::check_num_classes(&model, spec.data.num_classes).map_err(message)?;
            model
        }
    };
    workload::check_example_shape(&args.input, input.example_shape.as_deref(), model.input_shape()).map_err(message)?;
    model.check_inputs(&input.x).map_err(|x| format!("--input: {}: {x}", args.input.display()))?;
    let params = trained::params_in_order(&ckpt.path.to_string(), &model.variables(), &values).map_err(message)?;
    if !evaluate {
        return Ok(trained::predictions_csv(&model, &params, &input.x));
    }
    let targets = input.targets.expect("read_input requires labels for evaluate");
    model.check_targets(&targets).map_err(|x| format!("{}: {x}", args.labels.as_deref().unwrap_or(args.input.as_path()).display()))?;
    let result = trained::evaluate(&model, &params, &input.x, &targets);
    let report = serde_json::json!({
        "checkpoint": ckpt.path.to_string(),
        "global_step": ckpt.global_step,
        "examples": result.examples,
        "loss": result.loss,
        "accuracy": result.accuracy,
    });
    Ok(format!("{report}\n"))
}

/// `generate`: learnable data with known weights, and the AUC they allow.
fn run_generate(args: &GenerateArgs) -> u8 {
    use std::io::Write;
    use tfjob_runtime::data::{GENERATED_EVAL_BASE, Generator, SparseFormat};
    let format: SparseFormat = match args.data_format.parse() {
        Ok(f) => f,
        Err(e) => return fail(2, format_args!("--data_format: {e}")),
    };
    let g = Generator::new(format, args.seed);
    let write = |name: &str, range: std::ops::Range<u64>| -> std::io::Result<PathBuf> {
        let path = args.out.join(if args.gzip { format!("{name}.txt.gz") } else { format!("{name}.txt") });
        let file = std::io::BufWriter::new(std::fs::File::create(&path)?);
        let mut out: Box<dyn Write> = if args.gzip { Box::new(flate2::write::GzEncoder::new(file, flate2::Compression::fast())) } else { Box::new(file) };
        for i in range {
            out.write_all(g.line(i).as_bytes())?;
        }
        out.flush()?;
        Ok(path)
    };
    let written = std::fs::create_dir_all(&args.out)
        .and_then(|()| Ok((write("train", 0..args.train_examples)?, write("eval", GENERATED_EVAL_BASE..GENERATED_EVAL_BASE + args.eval_examples)?)));
    let (train, eval) = match written {
        Ok(w) => w,
        Err(e) => return fail(2, format_args!("{}: {e}", args.out.display())),
    };
    print_report(&serde_json::json!({
        "data_format": format.as_str(),
        "seed": args.seed,
        "train": train.display().to_string(),
        "eval": eval.display().to_string(),
        "train_examples": args.train_examples,
        "eval_examples": args.eval_examples,
        "achievable_auc": g.achievable_auc(args.eval_examples),
    }));
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The boolean flags take every spelling they took before (any case),
    /// alone they mean true, and a bad value's error names the flag.
    #[test]
    fn boolean_flags() {
        let parse = |args: &[&str]| Cli::try_parse_from(std::iter::once("tfjob-runtime").chain(args.iter().copied()));
        let spellings = [
            ("true", true),
            ("1", true),
            ("yes", true),
            ("on", true),
            ("TRUE", true),
            ("Yes", true),
            ("false", false),
            ("0", false),
            ("no", false),
            ("off", false),
            ("OFF", false),
        ];
        for (text, want) in spellings {
            let cli = parse(&[&format!("--sync_replicas={text}"), &format!("--tensor_channel={text}"), &format!("--from_logits={text}")]).unwrap();
            assert_eq!((cli.task.sync_replicas, cli.task.tensor_channel, cli.task.model.keras.from_logits), (want, want, want), "{text}");
        }
        let cli = parse(&["--sync_replicas", "--from_logits"]).unwrap();
        assert!(cli.task.sync_replicas && cli.task.model.keras.from_logits && cli.task.tensor_channel);
        let cli = parse(&[]).unwrap();
        assert!(!cli.task.sync_replicas && !cli.task.model.keras.from_logits && cli.task.tensor_channel);
        for flag in ["--sync_replicas", "--tensor_channel", "--from_logits"] {
            let err = parse(&[&format!("{flag}=maybe")]).unwrap_err().to_string();
            assert!(err.contains(flag) && err.contains("maybe"), "{err}");
        }
    }
}
