//! `tfjob-runtime`: runs the task given by `TF_CONFIG` or the classic
//! distributed-TensorFlow flags (ps, worker, chief or evaluator), or trains
//! in a single process when there is no cluster.
//!
//! This file holds the flags and their conversion into the library's
//! options; running them is [`tfjob_runtime::task`] (a task) and
//! [`tfjob_runtime::commands`] (the other commands).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser, Subcommand};
use tfjob_runtime::auth::{TOKEN_ENV, TlsSource};
use tfjob_runtime::cluster::ClusterFlags;
use tfjob_runtime::commands::{self, Ask, GenerateRequest, InferenceInput};
use tfjob_runtime::data::SparseFormat;
use tfjob_runtime::dispatch::ShardPlan;
use tfjob_runtime::exit::{fail, print_report};
use tfjob_runtime::optimizer::Optimizer;
use tfjob_runtime::proto::{self, run_session_request::Fetch};
use tfjob_runtime::storage::Location;
use tfjob_runtime::task::{TaskOptions, run_task};
use tfjob_runtime::tensor;
use tfjob_runtime::train::{Aggregate, CheckpointSettings, TrainSettings};
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
        /// The port to serve on.
        #[arg(long, default_value_t = 2222)]
        port: u16,
        /// The address to listen on.
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
        /// Where the job wrote its checkpoints (a path or an object-store URL).
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
    /// Examples in train.txt.
    #[arg(long = "train_examples", visible_alias = "train-examples", default_value_t = 20_000)]
    train_examples: u64,
    /// Examples in eval.txt.
    #[arg(long = "eval_examples", visible_alias = "eval-examples", default_value_t = 5_000)]
    eval_examples: u64,
    /// Seed of the generated data (the same seed, the same files).
    #[arg(long, default_value_t = tfjob_runtime::train::DEFAULT_SEED)]
    seed: u64,
    /// Writes train.txt.gz and eval.txt.gz.
    #[arg(long)]
    gzip: bool,
}

#[derive(Args, Debug)]
struct InferenceArgs {
    /// Where the job wrote its checkpoints (a path or an object-store URL).
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
    /// The optimizer's learning rate.
    #[arg(long = "learning_rate", visible_alias = "learning-rate", default_value_t = 0.01)]
    learning_rate: f32,
    /// The momentum of --optimizer=momentum and nesterov.
    #[arg(long, default_value_t = 0.9)]
    momentum: f32,
    /// Examples per step (default: 1 for linear, as in the classic example; 32 for a
    /// --keras_model, as Keras's fit; 100 for softmax, mlp and the sparse models).
    #[arg(long = "batch_size", visible_alias = "batch-size")]
    batch_size: Option<usize>,
    /// Global steps to train (default 1000; without it, --num_epochs alone decides).
    #[arg(long = "train_steps", visible_alias = "train-steps")]
    train_steps: Option<u64>,
    /// Epochs of the training set to train: training ends when every shard of every epoch is
    /// done (with --train_steps too: whichever comes first).
    #[arg(long = "num_epochs", visible_alias = "num-epochs")]
    num_epochs: Option<u64>,
    /// Examples per shard of the training set (default: 10 batches, at least 1,000). Ps task 0 hands shards
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
    /// Seed of the initial values and of the data order (the same on every task).
    #[arg(long, default_value_t = tfjob_runtime::train::DEFAULT_SEED)]
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
    /// How embedding rows are cut over the ps tasks: consistent (jump consistent hash of the row id:
    /// adding or removing a ps moves only its share), mod (row id % ps) or div (contiguous runs).
    #[arg(long = "partition_strategy", visible_alias = "partition-strategy", default_value = "consistent")]
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
    /// Host:port of the chief task (at most one).
    #[arg(long = "chief_hosts", visible_alias = "chief-hosts")]
    chief_hosts: Option<String>,
    /// Host:port of the evaluator task (at most one).
    #[arg(long = "evaluator_hosts", visible_alias = "evaluator-hosts")]
    evaluator_hosts: Option<String>,
    /// ps, worker, chief or evaluator.
    #[arg(long = "job_name", visible_alias = "job-name")]
    job_name: Option<String>,
    /// This task's index in its job's hosts (default 0).
    #[arg(long = "task_index", visible_alias = "task-index")]
    task_index: Option<u32>,
    /// Address to listen on (the port comes from this task's host:port).
    #[arg(long, env = "TFJOB_BIND", default_value = "0.0.0.0")]
    bind: IpAddr,
    /// Threads one matrix product may use (TensorFlow's intra_op_parallelism_threads), at most 4.
    /// 0: MATMUL_NUM_THREADS when set, else 1 for a task of a cluster (its ps and sibling workers
    /// often share the machine) and the cores it may use for a single process (its CPU quota
    /// under Kubernetes). Give a worker with a CPU limit of N the value N. The numbers trained
    /// are the same whatever it is.
    #[arg(long = "intra_op_parallelism_threads", visible_alias = "num_intra_threads", default_value_t = 0)]
    intra_op_threads: usize,
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
    /// Serve Prometheus metrics on this port (/metrics); also read from TFJOB_METRICS_PORT, which
    /// the operator can set in every replica's environment (the flag wins). ps 0's endpoint shows
    /// the whole job's progress: steps, epochs, the training loss and the latest evaluation.
    #[arg(long = "metrics_port", visible_alias = "metrics-port", env = "TFJOB_METRICS_PORT")]
    metrics_port: Option<u16>,
    /// A training task not heard from for this long no longer counts as live (elastic sync).
    #[arg(long = "lease_secs", visible_alias = "lease-secs", default_value_t = 10.0)]
    lease_secs: f64,
    /// How often training tasks renew their lease.
    #[arg(long = "heartbeat_secs", visible_alias = "heartbeat-secs", default_value_t = 2.0)]
    heartbeat_secs: f64,
    /// TLS between tasks (mutual: every task presents its certificate and
    /// checks its peer's): this task's certificate (PEM). `tfjob run` sets
    /// the three files through the environment.
    #[arg(long = "tls_cert", visible_alias = "tls-cert", env = "TFJOB_TLS_CERT", requires_all = ["tls_key", "tls_ca"], group = "tls_identity")]
    tls_cert: Option<PathBuf>,
    /// TLS: this task's private key (PEM).
    #[arg(long = "tls_key", visible_alias = "tls-key", env = "TFJOB_TLS_KEY", requires_all = ["tls_cert", "tls_ca"])]
    tls_key: Option<PathBuf>,
    /// TLS: the CA that signed every task's certificate (PEM), with
    /// --tls_cert and --tls_key or with --tls_ca_key.
    #[arg(long = "tls_ca", visible_alias = "tls-ca", env = "TFJOB_TLS_CA", requires = "tls_identity")]
    tls_ca: Option<PathBuf>,
    /// TLS: the key of the job's CA (PEM): this task makes its own key and
    /// a certificate for its address at start, signed by it (the operator
    /// sets it and --tls_ca through the environment).
    #[arg(long = "tls_ca_key", visible_alias = "tls-ca-key", env = "TFJOB_TLS_CA_KEY", requires = "tls_ca", conflicts_with_all = ["tls_cert", "tls_key"], group = "tls_identity")]
    tls_ca_key: Option<PathBuf>,
    /// How long a worker waits for the chief to initialise the variables.
    #[arg(long = "init_timeout_secs", visible_alias = "init-timeout-secs", default_value_t = 300)]
    init_timeout_secs: u64,
    /// How long a ps may stay unreachable before the task gives up.
    #[arg(long = "connect_timeout_secs", visible_alias = "connect-timeout-secs", default_value_t = 120)]
    connect_timeout_secs: u64,
    /// How long one synchronous step may take before the task gives up.
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
    /// no copies beyond the kernel's; inside TLS when the job has
    /// certificates) instead of gRPC.
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

fn main() -> ExitCode {
    tfjob_runtime::process_age();
    tfjob_runtime::tune_allocator();
    let cli = Cli::parse();
    // Before any thread starts (it sets the environment).
    let alone = cli.command.is_some() || cli.task.trains_alone();
    let matmul_threads = tfjob_runtime::set_matmul_threads(cli.task.intra_op_threads, alone);
    let format = cli.task.log_format.clone();
    init_logging(&format);
    tracing::debug!(matmul_threads, "threads of a matrix product");
    let runtime = task_runtime();
    let code = runtime.block_on(async move {
        match cli.command {
            Some(Command::Server { port, bind }) => commands::run_server(SocketAddr::new(bind, port)).await,
            Some(Command::Client(args)) => commands::run_client(&args.target, args.ask()).await,
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
            Some(Command::Predict(args)) => commands::run_inference(args.input(), false),
            Some(Command::Generate(args)) => match args.request() {
                Ok(req) => commands::run_generate(&req),
                Err(e) => fail(2, e),
            },
            Some(Command::Evaluate(args)) => commands::run_inference(args.input(), true),
            // On a worker thread of the runtime, not on this one: a worker
            // thread waits for its sockets itself, so a reply wakes the thread
            // that trains. Polled here, every reply woke a runtime thread that
            // then woke this one: two wake-ups a message, the sparse_lr job's
            // steps 1.27x slower and its kernel time 1.43x (BENCHMARKS.md,
            // "One wake-up a reply").
            None => match tokio::spawn(run_task(cli.task.options())).await {
                Ok(code) => code,
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            },
        }
    });
    // Do not wait for lingering connections of peers.
    runtime.shutdown_timeout(Duration::from_millis(200));
    ExitCode::from(code)
}

/// The task's runtime: tokio's own number of worker threads (the cores it
/// may use, or `TOKIO_WORKER_THREADS`), but at least two, since the task's
/// training loop computes on one of them (`main`) and its servers, heartbeats
/// and lease must go on meanwhile, also in a pod with a 1-CPU quota.
fn task_runtime() -> tokio::runtime::Runtime {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        builder.worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get().max(2)));
    }
    builder.enable_all().build().expect("tokio runtime")
}

impl ClientArgs {
    /// What the flags ask the task.
    fn ask(&self) -> Ask {
        if self.health {
            Ask::Health
        } else if self.status {
            Ask::Status
        } else {
            Ask::Session(self.fetch())
        }
    }

    /// A session's fetch: a training run (`--train`, the model flags) or a
    /// constant sent back.
    fn fetch(&self) -> Result<Fetch, String> {
        if !self.train {
            let text = self.message.clone().unwrap_or_else(|| "Hello, distributed TensorFlow!".into());
            return Ok(Fetch::Constant(tensor::tensor_from_str(&text)));
        }
        let m = &self.model;
        if m.keras.keras_model.is_some() || m.data.given() {
            return Err("--train: a session runs the built-in models only (--keras_model and the data format flags are for tasks)".into());
        }
        Ok(Fetch::Train(proto::TrainRun {
            model: m.model.clone(),
            hidden_units: m.mlp.hidden_units.as_deref().and_then(|h| h.split(',').next()).and_then(|s| s.trim().parse().ok()).unwrap_or(100),
            train_steps: m.train_steps.unwrap_or(0),
            batch_size: m.batch_size.unwrap_or(0) as u32,
            learning_rate: m.learning_rate,
            optimizer: m.optimizer.clone(),
            log_every_steps: m.log_every_steps as u32,
            data_dir: m.data_dir.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            seed: m.seed,
        }))
    }
}

impl InferenceArgs {
    /// The model, the examples and the checkpoints to read.
    fn input(&self) -> Result<InferenceInput, String> {
        let spec = workload::InferenceSpec {
            model: self.model.clone(),
            hidden_units: self.mlp.hidden_units()?,
            activation: self.mlp.activation.clone(),
            keras: self.keras.options(),
            data: self.data.options()?,
        };
        Ok(InferenceInput { spec, input: self.input.clone(), labels: self.labels.clone(), checkpoint_dir: self.checkpoint_dir.clone() })
    }
}

impl GenerateArgs {
    fn request(&self) -> Result<GenerateRequest, String> {
        let format: SparseFormat = self.data_format.parse().map_err(|e| format!("--data_format: {e}"))?;
        Ok(GenerateRequest {
            format,
            seed: self.seed,
            out: self.out.clone(),
            gzip: self.gzip,
            train_examples: self.train_examples,
            eval_examples: self.eval_examples,
        })
    }
}

impl TaskArgs {
    fn cluster_flags(&self) -> ClusterFlags {
        ClusterFlags {
            ps_hosts: self.ps_hosts.clone(),
            worker_hosts: self.worker_hosts.clone(),
            chief_hosts: self.chief_hosts.clone(),
            evaluator_hosts: self.evaluator_hosts.clone(),
            job_name: self.job_name.clone(),
            task_index: self.task_index,
        }
    }

    /// No cluster: neither the classic flags nor `TF_CONFIG` give one.
    fn trains_alone(&self) -> bool {
        tfjob_runtime::cluster::source(&self.cluster_flags(), std::env::var("TF_CONFIG").ok().as_deref()).is_none()
    }

    /// The task's options: the cluster's flags and `TF_CONFIG`, the
    /// settings and the workload (checked after the cluster), the
    /// credentials (`TFJOB_TOKEN`, the TLS files).
    fn options(&self) -> TaskOptions {
        TaskOptions {
            cluster: self.cluster_flags(),
            tf_config: std::env::var("TF_CONFIG").ok(),
            settings: settings(self),
            spec: workload_spec(&self.model),
            token: std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()),
            tls: match (&self.tls_cert, &self.tls_key, &self.tls_ca, &self.tls_ca_key) {
                (Some(cert), Some(key), Some(ca), _) => Some(TlsSource::Files { cert: cert.clone(), key: key.clone(), ca: ca.clone() }),
                (None, None, Some(ca), Some(ca_key)) => Some(TlsSource::JobCa { ca: ca.clone(), ca_key: ca_key.clone() }),
                _ => None,
            },
            bind: self.bind,
            metrics_port: self.metrics_port,
            lease_secs: self.lease_secs,
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The boolean flags take every spelling they took before (any case),
    /// alone they mean true, and a bad value's error names the flag.
    /// Every flag of every command says what it is for in `--help`.
    #[test]
    fn every_flag_has_help() {
        fn missing(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
            for arg in cmd.get_arguments().filter(|a| !a.is_hide_set() && a.get_long().is_some()) {
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    out.push(format!("{path} --{}", arg.get_long().unwrap_or_default()));
                }
            }
            for sub in cmd.get_subcommands() {
                missing(sub, &format!("{path} {}", sub.get_name()), out);
            }
        }
        let mut out = Vec::new();
        missing(&<Cli as clap::CommandFactory>::command(), "tfjob-runtime", &mut out);
        assert!(out.is_empty(), "flags without help: {out:?}");
    }

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
