//! tfjob-runtime: the program inside every replica of a TFJob.
//!
//! Pure cores (cluster parsing, placement, tensors, optimizers, the sync
//! accumulator, models, data) with thin async shells (the gRPC servers and
//! the training loop).

pub mod proto {
    //! Generated from `proto/tfjob/runtime/v1`.
    tonic::include_proto!("tfjob.runtime.v1");
}

pub mod data;
pub mod model;
