{{/*
Chart name, overridable with nameOverride.
*/}}
{{- define "tfjob-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name that prefixes every object: fullnameOverride, else the release name when it already
contains the chart name, else <release>-<chart>. At most 63 characters (DNS label).
*/}}
{{- define "tfjob-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Name of cluster-scoped objects (ClusterRole, ClusterRoleBinding): the full name plus the release
namespace, so that releases of the same name in different namespaces do not collide.
*/}}
{{- define "tfjob-operator.clusterName" -}}
{{- printf "%s-%s" (include "tfjob-operator.fullname" .) .Release.Namespace | trunc 253 | trimSuffix "-" }}
{{- end }}

{{- define "tfjob-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object.
*/}}
{{- define "tfjob-operator.labels" -}}
helm.sh/chart: {{ include "tfjob-operator.chart" . }}
{{ include "tfjob-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: tfjob
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Labels that select the operator pods (immutable in a Deployment: keep them stable).
*/}}
{{- define "tfjob-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tfjob-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tfjob-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tfjob-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image reference: repository@digest, or repository:tag (tag defaults to appVersion).
*/}}
{{- define "tfjob-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}
{{- end }}

{{/*
The gang scheduler setting as the operator reads it (trimmed; `none` means none).
*/}}
{{- define "tfjob-operator.gangScheduler" -}}
{{- $g := .Values.gangScheduler | default "" | toString | trim }}
{{- if ne $g "none" }}{{ $g }}{{ end }}
{{- end }}

{{/*
API group of the PodGroups the operator writes: empty without gang scheduling,
scheduling.volcano.sh for `volcano`, scheduling.k8s.io (Kubernetes' own) for `kubernetes`,
scheduling.x-k8s.io (scheduler-plugins) otherwise.
*/}}
{{- define "tfjob-operator.podGroupApiGroup" -}}
{{- $g := include "tfjob-operator.gangScheduler" . }}
{{- if eq $g "volcano" }}scheduling.volcano.sh
{{- else if eq $g "kubernetes" }}scheduling.k8s.io
{{- else if $g }}scheduling.x-k8s.io
{{- end }}
{{- end }}

{{/*
Fails rendering on contradictory values.
*/}}
{{- define "tfjob-operator.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail "replicaCount > 1 needs leaderElection.enabled=true: without a Lease every replica would reconcile the same TFJobs" }}
{{- end }}
{{- if not (has .Values.logFormat (list "text" "json")) }}
{{- fail (printf "logFormat must be text or json, not %q" (toString .Values.logFormat)) }}
{{- end }}
{{- end }}

{{/*
What the chart does with the TFJob CRD (tfjobs.kubeflow.org), decided before Helm applies
anything, since the CRD is a template (templates/crd.yaml) and not in crds/: Helm 3 silently skips
a CRD of crds/ that exists, and Helm 4 server-side applies it over the one there (merging into
another operator's CRD, or failing on a field conflict). `lookup` sees the cluster on install and
upgrade; under `helm template`, `helm lint` and --dry-run=client it sees nothing, and the CRD
renders. Results:
- "render": no TFJob CRD yet, or the one this release installed before: the chart's CRD, kept on
  uninstall (helm.sh/resource-policy: keep) and updated on upgrade.
- "keep": this project's CRD (label app.kubernetes.io/part-of=tfjob-rs), installed otherwise
  (`kubectl apply`, or another release of this chart): left as it is.
- "beside": another operator's CRD (Kubeflow's training-operator's, most likely) with
  besideKubeflow=true: left as it is, if it has spec.runPolicy.managedBy (training-operator v1.9
  and later; without it the API server drops the field and no job could be given to this
  operator) and, where it lists the allowed values, this operator's among them.
Another operator's CRD without besideKubeflow fails, saying what to do: two controllers must not
reconcile the same TFJobs.
*/}}
{{- define "tfjob-operator.crd" -}}
{{- $crd := lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" "tfjobs.kubeflow.org" }}
{{- if not $crd }}render
{{- else }}
{{- $labels := $crd.metadata.labels | default dict }}
{{- $annotations := $crd.metadata.annotations | default dict }}
{{- if eq (get $labels "app.kubernetes.io/part-of") "tfjob-rs" }}
{{- if and (eq (get $annotations "meta.helm.sh/release-name") .Release.Name) (eq (get $annotations "meta.helm.sh/release-namespace") .Release.Namespace) }}render
{{- else }}keep
{{- end }}
{{- else if not .Values.besideKubeflow }}
{{- fail (printf "the cluster already has a TFJob CRD (tfjobs.kubeflow.org) that this chart did not install (labels: %s), most likely Kubeflow's training-operator's. Two controllers must not reconcile the same TFJobs, and this chart changes nothing. Either run beside it: install with --set besideKubeflow=true (this operator then takes only TFJobs with spec.runPolicy.managedBy: tfjob-rs.io/operator; see README.md, \"Running beside Kubeflow\"), or make this operator the cluster's TFJob controller: remove Kubeflow's training-operator, apply this project's CRD (kubectl apply --server-side --force-conflicts -f https://raw.githubusercontent.com/tfjob-rs/tfjob-rs/v%s/crds/tfjob.yaml) and install again." (toJson $labels) .Chart.AppVersion) }}
{{- else }}
{{- include "tfjob-operator.checkBesideCrd" $crd }}beside
{{- end }}
{{- end }}
{{- end }}

{{/*
Beside Kubeflow: the other operator's CRD must carry spec.runPolicy.managedBy in its served
versions, and allow tfjob-rs.io/operator where it lists values (an enum).
*/}}
{{- define "tfjob-operator.checkBesideCrd" -}}
{{- range .spec.versions }}
{{- if .served }}
{{- $managedBy := dig "schema" "openAPIV3Schema" "properties" "spec" "properties" "runPolicy" "properties" "managedBy" "" . }}
{{- if not $managedBy }}
{{- fail (printf "besideKubeflow=true, but the TFJob CRD (tfjobs.kubeflow.org, version %s) of the other operator has no spec.runPolicy.managedBy: the API server would drop the field, so no TFJob could be given to this operator. Kubeflow's training-operator has it from v1.9 on: upgrade it first (see README.md, \"Running beside Kubeflow\")." .name) }}
{{- end }}
{{- if and (kindIs "map" $managedBy) (hasKey $managedBy "enum") (not (has "tfjob-rs.io/operator" $managedBy.enum)) }}
{{- fail (printf "besideKubeflow=true, but the TFJob CRD (tfjobs.kubeflow.org, version %s) allows spec.runPolicy.managedBy only in %s, not tfjob-rs.io/operator: no TFJob could be given to this operator." .name (toJson $managedBy.enum)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The operator's rules: exactly the API calls of operator/controller (both for the ClusterRole
and for the namespaced Role). Each verb is there for a call named in its comment.
*/}}
{{- define "tfjob-operator.rules" -}}
# TFJobs: the controller's watch (list, watch; also the startup check that the CRD is served),
# and deleting a job whose ttlSecondsAfterFinished expired (delete).
- apiGroups: ["kubeflow.org"]
  resources: ["tfjobs"]
  verbs: ["list", "watch", "delete"]
# Status: written with server-side apply on the status subresource (patch).
- apiGroups: ["kubeflow.org"]
  resources: ["tfjobs/status"]
  verbs: ["patch"]
# Children carry an owner reference with blockOwnerDeletion: true; clusters that enable the
# OwnerReferencesPermissionEnforcement admission plugin (OpenShift does) require update on the
# owner's finalizers subresource for that.
- apiGroups: ["kubeflow.org"]
  resources: ["tfjobs/finalizers"]
  verbs: ["update"]
# The throughput autoscaler (elasticPolicy.autoscale: Throughput) scales a job's workers as
# kubectl scale does: a merge patch of the scale subresource (patch).
- apiGroups: ["kubeflow.org"]
  resources: ["tfjobs/scale"]
  verbs: ["patch"]
# Pods: the watch that fills the operator's cache (list, watch), created (create) and deleted
# on restart, scale-down and cleanup (delete). Never changed in place, but with kueue.podGroups
# (patch): Kueue's finalizer taken off a pod that ended while being deleted, and the pods of a
# finished job marked so that Kueue ends their group.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "delete"{{ if .Values.kueue.podGroups }}, "patch"{{ end }}]
# The headless Service of each job: the watch that fills the cache (list, watch), server-side
# applied when missing or different (create, patch). It goes away with its job through the
# garbage collector.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "patch"]
# The Secret of each job (its token and its TLS CA): created once (create;
# AlreadyExists means it is there). The operator never reads, lists or watches these: a
# controller that may list Secrets can read every credential in reach.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# Events (events.k8s.io/v1, kube-rs Recorder): new events (create), repeats counted in a series
# (patch).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# The HorizontalPodAutoscaler of a job with elasticPolicy.metrics, server-side applied
# (create, patch); it targets the job's scale subresource and goes with its job through the
# garbage collector.
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["create", "patch"]
{{- if .Values.kueue.admission }}
# Kueue: the Workloads of a job labelled kueue.x-k8s.io/queue-name, listed by the job's uid
# before its pods are created (list): none beyond what the admitted Workload counts.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list"]
{{- end }}
{{- if .Values.networkPolicy.enabled }}
# The NetworkPolicy of each job, server-side applied with its Service (create, patch).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "patch"]
{{- end }}
{{- with include "tfjob-operator.podGroupApiGroup" . }}
# Gang scheduling: one PodGroup per job, server-side applied (create, patch), deleted when the job
# finishes (delete).
# With Volcano, the phase of a job's PodGroup is read before its pods are created (get): none is
# created before Volcano takes the gang in.
- apiGroups: [{{ . | quote }}]
  resources: ["podgroups"]
  verbs: [{{ if eq . "scheduling.volcano.sh" }}"get", {{ end }}"create", "patch", "delete"]
{{- end }}
{{- end }}
