//! TLS between the replicas of a job: which jobs get it, the names a
//! replica's certificate carries, the Secret that holds it, and how a pod
//! finds it. The certificates themselves are [`crate::pki`]'s.
//!
//! A job gets TLS when every replica runs `tfjob-runtime` (the `tensorflow`
//! container's command, or its image when it has none): stock TensorFlow
//! speaks plaintext gRPC and would be cut off. The annotation
//! [`TLS_ANNOTATION`] says `"true"` or `"false"` to decide otherwise.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, SecretVolumeSource, Volume, VolumeMount};

pub use crate::api::TLS_ANNOTATION;
use crate::api::{self, DEFAULT_CONTAINER_NAME, TFJob};
use crate::pki::{CA_CERT_KEY, IssuedCert, TLS_CERT_KEY, TLS_KEY_KEY};
/// The runtime's environment variables for its certificate, key and CA (paths).
pub const ENV_TLS_CERT: &str = "TFJOB_TLS_CERT";
/// See [`ENV_TLS_CERT`].
pub const ENV_TLS_KEY: &str = "TFJOB_TLS_KEY";
/// See [`ENV_TLS_CERT`].
pub const ENV_TLS_CA: &str = "TFJOB_TLS_CA";
/// Where a pod mounts its replica's TLS Secret.
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

/// The names a replica is reached by on a cluster (the host of its `TF_CONFIG` address and
/// the shorter forms a resolver completes): `<pod>.<job>[.<ns>[.svc[.<domain>]]]`, the domain
/// being `cluster_domain` or `cluster.local`.
pub fn cluster_names(pod: &str, job: &str, namespace: &str, cluster_domain: Option<&str>) -> Vec<String> {
    let host = format!("{pod}.{job}");
    let domain = cluster_domain.filter(|d| !d.is_empty()).unwrap_or("cluster.local");
    vec![format!("{host}.{namespace}.svc"), format!("{host}.{namespace}.svc.{domain}"), format!("{host}.{namespace}"), host]
}

/// Name of a replica's TLS Secret: `<pod>-tls`.
pub fn tls_secret_name(pod: &str) -> String {
    format!("{pod}-tls")
}

/// The data of a replica's TLS Secret (`kubernetes.io/tls`, with the job's CA as `ca.crt`).
pub fn tls_secret_data(ca_pem: &str, issued: &IssuedCert) -> BTreeMap<String, ByteString> {
    let data = [(CA_CERT_KEY, ca_pem), (TLS_CERT_KEY, issued.cert_pem.as_str()), (TLS_KEY_KEY, issued.key_pem.as_str())];
    data.into_iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect()
}

/// The runtime's TLS variables for files in `dir` (`ca.crt`, `tls.crt`, `tls.key`).
pub fn tls_env(dir: &str) -> [(&'static str, String); 3] {
    [(ENV_TLS_CERT, format!("{dir}/{TLS_CERT_KEY}")), (ENV_TLS_KEY, format!("{dir}/{TLS_KEY_KEY}")), (ENV_TLS_CA, format!("{dir}/{CA_CERT_KEY}"))]
}

/// Mounts the replica's TLS Secret `secret` into the pod's `tensorflow` container (read-only)
/// and points the runtime at it.
pub fn mount_tls(spec: &mut PodSpec, secret: &str) {
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: TLS_VOLUME.to_string(),
        secret: Some(SecretVolumeSource { secret_name: Some(secret.to_string()), ..Default::default() }),
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
        env.retain(|e| ![ENV_TLS_CERT, ENV_TLS_KEY, ENV_TLS_CA].contains(&e.name.as_str()));
        env.extend(tls_env(TLS_MOUNT_PATH).into_iter().map(|(name, value)| EnvVar { name: name.to_string(), value: Some(value), value_from: None }));
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
    fn names_secret_and_mount_of_a_replica() {
        let names = cluster_names("mnist-worker-1", "mnist", "team", None);
        assert_eq!(
            names,
            ["mnist-worker-1.mnist.team.svc", "mnist-worker-1.mnist.team.svc.cluster.local", "mnist-worker-1.mnist.team", "mnist-worker-1.mnist"]
        );
        assert_eq!(cluster_names("m-ps-0", "m", "n", Some("corp.example"))[1], "m-ps-0.m.n.svc.corp.example");
        assert_eq!(tls_secret_name("j-worker-1"), "j-worker-1-tls");
        let issued = IssuedCert { cert_pem: "C".into(), key_pem: "K".into() };
        let data = tls_secret_data("CA", &issued);
        assert_eq!((data["ca.crt"].0.as_slice(), data["tls.crt"].0.as_slice(), data["tls.key"].0.as_slice()), (&b"CA"[..], &b"C"[..], &b"K"[..]));
        let mut spec = PodSpec {
            containers: vec![container(Some(&["tfjob-runtime"]), None), Container { name: "sidecar".into(), ..Default::default() }],
            ..Default::default()
        };
        mount_tls(&mut spec, "j-worker-1-tls");
        assert_eq!(spec.volumes.as_ref().unwrap()[0].secret.as_ref().unwrap().secret_name.as_deref(), Some("j-worker-1-tls"));
        let tf = &spec.containers[0];
        assert_eq!(tf.volume_mounts.as_ref().unwrap()[0].mount_path, TLS_MOUNT_PATH);
        let env: Vec<(&str, &str)> = tf.env.as_ref().unwrap().iter().map(|e| (e.name.as_str(), e.value.as_deref().unwrap())).collect();
        assert_eq!(
            env,
            [(ENV_TLS_CERT, "/var/run/tfjob-rs/tls/tls.crt"), (ENV_TLS_KEY, "/var/run/tfjob-rs/tls/tls.key"), (ENV_TLS_CA, "/var/run/tfjob-rs/tls/ca.crt")]
        );
        assert!(spec.containers[1].env.is_none() && spec.containers[1].volume_mounts.is_none(), "other containers are left alone");
    }
}
