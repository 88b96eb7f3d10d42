//! How one reconcile fails, and the metric category of each failure.

use crate::api_errors::CONFLICT;

/// Errors of one reconciliation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("kubernetes API error during {op}: {source}")]
    Kube {
        /// What was being done.
        op: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// An object could not be (de)serialised.
    #[error("serialization error: {0}")]
    Serialization(#[from] serde_json::Error),
    /// The object lacks a namespace or name.
    #[error("object without {0}")]
    MissingField(&'static str),
    /// The watch caches of pods and Services have not loaded (RBAC, connectivity).
    #[error("the pod and Service caches are not ready yet")]
    CacheNotReady,
    /// A replica's TLS certificate could not be made.
    #[error("TLS certificate {0}")]
    Certificate(String),
    /// The reconcile did not finish in time and was abandoned: a request the API server did not
    /// answer (kube's client has no read timeout; a half-open connection waits for ever).
    #[error("not finished within {0:?} (a request the API server did not answer?); abandoned")]
    Timeout(std::time::Duration),
}

impl Error {
    /// Metric category.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube { source: kube::Error::Api(s), .. } if s.code == CONFLICT => "conflict",
            Error::Kube { source: kube::Error::Api(_), .. } => "api",
            Error::Kube { .. } => "transport",
            Error::Serialization(_) => "serialization",
            Error::MissingField(_) => "invalid_object",
            Error::CacheNotReady => "cache",
            Error::Certificate(_) => "certificate",
            Error::Timeout(_) => "timeout",
        }
    }
}

/// The [`Error::Kube`] of a failed call doing `op`.
pub fn kerr(op: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let op = op.into();
    move |source| Error::Kube { op, source }
}
