//! The Helm chart `charts/tfjob-operator`, with the real `helm` of the test control plane:
//! its CRD is the repository's, `helm lint` is clean, `helm template` renders what the operator
//! needs (parsed into k8s-openapi types, with no field k8s-openapi does not know), RBAC is exactly
//! the operator's API calls, and `helm install` into the test API server is accepted, grants what
//! it should and nothing more, and `helm uninstall` removes it again.
//!
//! All tests share one control plane and work in their own namespaces. The TFJob CRD is
//! cluster-scoped: a release creates it (templates/crd.yaml) when it is missing and leaves it
//! otherwise; no test here deletes it (tests/tests/release.rs checks its lifecycle on control
//! planes of their own).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tfjob_tests::chart::{self, can_i, chart_dir};
use tfjob_tests::controlplane::ControlPlane;
use tfjob_tests::operator::{files_under, repo_root};

const RELEASE: &str = "tfjob-operator";
const RELEASE_NS: &str = "tfjob-system";

// ---------------------------------------------------------------------------------------------
// Expected RBAC: one row per API call family of the controller (operator/controller/src).

type Row = (&'static str, &'static str, &'static [&'static str]);

/// The operator's rules, for the ClusterRole (cluster mode) or the Role (namespaced mode).
const OPERATOR_RULES: &[Row] = &[
    ("kubeflow.org", "tfjobs", &["list", "watch", "delete"]),
    ("kubeflow.org", "tfjobs/status", &["patch"]),
    ("kubeflow.org", "tfjobs/finalizers", &["update"]),
    ("kubeflow.org", "tfjobs/scale", &["patch"]),
    ("", "pods", &["list", "watch", "create", "delete"]),
    ("", "services", &["list", "watch", "create", "patch"]),
    ("", "secrets", &["create"]),
    ("events.k8s.io", "events", &["create", "patch"]),
    ("autoscaling", "horizontalpodautoscalers", &["create", "patch"]),
    ("kueue.x-k8s.io", "workloads", &["list"]),
];

/// One permission: (API group, resource, resource name, verb).
type Grant = (String, String, Option<String>, String);

fn grants_of_rows(rows: &[Row]) -> BTreeSet<Grant> {
    rows.iter().flat_map(|(g, r, verbs)| verbs.iter().map(move |v| (g.to_string(), r.to_string(), None, v.to_string()))).collect()
}

fn network_policy_grants() -> BTreeSet<Grant> {
    ["create", "patch"].iter().map(|v| ("networking.k8s.io".to_string(), "networkpolicies".to_string(), None, v.to_string())).collect()
}

/// Volcano's phase is read (get) before pods are created; scheduler-plugins' is not.
fn podgroup_grants(group: &str) -> BTreeSet<Grant> {
    let verbs: &[&str] = if group == "scheduling.volcano.sh" { &["get", "create", "patch", "delete"] } else { &["create", "patch", "delete"] };
    verbs.iter().map(|v| (group.to_string(), "podgroups".to_string(), None, v.to_string())).collect()
}

fn lease_grants(lease: &str) -> BTreeSet<Grant> {
    let l = |name: Option<&str>, verb: &str| ("coordination.k8s.io".to_string(), "leases".to_string(), name.map(str::to_string), verb.to_string());
    [l(None, "create"), l(Some(lease), "get"), l(Some(lease), "update")].into_iter().collect()
}

/// Expands rules into single permissions; wildcards and non-resource URLs are refused outright.
fn grants(rules: &[PolicyRule]) -> Result<BTreeSet<Grant>> {
    let mut out = BTreeSet::new();
    for r in rules {
        ensure!(r.non_resource_urls.is_none(), "non-resource URL rule: {r:?}");
        let groups = r.api_groups.clone().unwrap_or_default();
        let resources = r.resources.clone().unwrap_or_default();
        ensure!(!groups.is_empty() && !resources.is_empty() && !r.verbs.is_empty(), "incomplete rule: {r:?}");
        let names: Vec<Option<String>> = match &r.resource_names {
            Some(n) if !n.is_empty() => n.iter().cloned().map(Some).collect(),
            _ => vec![None],
        };
        for g in &groups {
            for res in &resources {
                for n in &names {
                    for v in &r.verbs {
                        ensure!(g != "*" && res != "*" && v != "*", "wildcard in rule: {r:?}");
                        ensure!(out.insert((g.clone(), res.clone(), n.clone(), v.clone())), "permission granted twice: {g}/{res} {v}");
                    }
                }
            }
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Rendering and parsing.

/// The chart's objects, parsed into k8s-openapi types.
#[derive(Debug, Default)]
struct Rendered {
    deployments: Vec<Deployment>,
    service_accounts: Vec<ServiceAccount>,
    services: Vec<Service>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    service_monitors: Vec<Value>,
    pod_monitors: Vec<Value>,
    leases: Vec<Lease>,
    crds: Vec<CustomResourceDefinition>,
    /// (kind, namespace, name) of every document, in order.
    objects: Vec<(String, Option<String>, String)>,
}

impl Rendered {
    fn deployment(&self) -> &Deployment {
        assert_eq!(self.deployments.len(), 1, "exactly one Deployment");
        &self.deployments[0]
    }
    fn role(&self, name: &str) -> Option<&Role> {
        self.roles.iter().find(|r| r.metadata.name.as_deref() == Some(name))
    }
    fn role_binding(&self, name: &str) -> Option<&RoleBinding> {
        self.role_bindings.iter().find(|r| r.metadata.name.as_deref() == Some(name))
    }
    fn kinds(&self) -> BTreeSet<&str> {
        self.objects.iter().map(|(k, _, _)| k.as_str()).collect()
    }
}

/// Paths at which two JSON values differ (for a readable assertion message).
fn differences(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys()).collect::<BTreeSet<_>>() {
                let p = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => differences(&p, u, v, out),
                    (Some(u), None) => out.push(format!("{p}: {u} is dropped by the typed object (unknown field?)")),
                    (None, Some(v)) => out.push(format!("{p}: {v} appears only in the typed object")),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                differences(&format!("{path}[{i}]"), u, v, out);
            }
        }
        _ if a != b => out.push(format!("{path}: rendered {a}, typed {b}")),
        _ => {}
    }
}

/// Parses a document into a k8s-openapi type and back: every rendered field must survive, so a
/// misspelt or misplaced field (which k8s-openapi would silently ignore) fails the test.
fn typed<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T> {
    let t: T = serde_json::from_value(doc.clone()).with_context(|| format!("parsing {doc}"))?;
    let back = serde_json::to_value(&t)?;
    let mut diffs = Vec::new();
    differences("", doc, &back, &mut diffs);
    ensure!(diffs.is_empty(), "{} does not round-trip:\n{}", doc["kind"], diffs.join("\n"));
    Ok(t)
}

fn parse(yaml: &str) -> Result<Rendered> {
    let mut r = Rendered::default();
    for doc in chart::documents(yaml)? {
        let kind = doc["kind"].as_str().context("document without kind")?.to_string();
        let name = doc["metadata"]["name"].as_str().context("document without name")?.to_string();
        let namespace = doc["metadata"]["namespace"].as_str().map(str::to_string);
        match (doc["apiVersion"].as_str().unwrap_or_default(), kind.as_str()) {
            ("apps/v1", "Deployment") => r.deployments.push(typed(&doc)?),
            ("v1", "ServiceAccount") => r.service_accounts.push(typed(&doc)?),
            ("v1", "Service") => r.services.push(typed(&doc)?),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => r.cluster_roles.push(typed(&doc)?),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => r.cluster_role_bindings.push(typed(&doc)?),
            ("rbac.authorization.k8s.io/v1", "Role") => r.roles.push(typed(&doc)?),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => r.role_bindings.push(typed(&doc)?),
            ("monitoring.coreos.com/v1", "ServiceMonitor") => r.service_monitors.push(doc.clone()),
            ("monitoring.coreos.com/v1", "PodMonitor") => r.pod_monitors.push(doc.clone()),
            ("coordination.k8s.io/v1", "Lease") => r.leases.push(typed(&doc)?),
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => r.crds.push(typed(&doc)?),
            (api, kind) => bail!("unexpected object {api} {kind} {name}"),
        }
        // Namespaced objects name their namespace explicitly (kubectl apply of `helm template`
        // output must not depend on the current namespace).
        if !matches!(kind.as_str(), "ClusterRole" | "ClusterRoleBinding" | "CustomResourceDefinition") {
            ensure!(namespace.is_some(), "{kind} {name} has no namespace");
        }
        r.objects.push((kind, namespace, name));
    }
    Ok(r)
}

fn render(cp: &ControlPlane, values: &[(&str, &str)]) -> Result<Rendered> {
    let yaml = chart::template(cp, RELEASE, RELEASE_NS, values, &[])?;
    parse(&yaml).with_context(|| format!("values {values:?}:\n{yaml}"))
}

fn env_of(d: &Deployment) -> BTreeMap<String, String> {
    let c = &d.spec.template.spec.as_ref().unwrap().containers[0];
    c.env
        .iter()
        .flatten()
        .map(|e| {
            let v = match (&e.value, &e.value_from) {
                (Some(v), None) => v.clone(),
                (None, Some(from)) => {
                    format!("fieldRef:{}", from.field_ref.as_ref().unwrap().field_path)
                }
                other => panic!("env {} is neither a value nor a fieldRef: {other:?}", e.name),
            };
            (e.name.clone(), v)
        })
        .collect()
}

fn expected_env(extra: &[(&str, &str)], metrics_port: u16) -> BTreeMap<String, String> {
    let mut m: BTreeMap<String, String> = [
        ("POD_NAME", "fieldRef:metadata.name"),
        ("POD_NAMESPACE", "fieldRef:metadata.namespace"),
        ("TFJOB_LEADER_ELECT", "true"),
        ("TFJOB_LEASE_NAME", RELEASE),
        ("TFJOB_LOG_LEVEL", "info"),
        ("TFJOB_LOG_FORMAT", "text"),
        ("TFJOB_CONCURRENCY", "8"),
        ("TFJOB_BESIDE_KUBEFLOW", "false"),
        ("TFJOB_TLS_SEED_SECRET", "tfjob-operator-tls-seed"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    m.insert("TFJOB_METRICS_ADDR".into(), format!("0.0.0.0:{metrics_port}"));
    for (k, v) in extra {
        m.insert(k.to_string(), v.to_string());
    }
    m
}

fn sa_subject(name: &str) -> Vec<Subject> {
    vec![Subject { kind: "ServiceAccount".into(), name: name.into(), namespace: Some(RELEASE_NS.into()), api_group: None }]
}

fn cluster_name() -> String {
    format!("{RELEASE}-{RELEASE_NS}")
}

/// The operator's rules as rendered: from the ClusterRole (cluster mode) or from the Role in
/// `watch` (namespaced mode); also checks the binding to the ServiceAccount.
fn operator_grants(r: &Rendered, watch: Option<&str>) -> Result<BTreeSet<Grant>> {
    match watch {
        None => {
            ensure!(r.cluster_roles.len() == 1 && r.cluster_role_bindings.len() == 1, "{:?}", r.objects);
            let cr = &r.cluster_roles[0];
            let crb = &r.cluster_role_bindings[0];
            assert_eq!(cr.metadata.name.as_deref(), Some(cluster_name().as_str()));
            assert_eq!(crb.role_ref.kind, "ClusterRole");
            assert_eq!(Some(&crb.role_ref.name), cr.metadata.name.as_ref());
            assert_eq!(crb.subjects.as_deref(), Some(sa_subject(RELEASE).as_slice()));
            assert!(cr.aggregation_rule.is_none());
            grants(cr.rules.as_deref().unwrap_or_default())
        }
        Some(ns) => {
            ensure!(r.cluster_roles.is_empty() && r.cluster_role_bindings.is_empty(), "{:?}", r.objects);
            let role = r.role(RELEASE).context("no operator Role")?;
            let rb = r.role_binding(RELEASE).context("no operator RoleBinding")?;
            assert_eq!(role.metadata.namespace.as_deref(), Some(ns));
            assert_eq!(rb.metadata.namespace.as_deref(), Some(ns));
            assert_eq!((rb.role_ref.kind.as_str(), rb.role_ref.name.as_str()), ("Role", RELEASE));
            assert_eq!(rb.subjects.as_deref(), Some(sa_subject(RELEASE).as_slice()));
            grants(role.rules.as_deref().unwrap_or_default())
        }
    }
}

/// The leases Role and RoleBinding in the release namespace, if rendered.
fn leader_election_grants(r: &Rendered) -> Result<Option<BTreeSet<Grant>>> {
    let name = format!("{RELEASE}-leader-election");
    let (Some(role), Some(rb)) = (r.role(&name), r.role_binding(&name)) else {
        ensure!(r.role(&name).is_none() && r.role_binding(&name).is_none(), "half a leases Role");
        return Ok(None);
    };
    assert_eq!(role.metadata.namespace.as_deref(), Some(RELEASE_NS));
    assert_eq!(rb.metadata.namespace.as_deref(), Some(RELEASE_NS));
    assert_eq!((rb.role_ref.kind.as_str(), rb.role_ref.name.as_str()), ("Role", name.as_str()));
    assert_eq!(rb.subjects.as_deref(), Some(sa_subject(RELEASE).as_slice()));
    Ok(Some(grants(role.rules.as_deref().unwrap_or_default())?))
}

/// The grants of the TLS seed Role (in the release namespace): `get` on the seed Secret the
/// operator is told to use, `create` on Secrets (to make it at the first start).
fn tls_seed_grants(r: &Rendered) -> Result<BTreeSet<Grant>> {
    let name = format!("{RELEASE}-tls-seed");
    let (Some(role), Some(rb)) = (r.role(&name), r.role_binding(&name)) else {
        anyhow::bail!("no TLS seed Role and RoleBinding {name}");
    };
    assert_eq!((role.metadata.namespace.as_deref(), rb.metadata.namespace.as_deref()), (Some(RELEASE_NS), Some(RELEASE_NS)));
    assert_eq!((rb.role_ref.kind.as_str(), rb.role_ref.name.as_str()), ("Role", name.as_str()));
    assert_eq!(rb.subjects.as_deref(), Some(sa_subject(RELEASE).as_slice()));
    grants(role.rules.as_deref().unwrap_or_default())
}

fn seed_grants(secret: &str) -> BTreeSet<Grant> {
    let s = |name: Option<&str>, verb: &str| (String::new(), "secrets".to_string(), name.map(str::to_string), verb.to_string());
    [s(None, "create"), s(Some(secret), "get")].into_iter().collect()
}

fn chart_app_version() -> Result<String> {
    let text = std::fs::read_to_string(chart_dir().join("Chart.yaml"))?;
    let v: Value = serde_saphyr::from_str(&text)?;
    Ok(v["appVersion"].as_str().context("Chart.yaml has no appVersion")?.to_string())
}

// ---------------------------------------------------------------------------------------------
// Files.

#[test]
fn chart_crd_is_byte_identical_to_the_repository_crd() -> Result<()> {
    let repo = std::fs::read(chart_dir().join("../../crds/tfjob.yaml")).context("crds/tfjob.yaml")?;
    let chart = std::fs::read(chart_dir().join("files/tfjob-crd.yaml")).context("charts/tfjob-operator/files/tfjob-crd.yaml")?;
    assert!(
        repo == chart,
        "charts/tfjob-operator/files/tfjob-crd.yaml differs from crds/tfjob.yaml; copy it: \
         cp crds/tfjob.yaml charts/tfjob-operator/files/tfjob-crd.yaml"
    );
    // No crds/ directory: Helm would apply it before templates/crd.yaml could look at the
    // cluster's CRD (and skip or merge over another operator's).
    assert!(!chart_dir().join("crds").exists(), "charts/tfjob-operator/crds/ exists");
    // `helm template` (no cluster to look at) renders it as it is.
    let cp = ControlPlane::shared()?;
    let rendered = chart::template(cp, RELEASE, RELEASE_NS, &[], &["templates/crd.yaml"])?;
    let docs = chart::documents(&rendered)?;
    let want: Value = serde_saphyr::from_str(std::str::from_utf8(&repo)?)?;
    assert_eq!(docs, vec![want]);
    Ok(())
}

#[test]
fn chart_app_version_is_the_operator_version() -> Result<()> {
    // The image tag defaults to appVersion: it must name the operator this repository builds.
    assert_eq!(chart_app_version()?, env!("CARGO_PKG_VERSION"));
    Ok(())
}

/// Every Rust source of the controller crate (operator/controller/src), one after the other.
fn controller_sources() -> Result<String> {
    let mut files = files_under(&repo_root().join("operator/controller/src"));
    files.retain(|f| f.extension().is_some_and(|x| x == "rs"));
    files.sort();
    ensure!(!files.is_empty(), "no Rust sources under operator/controller/src");
    let mut out = String::new();
    for f in files {
        out.push_str(&std::fs::read_to_string(&f)?);
    }
    Ok(out)
}

#[test]
fn every_environment_variable_of_the_deployment_is_read_by_the_operator() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let source = controller_sources()?;
    let all = [("watchNamespace", "team-a"), ("clusterDomain", "cluster.local"), ("gangScheduler", "volcano"), ("networkPolicy.enabled", "true")];
    let r = render(cp, &all)?;
    for name in env_of(r.deployment()).keys() {
        assert!(
            source.contains(&format!("env = \"{name}\"")) || source.contains(&format!("var(\"{name}\")")),
            "the chart sets {name}, which the controller (operator/controller/src) does not read"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// helm lint.

const VARIANTS: &[&[(&str, &str)]] = &[
    &[],
    &[("watchNamespace", "team-a")],
    &[("gangScheduler", "volcano")],
    &[("gangScheduler", "scheduler-plugins-scheduler"), ("watchNamespace", "team-a")],
    &[("replicaCount", "2")],
    &[("leaderElection.enabled", "false")],
    &[("serviceMonitor.enabled", "true"), ("serviceMonitor.labels.release", "prometheus")],
    &[("podMonitor.enabled", "true"), ("podMonitor.labels.release", "prometheus")],
    &[("podMonitor.enabled", "true"), ("watchNamespace", "team-a")],
    &[("image.repository", "registry.example.com/ml/tfjob-operator"), ("image.tag", "v9"), ("image.pullPolicy", "Always")],
    &[("serviceAccount.create", "false"), ("serviceAccount.name", "existing")],
    &[("rbac.create", "false")],
    &[("networkPolicy.enabled", "true")],
];

#[test]
fn helm_lint_is_clean_for_the_default_values_and_variants() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let dir = chart_dir().display().to_string();
    for values in VARIANTS {
        for strict in [false, true] {
            let mut args = vec!["lint".to_string(), dir.clone(), "--namespace".into(), RELEASE_NS.into()];
            if strict {
                args.push("--strict".into());
            }
            for (k, v) in *values {
                args.push("--set".into());
                args.push(format!("{k}={v}"));
            }
            let out = cp.helm(&args)?;
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "helm {args:?} failed:\n{text}");
            assert!(text.contains("1 chart(s) linted, 0 chart(s) failed"), "helm {args:?}:\n{text}");
            assert!(!text.contains("[WARNING]") && !text.contains("[ERROR]"), "helm {args:?}:\n{text}");
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// helm template.

#[test]
fn default_values_render_a_locked_down_deployment() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let r = render(cp, &[])?;
    let want: BTreeSet<&str> =
        ["CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment", "Lease"].into();
    assert_eq!(r.kinds(), want, "{:?}", r.objects);
    assert!(r.service_monitors.is_empty());
    assert_eq!(r.crds.len(), 1);
    assert_eq!(
        r.crds[0].metadata.annotations.as_ref().and_then(|a| a.get("helm.sh/resource-policy")).map(String::as_str),
        Some("keep"),
        "helm uninstall would delete the CRD and every TFJob"
    );

    let d = r.deployment();
    let spec = &d.spec;
    assert_eq!(spec.replicas, Some(1));
    // A standby is not Ready (/readyz waits for leadership): a surge rollout would never finish.
    assert_eq!(spec.strategy.as_ref().and_then(|s| s.type_.as_deref()), Some("Recreate"));
    let pod_labels = spec.template.metadata.as_ref().unwrap().labels.clone().unwrap();
    for (k, v) in spec.selector.match_labels.as_ref().unwrap() {
        assert_eq!(pod_labels.get(k), Some(v), "selector label {k} is not on the pod template");
    }
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some(RELEASE));
    assert_eq!(r.service_accounts.len(), 1);
    assert_eq!(r.service_accounts[0].metadata.name.as_deref(), Some(RELEASE));
    assert_eq!(r.service_accounts[0].metadata.namespace.as_deref(), Some(RELEASE_NS));

    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(psc.run_as_user, Some(65532));
    assert_eq!(psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()), Some("RuntimeDefault"));
    assert!(pod.host_network.is_none() && pod.host_pid.is_none() && pod.host_ipc.is_none());

    assert_eq!(pod.containers.len(), 1);
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some(format!("ghcr.io/tfjob-rs/tfjob-operator:{}", chart_app_version()?).as_str()));
    assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
    // The image's entrypoint (`tfjob-operator`) runs unchanged.
    assert!(c.command.is_none() && c.args.is_none());
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_ne!(sc.privileged, Some(true));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(["ALL".to_string()].as_slice()));
    assert!(caps.add.is_none());
    assert_eq!(sc.seccomp_profile.as_ref().map(|s| s.type_.as_str()), Some("RuntimeDefault"));

    let res = c.resources.as_ref().unwrap();
    for part in [&res.requests, &res.limits] {
        let part = part.as_ref().unwrap();
        assert!(part.contains_key("cpu") && part.contains_key("memory"), "{res:?}");
    }

    let ports = c.ports.as_ref().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!((ports[0].name.as_deref(), ports[0].container_port), (Some("metrics"), 8080));
    for (probe, path) in [(&c.liveness_probe, "/healthz"), (&c.readiness_probe, "/readyz")] {
        let http = probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(http.path.as_deref(), Some(path));
        assert_eq!(serde_json::to_value(&http.port)?, "metrics");
    }

    assert_eq!(env_of(d), expected_env(&[], 8080));

    // The metrics Service reaches the pods' metrics port.
    assert_eq!(r.services.len(), 1);
    let svc = r.services[0].spec.as_ref().unwrap();
    assert_eq!(r.services[0].metadata.name.as_deref(), Some(format!("{RELEASE}-metrics").as_str()));
    for (k, v) in svc.selector.as_ref().unwrap() {
        assert_eq!(pod_labels.get(k), Some(v), "Service selector label {k} is not on the pods");
    }
    let sp = &svc.ports.as_ref().unwrap()[0];
    assert_eq!((sp.name.as_deref(), sp.port), (Some("metrics"), 8080));
    assert_eq!(serde_json::to_value(&sp.target_port)?, "metrics");
    Ok(())
}

#[test]
fn default_rbac_is_exactly_the_operators_api_calls() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let r = render(cp, &[])?;
    assert_eq!(operator_grants(&r, None)?, grants_of_rows(OPERATOR_RULES));
    // No podgroups without gang scheduling.
    assert!(!operator_grants(&r, None)?.iter().any(|g| g.1 == "podgroups"));
    // Leases: a Role in the release namespace; get/update only on the lease the operator is told
    // to use.
    let env = env_of(r.deployment());
    assert_eq!(leader_election_grants(&r)?, Some(lease_grants(&env["TFJOB_LEASE_NAME"])));
    assert_eq!(tls_seed_grants(&r)?, seed_grants(&env["TFJOB_TLS_SEED_SECRET"]));
    assert_eq!(r.roles.len(), 2, "only the leases and TLS seed Roles in cluster mode");
    // The Lease itself is part of the release (helm uninstall removes it), without a holder.
    assert_eq!(r.leases.len(), 1);
    let lease = &r.leases[0];
    assert_eq!(lease.metadata.name.as_deref(), Some(env["TFJOB_LEASE_NAME"].as_str()));
    assert_eq!(lease.metadata.namespace.as_deref(), Some(RELEASE_NS));
    assert!(lease.spec.is_none(), "the operator owns the spec: {lease:?}");
    Ok(())
}

#[test]
fn namespaced_mode_uses_a_role_in_the_watched_namespace() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let r = render(cp, &[("watchNamespace", "team-a")])?;
    assert_eq!(operator_grants(&r, Some("team-a"))?, grants_of_rows(OPERATOR_RULES));
    assert_eq!(leader_election_grants(&r)?, Some(lease_grants(RELEASE)));
    assert_eq!(env_of(r.deployment()), expected_env(&[("TFJOB_NAMESPACE", "team-a")], 8080));
    Ok(())
}

#[test]
fn gang_scheduling_adds_podgroup_rules_of_its_api_group_only() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let base = grants_of_rows(OPERATOR_RULES);
    for (setting, group) in
        [("volcano", Some("scheduling.volcano.sh")), ("kubernetes", Some("scheduling.k8s.io")), ("my-coscheduler", Some("scheduling.x-k8s.io")), ("none", None)]
    {
        for watch in [None, Some("team-a")] {
            let mut values = vec![("gangScheduler", setting)];
            values.extend(watch.map(|w| ("watchNamespace", w)));
            let r = render(cp, &values)?;
            let mut want = base.clone();
            if let Some(g) = group {
                want.extend(podgroup_grants(g));
            }
            assert_eq!(operator_grants(&r, watch)?, want, "{values:?}");
            let env = env_of(r.deployment());
            assert_eq!(env.get("TFJOB_GANG_SCHEDULER").map(String::as_str), group.map(|_| setting), "{values:?}");
        }
    }
    Ok(())
}

#[test]
fn kueue_admission_is_on_by_default_and_its_rule_goes_when_off() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let workloads = ("kueue.x-k8s.io".to_string(), "workloads".to_string(), None, "list".to_string());
    for watch in [None, Some("team-a")] {
        let mut values = vec![("kueue.admission", "false")];
        values.extend(watch.map(|w| ("watchNamespace", w)));
        let off = render(cp, &values)?;
        let mut want = grants_of_rows(OPERATOR_RULES);
        want.remove(&workloads);
        assert_eq!(operator_grants(&off, watch)?, want, "{values:?}");
        assert_eq!(env_of(off.deployment()).get("TFJOB_KUEUE_ADMISSION").map(String::as_str), Some("false"));
        let on = render(cp, &values[1..])?;
        assert!(operator_grants(&on, watch)?.contains(&workloads));
        assert!(!env_of(on.deployment()).contains_key("TFJOB_KUEUE_ADMISSION"));
    }
    Ok(())
}

#[test]
fn kueue_pod_groups_are_off_by_default_and_add_only_pod_patch_when_on() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let patch_pods = (String::new(), "pods".to_string(), None, "patch".to_string());
    for watch in [None, Some("team-a")] {
        let mut values = vec![("kueue.podGroups", "true")];
        values.extend(watch.map(|w| ("watchNamespace", w)));
        let on = render(cp, &values)?;
        let mut want = grants_of_rows(OPERATOR_RULES);
        assert!(!want.contains(&patch_pods), "pods are never patched by default");
        want.insert(patch_pods.clone());
        assert_eq!(operator_grants(&on, watch)?, want, "{values:?}");
        assert_eq!(env_of(on.deployment()).get("TFJOB_KUEUE_POD_GROUPS").map(String::as_str), Some("true"));
        let off = render(cp, &values[1..])?;
        assert!(!env_of(off.deployment()).contains_key("TFJOB_KUEUE_POD_GROUPS"));
    }
    Ok(())
}

#[test]
fn a_network_policy_per_job_is_off_by_default_and_adds_its_rules_when_on() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let base = grants_of_rows(OPERATOR_RULES);
    for watch in [None, Some("team-a")] {
        let mut values = vec![];
        values.extend(watch.map(|w| ("watchNamespace", w)));
        let off = render(cp, &values)?;
        assert_eq!(operator_grants(&off, watch)?, base, "{values:?}");
        assert!(!env_of(off.deployment()).contains_key("TFJOB_NETWORK_POLICY"));
        values.push(("networkPolicy.enabled", "true"));
        let on = render(cp, &values)?;
        let mut want = base.clone();
        want.extend(network_policy_grants());
        assert_eq!(operator_grants(&on, watch)?, want, "{values:?}");
        let env = env_of(on.deployment());
        assert_eq!(env["TFJOB_NETWORK_POLICY"], "true", "{values:?}");
    }
    let err = chart::template(cp, RELEASE, RELEASE_NS, &[("networkPolicy.enabled", "yes")], &[]).expect_err("a string for networkPolicy.enabled");
    assert!(format!("{err:#}").contains("networkPolicy"), "{err:#}");
    Ok(())
}

#[test]
fn several_replicas_need_leader_election() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let r = render(cp, &[("replicaCount", "2")])?;
    assert_eq!(r.deployment().spec.replicas, Some(2));
    assert_eq!(env_of(r.deployment())["TFJOB_LEADER_ELECT"], "true");
    assert!(leader_election_grants(&r)?.is_some());

    let err = chart::template(cp, RELEASE, RELEASE_NS, &[("replicaCount", "2"), ("leaderElection.enabled", "false")], &[])
        .expect_err("two replicas without leader election must be refused");
    assert!(format!("{err:#}").contains("leaderElection.enabled=true"), "{err:#}");

    // One replica without leader election: no Lease, no leases Role (the TLS seed's stays).
    let r = render(cp, &[("leaderElection.enabled", "false")])?;
    assert_eq!(env_of(r.deployment())["TFJOB_LEADER_ELECT"], "false");
    assert_eq!(leader_election_grants(&r)?, None);
    assert!(r.roles.len() == 1 && r.role_bindings.len() == 1 && r.leases.is_empty());
    assert_eq!(tls_seed_grants(&r)?, seed_grants("tfjob-operator-tls-seed"));
    Ok(())
}

#[test]
fn service_monitor_is_rendered_only_when_enabled() -> Result<()> {
    let cp = ControlPlane::shared()?;
    assert!(render(cp, &[])?.service_monitors.is_empty());
    let r = render(cp, &[("serviceMonitor.enabled", "true"), ("serviceMonitor.labels.release", "prometheus")])?;
    assert_eq!(r.service_monitors.len(), 1);
    let sm = &r.service_monitors[0];
    assert_eq!(sm["metadata"]["namespace"], RELEASE_NS);
    assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(sm["spec"]["namespaceSelector"]["matchNames"], serde_json::json!([RELEASE_NS]));
    let svc = &r.services[0];
    let svc_labels = svc.metadata.labels.as_ref().unwrap();
    let selector = sm["spec"]["selector"]["matchLabels"].as_object().context("matchLabels")?;
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(svc_labels.get(k).map(String::as_str), v.as_str(), "ServiceMonitor selects {k}={v}");
    }
    let endpoints = sm["spec"]["endpoints"].as_array().context("endpoints")?;
    assert_eq!(endpoints.len(), 1);
    let port_name = svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].name.clone();
    assert_eq!(endpoints[0]["port"].as_str(), port_name.as_deref());
    assert_eq!(endpoints[0]["path"], "/metrics");
    Ok(())
}

/// The PodMonitor selects exactly the pods the operator creates (by the label it puts on
/// them), scrapes the port the examples name `metrics`, in the watched namespace or all.
#[test]
fn pod_monitor_scrapes_the_replicas_only_when_enabled() -> Result<()> {
    let cp = ControlPlane::shared()?;
    assert!(render(cp, &[])?.pod_monitors.is_empty());
    let r = render(cp, &[("podMonitor.enabled", "true"), ("podMonitor.labels.release", "prometheus")])?;
    assert_eq!(r.pod_monitors.len(), 1);
    let pm = &r.pod_monitors[0];
    assert_eq!(pm["metadata"]["namespace"], RELEASE_NS);
    assert_eq!(pm["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(pm["spec"]["selector"]["matchLabels"], serde_json::json!({ tfjob_api::plan::LABEL_OPERATOR_NAME: tfjob_api::plan::OPERATOR_NAME }));
    assert_eq!(pm["spec"]["namespaceSelector"], serde_json::json!({ "any": true }));
    let endpoint = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!((endpoint["port"].as_str(), endpoint["path"].as_str()), (Some("metrics"), Some("/metrics")));
    let targets: Vec<&str> = endpoint["relabelings"].as_array().context("relabelings")?.iter().filter_map(|r| r["targetLabel"].as_str()).collect();
    assert_eq!(targets, ["tfjob", "replica_type", "replica_index"]);
    // The examples that serve metrics name their port as the PodMonitor scrapes it.
    for example in ["shared-volume", "s3-checkpoints"] {
        let text = std::fs::read_to_string(tfjob_tests::operator::repo_root().join(format!("examples/{example}.yaml")))?;
        assert!(text.contains("--metrics_port=9090") && text.contains("name: metrics"), "{example}");
    }
    let r = render(cp, &[("podMonitor.enabled", "true"), ("watchNamespace", "team-a")])?;
    assert_eq!(r.pod_monitors[0]["spec"]["namespaceSelector"], serde_json::json!({ "matchNames": ["team-a"] }));
    Ok(())
}

#[test]
fn image_and_settings_reach_the_deployment() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let r = render(
        cp,
        &[
            ("image.repository", "registry.example.com/ml/tfjob-operator"),
            ("image.tag", "v9"),
            ("image.pullPolicy", "Always"),
            ("clusterDomain", "cluster.local"),
            ("logLevel", "tfjob_operator=debug"),
            ("logFormat", "json"),
            ("metrics.port", "9090"),
            ("concurrency", "3"),
            ("nodeSelector.kubernetes\\.io/os", "linux"),
            ("tolerations[0].key", "dedicated"),
            ("tolerations[0].operator", "Exists"),
            ("priorityClassName", "system-cluster-critical"),
        ],
    )?;
    let d = r.deployment();
    let pod = d.spec.template.spec.as_ref().unwrap();
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some("registry.example.com/ml/tfjob-operator:v9"));
    assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
    let mut want = expected_env(&[("TFJOB_CLUSTER_DOMAIN", "cluster.local"), ("TFJOB_CONCURRENCY", "3")], 9090);
    want.insert("TFJOB_LOG_LEVEL".into(), "tfjob_operator=debug".into());
    want.insert("TFJOB_LOG_FORMAT".into(), "json".into());
    assert_eq!(env_of(d), want);
    assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 9090);
    assert_eq!(r.services[0].spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port, 9090);
    assert_eq!(pod.node_selector.as_ref().unwrap()["kubernetes.io/os"], "linux");
    let t = &pod.tolerations.as_ref().unwrap()[0];
    assert_eq!((t.key.as_deref(), t.operator.as_deref()), (Some("dedicated"), Some("Exists")));
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-cluster-critical"));

    let digest = format!("sha256:{}", "ab".repeat(32));
    let r = render(cp, &[("image.digest", &digest), ("image.tag", "ignored")])?;
    let c = &r.deployment().spec.template.spec.as_ref().unwrap().containers[0];
    assert_eq!(c.image.as_deref(), Some(format!("ghcr.io/tfjob-rs/tfjob-operator@{digest}").as_str()));
    Ok(())
}

#[test]
fn an_existing_service_account_and_no_rbac_are_supported() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let r = render(cp, &[("serviceAccount.create", "false"), ("serviceAccount.name", "existing")])?;
    assert!(r.service_accounts.is_empty());
    let pod = r.deployment().spec.template.spec.clone().unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("existing"));
    assert_eq!(r.cluster_role_bindings[0].subjects.as_ref().unwrap()[0].name, "existing");
    for rb in &r.role_bindings {
        assert_eq!(rb.subjects.as_ref().unwrap()[0].name, "existing");
    }
    let err = chart::template(cp, RELEASE, RELEASE_NS, &[("serviceAccount.create", "false")], &[]).expect_err("no ServiceAccount and no name");
    assert!(format!("{err:#}").contains("serviceAccount.name is required"), "{err:#}");

    let r = render(cp, &[("rbac.create", "false")])?;
    let kinds = r.kinds();
    assert!(!kinds.iter().any(|k| k.contains("Role")), "{kinds:?}");
    Ok(())
}

#[test]
fn invalid_values_are_refused_with_the_offending_value_named() -> Result<()> {
    let cp = ControlPlane::shared()?;
    for (values, needle) in [
        (&[("replicas", "2")][..], "replicas"),
        (&[("logFormat", "xml")][..], "/logFormat"),
        (&[("metrics.port", "0")][..], "/metrics/port"),
        (&[("watchNamespace", "Team_A")][..], "/watchNamespace"),
        (&[("image.pullPolicy", "Sometimes")][..], "/image/pullPolicy"),
        (&[("leaderElection.enabled", "yes")][..], "/leaderElection/enabled"),
    ] {
        let err = chart::template(cp, RELEASE, RELEASE_NS, values, &[]).err().with_context(|| format!("{values:?} was accepted"))?;
        let msg = format!("{err:#}");
        assert!(msg.contains(needle), "{values:?}: {msg}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The helper for the operator's tests.

#[test]
fn render_rbac_returns_the_service_account_and_rbac_only() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let yaml = chart::render_rbac(cp, RELEASE_NS, &[])?;
    let r = parse(&yaml)?;
    let mut kinds: Vec<&str> = r.objects.iter().map(|(k, _, _)| k.as_str()).collect();
    kinds.sort();
    assert_eq!(kinds, ["ClusterRole", "ClusterRoleBinding", "Role", "Role", "RoleBinding", "RoleBinding", "ServiceAccount"]);
    let scoped = parse(&chart::render_rbac(cp, RELEASE_NS, &[("watchNamespace", "team-a")])?)?;
    let mut kinds: Vec<(&str, Option<&str>)> = scoped.objects.iter().map(|(k, ns, _)| (k.as_str(), ns.as_deref())).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            ("Role", Some("team-a")),
            ("Role", Some(RELEASE_NS)),
            ("Role", Some(RELEASE_NS)),
            ("RoleBinding", Some("team-a")),
            ("RoleBinding", Some(RELEASE_NS)),
            ("RoleBinding", Some(RELEASE_NS)),
            ("ServiceAccount", Some(RELEASE_NS)),
        ]
    );
    assert!(chart::render_rbac(cp, RELEASE_NS, &[("rbac.create", "false")]).is_err());
    Ok(())
}

fn eventually(what: &str, timeout: Duration, mut check: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last = None;
    loop {
        match check() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last = Some(e),
        }
        if Instant::now() > deadline {
            bail!("{what}: not true after {timeout:?}{}", last.map(|e| format!(" (last error: {e:#})")).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn apply_rbac_lets_the_service_account_make_exactly_the_operators_calls() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let ns = cp.create_namespace("chart-rbac")?;
    let account = chart::apply_rbac(cp, &ns, &[("watchNamespace", &ns)])?;
    assert_eq!(account.service_account, RELEASE);
    let as_operator = |args: &[&str], stdin: Option<&str>| -> Result<(bool, String)> {
        let mut cmd = cp.command_with_kubeconfig("kubectl", &account.kubeconfig);
        cmd.args(args).args(["-n", &ns]);
        let out = match stdin {
            None => cmd.output()?,
            Some(input) => {
                use std::io::Write;
                cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
                let mut child = cmd.spawn()?;
                child.stdin.take().unwrap().write_all(input.as_bytes())?;
                child.wait_with_output()?
            }
        };
        Ok((out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))))
    };
    eventually("the RoleBinding takes effect", Duration::from_secs(30), || Ok(as_operator(&["get", "pods"], None)?.0))?;

    // Server-side apply that creates an object needs create and patch: both granted for Services.
    let svc = "apiVersion: v1\nkind: Service\nmetadata:\n  name: job\nspec:\n  clusterIP: None\n  selector:\n    job: job\n";
    let (ok, out) = as_operator(&["apply", "--server-side", "--field-manager=tfjob-operator", "-f", "-"], Some(svc))?;
    assert!(ok, "server-side apply of a Service: {out}");
    let (ok, out) = as_operator(&["get", "service", "job"], None)?;
    assert!(!ok && out.to_lowercase().contains("forbidden"), "get service must be forbidden (the operator never reads one): {out}");
    let (ok, out) = as_operator(&["delete", "service", "job"], None)?;
    assert!(!ok && out.to_lowercase().contains("forbidden"), "{out}");
    // The same for a job's HorizontalPodAutoscaler (elasticPolicy.metrics).
    let hpa = "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: job\nspec:\n  scaleTargetRef:\n    apiVersion: kubeflow.org/v1\n    kind: TFJob\n    name: job\n  maxReplicas: 4\n";
    let (ok, out) = as_operator(&["apply", "--server-side", "--field-manager=tfjob-operator", "-f", "-"], Some(hpa))?;
    assert!(ok, "server-side apply of a HorizontalPodAutoscaler: {out}");
    let (ok, out) = as_operator(&["delete", "horizontalpodautoscaler", "job"], None)?;
    assert!(!ok && out.to_lowercase().contains("forbidden"), "{out}");
    // Secrets: create, and nothing else: not even read back.
    assert!(as_operator(&["create", "secret", "generic", "tok", "--from-literal=token=x"], None)?.0);
    for verb in [&["get", "secret", "tok"][..], &["get", "secrets"], &["label", "secret", "tok", "a=b"], &["delete", "secret", "tok"]] {
        let (ok, out) = as_operator(verb, None)?;
        assert!(!ok && out.to_lowercase().contains("forbidden"), "{verb:?}: {out}");
    }
    // Nothing else.
    let (ok, out) = as_operator(&["create", "configmap", "x"], None)?;
    assert!(!ok && out.to_lowercase().contains("forbidden"), "{out}");
    assert!(!as_operator(&["get", "pods", "--all-namespaces"], None)?.0, "namespaced mode reaches other namespaces");

    // Leader election: create, then get and update only the lease the chart names.
    let lease = |name: &str, holder: &str| {
        format!("apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: {name}\nspec:\n  holderIdentity: {holder}\n  leaseDurationSeconds: 15\n")
    };
    let (ok, out) = as_operator(&["create", "-f", "-"], Some(&lease(&account.lease_name, "a")))?;
    assert!(ok, "create lease: {out}");
    let (ok, out) = as_operator(&["get", "lease", &account.lease_name, "-o", "yaml"], None)?;
    assert!(ok, "get lease: {out}");
    let updated = out.replace("holderIdentity: a", "holderIdentity: b");
    let (ok, out) = as_operator(&["replace", "-f", "-"], Some(&updated))?;
    assert!(ok, "replace (update) lease: {out}");
    assert!(as_operator(&["create", "-f", "-"], Some(&lease("someone-elses", "x")))?.0);
    let (ok, out) = as_operator(&["get", "lease", "someone-elses"], None)?;
    assert!(!ok && out.to_lowercase().contains("forbidden"), "another lease must not be readable: {out}");
    assert!(!as_operator(&["get", "leases"], None)?.0, "leases must not be listable");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// helm install into the test API server.

fn check_permissions(cp: &ControlPlane, who: &str, table: &[(&[&str], bool)]) -> Result<()> {
    let mut wrong = Vec::new();
    for (args, want) in table {
        if can_i(cp, who, args)? != *want {
            wrong.push(format!("can-i {} should be {want}", args.join(" ")));
        }
    }
    ensure!(wrong.is_empty(), "{who}:\n{}", wrong.join("\n"));
    Ok(())
}

fn exists(cp: &ControlPlane, kind: &str, name: &str, namespace: Option<&str>) -> Result<bool> {
    let mut args = vec!["get", kind, name, "-o", "name"];
    if let Some(ns) = namespace {
        args.extend(["-n", ns]);
    }
    let out = cp.kubectl(&args)?;
    if out.status.success() {
        return Ok(true);
    }
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(err.contains("NotFound"), "kubectl get {kind} {name}: {err}");
    Ok(false)
}

/// Installs the chart (no --wait: no kubelet runs, pods stay Pending) and returns the objects it
/// renders for these values, but the CRD (which the release creates only on a cluster without
/// one, and which outlives it).
fn install(cp: &ControlPlane, ns: &str, values: &[(&str, &str)]) -> Result<Vec<(String, Option<String>, String)>> {
    let mut objects = parse(&chart::template(cp, RELEASE, ns, values, &[])?)?.objects;
    objects.retain(|(kind, _, _)| kind != "CustomResourceDefinition");
    let mut args = vec!["install".to_string(), RELEASE.into(), chart_dir().display().to_string(), "-n".into(), ns.into()];
    for (k, v) in values {
        args.push("--set".into());
        args.push(format!("{k}={v}"));
    }
    // One install at a time: on a control plane without the CRD, two releases installed at once
    // both find it missing, both render it, and the second is refused the first's CRD ("exists
    // and cannot be imported into the current release"; seen in CI, 2026-11-30).
    let out = {
        static INSTALLS: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = INSTALLS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        cp.helm(&args)?
    };
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "helm {args:?}:\n{text}");
    ensure!(text.contains("STATUS: deployed"), "helm {args:?}:\n{text}");
    ensure!(!text.contains("would violate PodSecurity"), "helm {args:?}:\n{text}");
    cp.wait_established(&["tfjobs.kubeflow.org"])?;
    for (kind, namespace, name) in &objects {
        ensure!(exists(cp, kind, name, namespace.as_deref())?, "{kind} {name} was not created by helm install");
    }
    Ok(objects)
}

fn uninstall(cp: &ControlPlane, ns: &str, objects: &[(String, Option<String>, String)]) -> Result<()> {
    cp.helm_ok(["uninstall", RELEASE, "-n", ns])?;
    for (kind, namespace, name) in objects {
        eventually(&format!("{kind} {name} is deleted"), Duration::from_secs(60), || Ok(!exists(cp, kind, name, namespace.as_deref())?))?;
    }
    // The CRD outlives every release (helm.sh/resource-policy: keep): TFJobs survive an uninstall.
    ensure!(exists(cp, "crd", "tfjobs.kubeflow.org", None)?, "helm uninstall deleted the CRD");
    Ok(())
}

#[test]
fn helm_install_in_cluster_mode_is_accepted_under_the_restricted_pod_security_standard() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let ns = cp.create_namespace("chart-install")?;
    // PodSecurity admission refuses pods that are not "restricted": the ReplicaSet's pod only
    // exists if the chart's security contexts comply.
    cp.kubectl_ok(["label", "namespace", &ns, "pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/enforce-version=latest"])?;
    let objects = install(cp, &ns, &[])?;
    let kinds: BTreeSet<&str> = objects.iter().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(kinds, ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment", "Lease"].into());
    let crd_json: Value = serde_json::from_str(&cp.kubectl_ok(["get", "crd", "tfjobs.kubeflow.org", "-o", "json"])?)?;
    assert_eq!(crd_json["spec"]["group"], "kubeflow.org");

    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    eventually("the ReplicaSet creates the operator pod", Duration::from_secs(60), || {
        Ok(!cp.kubectl_ok(["get", "pods", "-n", &ns, "-l", &selector, "-o", "name"])?.trim().is_empty())
    })?;
    let pods: Value = serde_json::from_str(&cp.kubectl_ok(["get", "pods", "-n", &ns, "-l", &selector, "-o", "json"])?)?;
    let pod = &pods["items"][0];
    assert_eq!(pod["spec"]["serviceAccountName"], RELEASE);
    assert_eq!(pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"], true);

    let who = format!("system:serviceaccount:{ns}:{RELEASE}");
    eventually("the ClusterRoleBinding takes effect", Duration::from_secs(30), || can_i(cp, &who, &["list", "tfjobs.kubeflow.org", "--all-namespaces"]))?;
    let lease_ns = ["-n", ns.as_str()];
    let table: Vec<(Vec<&str>, bool)> = vec![
        (vec!["watch", "tfjobs.kubeflow.org", "--all-namespaces"], true),
        (vec!["delete", "tfjobs.kubeflow.org", "-n", "default"], true),
        (vec!["update", "tfjobs.kubeflow.org", "-n", "default"], false),
        (vec!["create", "tfjobs.kubeflow.org", "-n", "default"], false),
        (vec!["patch", "tfjobs.kubeflow.org", "--subresource=status", "-n", "default"], true),
        (vec!["update", "tfjobs.kubeflow.org", "--subresource=status", "-n", "default"], false),
        (vec!["update", "tfjobs.kubeflow.org", "--subresource=finalizers", "-n", "default"], true),
        (vec!["create", "pods", "-n", "default"], true),
        (vec!["patch", "pods", "-n", "default"], false),
        (vec!["delete", "pods", "-n", "default"], true),
        (vec!["update", "pods", "-n", "default"], false),
        (vec!["create", "pods", "--subresource=exec", "-n", "default"], false),
        (vec!["create", "services", "-n", "default"], true),
        (vec!["delete", "services", "-n", "default"], false),
        // Secrets: create only; no reading any credential of the cluster.
        (vec!["create", "secrets", "-n", "default"], true),
        (vec!["get", "secrets", "-n", "kube-system"], false),
        (vec!["list", "secrets", "--all-namespaces"], false),
        (vec!["watch", "secrets", "--all-namespaces"], false),
        (vec!["update", "secrets", "-n", "default"], false),
        (vec!["delete", "secrets", "-n", "default"], false),
        (vec!["create", "networkpolicies.networking.k8s.io", "-n", "default"], false),
        (vec!["create", "events.events.k8s.io", "-n", "default"], true),
        (vec!["patch", "events.events.k8s.io", "-n", "default"], true),
        (vec!["create", "events", "-n", "default"], false),
        (vec!["create", "podgroups.scheduling.volcano.sh", "-n", "default"], false),
        (vec!["get", "configmaps", "-n", "default"], false),
        (vec!["create", "deployments.apps", "-n", "default"], false),
        (vec!["create", "leases.coordination.k8s.io", lease_ns[0], lease_ns[1]], true),
        (vec!["update", "leases.coordination.k8s.io/tfjob-operator", lease_ns[0], lease_ns[1]], true),
        (vec!["get", "leases.coordination.k8s.io/kube-controller-manager", "-n", "kube-system"], false),
        (vec!["list", "leases.coordination.k8s.io", lease_ns[0], lease_ns[1]], false),
        (vec!["create", "leases.coordination.k8s.io", "-n", "default"], false),
    ];
    let table: Vec<(&[&str], bool)> = table.iter().map(|(a, w)| (a.as_slice(), *w)).collect();
    check_permissions(cp, &who, &table)?;

    uninstall(cp, &ns, &objects)
}

#[test]
fn helm_install_in_namespaced_mode_grants_nothing_outside_the_watched_namespace() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let ops = cp.create_namespace("chart-ops")?;
    let team = cp.create_namespace("chart-team")?;
    let objects = install(cp, &ops, &[("watchNamespace", &team), ("gangScheduler", "volcano")])?;
    assert!(objects.iter().all(|(k, _, _)| !k.starts_with("Cluster")), "{objects:?}");
    assert!(objects.iter().any(|(k, n, _)| k == "Role" && n.as_deref() == Some(team.as_str())), "{objects:?}");

    let who = format!("system:serviceaccount:{ops}:{RELEASE}");
    eventually("the RoleBinding takes effect", Duration::from_secs(30), || can_i(cp, &who, &["list", "tfjobs.kubeflow.org", "-n", &team]))?;
    let table: Vec<(Vec<&str>, bool)> = vec![
        (vec!["watch", "pods", "-n", &team], true),
        (vec!["create", "podgroups.scheduling.volcano.sh", "-n", &team], true),
        (vec!["delete", "podgroups.scheduling.volcano.sh", "-n", &team], true),
        (vec!["create", "podgroups.scheduling.x-k8s.io", "-n", &team], false),
        (vec!["list", "tfjobs.kubeflow.org", "--all-namespaces"], false),
        (vec!["list", "tfjobs.kubeflow.org", "-n", &ops], false),
        (vec!["get", "secrets", "-n", &ops], false),
        (vec!["get", "secrets", "-n", "default"], false),
        (vec!["create", "leases.coordination.k8s.io", "-n", &ops], true),
        (vec!["create", "leases.coordination.k8s.io", "-n", &team], false),
    ];
    let table: Vec<(&[&str], bool)> = table.iter().map(|(a, w)| (a.as_slice(), *w)).collect();
    check_permissions(cp, &who, &table)?;

    let env = cp.kubectl_ok([
        "get",
        "deployment",
        RELEASE,
        "-n",
        &ops,
        "-o",
        "jsonpath={range .spec.template.spec.containers[0].env[*]}{.name}={.value}{\"\\n\"}{end}",
    ])?;
    assert!(env.lines().any(|l| l == format!("TFJOB_NAMESPACE={team}")), "{env}");
    assert!(env.lines().any(|l| l == "TFJOB_GANG_SCHEDULER=volcano"), "{env}");

    uninstall(cp, &ops, &objects)
}
