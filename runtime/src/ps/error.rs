//! Why the store refuses a request ([`StoreError`], one gRPC status code
//! each), and the checked task a request names.

use tonic::Status;

use crate::cluster::TaskId;
use crate::{embedding, proto, tensor};

/// Why the store refused a request; each maps to one gRPC status code.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    PermissionDenied(String),
    /// Storage (a checkpoint's) out of reach for now: the caller may retry.
    #[error("{0}")]
    Unavailable(String),
    /// The job's layout changed (or is changing): the caller asks ps 0 for
    /// the current one and cuts its request again.
    #[error("layout changed: {0}")]
    LayoutChanged(String),
}

static BAD_REQUESTS: crate::auth::RefusalLog = crate::auth::RefusalLog::new("invalid");

impl From<StoreError> for Status {
    fn from(e: StoreError) -> Status {
        if matches!(e, StoreError::InvalidArgument(_) | StoreError::NotFound(_) | StoreError::PermissionDenied(_)) {
            BAD_REQUESTS.note(&e.to_string());
        }
        match e {
            StoreError::InvalidArgument(m) => Status::invalid_argument(m),
            StoreError::NotFound(m) => Status::not_found(m),
            StoreError::FailedPrecondition(m) => Status::failed_precondition(m),
            StoreError::PermissionDenied(m) => Status::permission_denied(m),
            StoreError::Unavailable(m) => Status::unavailable(m),
            e @ StoreError::LayoutChanged(_) => Status::aborted(e.to_string()),
        }
    }
}

impl From<tensor::TensorError> for StoreError {
    fn from(e: tensor::TensorError) -> Self {
        StoreError::InvalidArgument(e.to_string())
    }
}

impl From<embedding::RowError> for StoreError {
    fn from(e: embedding::RowError) -> Self {
        StoreError::InvalidArgument(e.to_string())
    }
}

/// The task a request names, checked.
pub(super) fn task_of(t: &Option<proto::TaskId>, field: &str) -> Result<TaskId, StoreError> {
    let t = t.as_ref().ok_or_else(|| StoreError::InvalidArgument(format!("{field}: missing")))?;
    if t.job.is_empty() {
        return Err(StoreError::InvalidArgument(format!("{field}.job: empty")));
    }
    Ok(TaskId::from(t))
}
