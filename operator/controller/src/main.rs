//! `tfjob-operator`: the binary of the operator image.

use clap::Parser;

/// The TFJob (kubeflow.org/v1) operator; every flag has an environment fallback.
#[derive(Debug, Parser)]
#[command(name = "tfjob-operator", version, about = "TFJob (kubeflow.org/v1) operator")]
struct Cli {
    #[command(flatten)]
    args: tfjob_operator::OperatorArgs,
}

fn main() -> std::process::ExitCode {
    tfjob_operator::run_operator(Cli::parse().args)
}
