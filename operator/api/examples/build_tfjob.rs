//! Builds a TFJob in Rust, validates it, plans it and prints the `TF_CONFIG` of each replica:
//!
//! ```text
//! cargo run -p tfjob-api --example build_tfjob
//! ```
//!
//! A job like `examples/linreg-sync.yaml` of the repository, written with the types instead of
//! YAML: one parameter server and two workers of `tfjob-runtime`, training synchronously.
//! `cargo test -p tfjob-api` builds this example and runs its tests.

use std::collections::BTreeMap;
use std::process::ExitCode;

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use tfjob_api::api::{self, ReplicaSpec, RestartPolicy, TFJob, TFJobSpec};
use tfjob_api::field::ValidationErrors;
use tfjob_api::plan::{self, ClusterDns};

/// A replica set of `replicas` pods, each running `tfjob-runtime` with `args` in the container
/// named `tensorflow` (the one that gets `TF_CONFIG`).
fn runtime_replicas(replicas: i32, args: &[&str]) -> ReplicaSpec {
    let container = Container {
        name: "tensorflow".into(),
        image: Some("ghcr.io/tfjob-rs/tfjob-runtime:0.1.0".into()),
        command: Some(vec!["tfjob-runtime".into()]),
        args: Some(args.iter().map(|a| a.to_string()).collect()),
        ..Default::default()
    };
    ReplicaSpec {
        replicas,
        restart_policy: RestartPolicy::OnFailure,
        template: PodTemplateSpec { spec: Some(PodSpec { containers: vec![container], ..Default::default() }), ..Default::default() }.into(),
        ..Default::default()
    }
}

/// The job: TFJob `linear` in namespace `default`, 1 ps and 2 workers.
fn build_tfjob() -> TFJob {
    let args = ["--model=linear", "--sync_replicas", "--train_steps=2000"];
    let spec = TFJobSpec {
        tf_replica_specs: BTreeMap::from([("PS".to_string(), runtime_replicas(1, &args)), ("Worker".to_string(), runtime_replicas(2, &args))]),
        ..Default::default()
    };
    let mut job = TFJob::new("linear", spec);
    job.metadata.namespace = Some("default".into());
    job
}

/// `(pod name, TF_CONFIG)` of every replica of `job`, addressed as in its namespace of a
/// cluster; every problem of the job when it is not valid.
fn tf_configs(job: &TFJob) -> Result<Vec<(String, String)>, ValidationErrors> {
    let problems = api::validate(job);
    if !problems.is_empty() {
        return Err(ValidationErrors(problems));
    }
    let mut job = job.clone();
    api::apply_defaults(&mut job.spec);
    let namespace = job.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let dns = ClusterDns { job: job.name().to_string(), namespace, cluster_domain: None };
    let replicas = plan::plan_replicas(job.name(), &job.spec, &dns);
    Ok(replicas.into_iter().map(|r| (r.pod_name, r.tf_config.unwrap_or_default())).collect())
}

fn main() -> ExitCode {
    match tf_configs(&build_tfjob()) {
        Ok(configs) => {
            for (pod, tf_config) in configs {
                println!("{pod}: TF_CONFIG={tf_config}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("the TFJob is not valid: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_replica_of_the_example_gets_its_tf_config() {
        let configs = tf_configs(&build_tfjob()).unwrap();
        let pods: Vec<&str> = configs.iter().map(|(pod, _)| pod.as_str()).collect();
        assert_eq!(pods, ["linear-ps-0", "linear-worker-0", "linear-worker-1"]);
        let worker1: serde_json::Value = serde_json::from_str(&configs[2].1).unwrap();
        assert_eq!(
            worker1,
            serde_json::json!({
                "cluster": {
                    "ps": ["linear-ps-0.linear.default.svc:2222"],
                    "worker": ["linear-worker-0.linear.default.svc:2222", "linear-worker-1.linear.default.svc:2222"],
                },
                "task": {"type": "worker", "index": 1},
                "environment": "cloud",
            })
        );
    }

    #[test]
    fn a_job_without_a_tensorflow_container_is_refused_naming_the_field() {
        let mut job = build_tfjob();
        let worker = job.spec.tf_replica_specs.get_mut("Worker").unwrap();
        worker.template.spec.as_mut().unwrap().containers[0].name = "trainer".into();
        let errors = tf_configs(&job).unwrap_err();
        assert!(errors.0.iter().any(|e| e.field == "spec.tfReplicaSpecs.Worker.template.spec.containers"), "{errors}");
    }
}
