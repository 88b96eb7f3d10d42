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

/// matrixmultiply splits one product over at most this many threads.
pub const MATMUL_MAX_THREADS: usize = 4;

/// How many threads a matrix product may use (TensorFlow's
/// `intra_op_parallelism_threads`): `requested` when above 0; else what
/// `MATMUL_NUM_THREADS` says when it is set (matrixmultiply's own
/// variable); else, for a process that trains `alone` (no cluster, or a
/// command such as `predict`), the cores it may use (`allowed`: its CPU
/// quota under Kubernetes) and no more than the physical ones (two
/// hyperthreads share one core's FMA units); for a task of a cluster, one:
/// its ps and sibling workers often share the machine (`tfjob run`, a
/// laptop), and there two threads per worker made a 1 ps + 2 worker MLP job
/// 7 % slower with 16 % more CPU on 2 cores (BENCHMARKS.md). At most
/// [`MATMUL_MAX_THREADS`], at least 1. A product too small to gain stays on
/// one thread whatever this says (matrixmultiply's rule).
pub fn matmul_threads(requested: usize, env: Option<&str>, alone: bool, allowed: usize, physical: usize) -> usize {
    let chosen = match (requested, env.and_then(|v| v.trim().parse::<usize>().ok())) {
        (0, Some(n)) => n,
        (0, None) if alone => allowed.min(physical),
        (0, None) => 1,
        (n, _) => n,
    };
    chosen.clamp(1, MATMUL_MAX_THREADS)
}

/// Sets the threads of this process's matrix products (see
/// [`matmul_threads`]) and returns how many. matrixmultiply reads
/// `MATMUL_NUM_THREADS` once, at its first product: call this first thing
/// in `main`, before any other thread exists (tfjob-runtime does).
pub fn set_matmul_threads(requested: usize, alone: bool) -> usize {
    const VAR: &str = "MATMUL_NUM_THREADS";
    let env = std::env::var(VAR).ok();
    let threads = matmul_threads(requested, env.as_deref(), alone, num_cpus::get(), num_cpus::get_physical());
    // SAFETY: called from `main` before it starts a thread, so no other
    // thread reads or writes the environment meanwhile.
    unsafe { std::env::set_var(VAR, threads.to_string()) };
    threads
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

#[cfg(test)]
mod matmul_thread_tests {
    use super::matmul_threads;

    #[test]
    fn the_threads_of_a_matrix_product() {
        // (requested, MATMUL_NUM_THREADS, alone, allowed cores, physical cores) -> threads
        let cases = [
            ((0, None, true, 2, 2), 2),        // one process on 2 cores: both
            ((0, None, true, 1, 16), 1),       // ... in a pod with a 1-CPU quota on a big node
            ((0, None, true, 16, 8), 4),       // many cores: matrixmultiply's most
            ((0, None, true, 8, 2), 2),        // hyperthreads: the physical cores
            ((0, None, false, 2, 2), 1),       // a task of a cluster: one
            ((0, Some("3"), false, 2, 2), 3),  // the variable, when set
            ((0, Some(" 2 "), true, 8, 8), 2), // ... trimmed
            ((0, Some("x"), true, 2, 2), 2),   // unreadable: as if unset
            ((0, Some("0"), true, 2, 2), 1),   // at least one
            ((1, Some("4"), true, 8, 8), 1),   // the flag wins
            ((2, None, false, 2, 2), 2),       // ... for a task of a cluster too
            ((9, None, true, 2, 2), 4),        // at most 4
            ((0, None, true, 0, 0), 1),        // nothing known: one
        ];
        for ((requested, env, alone, allowed, physical), want) in cases {
            assert_eq!(matmul_threads(requested, env, alone, allowed, physical), want, "{requested} {env:?} {alone} {allowed} {physical}");
        }
    }
}
