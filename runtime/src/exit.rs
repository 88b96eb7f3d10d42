//! How a command of `tfjob-runtime` ends: the error line and exit code, the
//! final report (one JSON line), the signals that stop it.

/// Exit codes, following the `ExitCode` restart policy's contract: 1-127 a
/// permanent failure (a restart would fail the same way), 128 and above a
/// transient one.
pub mod code {
    /// A bad flag, configuration or data.
    pub const CONFIG: u8 = 2;
    /// A peer refused a request (invalid, not permitted).
    pub const REFUSED: u8 = 3;
    /// A checkpoint that cannot be read or written for good.
    pub const CHECKPOINT: u8 = 4;
    /// A peer or the storage could not be reached, a timeout: a restart may cure it.
    pub const TRANSIENT: u8 = 138;
    /// Stopped by SIGTERM.
    pub const TERMINATED: u8 = 143;

    /// [`TRANSIENT`] when a restart may cure the failure, else `permanent`.
    pub fn of(transient: bool, permanent: u8) -> u8 {
        if transient { TRANSIENT } else { permanent }
    }
}

/// Logs `message` as an error, prints it on stderr, and gives `code` back.
pub fn fail(code: u8, message: impl std::fmt::Display) -> u8 {
    tracing::error!("{message}");
    eprintln!("tfjob-runtime: {message}");
    code
}

/// Prints a task's final figures as one JSON line, with the process's peak
/// resident memory (`peak_rss_mib`, Linux's VmHWM) when it is known.
pub fn print_report(report: &impl serde::Serialize) {
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

/// Resolves with the exit code a signal asks for: 130 for Ctrl-C, 143 for
/// SIGTERM (transient: >= 128 under the ExitCode restart policy).
pub async fn termination() -> u8 {
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
