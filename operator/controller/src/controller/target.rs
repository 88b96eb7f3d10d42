//! The job one reconcile works on, with what its gate found out about it.

use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::Pod;
use tfjob_api::api::TFJob;
use tfjob_api::pki::{JobCa, PkiError};

/// The job a reconcile works on.
pub struct Target<'a> {
    /// The job as the watch delivered it.
    pub job: &'a TFJob,
    /// Its namespace.
    pub ns: String,
    /// Its name.
    pub name: String,
    /// Its uid (empty when it has none).
    pub uid: String,
    /// What the controller remembers of the job is keyed by its uid: a job deleted and created
    /// again under the same name is another job (`<namespace>/<name>` without a uid).
    pub key: String,
    /// Its pods in the watch cache.
    pub pods: Vec<Arc<Pod>>,
    /// It had finished before this reconcile.
    pub finished: bool,
    /// The job's CA and its certificate (PEM), derived at the first replica certificate this
    /// reconcile issues and kept for the others: deriving it (an Ed25519 key from the seed and a
    /// self-signed certificate) cost as much as issuing a replica's certificate.
    pub job_ca: OnceLock<Result<(JobCa, String), String>>,
}

impl<'a> Target<'a> {
    /// The job a reconcile works on, with the pods the cache shows of it.
    pub fn new(job: &'a TFJob, ns: String, name: String, uid: String, key: String, pods: Vec<Arc<Pod>>, finished: bool) -> Self {
        Target { job, ns, name, uid, key, pods, finished, job_ca: OnceLock::new() }
    }

    /// The job's CA ([`JobCa::derive`] from the operator's `seed` and the job's uid) and its
    /// certificate, derived once per reconcile.
    pub fn job_ca(&self, seed: &[u8]) -> Result<&(JobCa, String), String> {
        let derive = || -> Result<(JobCa, String), PkiError> {
            let ca = JobCa::derive(seed, &self.uid, &self.name)?;
            let pem = ca.cert_pem()?;
            Ok((ca, pem))
        };
        self.job_ca.get_or_init(|| derive().map_err(|e| e.to_string())).as_ref().map_err(Clone::clone)
    }

    /// The uid of the job's pod `pod` in the cache.
    pub fn uid_of(&self, pod: &str) -> Option<String> {
        self.pods.iter().find(|p| p.metadata.name.as_deref() == Some(pod)).and_then(|p| p.metadata.uid.clone())
    }
}
