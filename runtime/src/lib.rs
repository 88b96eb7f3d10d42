//! tfjob-runtime: the program inside every replica of a TFJob.
//!
//! Pure cores (cluster parsing, placement, tensors, optimizers, the sync
//! accumulator, models, data) with thin async shells (the gRPC servers, the
//! client that fans out to the ps tasks, and the training loops).

pub mod proto {
    //! Generated from `proto/tfjob/runtime/v1`.
    tonic::include_proto!("tfjob.runtime.v1");
}

pub mod auth;
pub mod channel;
pub mod checkpoint;
pub mod client;
pub mod cluster;
pub mod commands;
pub mod connection;
pub mod data;
pub mod dispatch;
pub mod embedding;
pub mod events;
pub mod exit;
pub mod hash;
pub mod init;
pub mod layout;
pub mod le;
pub mod lookup;
pub mod metrics;
pub mod model;
pub mod optimizer;
pub mod placement;
pub mod ps;
pub mod replica_cert;
pub mod server;
pub mod status;
pub mod storage;
pub mod sync;
pub mod task;
pub mod tensor;
pub mod tls_records;
pub mod tls_stream;
pub mod train;
pub mod trained;
pub mod wire;
pub mod worker;
pub mod workload;

/// Keeps glibc's malloc from giving part-sized buffers back to the kernel
/// after every message. By default a buffer of more than 128 KiB (a tensor
/// part, an HTTP/2 frame, an MLP gradient) is a fresh mmap, and the heap of a
/// thread's arena is trimmed when its top is free: each such buffer then
/// costs page faults and zeroing on every use, a tenth of a ps's CPU time in
/// sync MLP training. Here buffers up to 32 MiB come from the heap and up to
/// 256 MiB of free heap is kept for reuse. At most two arenas: each thread
/// that allocates otherwise gets its own (up to 8 per core), and a ps that
/// handed half its table over to a new ps kept 60 MB more than a ps of a
/// static job in the arenas of the threads that had cut and joined the
/// fragments (`tfjob-bench --only elastic-ps`: ps 0's RSS after the move
/// 0.68x of before with the default, 0.53x with two arenas; MLP examples/s
/// unchanged, BENCHMARKS.md). Call once, early in `main` (tfjob-runtime
/// does; so does tfjob-bench before its in-process ps). Elsewhere than
/// glibc it does nothing.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes the allocator's own lock and only changes its
    // parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// How long ago this process started, for figures such as "first gradient
/// accepted N s after the process started". The time since the first call
/// (which `main` makes first thing) is exact but misses the exec; on Linux
/// the kernel's start time (`/proc`, in clock ticks of 10 ms) includes it:
/// the larger of the two is the better figure.
pub fn process_age() -> std::time::Duration {
    static FIRST_CALL: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let since_main = FIRST_CALL.get_or_init(std::time::Instant::now).elapsed();
    #[cfg(target_os = "linux")]
    if let Some(age) = linux_process_age() {
        return age.max(since_main);
    }
    since_main
}

#[cfg(target_os = "linux")]
fn linux_process_age() -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    // SAFETY: sysconf reads a constant of the system.
    let ticks_per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    process_age_from(&stat, &uptime, ticks_per_sec)
}

/// The age of a process from its `/proc/<pid>/stat` line (field 22: start
/// time in clock ticks since boot; the command name, field 2, may hold spaces
/// and parentheses, so fields are counted after its last `)`) and
/// `/proc/uptime` (seconds since boot).
fn process_age_from(stat: &str, uptime: &str, ticks_per_sec: i64) -> Option<std::time::Duration> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow the name: the start time is the 20th of them.
    let start_ticks: f64 = after_name.split_whitespace().nth(19)?.parse().ok()?;
    let up: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    if ticks_per_sec <= 0 {
        return None;
    }
    Some(std::time::Duration::from_secs_f64((up - start_ticks / ticks_per_sec as f64).max(0.0)))
}

#[cfg(test)]
mod process_age_tests {
    use super::*;

    #[test]
    fn process_age_from_proc_lines() {
        // pid (comm) state ppid ... field 22 = start time.
        let fields: Vec<String> = (3..=22).map(|f| if f == 22 { "12345".to_string() } else { f.to_string() }).collect();
        let stat = format!("42 (a (weird) name) {} 0 0\n", fields.join(" "));
        let cases: [(&str, i64, Option<f64>); 4] = [
            ("130.45 99.0\n", 100, Some(130.45 - 123.45)),
            ("100.00 1.0\n", 100, Some(0.0)), // started "after" uptime's rounding: never negative
            ("oops", 100, None),
            ("130.45", 0, None),
        ];
        for (uptime, hz, want) in cases {
            let got = process_age_from(&stat, uptime, hz).map(|d| d.as_secs_f64());
            match (got, want) {
                (Some(g), Some(w)) => assert!((g - w).abs() < 1e-6, "{uptime}: {g} vs {w}"),
                (g, w) => assert_eq!(g, w, "{uptime}"),
            }
        }
        assert_eq!(process_age_from("no name here", "1.0", 100), None);
    }

    #[test]
    fn this_process_is_young_and_ageing() {
        let a = process_age();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let b = process_age();
        assert!(b >= a, "{a:?} then {b:?}");
        assert!(a < std::time::Duration::from_secs(3600), "{a:?}");
    }
}
