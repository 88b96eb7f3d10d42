//! tfjob: the `tfjob` command.
//!
//! - [`cli`]: the command line and what each subcommand runs.
//! - [`local`]: `tfjob run`: one job on this machine, its replicas processes or containers.
//! - [`plot`]: every picture the project draws (training under `tfjob run`, the benchmark's).
//!
//! The API types, planning and the status machine are [`tfjob_api`]'s; `tfjob operator` is
//! [`tfjob_operator`]'s controller.

pub mod cli;
pub mod local;
pub mod plot;
