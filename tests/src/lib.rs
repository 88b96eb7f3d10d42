//! Helpers shared by the end-to-end tests: locating built binaries, free ports, processes.
//!
//! - [`controlplane`]: a real etcd + kube-apiserver + kube-controller-manager (plus kubectl and
//!   helm) built from pinned Go modules, for tests against a real Kubernetes API.
//! - [`chart`]: the Helm chart `charts/tfjob-operator` rendered with that helm, e.g. the exact
//!   RBAC the chart grants the operator.
//! - [`data`]: small learnable datasets in the MNIST IDX format, written by the tests.
//! - [`kubeflow`]: Kubeflow's training-operator built from its Go module and run against the
//!   control plane (the controller a takeover starts from).
//! - [`kubelet_logs`]: the kubelet's log endpoint for the node agent's pods (`kubectl logs`).
//! - [`kueue`]: Kueue (the batch queue) built from its Go module and run against the control
//!   plane.
//! - [`local`]: the `tfjob run` tests' manifests and replica processes.
//! - [`node_agent`]: the kubelet of the test control plane: its pods as podman containers.
//! - [`s3`]: a real S3-compatible server on 127.0.0.1 (s3s over s3s-fs).
//! - [`scene`]: a training job on the control plane followed from `kubectl apply` to its end,
//!   with the chart's operator (the end-to-end and chaos tests).
//! - [`soak`]: minutes of TFJob churn against one operator, then its caches, memory and latency.

pub mod chart;
pub mod controlplane;
pub mod data;
pub mod kubeflow;
pub mod kubelet_logs;
pub mod kueue;
pub mod local;
pub mod node_agent;
pub mod operator;
pub mod podman;
pub mod report;
pub mod s3;
pub mod scene;
pub mod soak;
