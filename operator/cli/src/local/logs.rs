//! `tfjob logs RUN_DIR|JOB [REPLICA] [-f]`: the replicas' logs of a `tfjob run`, read from its
//! run directory (`<replica>.log`, one per replica, written as the run goes). A job name means
//! its latest run, as for `tfjob scale`. Without a replica every log is shown, each line
//! prefixed with `[replica]` as `tfjob run` shows them; `-f` keeps reading until the run ends
//! (its `control.sock` is removed), picking up the logs of replicas that start later.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::control::{self, ClientError, SOCKET_NAME};

/// How often `-f` looks for new lines.
const FOLLOW_PERIOD: Duration = Duration::from_millis(200);

/// Why `tfjob logs` cannot show the logs.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    /// No such run.
    #[error(transparent)]
    Run(#[from] ClientError),
    /// The replica has no log in the run directory.
    #[error("no log of replica {replica} in {dir} (replicas with a log: {known})")]
    NoReplica {
        /// The replica asked for.
        replica: String,
        /// The run directory.
        dir: String,
        /// The replicas that have a log.
        known: String,
    },
    /// Reading a log or writing the output failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The replicas with a log in `dir`, by name (`ps-0`, `worker-0`, ...), with their log files.
pub fn replica_logs(dir: &Path) -> std::io::Result<BTreeMap<String, PathBuf>> {
    let mut logs = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if let Some(name) = path.file_name().and_then(|n| n.to_str())
            && let Some(replica) = name.strip_suffix(".log")
            && path.is_file()
        {
            logs.insert(replica.to_string(), path);
        }
    }
    Ok(logs)
}

/// One log being read: where it is, how far it was read, and a line not yet complete.
struct Tail {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl Tail {
    /// Reads what was appended since the last call; returns the complete lines.
    fn read_lines(&mut self) -> std::io::Result<Vec<String>> {
        let mut file = File::open(&self.path)?;
        file.seek(SeekFrom::Start(self.offset))?;
        let mut chunk = Vec::new();
        self.offset += file.read_to_end(&mut chunk)? as u64;
        self.partial.extend_from_slice(&chunk);
        Ok(complete_lines(&mut self.partial))
    }
}

/// Takes the complete lines (ending in `\n`) out of `buf`, leaving the rest. Pure.
pub fn complete_lines(buf: &mut Vec<u8>) -> Vec<String> {
    let Some(last) = buf.iter().rposition(|b| *b == b'\n') else {
        return Vec::new();
    };
    let rest = buf.split_off(last + 1);
    let done = std::mem::replace(buf, rest);
    String::from_utf8_lossy(&done[..last]).split('\n').map(str::to_string).collect()
}

/// Writes the logs of the run `run` (a run directory or a job name) to `out`.
pub fn show(run: &str, replica: Option<&str>, follow: bool, out: &mut impl Write) -> Result<(), LogsError> {
    let dir = control::resolve_run_dir(run, &control::runs_root())?;
    let logs = replica_logs(&dir)?;
    if let Some(r) = replica
        && !logs.contains_key(r)
        && !(follow && running(&dir))
    {
        return Err(LogsError::NoReplica {
            replica: r.to_string(),
            dir: dir.display().to_string(),
            known: logs.keys().cloned().collect::<Vec<_>>().join(", "),
        });
    }
    let mut tails: BTreeMap<String, Tail> = BTreeMap::new();
    loop {
        // Whether the run was still going before this pass: a pass after the end reads
        // everything the replicas wrote.
        let was_running = running(&dir);
        for (name, path) in replica_logs(&dir)? {
            if replica.is_none_or(|r| r == name) {
                tails.entry(name).or_insert(Tail { path, offset: 0, partial: Vec::new() });
            }
        }
        for (name, tail) in &mut tails {
            for line in tail.read_lines()? {
                match replica {
                    Some(_) => writeln!(out, "{line}")?,
                    None => writeln!(out, "[{name}] {line}")?,
                }
            }
        }
        out.flush()?;
        if !follow || !was_running {
            return Ok(());
        }
        std::thread::sleep(FOLLOW_PERIOD);
    }
}

/// Whether the run in `dir` is still going (its control socket is there).
fn running(dir: &Path) -> bool {
    dir.join(SOCKET_NAME).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_lines_keep_the_partial_one() {
        let cases: [(&str, &[&str], &str); 5] =
            [("", &[], ""), ("abc", &[], "abc"), ("a\n", &["a"], ""), ("a\nb\nc", &["a", "b"], "c"), ("\n\nx", &["", ""], "x")];
        for (input, lines, rest) in cases {
            let mut buf = input.as_bytes().to_vec();
            assert_eq!(complete_lines(&mut buf), lines, "{input:?}");
            assert_eq!(buf, rest.as_bytes(), "{input:?}");
        }
    }
}
