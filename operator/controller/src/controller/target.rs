//! The job one reconcile works on, with what its gate found out about it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tfjob_api::api::TFJob;

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
}

impl<'a> Target<'a> {
    /// The job a reconcile works on, with the pods the cache shows of it.
    pub fn new(job: &'a TFJob, ns: String, name: String, uid: String, key: String, pods: Vec<Arc<Pod>>, finished: bool) -> Self {
        Target { job, ns, name, uid, key, pods, finished }
    }

    /// The uid of the job's pod `pod` in the cache.
    pub fn uid_of(&self, pod: &str) -> Option<String> {
        self.pods.iter().find(|p| p.metadata.name.as_deref() == Some(pod)).and_then(|p| p.metadata.uid.clone())
    }
}
