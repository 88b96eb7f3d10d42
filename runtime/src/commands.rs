//! The other commands of `tfjob-runtime`, once their flags are read: a
//! standalone session server, a client of a task, predictions and
//! evaluation from a checkpoint, generated data.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ndarray::ArrayD;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::auth::{Credentials, TOKEN_ENV, TokenAttach};
use crate::cluster::{self, TaskId};
use crate::data::{self, GENERATED_EVAL_BASE, Generator, LabelKind, SparseFormat};
use crate::exit::{fail, print_report, termination};
use crate::model::Model as _;
use crate::optimizer::Optimizer;
use crate::proto::{self, run_session_request::Fetch, session_event::Event, worker_client::WorkerClient};
use crate::server::{self, WorkerService, WorkloadFactory};
use crate::status::TaskStatus;
use crate::storage::Location;
use crate::train::TrainSettings;
use crate::workload::{self, WorkloadSpec};
use crate::{tensor, trained};

/// `server`: serves sessions (TensorFlow's `create_local_server`) until a
/// signal comes.
pub async fn run_server(addr: SocketAddr) -> u8 {
    let status = Arc::new(TaskStatus::new(TaskId::new("localhost", 0)));
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

/// A session's training run as a workload and its settings (what the run
/// leaves out takes the flags' defaults).
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

/// What `client` asks a task.
pub enum Ask {
    /// The standard health service's answer (no token needed).
    Health,
    /// The task's status.
    Status,
    /// A session: a constant sent back, or a training run (an error when
    /// the flags ask for what a session cannot run).
    Session(Result<Fetch, String>),
}

/// `client`: asks the task at `target` (grpc://host:port) and prints the
/// answer.
pub async fn run_client(target: &str, ask: Ask) -> u8 {
    let address = target.strip_prefix("grpc://").unwrap_or(target).to_string();
    if let Err(e) = cluster::check_address("--target", &address) {
        return fail(2, e);
    }
    let token = std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty());
    let attach = match TokenAttach::new(token.as_deref()) {
        Ok(a) => a,
        Err(e) => return fail(2, e.message()),
    };
    let channel = match crate::client::channel(&address, Duration::from_secs(5), &Credentials::default()) {
        Ok(c) => c,
        Err(e) => return fail(2, e),
    };
    let session = match ask {
        Ask::Health => return print_health(target, HealthClient::new(channel)).await,
        Ask::Status => None,
        Ask::Session(s) => Some(s),
    };
    let client = WorkerClient::with_interceptor(channel, attach)
        .max_decoding_message_size(tensor::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(tensor::MAX_MESSAGE_BYTES);
    match session {
        None => print_status(target, client).await,
        Some(Err(e)) => fail(2, e),
        Some(Ok(fetch)) => print_session(target, client, fetch).await,
    }
}

type Client = WorkerClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, TokenAttach>>;

/// SERVING or NOT_SERVING (exit 1 unless serving).
async fn print_health(target: &str, mut health: HealthClient<tonic::transport::Channel>) -> u8 {
    match health.check(HealthCheckRequest { service: String::new() }).await {
        Ok(r) => {
            let status = ServingStatus::try_from(r.into_inner().status).unwrap_or(ServingStatus::Unknown);
            println!("{}", status.as_str_name());
            u8::from(status != ServingStatus::Serving)
        }
        Err(e) => fail(1, format_args!("{target}: {}", e.message())),
    }
}

/// The task, its state and steps, and its message, on one line.
async fn print_status(target: &str, mut client: Client) -> u8 {
    match client.get_status(proto::GetStatusRequest {}).await {
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
        Err(e) => fail(1, format_args!("{target}: {}", e.message())),
    }
}

/// Runs a session and prints its events as they come.
async fn print_session(target: &str, mut client: Client, fetch: Fetch) -> u8 {
    let mut stream = match client.run_session(proto::RunSessionRequest { fetch: Some(fetch) }).await {
        Ok(s) => s.into_inner(),
        Err(e) => return fail(1, format_args!("{target}: {}", e.message())),
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
            Err(e) => return fail(1, format_args!("{target}: {}", e.message())),
        }
    }
}

fn metrics_line(m: &std::collections::HashMap<String, f64>) -> String {
    let mut keys: Vec<_> = m.keys().collect();
    keys.sort();
    keys.into_iter().map(|k| format!(" {k}={:.4}", m[k])).collect()
}

/// What `predict` and `evaluate` read: the model, the examples (and their
/// labels), the checkpoints.
pub struct InferenceInput {
    pub spec: workload::InferenceSpec,
    pub input: PathBuf,
    pub labels: Option<PathBuf>,
    pub checkpoint_dir: Location,
}

/// `predict` (CSV on stdout) or `evaluate` (one JSON line): the Keras model
/// (or the built-in model's preset) with the latest complete checkpoint's
/// weights on the input.
pub fn run_inference(input: Result<InferenceInput, String>, evaluate: bool) -> u8 {
    match input.and_then(|i| inference(&i, evaluate)) {
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

/// The model to run: the Keras one (read before anything else), or the
/// built-in one sized by the checkpoint.
fn inference_model(
    spec: &workload::InferenceSpec,
    keras: Option<crate::model::keras::KerasModel>,
    checkpoint: &str,
    values: &BTreeMap<String, ArrayD<f32>>,
) -> Result<crate::model::keras::KerasModel, String> {
    let model = match keras {
        Some(m) => return Ok(m),
        None => workload::inference_model(spec, checkpoint, values).map_err(message)?,
    };
    workload::check_num_classes(&model, spec.data.num_classes).map_err(message)?;
    Ok(model)
}

/// What `predict` or `evaluate` prints.
fn inference(args: &InferenceInput, evaluate: bool) -> Result<String, String> {
    let spec = &args.spec;
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
    let model = inference_model(spec, keras, &ckpt.path.to_string(), &values)?;
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

/// What `generate` writes.
pub struct GenerateRequest {
    pub format: SparseFormat,
    pub seed: u64,
    pub out: PathBuf,
    pub gzip: bool,
    pub train_examples: u64,
    pub eval_examples: u64,
}

/// Writes `name`.txt (or .txt.gz) in `dir`: lines `range` of `g`.
fn write_lines(g: &Generator, dir: &Path, name: &str, gzip: bool, range: std::ops::Range<u64>) -> std::io::Result<PathBuf> {
    use std::io::Write;
    let path = dir.join(if gzip { format!("{name}.txt.gz") } else { format!("{name}.txt") });
    let file = std::io::BufWriter::new(std::fs::File::create(&path)?);
    let mut out: Box<dyn Write> = if gzip { Box::new(flate2::write::GzEncoder::new(file, flate2::Compression::fast())) } else { Box::new(file) };
    for i in range {
        out.write_all(g.line(i).as_bytes())?;
    }
    out.flush()?;
    Ok(path)
}

/// `generate`: learnable data with known weights, and the AUC they allow.
pub fn run_generate(req: &GenerateRequest) -> u8 {
    let g = Generator::new(req.format, req.seed);
    let eval_range = GENERATED_EVAL_BASE..GENERATED_EVAL_BASE + req.eval_examples;
    let written = std::fs::create_dir_all(&req.out)
        .and_then(|()| Ok((write_lines(&g, &req.out, "train", req.gzip, 0..req.train_examples)?, write_lines(&g, &req.out, "eval", req.gzip, eval_range)?)));
    let (train, eval) = match written {
        Ok(w) => w,
        Err(e) => return fail(2, format_args!("{}: {e}", req.out.display())),
    };
    print_report(&serde_json::json!({
        "data_format": req.format.as_str(),
        "seed": req.seed,
        "train": train.display().to_string(),
        "eval": eval.display().to_string(),
        "train_examples": req.train_examples,
        "eval_examples": req.eval_examples,
        "achievable_auc": g.achievable_auc(req.eval_examples),
    }));
    0
}
