//! The `tfjob` command.

use clap::Parser;

fn main() -> std::process::ExitCode {
    tfjob::cli::run(tfjob::cli::Cli::parse())
}
