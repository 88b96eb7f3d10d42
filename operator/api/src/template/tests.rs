//! Table tests of strict template reading and value checks.

use serde_json::json;

use super::*;

/// (field, message) of every problem.
fn pairs(errs: &[FieldError]) -> Vec<(String, String)> {
    errs.iter().map(|e| (e.field.clone(), e.message.clone())).collect()
}

fn owned(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[test]
fn unknown_fields_are_named_with_a_hint() {
    // (template, unknown fields as (path, message))
    let cases: Vec<(Value, Vec<(&str, &str)>)> = vec![
        (
            json!({"spec": {"containers": [{"name": "tensorflow", "image": "i", "resource": {}}]}}),
            vec![("spec.containers[0].resource", "unknown field; did you mean \"resources\"?")],
        ),
        (
            json!({"spec": {"containers": [{"name": "tensorflow", "image": "i",
                "ports": [{"containerPort": 1, "nmae": "x"}]}]}}),
            vec![("spec.containers[0].ports[0].nmae", "unknown field; did you mean \"name\"?")],
        ),
        (
            json!({"metadata": {"lables": {"a": "b"}}, "spec": {"nodeselector": {}, "containers": []}}),
            vec![("metadata.lables", "unknown field; did you mean \"labels\"?"), ("spec.nodeselector", "unknown field; did you mean \"nodeSelector\"?")],
        ),
        (
            json!({"spec": {"containers": [{"name": "t", "image": "i",
                "resources": {"limits": {"cpu": 1}, "requets": {"cpu": 1}}}]}}),
            vec![("spec.containers[0].resources.requets", "unknown field; did you mean \"requests\"?")],
        ),
        (json!({"spec": {"containers": [{"name": "t", "image": "i", "gpu": 1}]}}), vec![("spec.containers[0].gpu", "unknown field")]),
        (json!({"specs": {}}), vec![("specs", "unknown field; did you mean \"spec\"?")]),
        // What kubectl and generators write is known: null timestamps, empty objects.
        (
            json!({"metadata": {"creationTimestamp": null, "labels": {"app": "x"}},
                   "spec": {"containers": [{"name": "t", "image": "i", "resources": {}}]}}),
            vec![],
        ),
    ];
    for (template, want) in cases {
        let (_, reading) = read(template.clone());
        assert_eq!(reading.error, None, "{template}");
        assert_eq!(pairs(&reading.unknown_fields), owned(&want), "{template}");
    }
}

#[test]
fn values_of_the_wrong_type_are_named() {
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"spec": {"containers": "tensorflow"}}), "spec.containers", "expected a sequence"),
        (
            json!({"spec": {"containers": [{"name": "t", "image": "i", "ports": [{"containerPort": "http"}]}]}}),
            "spec.containers[0].ports[0].containerPort",
            "expected i32",
        ),
        (json!({"spec": {"containers": [{"name": "t", "image": 3}]}}), "spec.containers[0].image", "invalid type: integer `3`"),
        (json!("tensorflow"), "", "invalid type: string"),
    ];
    for (template, field, needle) in cases {
        let (t, reading) = read(template.clone());
        let e = reading.error.expect("an error");
        assert_eq!(e.field, field, "{template}");
        assert!(e.message.starts_with("cannot be decoded: "), "{e}");
        assert!(e.message.contains(needle), "{template}: {e}");
        assert_eq!(t, PodTemplateSpec::default());
    }
}

/// A template with one container `tensorflow`, merged with `extra` into the container and
/// `pod` into the pod spec.
fn template(container: Value, pod: Value) -> PodTemplateSpec {
    let mut c = json!({"name": "tensorflow", "image": "tfjob-runtime:latest"});
    c.as_object_mut().unwrap().extend(container.as_object().unwrap().clone());
    let mut spec = json!({"containers": [c]});
    spec.as_object_mut().unwrap().extend(pod.as_object().unwrap().clone());
    let (t, reading) = read(json!({"spec": spec}));
    assert_eq!(reading, Reading::default(), "{spec}");
    t
}

#[test]
fn values_the_api_server_refuses_are_named() {
    let none = json!({});
    // (container fields, pod fields, expected problems)
    type Case = (Value, Value, Vec<(&'static str, &'static str)>);
    let cases: Vec<Case> = vec![
        (none.clone(), none.clone(), vec![]),
        (
            json!({"imagePullPolicy": "Sometimes"}),
            none.clone(),
            vec![("spec.containers[0].imagePullPolicy", "unsupported value \"Sometimes\"; supported values: \"Always\", \"IfNotPresent\", \"Never\"")],
        ),
        (
            json!({"ports": [{"name": "tfjob_port", "containerPort": 2222}]}),
            none.clone(),
            vec![(
                "spec.containers[0].ports[0].name",
                "\"tfjob_port\" is not a valid port name (IANA_SVC_NAME): it may contain only lower case letters, digits and '-'",
            )],
        ),
        (
            json!({"ports": [{"name": "a-much-too-long-port-name", "containerPort": 70000, "protocol": "tcp"}]}),
            none.clone(),
            vec![
                ("spec.containers[0].ports[0].containerPort", "must be between 1 and 65535, got 70000"),
                (
                    "spec.containers[0].ports[0].name",
                    "\"a-much-too-long-port-name\" is not a valid port name (IANA_SVC_NAME): it must be 1 to 15 characters long",
                ),
                ("spec.containers[0].ports[0].protocol", "unsupported value \"tcp\"; supported values: \"TCP\", \"UDP\", \"SCTP\""),
            ],
        ),
        (
            json!({"resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "2", "memory": "lots"}}}),
            none.clone(),
            vec![
                ("spec.containers[0].resources.requests.memory", "\"lots\" is not a quantity (e.g. 500m, 2, 1.5Gi, 128974848, 129e6)"),
                ("spec.containers[0].resources.requests.cpu", "must be less than or equal to the cpu limit"),
            ],
        ),
        (
            json!({"volumeMounts": [{"name": "data", "mountPath": "/data"}]}),
            none.clone(),
            vec![("spec.containers[0].volumeMounts[0].name", "volume \"data\" is not among spec.volumes")],
        ),
        (json!({"volumeMounts": [{"name": "data", "mountPath": "/data"}]}), json!({"volumes": [{"name": "data", "emptyDir": {}}]}), vec![]),
        (
            none.clone(),
            json!({"volumes": [{"name": "Data"}]}),
            vec![
                (
                    "spec.volumes[0].name",
                    "\"Data\" is not a valid DNS-1123 label: lower case alphanumeric characters or '-', starting and ending with an alphanumeric character, at most 63",
                ),
                ("spec.volumes[0]", "must specify a volume type (emptyDir, configMap, persistentVolumeClaim, ...)"),
            ],
        ),
        (
            json!({"env": [{"name": "", "value": "x"}, {"name": "A", "value": "v", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}),
            none.clone(),
            vec![
                ("spec.containers[0].env[0].name", "\"\" is not a valid environment variable name: it must not be empty or contain '='"),
                ("spec.containers[0].env[1].valueFrom", "may not be specified when `value` is not empty"),
            ],
        ),
        (
            json!({"livenessProbe": {"httpGet": {"port": "metrics_port"}}, "readinessProbe": {}}),
            none.clone(),
            vec![
                (
                    "spec.containers[0].livenessProbe.httpGet.port",
                    "\"metrics_port\" is not a valid port name (IANA_SVC_NAME): it may contain only lower case letters, digits and '-'",
                ),
                ("spec.containers[0].readinessProbe", "must specify exactly one of exec, httpGet, tcpSocket and grpc"),
            ],
        ),
        (
            none.clone(),
            json!({"restartPolicy": "Sometimes", "dnsPolicy": "Cluster",
                   "initContainers": [{"name": "tensorflow", "image": ""}]}),
            vec![
                ("spec.restartPolicy", "unsupported value \"Sometimes\"; supported values: \"Always\", \"OnFailure\", \"Never\""),
                ("spec.dnsPolicy", "unsupported value \"Cluster\"; supported values: \"ClusterFirstWithHostNet\", \"ClusterFirst\", \"Default\", \"None\""),
                ("spec.initContainers[0].name", "duplicate container name \"tensorflow\""),
                ("spec.initContainers[0].image", "must not be empty"),
            ],
        ),
        (
            none.clone(),
            json!({"tolerations": [{"key": "gpu", "operator": "Exists", "value": "x", "effect": "NoScheduling"}],
                   "nodeSelector": {"gpu type": "a100"}}),
            vec![
                (
                    "spec.nodeSelector.gpu type",
                    "key \"gpu type\" is not valid: the name must be at most 63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric",
                ),
                ("spec.tolerations[0].value", "must be empty when `operator` is 'Exists'"),
                ("spec.tolerations[0].effect", "unsupported value \"NoScheduling\"; supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\""),
            ],
        ),
        (
            json!({"name": "TensorFlow"}),
            none.clone(),
            vec![(
                "spec.containers[0].name",
                "\"TensorFlow\" is not a valid DNS-1123 label: lower case alphanumeric characters or '-', starting and ending with an alphanumeric character, at most 63",
            )],
        ),
    ];
    for (container, pod, want) in cases {
        let t = template(container.clone(), pod.clone());
        assert_eq!(pairs(&check(&t)), owned(&want), "{container} {pod}");
    }
}

#[test]
fn labels_of_the_template_are_checked() {
    let (t, _) = read(json!({"metadata": {
        "labels": {"app.kubernetes.io/name": "mnist", "bad/key/x": "v", "ok": "-bad-"},
        "annotations": {"example.com/note": "anything at all", "": "x"},
    }}));
    let got = pairs(&check(&t));
    let fields: Vec<&str> = got.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(fields, vec!["metadata.labels.bad/key/x", "metadata.labels.ok", "metadata.annotations."], "{got:?}");
}

#[test]
fn quantities() {
    for (s, want) in [
        ("1", Some(1.0)),
        ("500m", Some(0.5)),
        ("1.5Gi", Some(1.5 * 1024.0 * 1024.0 * 1024.0)),
        ("129e6", Some(129e6)),
        ("1E3", Some(1000.0)),
        ("+2k", Some(2000.0)),
        (".5", Some(0.5)),
        ("-1", Some(-1.0)),
        ("", None),
        ("lots", None),
        ("1GB", None),
        ("1.2.3", None),
        ("1e", None),
        ("m", None),
    ] {
        assert_eq!(parse_quantity(s), want, "{s:?}");
    }
}

#[test]
fn port_names() {
    for (name, ok) in [
        ("tfjob-port", true),
        ("http", true),
        ("h2c", true),
        ("123", false),
        ("a--b", false),
        ("-a", false),
        ("UPPER", false),
        ("sixteen-chars-xx", false),
        ("", false),
    ] {
        assert_eq!(check_port_name(name).is_ok(), ok, "{name:?}");
    }
}

#[test]
fn a_pod_template_reads_as_its_spec_and_takes_no_heap_when_empty() {
    let full: PodTemplateSpec = serde_json::from_value(json!({"spec": {"containers": [{"name": "tensorflow", "image": "i"}]}})).unwrap();
    // (case, template) -> (empty, its JSON)
    let cases = [
        ("default", PodTemplate::default(), true, json!({})),
        ("from an empty spec", PodTemplate::from(PodTemplateSpec::default()), true, json!({})),
        ("from a spec", PodTemplate::from(full.clone()), false, serde_json::to_value(&full).unwrap()),
    ];
    for (case, template, empty, as_json) in cases {
        assert_eq!(template.is_empty(), empty, "{case}");
        assert_eq!(serde_json::to_value(&template).unwrap(), as_json, "{case}");
        assert_eq!(*template == PodTemplateSpec::default(), empty, "{case}");
    }
    assert_eq!(PodTemplate::default(), PodTemplate::from(PodTemplateSpec::default()));
    assert_ne!(PodTemplate::default(), PodTemplate::from(full.clone()));
    // Written through, an empty template takes a spec of its own.
    let mut written = PodTemplate::default();
    let through: &mut PodTemplateSpec = &mut written;
    through.spec = full.spec.clone();
    assert_eq!((written.is_empty(), written), (false, PodTemplate::from(full)));
}
