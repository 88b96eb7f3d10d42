//! The `tfjob` command: `crd`, `validate`, `render`, `operator`, `run`, `scale`, `status`,
//! `logs` and `completions`. Commands whose output is data take `-o yaml|json`.
//!
//! Each subcommand is a variant of [`Command`] with its own argument struct and a function that
//! runs it; adding a subcommand means adding a variant and a match arm in [`run`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use tfjob_api::crd::{crd, crd_yaml};

use tfjob_api::api::{self, ManifestError};
use tfjob_api::plan::{self, PlanOptions};

/// `tfjob`: TFJob operator and tools.
#[derive(Debug, Parser)]
#[command(name = "tfjob", version, about = "TFJob (kubeflow.org/v1) operator and tools")]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands of `tfjob`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the TFJob CustomResourceDefinition (YAML, or `-o json`).
    Crd(CrdArgs),
    /// Validate TFJob manifests; report every problem, exit non-zero if any.
    Validate(ValidateArgs),
    /// Print the objects the controller would create for a manifest (YAML, or `-o json`: a
    /// `List`).
    Render(RenderArgs),
    /// Run the Kubernetes controller.
    Operator(tfjob_operator::OperatorArgs),
    /// Run a TFJob on this machine: every replica a process on 127.0.0.1 (or a container with
    /// `--backend container`), driven by the same planning and status code as the operator.
    Run(RunArgs),
    /// Scale a running `tfjob run`: `tfjob scale RUN_DIR_OR_JOB_NAME Worker=N` (or `PS=N` to add ps tasks).
    Scale(ScaleArgs),
    /// Print the status of a `tfjob run` (its run directory, or a job's latest run).
    Status(StatusArgs),
    /// Print the replicas' logs of a `tfjob run`; `-f` follows them until the run ends.
    Logs(LogsArgs),
    /// Print a shell completion script: `tfjob completions bash > /etc/bash_completion.d/tfjob`,
    /// `tfjob completions zsh > "${fpath[1]}/_tfjob"`, `tfjob completions fish >
    /// ~/.config/fish/completions/tfjob.fish`.
    Completions(CompletionsArgs),
}

/// How a command prints data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// YAML.
    Yaml,
    /// JSON (indented).
    Json,
}

impl Output {
    /// `value` in this format, ending with a newline.
    pub fn format<T: serde::Serialize>(self, value: &T) -> Result<String, CliError> {
        let text = match self {
            Output::Yaml => api::to_yaml(value).map_err(|e| CliError::Output(e.to_string()))?,
            Output::Json => serde_json::to_string_pretty(value).map_err(|e| CliError::Output(e.to_string()))?,
        };
        Ok(if text.ends_with('\n') { text } else { text + "\n" })
    }
}

/// Arguments of `tfjob crd`.
#[derive(Debug, Args)]
pub struct CrdArgs {
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value = "yaml")]
    pub output: Output,
}

/// Arguments of `tfjob status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The run: its run directory, or the name of its TFJob for the latest run of that job.
    #[arg(value_name = "RUN_DIR_OR_JOB_NAME")]
    pub run: String,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value = "yaml")]
    pub output: Output,
}

/// Arguments of `tfjob logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The run: its run directory, or the name of its TFJob for the latest run of that job.
    #[arg(value_name = "RUN_DIR_OR_JOB_NAME")]
    pub run: String,
    /// One replica (`worker-0`, `ps-1`, ...); every replica, each line prefixed, when absent.
    pub replica: Option<String>,
    /// Keep printing new lines until the run ends.
    #[arg(long, short = 'f')]
    pub follow: bool,
}

/// Arguments of `tfjob completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Arguments of `tfjob scale`.
#[derive(Debug, Args)]
pub struct ScaleArgs {
    /// The run: its run directory, or the name of its TFJob for the latest run of that job.
    #[arg(value_name = "RUN_DIR_OR_JOB_NAME")]
    pub run: String,
    /// The new number of workers, `Worker=N`, or of parameter servers, `PS=N` (a removed ps hands
    /// its state to those that stay; ps 0 is never removed).
    #[arg(value_name = "Worker=N|PS=N", value_parser = crate::local::control::parse_scale)]
    pub replicas: crate::local::control::ScaleRequest,
    /// Given a job name, how long to wait for a run of it that is starting (`tfjob run job.yaml &`
    /// then `tfjob scale`, pasted at once), in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = crate::local::control::START_WAIT.as_secs())]
    pub wait: u64,
}

/// Arguments of `tfjob run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The TFJob manifest (`-`: standard input, as `kubectl apply -f -`).
    pub file: PathBuf,
    /// Directory for the replicas' logs and the job's status.yaml (default: a new directory
    /// under the system temp dir).
    #[arg(long = "run-dir", value_hint = clap::ValueHint::DirPath)]
    pub run_dir: Option<PathBuf>,
    /// Do not show the replicas' logs (they are still saved).
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Show only this replica's log (e.g. `worker-1`).
    #[arg(long, conflicts_with = "quiet")]
    pub follow: Option<String>,
    /// Where replicas run: `process` (default) or `container` (alias `docker`).
    #[arg(long, default_value = "process", value_parser = backend_parser())]
    pub backend: crate::local::BackendKind,
}

/// `--backend`'s values, named to clap so that errors list them and shell
/// completion offers them (not file names).
fn backend_parser() -> impl clap::builder::TypedValueParser<Value = crate::local::BackendKind> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let values = [PossibleValue::new("process").alias("local"), PossibleValue::new("container").aliases(["docker", "podman"])];
    PossibleValuesParser::new(values).map(|name| match name.as_str() {
        "process" => crate::local::BackendKind::Process,
        _ => crate::local::BackendKind::Container,
    })
}

/// Arguments of `tfjob validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Manifest files (YAML, possibly several documents each; `-` for stdin).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Print the result as data (one entry per file: `file`, `valid`, `problems`) instead of
    /// lines; the exit code is the same.
    #[arg(long, short = 'o', value_enum)]
    pub output: Option<Output>,
}

/// Arguments of `tfjob render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// Manifest file (`-` for stdin).
    pub file: PathBuf,
    /// Namespace of the job when the manifest has none.
    #[arg(long, short = 'n', default_value = "default")]
    pub namespace: String,
    /// Cluster domain appended to replica addresses (e.g. `cluster.local`).
    #[arg(long, env = "TFJOB_CLUSTER_DOMAIN")]
    pub cluster_domain: Option<String>,
    /// Gang scheduler (`volcano`, `kubernetes` or a scheduler-plugins scheduler name).
    #[arg(long, env = "TFJOB_GANG_SCHEDULER")]
    pub gang_scheduler: Option<String>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value = "yaml")]
    pub output: Output,
    /// Also render the job's NetworkPolicy (the operator's `--network-policy`).
    #[arg(long, env = "TFJOB_NETWORK_POLICY", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub network_policy: bool,
}

/// Errors of the CLI.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// A manifest is not valid.
    #[error("{path}: {source}")]
    Manifest {
        /// File.
        path: String,
        /// Cause.
        source: ManifestError,
    },
    /// The manifest holds no TFJob.
    #[error("{0}: no TFJob found")]
    Empty(String),
    /// Output failed.
    #[error("cannot write output: {0}")]
    Output(String),
}

fn read(path: &Path) -> Result<String, CliError> {
    crate::local::driver::read_manifest(path).map_err(|source| CliError::Read { path: path.display().to_string(), source })
}

/// The validation of one file, as `tfjob validate -o json|yaml` prints it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FileValidation {
    /// The file as given.
    pub file: String,
    /// Whether it holds TFJobs and they are all valid.
    pub valid: bool,
    /// Every problem, one line each (as `tfjob validate` prints them).
    pub problems: Vec<String>,
}

/// Validates the files; returns one line per problem (empty when everything is valid).
pub fn validate_files(files: &[PathBuf]) -> Vec<String> {
    validate_each(files).into_iter().flat_map(|f| f.problems).collect()
}

/// Validates each file.
pub fn validate_each(files: &[PathBuf]) -> Vec<FileValidation> {
    files
        .iter()
        .map(|path| {
            let problems = validate_file(path);
            FileValidation { file: path.display().to_string(), valid: problems.is_empty(), problems }
        })
        .collect()
}

fn validate_file(path: &Path) -> Vec<String> {
    let shown = path.display().to_string();
    let text = match read(path) {
        Ok(t) => t,
        Err(e) => return vec![e.to_string()],
    };
    let docs = match api::load_manifest(&text) {
        Err(e) => return vec![format!("{shown}: {e}")],
        Ok(docs) if docs.is_empty() => return vec![CliError::Empty(shown).to_string()],
        Ok(docs) => docs,
    };
    let mut problems = Vec::new();
    for doc in docs {
        match doc {
            Ok(_) => {}
            Err(ManifestError::Invalid { name, errors }) => {
                for e in errors.0 {
                    problems.push(format!("{shown}: TFJob {name}: {e}"));
                }
            }
            Err(e) => problems.push(format!("{shown}: {e}")),
        }
    }
    problems
}

/// Renders the objects the controller would create for every TFJob in `text`, as multi-document
/// YAML (or, with `-o json`, a `v1` `List` as `kubectl get -o json` prints several objects).
/// The token is random, as in the cluster, and so is the CA of a job whose replicas talk over
/// TLS (the operator derives it from its seed).
pub fn render_text(text: &str, path: &str, args: &RenderArgs) -> Result<String, CliError> {
    let docs = api::load_manifest(text).map_err(|source| CliError::Manifest { path: path.to_string(), source })?;
    if docs.is_empty() {
        return Err(CliError::Empty(path.to_string()));
    }
    let opts = PlanOptions::from_settings(args.cluster_domain.as_deref(), args.gang_scheduler.as_deref(), args.network_policy);
    let mut all: Vec<serde_json::Value> = Vec::new();
    for doc in docs {
        let mut job = doc.map_err(|source| CliError::Manifest { path: path.to_string(), source })?;
        if job.metadata.namespace.is_none() {
            job.metadata.namespace = Some(args.namespace.clone());
        }
        let ca = tfjob_api::pki::JobCa::generate(job.name()).and_then(|ca| ca.pem()).map_err(|e| CliError::Output(e.to_string()))?;
        let objects = plan::desired_objects(&job, &plan::random_token(), Some(&ca), &opts);
        let mut values: Vec<serde_json::Value> = Vec::new();
        let to_value = |v: Result<serde_json::Value, serde_json::Error>| v.map_err(|e| CliError::Output(e.to_string()));
        values.push(with_kind(to_value(serde_json::to_value(&objects.secret))?, "v1", "Secret"));
        values.push(with_kind(to_value(serde_json::to_value(&objects.service))?, "v1", "Service"));
        for pod in objects.pods {
            let pod = serde_json::to_value(pod.into_pod());
            values.push(with_kind(to_value(pod)?, "v1", "Pod"));
        }
        if let Some(pg) = objects.pod_group {
            values.push(pg);
        }
        if let Some(np) = objects.network_policy {
            let np = serde_json::to_value(&np);
            values.push(with_kind(to_value(np)?, "networking.k8s.io/v1", "NetworkPolicy"));
        }
        all.extend(values);
    }
    if args.output == Output::Json {
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": all});
        return Output::Json.format(&list);
    }
    let mut out = String::new();
    for v in all {
        out.push_str("---\n");
        out.push_str(&Output::Yaml.format(&v)?);
    }
    Ok(out)
}

fn with_kind(mut v: serde_json::Value, api_version: &str, kind: &str) -> serde_json::Value {
    if let Some(o) = v.as_object_mut() {
        o.insert("apiVersion".into(), api_version.into());
        o.insert("kind".into(), kind.into());
    }
    v
}

/// `tfjob scale`: sends the request to the run and prints its answer (`Worker 2 → 4`); exits 1
/// when there is no such run, it has ended, or it refused.
fn scale(args: &ScaleArgs) -> ExitCode {
    use crate::local::control;
    let request = control::Request::Scale(args.replicas.clone());
    let waiting = |e: &control::ClientError| eprintln!("tfjob scale: {e}; waiting up to {}s for a run that is starting", args.wait);
    let reply = control::send_to_run(&args.run, &control::runs_root(), &request, std::time::Duration::from_secs(args.wait), waiting);
    match reply {
        Ok(control::Reply { ok: true, message, .. }) => {
            println!("{}", message.unwrap_or_default());
            ExitCode::SUCCESS
        }
        Ok(control::Reply { error, .. }) => {
            eprintln!("tfjob scale: {}", error.unwrap_or_default());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("tfjob scale: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the command line.
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Crd(args) => match args.output {
            Output::Yaml => print_out(Ok(crd_yaml())),
            Output::Json => print_out(Output::Json.format(&crd())),
        },
        Command::Validate(args) => validate(&args),
        Command::Render(args) => print_out(read(&args.file).and_then(|text| render_text(&text, &args.file.display().to_string(), &args))),
        Command::Operator(args) => tfjob_operator::run_operator(args),
        Command::Run(args) => run_job(args),
        Command::Scale(args) => scale(&args),
        Command::Status(args) => print_out(run_status(&args.run, args.output)),
        Command::Logs(args) => logs(&args),
        Command::Completions(args) => {
            let mut cmd = Cli::command();
            clap_complete::generate(args.shell, &mut cmd, "tfjob", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
    }
}

/// `tfjob validate`: every problem on stderr (or every file's result as data with `-o`); exits
/// 1 when any file has one.
fn validate(args: &ValidateArgs) -> ExitCode {
    if let Some(output) = args.output {
        let results = validate_each(&args.files);
        let valid = results.iter().all(|r| r.valid);
        return match print_out(output.format(&results)) {
            ExitCode::SUCCESS if valid => ExitCode::SUCCESS,
            _ => ExitCode::FAILURE,
        };
    }
    let problems = validate_files(&args.files);
    if problems.is_empty() {
        for f in &args.files {
            println!("{}: valid", f.display());
        }
        ExitCode::SUCCESS
    } else {
        for p in &problems {
            eprintln!("{p}");
        }
        eprintln!("{} problem(s) found", problems.len());
        ExitCode::FAILURE
    }
}

/// `tfjob run`: exits with the job's code (0 succeeded, 1 failed, 128 + a signal), 2 when it
/// could not run.
fn run_job(args: RunArgs) -> ExitCode {
    let opts = crate::local::RunOptions { run_dir: args.run_dir, quiet: args.quiet, follow: args.follow, ..Default::default() };
    match crate::local::run_file(&args.file, args.backend, &opts) {
        Ok(result) => ExitCode::from(result.exit_code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("tfjob run: {e}");
            ExitCode::from(2)
        }
    }
}

/// `tfjob logs`: the run's logs on stdout (followed with `-f`); exits 1 when there are none.
fn logs(args: &LogsArgs) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match crate::local::logs::show(&args.run, args.replica.as_deref(), args.follow, &mut stdout) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tfjob logs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes a command's output to stdout, or its error to stderr (exit code 1).
fn print_out(text: Result<String, CliError>) -> ExitCode {
    let written = text.and_then(|t| std::io::stdout().lock().write_all(t.as_bytes()).map_err(|e| CliError::Output(e.to_string())));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The status of a `tfjob run` (`status.yaml` of its run directory) in `output`'s format: the
/// job's conditions, replica counts and times, as `kubectl get tfjob -o yaml` shows `status`.
pub fn run_status(run: &str, output: Output) -> Result<String, CliError> {
    use crate::local::control;
    let dir = control::resolve_run_dir(run, &control::runs_root()).map_err(|e| CliError::Output(e.to_string()))?;
    let path = dir.join("status.yaml");
    let text = read(&path)?;
    let status: serde_json::Value = serde_saphyr::from_str(&text).map_err(|e| CliError::Output(format!("{}: {e}", path.display())))?;
    output.format(&status)
}
