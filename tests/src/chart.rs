//! The Helm chart `charts/tfjob-operator`, rendered with the real `helm` of the test control plane.
//!
//! The operator's control-plane tests run the operator with exactly the permissions the chart
//! grants, so that a missing or superfluous RBAC rule shows up as a failing test:
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use tfjob_tests::controlplane::ControlPlane;
//! use tfjob_tests::chart;
//! let cp = ControlPlane::shared()?;
//! let ns = cp.create_namespace("operator-rbac")?;
//! // ServiceAccount + ClusterRole/Binding + leases Role/RoleBinding, applied; a kubeconfig that
//! // authenticates as the ServiceAccount (a bearer token, no other permission).
//! let account = chart::apply_rbac(&cp, &ns, &[])?;
//! // Namespaced mode, gang scheduling: the same values as `helm install --set`.
//! let team = cp.create_namespace("team")?;
//! let scoped = chart::apply_rbac(&cp, &ns, &[("watchNamespace", &team), ("gangScheduler", "volcano")])?;
//! // Run the operator with KUBECONFIG=account.kubeconfig and POD_NAMESPACE=account.namespace
//! // (where its leader-election Lease may live) and TFJOB_LEASE_NAME=account.lease_name.
//! # let _ = (account, scoped); Ok(()) }
//! ```
//!
//! Values are passed as `helm --set key=value` (so `2` is a number and `true` a boolean; the
//! chart's values schema refuses unknown keys and wrongly typed values).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};

use crate::controlplane::ControlPlane;

/// Release name used by [`render_rbac`] and [`apply_rbac`]. It contains the chart name, so it is
/// also the chart's full name: ServiceAccount, Lease and namespaced objects are named
/// `tfjob-operator`, cluster-scoped ones `tfjob-operator-<namespace>`.
pub const RELEASE: &str = "tfjob-operator";

/// The chart's directory (`charts/tfjob-operator` at the repository root).
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("charts").join("tfjob-operator")
}

/// `helm template <release> charts/tfjob-operator --namespace <namespace> --set k=v ...`, limited
/// to the given templates (e.g. `templates/rbac.yaml`) when `show_only` is not empty. Returns the
/// multi-document YAML, or helm's error (a value refused by the schema, a failed check, ...).
pub fn template(cp: &ControlPlane, release: &str, namespace: &str, values: &[(&str, &str)], show_only: &[&str]) -> Result<String> {
    let mut args: Vec<String> = vec!["template".into(), release.into(), chart_dir().display().to_string(), "--namespace".into(), namespace.into()];
    for (k, v) in values {
        args.push("--set".into());
        args.push(format!("{k}={v}"));
    }
    for t in show_only {
        args.push("--show-only".into());
        args.push((*t).into());
    }
    cp.helm_ok(&args)
}

/// The ServiceAccount and every RBAC object the chart renders for release [`RELEASE`] in
/// `namespace` with `values` (`templates/serviceaccount.yaml` + `templates/rbac.yaml`): in cluster
/// mode a ClusterRole and ClusterRoleBinding, with `watchNamespace` a Role and RoleBinding in that
/// namespace, plus (leader election on, the default) the leases Role and RoleBinding in
/// `namespace`. Fails when the values turn the ServiceAccount or RBAC off.
pub fn render_rbac(cp: &ControlPlane, namespace: &str, values: &[(&str, &str)]) -> Result<String> {
    template(cp, RELEASE, namespace, values, &["templates/serviceaccount.yaml", "templates/rbac.yaml"]).context("rendering the chart's ServiceAccount and RBAC")
}

/// The operator's identity after [`apply_rbac`].
#[derive(Debug, Clone)]
pub struct OperatorAccount {
    /// Namespace of the ServiceAccount (the release namespace, also the Lease's: `POD_NAMESPACE`).
    pub namespace: String,
    /// Name of the ServiceAccount.
    pub service_account: String,
    /// Lease name the chart gives the operator (`TFJOB_LEASE_NAME`); the leases Role only allows
    /// get/update on this one.
    pub lease_name: String,
    /// A kubeconfig that authenticates as the ServiceAccount (token from the TokenRequest API).
    pub kubeconfig: PathBuf,
    /// What was applied (from [`render_rbac`]).
    pub manifest: String,
}

/// Renders ([`render_rbac`]) and applies (server-side) the chart's ServiceAccount and RBAC, and
/// writes a kubeconfig for the ServiceAccount. With `watchNamespace` that namespace must exist.
pub fn apply_rbac(cp: &ControlPlane, namespace: &str, values: &[(&str, &str)]) -> Result<OperatorAccount> {
    let manifest = render_rbac(cp, namespace, values)?;
    let service_account = service_account_name(&manifest)?;
    cp.apply(&manifest).context("applying the chart's RBAC")?;
    let kubeconfig = cp.service_account_kubeconfig(namespace, &service_account)?;
    Ok(OperatorAccount { namespace: namespace.to_string(), lease_name: RELEASE.to_string(), service_account, kubeconfig, manifest })
}

/// The documents of a multi-document YAML stream (empty documents skipped).
pub fn documents(yaml: &str) -> Result<Vec<serde_yaml::Value>> {
    use serde::Deserialize;
    let mut docs = Vec::new();
    for (i, de) in serde_yaml::Deserializer::from_str(yaml).enumerate() {
        let v = serde_yaml::Value::deserialize(de).with_context(|| format!("YAML document {i}"))?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

fn service_account_name(manifest: &str) -> Result<String> {
    let docs = documents(manifest)?;
    let sas: Vec<&serde_yaml::Value> = docs.iter().filter(|d| d["kind"].as_str() == Some("ServiceAccount")).collect();
    match sas.as_slice() {
        [sa] => sa["metadata"]["name"].as_str().map(str::to_string).ok_or_else(|| anyhow!("the rendered ServiceAccount has no name")),
        [] => bail!("the chart rendered no ServiceAccount (serviceAccount.create=false?)"),
        _ => bail!("the chart rendered {} ServiceAccounts", sas.len()),
    }
}
