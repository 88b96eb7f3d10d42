//! The `tfjob` command.

use clap::Parser;

fn main() -> std::process::ExitCode {
    tfjob_operator::cli::run(tfjob_operator::cli::Cli::parse())
}
