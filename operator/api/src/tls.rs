//! TLS between the replicas of a job: which jobs get it, and how a pod finds the job's CA,
//! with which each replica makes its own certificate at start. The certificates themselves are
//! [`crate::pki`]'s.
//!
//! A job gets TLS when every replica runs `tfjob-runtime` (the `tensorflow` container's command,
//! or its image when it has none): stock TensorFlow speaks plaintext gRPC and would be cut off.
//! The annotation [`TLS_ANNOTATION`] says `"true"` or `"false"` to decide otherwise.

use k8s_openapi::api::core::v1::{Container, EnvVar, KeyToPath, PodSpec, SecretVolumeSource, Volume, VolumeMount};

pub use crate::api::TLS_ANNOTATION;
use crate::api::{self, DEFAULT_CONTAINER_NAME, TFJob};
use crate::pki::{CA_CERT_KEY, CA_KEY_KEY, TLS_CERT_KEY, TLS_KEY_KEY};
/// The runtime's environment variables for its certificate, key and CA (paths).
pub const ENV_TLS_CERT: &str = "TFJOB_TLS_CERT";
/// See [`ENV_TLS_CERT`].
pub const ENV_TLS_KEY: &str = "TFJOB_TLS_KEY";
/// See [`ENV_TLS_CERT`].
pub const ENV_TLS_CA: &str = "TFJOB_TLS_CA";
/// The runtime's environment variable for the job CA's key (a path): with [`ENV_TLS_CA`] and no
/// certificate of its own, the runtime makes its own at start.
pub const ENV_TLS_CA_KEY: &str = "TFJOB_TLS_CA_KEY";
/// Every TLS variable of the runtime.
pub const ENV_TLS: [&str; 4] = [ENV_TLS_CERT, ENV_TLS_KEY, ENV_TLS_CA, ENV_TLS_CA_KEY];
/// Where a pod mounts the job's CA from the job's Secret.
pub const TLS_MOUNT_PATH: &str = "/var/run/tfjob-rs/tls";
/// Name of that volume.
pub const TLS_VOLUME: &str = "tfjob-tls";
/// The program whose replicas speak TLS.
const RUNTIME_PROGRAM: &str = "tfjob-runtime";

/// Whether a container runs `tfjob-runtime`: its command does, or it has none and its image is
/// `tfjob-runtime`'s (`…/tfjob-runtime[:tag]`).
pub fn runs_tfjob_runtime(c: &Container) -> bool {
    let base = |path: &str| path.rsplit('/').next().unwrap_or(path).to_string();
    match c.command.as_ref().and_then(|cmd| cmd.first()) {
        Some(program) => base(program) == RUNTIME_PROGRAM,
        None => c.image.as_deref().is_some_and(|image| base(image).split([':', '@']).next() == Some(RUNTIME_PROGRAM)),
    }
}

/// Whether a job's replicas talk over TLS: as the annotation says, else when every replica
/// set's `tensorflow` container runs `tfjob-runtime`.
pub fn job_uses_tls(job: &TFJob) -> bool {
    if let Ok(Some(on)) = api::tls_annotation(job) {
        return on;
    }
    let sets = api::replica_specs(&job.spec);
    !sets.is_empty()
        && sets.values().all(|rs| {
            let containers = rs.template.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
            containers.iter().find(|c| c.name == DEFAULT_CONTAINER_NAME).is_some_and(runs_tfjob_runtime)
        })
}

/// The runtime's TLS variables for files in `dir` (`ca.crt`, `tls.crt`, `tls.key`): a replica
/// given its certificate (`tfjob run`).
pub fn tls_env(dir: &str) -> [(&'static str, String); 3] {
    [(ENV_TLS_CERT, format!("{dir}/{TLS_CERT_KEY}")), (ENV_TLS_KEY, format!("{dir}/{TLS_KEY_KEY}")), (ENV_TLS_CA, format!("{dir}/{CA_CERT_KEY}"))]
}

/// The runtime's TLS variables for the job's CA in `dir` (`ca.crt`, `ca.key`): a replica that
/// makes its own certificate at start (on a cluster).
pub fn ca_env(dir: &str) -> [(&'static str, String); 2] {
    [(ENV_TLS_CA, format!("{dir}/{CA_CERT_KEY}")), (ENV_TLS_CA_KEY, format!("{dir}/{CA_KEY_KEY}"))]
}

/// Mounts the job's CA (`ca.crt` and `ca.key` of the job's Secret `secret`, nothing else of it)
/// into the pod's `tensorflow` container, read-only, and points the runtime at it: the replica
/// makes its own key and certificate for its address at start. The manifest's own `TFJOB_TLS_*`
/// values give way.
pub fn mount_tls(spec: &mut PodSpec, secret: &str) {
    let items = [CA_CERT_KEY, CA_KEY_KEY].map(|key| KeyToPath { key: key.to_string(), path: key.to_string(), ..Default::default() }).to_vec();
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: TLS_VOLUME.to_string(),
        secret: Some(SecretVolumeSource { secret_name: Some(secret.to_string()), items: Some(items), ..Default::default() }),
        ..Default::default()
    });
    for c in spec.containers.iter_mut().filter(|c| c.name == DEFAULT_CONTAINER_NAME) {
        c.volume_mounts.get_or_insert_with(Vec::new).push(VolumeMount {
            name: TLS_VOLUME.to_string(),
            mount_path: TLS_MOUNT_PATH.to_string(),
            read_only: Some(true),
            ..Default::default()
        });
        let env = c.env.get_or_insert_with(Vec::new);
        env.retain(|e| !ENV_TLS.contains(&e.name.as_str()));
        env.extend(ca_env(TLS_MOUNT_PATH).into_iter().map(|(name, value)| EnvVar { name: name.to_string(), value: Some(value), value_from: None }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(command: Option<&[&str]>, image: Option<&str>) -> Container {
        Container {
            name: DEFAULT_CONTAINER_NAME.into(),
            command: command.map(|c| c.iter().map(|s| s.to_string()).collect()),
            image: image.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn which_containers_run_tfjob_runtime() {
        type Case<'a> = (Option<&'a [&'a str]>, Option<&'a str>, bool);
        let cases: &[Case] = &[
            (Some(&["tfjob-runtime"]), Some("ghcr.io/tfjob-rs/tfjob-runtime:0.1.0"), true),
            (Some(&["/usr/local/bin/tfjob-runtime"]), Some("anything"), true),
            (None, Some("ghcr.io/tfjob-rs/tfjob-runtime:0.1.0"), true),
            (None, Some("localhost/tfjob-runtime@sha256:abc"), true),
            (None, Some("tfjob-runtime"), true),
            (Some(&["python", "train.py"]), Some("ghcr.io/tfjob-rs/tfjob-runtime:0.1.0"), false),
            (Some(&["sh", "-c", "tfjob-runtime --x"]), None, false),
            (None, Some("tensorflow/tensorflow:2.20.0"), false),
            (None, Some("example.com/tfjob-runtime-fork:1"), false),
            (None, None, false),
        ];
        for (command, image, want) in cases {
            assert_eq!(runs_tfjob_runtime(&container(*command, *image)), *want, "{command:?} {image:?}");
        }
    }

    fn job(annotation: Option<&str>, worker_command: &[&str]) -> TFJob {
        let yaml = format!(
            "apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata:\n  name: j\n{}spec:\n  tfReplicaSpecs:\n    PS:\n      replicas: 1\n      template:\n        spec:\n          containers:\n            - name: tensorflow\n              image: ghcr.io/tfjob-rs/tfjob-runtime:0.1.0\n              command: [tfjob-runtime]\n    Worker:\n      replicas: 2\n      template:\n        spec:\n          containers:\n            - name: tensorflow\n              image: x\n              command: {worker_command:?}\n",
            annotation.map(|a| format!("  annotations:\n    {TLS_ANNOTATION}: {a:?}\n")).unwrap_or_default()
        );
        serde_saphyr::from_str(&yaml).unwrap()
    }

    #[test]
    fn a_job_uses_tls_when_every_replica_runs_the_runtime_or_the_annotation_says_so() {
        use crate::api::validate;
        let cases = [
            (None, &["tfjob-runtime"][..], true, true),
            (None, &["python", "train.py"][..], false, true),
            (Some("false"), &["tfjob-runtime"][..], false, true),
            (Some("true"), &["python", "train.py"][..], true, true),
            (Some("yes"), &["tfjob-runtime"][..], true, false),
        ];
        for (annotation, command, uses, valid) in cases {
            let j = job(annotation, command);
            assert_eq!(job_uses_tls(&j), uses, "{annotation:?} {command:?}");
            let errs: Vec<_> = validate(&j).into_iter().filter(|e| e.to_string().contains(TLS_ANNOTATION)).collect();
            assert_eq!(errs.is_empty(), valid, "{annotation:?}: {errs:?}");
        }
    }

    #[test]
    fn the_job_ca_is_mounted_into_the_tensorflow_container_only() {
        let mut spec = PodSpec {
            containers: vec![container(Some(&["tfjob-runtime"]), None), Container { name: "sidecar".into(), ..Default::default() }],
            ..Default::default()
        };
        let manifest_env = [(ENV_TLS_CERT, "/mine/tls.crt"), ("OTHER", "kept")];
        spec.containers[0].env = Some(manifest_env.iter().map(|(n, v)| EnvVar { name: n.to_string(), value: Some(v.to_string()), value_from: None }).collect());
        mount_tls(&mut spec, "j-token");
        let secret = spec.volumes.as_ref().unwrap()[0].secret.as_ref().unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("j-token"));
        let items: Vec<(&str, &str)> = secret.items.iter().flatten().map(|i| (i.key.as_str(), i.path.as_str())).collect();
        assert_eq!(items, [("ca.crt", "ca.crt"), ("ca.key", "ca.key")], "the token stays out of the files");
        let tf = &spec.containers[0];
        assert_eq!(tf.volume_mounts.as_ref().unwrap()[0].mount_path, TLS_MOUNT_PATH);
        let env: Vec<(&str, &str)> = tf.env.as_ref().unwrap().iter().map(|e| (e.name.as_str(), e.value.as_deref().unwrap())).collect();
        assert_eq!(env, [("OTHER", "kept"), (ENV_TLS_CA, "/var/run/tfjob-rs/tls/ca.crt"), (ENV_TLS_CA_KEY, "/var/run/tfjob-rs/tls/ca.key")]);
        assert!(spec.containers[1].env.is_none() && spec.containers[1].volume_mounts.is_none(), "other containers are left alone");
    }
}
