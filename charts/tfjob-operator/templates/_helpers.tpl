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
scheduling.volcano.sh for `volcano`, scheduling.x-k8s.io (scheduler-plugins) otherwise.
*/}}
{{- define "tfjob-operator.podGroupApiGroup" -}}
{{- $g := include "tfjob-operator.gangScheduler" . }}
{{- if eq $g "volcano" }}scheduling.volcano.sh
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
The operator's rules: exactly the API calls of operator/src/kube.rs (both for the ClusterRole
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
# Pods: the watch that fills the operator's cache (list, watch), created (create) and deleted
# on restart, scale-down and cleanup (delete). Never changed in place.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "delete"]
# The headless Service of each job: the watch that fills the cache (list, watch), server-side
# applied when missing or different (create, patch). It goes away with its job through the
# garbage collector.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "patch"]
# The token Secret of each job: created once (create; AlreadyExists means it is there). The
# operator never reads, lists or watches Secrets: a controller that may list Secrets can read
# every credential in reach.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# Events (events.k8s.io/v1, kube-rs Recorder): new events (create), repeats counted in a series
# (patch).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.networkPolicy.enabled }}
# The NetworkPolicy of each job, server-side applied with its Service (create, patch).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "patch"]
{{- end }}
{{- with include "tfjob-operator.podGroupApiGroup" . }}
# Gang scheduling: one PodGroup per job, server-side applied (create, patch), deleted when the job
# finishes (delete).
- apiGroups: [{{ . | quote }}]
  resources: ["podgroups"]
  verbs: ["create", "patch", "delete"]
{{- end }}
{{- end }}
