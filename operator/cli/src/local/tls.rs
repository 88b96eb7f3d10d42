//! TLS under `tfjob run`, as the operator gives it on a cluster: a CA for
//! the run, and for each replica a directory in the run directory
//! (`tls/<replica>/`) with the CA's certificate and the replica's own
//! certificate and key, named as the runtime's variables point to them
//! ([`tfjob_api::tls::tls_env`]). Only for jobs that
//! [`tfjob_api::tls::job_uses_tls`].

use std::io::Write;
use std::path::{Path, PathBuf};

use tfjob_api::api::TFJob;
use tfjob_api::pki::{CA_CERT_KEY, JobCa, TLS_CERT_KEY, TLS_KEY_KEY};

/// The run's CA and where replicas' files go.
pub struct LocalTls {
    ca: JobCa,
    ca_pem: String,
    dir: PathBuf,
    /// Files readable by every user: a container's user is not the one who runs `tfjob run`
    /// (the run directory itself stays the user's).
    world_readable: bool,
}

impl LocalTls {
    /// The run's TLS, or `None` when the job speaks plaintext.
    pub fn for_job(job: &TFJob, run_dir: &Path, world_readable: bool) -> Result<Option<Self>, String> {
        if !tfjob_api::tls::job_uses_tls(job) {
            return Ok(None);
        }
        let ca = JobCa::generate(job.name()).map_err(|e| e.to_string())?;
        let ca_pem = ca.cert_pem().map_err(|e| e.to_string())?;
        Ok(Some(LocalTls { ca, ca_pem, dir: run_dir.join("tls"), world_readable }))
    }

    /// The directory of replica `short`'s files, written the first time with a certificate for
    /// `names`.
    pub fn replica_dir(&self, short: &str, names: &[String]) -> Result<PathBuf, String> {
        let dir = self.dir.join(short);
        if dir.join(TLS_KEY_KEY).exists() {
            return Ok(dir);
        }
        let issued = self.ca.issue(names).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        self.write(&dir.join(CA_CERT_KEY), &self.ca_pem, 0o644)?;
        self.write(&dir.join(TLS_CERT_KEY), &issued.cert_pem, 0o644)?;
        self.write(&dir.join(TLS_KEY_KEY), &issued.key_pem, if self.world_readable { 0o644 } else { 0o600 })?;
        Ok(dir)
    }

    fn write(&self, path: &Path, text: &str, mode: u32) -> Result<(), String> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        f.write_all(text.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_replica_gets_its_files_once() {
        let job: TFJob = serde_saphyr::from_str(
            "apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata:\n  name: j\nspec:\n  tfReplicaSpecs:\n    Worker:\n      replicas: 1\n      template:\n        spec:\n          containers:\n            - name: tensorflow\n              command: [tfjob-runtime]\n",
        )
        .unwrap();
        let run = tempfile::tempdir().unwrap();
        let tls = LocalTls::for_job(&job, run.path(), false).unwrap().expect("tfjob-runtime speaks TLS");
        let dir = tls.replica_dir("worker-0", &["localhost".into()]).unwrap();
        let key = std::fs::read(dir.join(TLS_KEY_KEY)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(dir.join(TLS_KEY_KEY)).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(tls.replica_dir("worker-0", &["localhost".into()]).unwrap(), dir);
        assert_eq!(std::fs::read(dir.join(TLS_KEY_KEY)).unwrap(), key, "a restart keeps the certificate");
        assert_eq!(std::fs::read_to_string(dir.join(CA_CERT_KEY)).unwrap(), tls.ca_pem);
        let mut plain = job.clone();
        plain.metadata.annotations = Some([(tfjob_api::tls::TLS_ANNOTATION.to_string(), "false".to_string())].into());
        assert!(LocalTls::for_job(&plain, run.path(), false).unwrap().is_none());
    }
}
