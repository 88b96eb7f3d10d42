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
pub mod data;
pub mod dispatch;
pub mod embedding;
pub mod events;
pub mod lookup;
pub mod metrics;
pub mod model;
pub mod optimizer;
pub mod placement;
pub mod ps;
pub mod server;
pub mod status;
pub mod sync;
pub mod tensor;
pub mod train;
pub mod trained;
pub mod worker;
pub mod workload;

/// Keeps glibc's malloc from giving part-sized buffers back to the kernel
/// after every message. By default a buffer of more than 128 KiB (a tensor
/// part, an HTTP/2 frame, an MLP gradient) is a fresh mmap, and the heap of a
/// thread's arena is trimmed when its top is free: each such buffer then
/// costs page faults and zeroing on every use, a tenth of a ps's CPU time in
/// sync MLP training. Here buffers up to 32 MiB come from the heap and up to
/// 256 MiB of free heap is kept for reuse. Call once, early in `main`
/// (tfjob-runtime does; so does tfjob-bench before its in-process ps).
/// Elsewhere than glibc it does nothing.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes the allocator's own lock and only changes its
    // parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}
