//! The end of a run: what the driver ([`super::driver`]) returns and the console
//! ([`super::console`]) reports.

use std::path::PathBuf;

/// The end of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    pub succeeded: bool,
    /// Reason and message of the final condition.
    pub reason: String,
    pub message: String,
    pub run_dir: PathBuf,
    /// Exit code for the `tfjob` process: 0 on success, 1 when the job
    /// failed, 130/143 when interrupted.
    pub exit_code: i32,
}
