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
pub mod checkpoint;
pub mod client;
pub mod cluster;
pub mod data;
pub mod events;
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
pub mod workload;
