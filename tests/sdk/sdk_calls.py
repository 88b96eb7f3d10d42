#!/usr/bin/env python3
"""Kubeflow's training SDK (kubeflow-training 1.9.x) driving one TFJob through its life, as its
users do, against whatever operator runs the cluster (tests/tests/sdk_controlplane.rs).

Usage: sdk_calls.py KUBECONFIG NAMESPACE JOB_JSON

JOB_JSON is the TFJob as a dict (JSON). Prints one JSON object per call on stdout:
{"step": ..., "ok": true, "result": ...} or {"step": ..., "ok": false, "error": ...}; exits 0
only when every call worked. What each call returns is for the test to judge.
"""
import json
import sys
import time

from kubeflow.training import TrainingClient
from kubeflow.training.api_client import ApiClient as TrainingApiClient
from kubeflow.training.utils import utils as training_utils
from kubernetes import client as k8s

SERIALIZE = k8s.ApiClient().sanitize_for_serialization
FAILED = []


def call(step, fn):
    """Runs fn, prints what it returned (or raised) as a JSON line, returns its result."""
    try:
        result = fn()
    except Exception as e:  # every failure is reported, the next calls still run
        FAILED.append(step)
        print(json.dumps({"step": step, "ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}), flush=True)
        return None
    print(json.dumps({"step": step, "ok": True, "result": SERIALIZE(result)}, default=str), flush=True)
    return result


def wait_deleted(client, name, namespace):
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            client.get_job(name, namespace=namespace, job_kind="TFJob")
        except RuntimeError as e:
            if getattr(e.__cause__, "status", None) == 404:
                return True
            raise
        time.sleep(1)
    raise TimeoutError("the TFJob is still there 60 s after delete_job")


def main():
    kubeconfig, namespace, job_file = sys.argv[1:4]
    with open(job_file) as f:
        body = json.load(f)
    name = body["metadata"]["name"]
    # The SDK's default kind is PyTorchJob: name TFJob everywhere.
    client = TrainingClient(config_file=kubeconfig, namespace=namespace, job_kind="TFJob")
    # create_job takes the SDK's model, not a dict; the model needs spec.runPolicy.
    job = call("model_from_dict", lambda: TrainingApiClient().deserialize(training_utils.FakeResponse(body), "KubeflowOrgV1TFJob"))
    if job is None:
        return 1
    call("create_job", lambda: client.create_job(job=job, namespace=namespace))
    call("wait_for_job_conditions", lambda: client.wait_for_job_conditions(
        name, namespace=namespace, job_kind="TFJob", expected_conditions={"Succeeded"}, wait_timeout=300, polling_interval=1))
    call("get_job", lambda: client.get_job(name, namespace=namespace, job_kind="TFJob"))
    call("get_job_conditions", lambda: client.get_job_conditions(name, namespace=namespace, job_kind="TFJob"))
    for check in ["is_job_created", "is_job_running", "is_job_succeeded", "is_job_failed"]:
        call(check, lambda check=check: getattr(client, check)(name, namespace=namespace, job_kind="TFJob"))
    call("get_job_pod_names", lambda: client.get_job_pod_names(name, namespace=namespace))
    call("get_job_pod_names_master", lambda: client.get_job_pod_names(name, namespace=namespace, is_master=True))
    call("get_job_pod_names_ps", lambda: client.get_job_pod_names(name, namespace=namespace, replica_type="ps"))
    call("get_job_pod_names_worker_1", lambda: client.get_job_pod_names(name, namespace=namespace, replica_type="worker", replica_index=1))
    # (logs by pod, events); by default the pod labelled job-role=master, container "tensorflow".
    call("get_job_logs", lambda: client.get_job_logs(name, namespace=namespace, job_kind="TFJob")[0])
    call("get_job_logs_worker_1", lambda: client.get_job_logs(
        name, namespace=namespace, job_kind="TFJob", is_master=False, replica_type="worker", replica_index=1)[0])
    call("delete_job", lambda: client.delete_job(name, namespace=namespace, job_kind="TFJob"))
    call("job_gone", lambda: wait_deleted(client, name, namespace))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
