#!/usr/bin/env bash
# End to end on a real Kubernetes cluster made with kind (see README.md next to this file):
#
#   1. build both images with operator/Dockerfile and runtime/Dockerfile
#   2. create a kind cluster (kind-config.yaml; deleted on exit unless KEEP_CLUSTER=1) and
#      `kind load` both images into it
#   3. `helm install` charts/tfjob-operator, wait for the CRD (Established) and the Deployment
#   4. `kubectl apply` every example, wait for Succeeded; the linear ones must end with
#      W within 0.1 of 2 and b within 0.1 of 10 (the chief's final JSON line)
#   5. delete a worker pod while the job trains (worker-restart.yaml): the operator recreates
#      it and the job still succeeds; a worker exiting 1 under restartPolicy ExitCode
#      (exitcode-failure.yaml) fails the job with the operator's message
#   6. `kubectl scale` a job while it trains (elastic-scale.yaml): 2 → 4 workers (only the
#      difference is created; the new worker trains at once), then 4 → 1 (workers 1-3 deleted,
#      the chief stays); Scaled events; every example of every epoch trained once. And the ps
#      set of a training job (examples/elastic-ps.yaml) patched 1 → 2 → 1: only ps-1 is created
#      and deleted, the state moves each time, ps-1 hands its part over before it exits
#   7. `kubectl delete tfjob` after each job: no pod, Service or Secret of the job is left
#   8. `helm uninstall`: no object of the release is left (the CRD stays: the chart marks it
#      helm.sh/resource-policy: keep)
#   9. print a timeline of every job (applied, pods created, all running, first step,
#      scaled, first gradient of a new worker, pods deleted, succeeded or failed, cleaned)
#
# On failure, the state of the cluster (kubectl get/describe, every pod's logs, events,
# `kind export logs`) is written to $ARTIFACTS_DIR.
#
# Settings (environment):
#   CLUSTER_NAME     kind cluster name (default tfjob-e2e); it must not exist yet
#   KEEP_CLUSTER=1   keep the cluster at exit (then: kind export kubeconfig --name NAME)
#   KIND_NODE_IMAGE  node image (default: the kind release's own)
#   SKIP_BUILD=1     do not build the images, use the local ones with the same tags
#   JOB_NAMESPACE    namespace of the TFJobs (default default)
#   JOB_TIMEOUT      seconds a job may take to finish (default 600)
#   ARTIFACTS_DIR    where the failure dump goes (default: a new directory under $TMPDIR)
#
# Requires docker (with BuildKit, the default since Docker 23), kind, kubectl, helm (v3.8+ or
# v4) and jq.
set -Eeuo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)

CLUSTER_NAME=${CLUSTER_NAME:-tfjob-e2e}
KEEP_CLUSTER=${KEEP_CLUSTER:-0}
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-}
SKIP_BUILD=${SKIP_BUILD:-0}
JOB_NAMESPACE=${JOB_NAMESPACE:-default}
JOB_TIMEOUT=${JOB_TIMEOUT:-600}

# Fixed by the repository; tests/tests/kind_script.rs keeps them in step with the chart, the
# examples and the operator.
RELEASE=tfjob-operator
RELEASE_NAMESPACE=tfjob-system
CHART=$repo/charts/tfjob-operator
CRD=tfjobs.kubeflow.org
# The image every TFJob manifest of examples/ and of this directory runs (the published name,
# .github/workflows/release.yml; built here and loaded into the nodes).
RUNTIME_IMAGE=ghcr.io/tfjob-rs/tfjob-runtime:0.1.0
# The chart's image.repository; the tag is whatever the chart renders by default (appVersion).
OPERATOR_REPOSITORY=ghcr.io/tfjob-rs/tfjob-operator
# Every manifest of examples/, in the order they run, but those below.
EXAMPLES=(linreg-sync linreg-async backup-workers elastic-workers chief-evaluator mnist-mlp ctr-wide-deep elastic-ps classic-flags autoscale-throughput)
# Examples this script does not run, deliberately: shared-volume needs a ReadWriteMany storage
# class (kind's local-path provisioner offers ReadWriteOnce only); s3-checkpoints needs an S3
# endpoint and its Secret. `tfjob run` runs both (tests/tests/local_run.rs, object_storage.rs).
SKIPPED_EXAMPLES=(shared-volume s3-checkpoints)
RESTART_MANIFEST=$here/worker-restart.yaml
FAILURE_MANIFEST=$here/exitcode-failure.yaml
SCALE_MANIFEST=$here/elastic-scale.yaml
# What the chief of elastic-scale.yaml reports: every example of every epoch, once.
SCALE_EPOCHS=600
SCALE_EXAMPLES=$((SCALE_EPOCHS * 101))
# The example whose ps set is patched 1 → 2 → 1 while it trains (run instead of its plain run),
# and what its chief reports (10 epochs of 250,000 generated examples).
PS_SCALE_EXAMPLE=elastic-ps
PS_SCALE_EPOCHS=10
PS_SCALE_EXAMPLES=2500000
# The Failed condition's message (operator/api/src/status.rs) for one permanent Worker failure: it names
# the pod and its exit code (then the kubelet's reason, e.g. "(Error)").
FAILURE_MESSAGE='has failed because 1 Worker replica(s) failed: pod exitcode-failure-worker-0 exited with code 1'
# Labels the operator puts on every object of a job (operator/api/src/plan.rs).
LABEL_JOB_NAME=training.kubeflow.org/job-name
LABEL_OPERATOR_NAME=training.kubeflow.org/operator-name
OPERATOR_NAME=tfjob-controller
LABEL_JOB_ROLE=training.kubeflow.org/job-role

work=$(mktemp -d "${TMPDIR:-/tmp}/tfjob-kind.XXXXXX")
ARTIFACTS_DIR=${ARTIFACTS_DIR:-$work/artifacts}
# Our own kubeconfig: the user's ~/.kube/config and current context are left alone.
export KUBECONFIG=$work/kubeconfig
timeline=$work/timeline.tsv
: >"$timeline"
cluster_created=0
finished=0

log() { printf '%s [kind-e2e] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() {
    log "FAIL: $*"
    exit 1
}
need() { command -v "$1" >/dev/null 2>&1 || die "$1 is required (see tests/e2e/kind/README.md)"; }
k() { kubectl "$@"; }
now() { date -u +%s; }

# RFC 3339 time (fractional seconds allowed) -> seconds since the epoch.
epoch_of() { jq -rn --arg t "$1" '$t | sub("\\.[0-9]+"; "") | fromdateiso8601'; }

# ---------------------------------------------------------------------------------------------
# Timeline: one line per event: sequence number of the job, job, event, epoch seconds.

seq_no=0
subject=""
mark() { printf '%s\t%s\t%s\t%s\n' "$seq_no" "$subject" "$1" "$2" >>"$timeline"; }
begin_subject() {
    seq_no=$((seq_no + 1))
    subject=$1
}

print_timeline() {
    [[ -s $timeline ]] || return 0
    echo
    echo "== timeline (UTC; +seconds since the first event of each line group)"
    sort -s -t $'\t' -k1,1n -k4,4n "$timeline" | while IFS=$'\t' read -r n name event t; do
        if [[ $n != "${last_n:-}" ]]; then
            printf '%s\n' "$name"
            base=$t
            last_n=$n
        fi
        printf '  %s  %+5ds  %s\n' "$(jq -rn --argjson t "$t" '$t | todate')" "$((t - base))" "$event"
    done
}

# ---------------------------------------------------------------------------------------------
# On exit: dump the cluster on failure, print the timeline, delete the cluster.

dump_cluster() {
    mkdir -p "$ARTIFACTS_DIR/logs"
    log "writing the state of the cluster to $ARTIFACTS_DIR"
    {
        k get nodes -o wide
        k get all,tfjobs,secrets,leases,serviceaccounts,roles,rolebindings -A -o wide
        k get clusterroles,clusterrolebindings -l app.kubernetes.io/instance=$RELEASE
        k get crd $CRD
        helm list -A
    } >"$ARTIFACTS_DIR/get.txt" 2>&1 || true
    k get tfjobs -A -o yaml >"$ARTIFACTS_DIR/tfjobs.yaml" 2>&1 || true
    k get pods -A -o yaml >"$ARTIFACTS_DIR/pods.yaml" 2>&1 || true
    {
        k describe tfjobs -A
        k describe pods -n "$JOB_NAMESPACE"
        k describe pods,deployments -n "$RELEASE_NAMESPACE"
    } >"$ARTIFACTS_DIR/describe.txt" 2>&1 || true
    k get events -A --sort-by=.lastTimestamp -o wide >"$ARTIFACTS_DIR/events.txt" 2>&1 || true
    local ns pod
    for ns in "$JOB_NAMESPACE" "$RELEASE_NAMESPACE"; do
        for pod in $(k get pods -n "$ns" -o name 2>/dev/null); do
            k logs -n "$ns" "$pod" --all-containers --timestamps \
                >"$ARTIFACTS_DIR/logs/$ns.${pod#pod/}.log" 2>&1 || true
            k logs -n "$ns" "$pod" --all-containers --timestamps --previous \
                >"$ARTIFACTS_DIR/logs/$ns.${pod#pod/}.previous.log" 2>/dev/null || true
        done
    done
    kind export logs "$ARTIFACTS_DIR/kind" --name "$CLUSTER_NAME" >/dev/null 2>&1 || true
    cp "$timeline" "$ARTIFACTS_DIR/timeline.tsv" 2>/dev/null || true
}

on_exit() {
    local rc=$? dumped=0
    trap - ERR
    set +e
    if [[ $finished != 1 && $cluster_created == 1 ]]; then
        dump_cluster
        dumped=1
    fi
    print_timeline
    if [[ $cluster_created == 1 ]]; then
        if [[ $KEEP_CLUSTER == 1 ]]; then
            log "keeping cluster $CLUSTER_NAME (KEEP_CLUSTER=1): kind export kubeconfig --name $CLUSTER_NAME"
        else
            log "deleting cluster $CLUSTER_NAME"
            kind delete cluster --name "$CLUSTER_NAME" >/dev/null 2>&1
        fi
    fi
    # The work directory goes, unless the failure dump is in it.
    if [[ $dumped == 0 || $ARTIFACTS_DIR != "$work"/* ]]; then
        rm -rf "$work"
    fi
    if [[ $finished == 1 ]]; then
        log "PASS"
    elif [[ $dumped == 1 ]]; then
        log "FAILED (exit $rc); the state of the cluster is in $ARTIFACTS_DIR"
    else
        log "FAILED (exit $rc)"
    fi
}
trap on_exit EXIT
# Names the failed command and where it ran: function:line, innermost first.
on_error() {
    local where="" i
    for ((i = 1; i < ${#FUNCNAME[@]}; i++)); do
        where+=" ${FUNCNAME[i]}:${BASH_LINENO[i - 1]}"
    done
    log "error: $1 (at${where})"
}
trap 'on_error "$BASH_COMMAND"' ERR

# ---------------------------------------------------------------------------------------------
# Before anything: the tools, no cluster of that name, the operator image's name.

for tool in docker kind kubectl helm jq; do need "$tool"; done

# (No `kind get clusters | grep -q`: with pipefail, grep -q stopping early can fail the pipe.)
clusters=$(kind get clusters 2>/dev/null) || clusters=""
if grep -qx "$CLUSTER_NAME" <<<"$clusters"; then
    die "a kind cluster named $CLUSTER_NAME exists; delete it (kind delete cluster --name $CLUSTER_NAME) or set CLUSTER_NAME"
fi

# The operator image is what the chart runs with its default values.
operator_image=$(helm template "$RELEASE" "$CHART" -n "$RELEASE_NAMESPACE" --show-only templates/deployment.yaml |
    awk '!found && $1 == "image:" { gsub(/"/, "", $2); print $2; found = 1 }')
[[ $operator_image == "$OPERATOR_REPOSITORY:"* ]] ||
    die "the chart renders the operator image '$operator_image', expected $OPERATOR_REPOSITORY:<tag>"

# ---------------------------------------------------------------------------------------------
# 1. Images (before the cluster: a build that fails leaves nothing to clean up).

if [[ $SKIP_BUILD != 1 ]]; then
    log "building $operator_image (operator/Dockerfile)"
    DOCKER_BUILDKIT=1 docker build -f "$repo/operator/Dockerfile" -t "$operator_image" "$repo"
    log "building $RUNTIME_IMAGE (runtime/Dockerfile)"
    DOCKER_BUILDKIT=1 docker build -f "$repo/runtime/Dockerfile" -t "$RUNTIME_IMAGE" "$repo"
fi

# ---------------------------------------------------------------------------------------------
# 2. Cluster, with both images on every node.

log "creating kind cluster $CLUSTER_NAME ($(kind version))"
cluster_created=1
kind create cluster --name "$CLUSTER_NAME" --config "$here/kind-config.yaml" \
    ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 180s
k wait --for=condition=Ready nodes --all --timeout=180s
# Replicas find each other by DNS names: the cluster DNS must serve before the first job.
k rollout status -n kube-system deployment/coredns --timeout=180s
k get nodes -o wide
for image in "$operator_image" "$RUNTIME_IMAGE"; do
    log "loading $image into the nodes"
    kind load docker-image "$image" --name "$CLUSTER_NAME"
done

# ---------------------------------------------------------------------------------------------
# 3. The operator, as README.md installs it. Its namespace enforces the "restricted" Pod
#    Security Standard: the chart's pod must comply.

begin_subject "helm release $RELEASE_NAMESPACE/$RELEASE"
k create namespace "$RELEASE_NAMESPACE"
k label namespace "$RELEASE_NAMESPACE" pod-security.kubernetes.io/enforce=restricted
mark "helm install" "$(now)"
helm install "$RELEASE" "$CHART" --namespace "$RELEASE_NAMESPACE"
k wait --for=condition=Established "crd/$CRD" --timeout=60s
deployment=$(k get deployments -n "$RELEASE_NAMESPACE" -l "app.kubernetes.io/instance=$RELEASE" -o name)
[[ -n $deployment ]] || die "helm install created no Deployment"
k rollout status -n "$RELEASE_NAMESPACE" "$deployment" --timeout=300s
mark "operator ready ($deployment)" "$(now)"
log "operator running: $deployment"

# ---------------------------------------------------------------------------------------------
# Jobs.

JOB=""
JOB_SELECTOR=""
JOB_REPLICAS=0
JOB_STATE=""
JOB_MESSAGE=""
JOB_DONE_AT=""
seen_created=0
seen_running=0

# Applies a manifest and starts the timeline of its TFJob.
apply_job() {
    local file=$1 out other
    [[ $(grep -c '^kind: TFJob' "$file") == 1 ]] || die "$file: expected exactly one TFJob"
    other=$(grep -E '^[[:space:]]+image:' "$file" | grep -v "image: $RUNTIME_IMAGE\$") || other=""
    [[ -z $other ]] || die "$file: every container must run $RUNTIME_IMAGE (loaded into the nodes): $other"
    out=$(k apply -n "$JOB_NAMESPACE" -f "$file" -o json)
    JOB=$(jq -r .metadata.name <<<"$out")
    JOB_REPLICAS=$(jq '[.spec.tfReplicaSpecs[] | .replicas // 1] | add' <<<"$out")
    JOB_SELECTOR="$LABEL_JOB_NAME=$JOB,$LABEL_OPERATOR_NAME=$OPERATOR_NAME"
    JOB_STATE=""
    JOB_MESSAGE=""
    seen_created=0
    seen_running=0
    begin_subject "TFJob $JOB_NAMESPACE/$JOB (${file#"$repo"/}, replicas: $JOB_REPLICAS)"
    mark applied "$(epoch_of "$(jq -r .metadata.creationTimestamp <<<"$out")")"
    log "applied ${file#"$repo"/}: TFJob $JOB, replicas: $JOB_REPLICAS"
}

# One look at the job and its pods: marks "pods created" and "all running" the first time every
# replica has a pod / a started container (from the objects' own times), and sets JOB_STATE to
# Succeeded or Failed (or empty), with JOB_MESSAGE and JOB_DONE_AT.
observe() {
    local job pods t
    job=$(k get tfjob -n "$JOB_NAMESPACE" "$JOB" -o json)
    pods=$(k get pods -n "$JOB_NAMESPACE" -l "$JOB_SELECTOR" -o json)
    if [[ $seen_created == 0 ]]; then
        t=$(jq -r --argjson n "$JOB_REPLICAS" \
            '[.items[].metadata.creationTimestamp] | if length >= $n then max else empty end' <<<"$pods")
        if [[ -n $t ]]; then
            mark "pods created" "$(epoch_of "$t")"
            seen_created=1
        fi
    fi
    if [[ $seen_running == 0 ]]; then
        t=$(jq -r --argjson n "$JOB_REPLICAS" '
            [.items[] | [.status.containerStatuses[]?
                         | .state.running.startedAt // .state.terminated.startedAt // empty]
                      | max // empty]
            | if length >= $n then max else empty end' <<<"$pods")
        if [[ -n $t ]]; then
            mark "all running" "$(epoch_of "$t")"
            seen_running=1
        fi
    fi
    local terminal
    terminal=$(jq -c '[.status.conditions[]?
                   | select(.status == "True" and (.type == "Succeeded" or .type == "Failed"))][0]
                  // empty' <<<"$job")
    if [[ -n $terminal ]]; then
        JOB_STATE=$(jq -r .type <<<"$terminal")
        JOB_MESSAGE=$(jq -r '.message // ""' <<<"$terminal")
        JOB_DONE_AT=$(jq -r .lastTransitionTime <<<"$terminal")
    fi
}

# Waits until the job is Succeeded or Failed (kubectl wait cannot stop at the other one) and
# requires $1.
wait_job() {
    local want=$1 deadline=$(($(now) + JOB_TIMEOUT))
    log "waiting for TFJob $JOB to be $want (up to ${JOB_TIMEOUT}s)"
    while :; do
        observe
        [[ -z $JOB_STATE ]] || break
        (($(now) < deadline)) || die "TFJob $JOB is neither Succeeded nor Failed after ${JOB_TIMEOUT}s"
        sleep 1
    done
    mark "$(tr '[:upper:]' '[:lower:]' <<<"$JOB_STATE")" "$(epoch_of "$JOB_DONE_AT")"
    [[ $JOB_STATE == "$want" ]] || die "TFJob $JOB is $JOB_STATE, expected $want: $JOB_MESSAGE"
    log "TFJob $JOB: $JOB_STATE: $JOB_MESSAGE"
}

# The chief's pod (the Chief, else worker 0: the operator labels it job-role=master).
chief_pod() {
    k get pods -n "$JOB_NAMESPACE" -l "$JOB_SELECTOR,$LABEL_JOB_ROLE=master" \
        -o jsonpath='{.items[0].metadata.name}'
}

# Marks the first training step the chief logged (the container runtime's time of the line).
mark_first_step() {
    local pod=$1 logs line
    logs=$(k logs -n "$JOB_NAMESPACE" "$pod" --timestamps 2>/dev/null) || return 0
    line=$(grep -m1 'local_step=' <<<"$logs") || return 0
    mark "first step logged ($pod)" "$(epoch_of "${line%% *}")"
}

# The last JSON line with W and b that a pod printed (each task prints its final figures).
final_report() {
    k logs -n "$JOB_NAMESPACE" "$1" | jq -R -c 'fromjson? | objects | select(has("W") and has("b"))' | tail -n 1
}

# The linear model must have learnt y = 2x + 10.
check_linear() {
    local pod=$1 report
    report=$(final_report "$pod")
    [[ -n $report ]] || die "$pod printed no final JSON line with W and b"
    jq -e '(.W - 2) * (.W - 2) < 0.01 and (.b - 10) * (.b - 10) < 0.01' <<<"$report" >/dev/null ||
        die "$pod: W and b are not within 0.1 of 2 and 10: $report"
    log "$pod: $(jq -r '"W=\(.W) b=\(.b) global_step=\(.global_step) loss=\(.loss)"' <<<"$report")"
}

# kubectl delete tfjob, then wait until no pod, Service or Secret of the job is left.
delete_job() {
    local left deadline=$(($(now) + 120))
    k delete tfjob -n "$JOB_NAMESPACE" "$JOB" --wait=true --timeout=120s
    while :; do
        left=$(
            k get pods,services,secrets -n "$JOB_NAMESPACE" -l "$LABEL_JOB_NAME=$JOB" -o name
            k get "service/$JOB" "secret/$JOB-token" -n "$JOB_NAMESPACE" -o name --ignore-not-found
        )
        [[ -n $left ]] || break
        (($(now) < deadline)) || die "deleting TFJob $JOB left: $(tr '\n' ' ' <<<"$left")"
        sleep 1
    done
    mark cleaned "$(now)"
    log "TFJob $JOB deleted; no pod, Service or Secret of it is left"
}

# 4. Every example succeeds; the linear ones learn W = 2, b = 10.
run_example() {
    local file=$repo/examples/$1.yaml pod
    [[ -f $file ]] || die "no $file"
    if [[ $1 == "$PS_SCALE_EXAMPLE" ]]; then
        run_ps_scale "$file"
        return
    fi
    apply_job "$file"
    wait_job Succeeded
    pod=$(chief_pod)
    [[ -n $pod ]] || die "TFJob $JOB: no pod labelled $LABEL_JOB_ROLE=master"
    mark_first_step "$pod"
    if grep -q -- '--model=linear' "$file"; then
        check_linear "$pod"
    fi
    delete_job
}

# 5a. A worker pod deleted while training: the operator recreates it, it rejoins, the job
#     succeeds. Training is synchronous over both workers, so no step is taken without it.
run_worker_restart() {
    local victim uid new_uid logs step deadline report
    apply_job "$RESTART_MANIFEST"
    victim=$JOB-worker-1
    deadline=$(($(now) + JOB_TIMEOUT))
    log "waiting for $victim to train"
    while :; do
        observe
        [[ -z $JOB_STATE ]] ||
            die "TFJob $JOB ended ($JOB_STATE) before $victim could be deleted; raise --train_steps in ${RESTART_MANIFEST#"$repo"/}"
        logs=$(k logs -n "$JOB_NAMESPACE" "$victim" 2>/dev/null) || logs=""
        [[ $logs != *local_step=* ]] || break
        (($(now) < deadline)) || die "$victim logged no training step in ${JOB_TIMEOUT}s"
        sleep 1
    done
    uid=$(k get pod -n "$JOB_NAMESPACE" "$victim" -o jsonpath='{.metadata.uid}')
    step=$(k logs -n "$JOB_NAMESPACE" "$(chief_pod)" | grep -o 'global_step=[0-9]*' | tail -n 1) || step=""
    k delete pod -n "$JOB_NAMESPACE" "$victim" --wait=false
    mark "$victim deleted (chief at ${step:-global_step=?})" "$(now)"
    log "deleted pod $victim while training (chief at ${step:-global_step=?})"
    while :; do
        observe
        [[ -z $JOB_STATE ]] || die "TFJob $JOB ended ($JOB_STATE: $JOB_MESSAGE) before $victim was recreated"
        new_uid=$(k get pod -n "$JOB_NAMESPACE" "$victim" -o jsonpath='{.metadata.uid}' 2>/dev/null) || new_uid=""
        [[ -z $new_uid || $new_uid == "$uid" ]] || break
        (($(now) < deadline)) || die "the operator did not recreate $victim"
        sleep 1
    done
    mark "$victim recreated" "$(epoch_of "$(k get pod -n "$JOB_NAMESPACE" "$victim" -o jsonpath='{.metadata.creationTimestamp}')")"
    log "the operator recreated $victim"
    wait_job Succeeded
    check_linear "$(chief_pod)"
    # The recreated worker's own report, when its pod is still there (best effort: a pod still
    # running when the job succeeds is deleted by cleanPodPolicy Running).
    report=$(final_report "$victim" 2>/dev/null) || report=""
    if [[ -n $report ]]; then
        log "recreated $victim: $(jq -r '"local_steps=\(.local_steps) of global_step=\(.global_step)"' <<<"$report")"
    fi
    mark_first_step "$(chief_pod)"
    delete_job
}

# 5b. Exit code 1 under restartPolicy ExitCode is permanent: the job fails with the message and
#     the pod is not recreated.
run_exit_code_failure() {
    local pod code recreated
    apply_job "$FAILURE_MANIFEST"
    wait_job Failed
    [[ $JOB_MESSAGE == *"$FAILURE_MESSAGE"* ]] ||
        die "TFJob $JOB failed with '$JOB_MESSAGE', expected a message with '$FAILURE_MESSAGE'"
    pod=$JOB-worker-0
    code=$(k get pod -n "$JOB_NAMESPACE" "$pod" \
        -o jsonpath='{.status.containerStatuses[?(@.name=="tensorflow")].state.terminated.exitCode}')
    [[ $code == 1 ]] || die "$pod: exit code '$code', expected 1"
    recreated=$(k get tfjob -n "$JOB_NAMESPACE" "$JOB" -o json | jq '.status.replicaStatuses.Worker.recreated // 0')
    [[ $recreated == 0 ]] || die "TFJob $JOB: the failed worker was recreated $recreated time(s)"
    log "$pod exited 1; TFJob $JOB Failed: $JOB_MESSAGE"
    delete_job
}

# 5c. `kubectl scale` of a job while it trains: 2 → 4 workers (only worker-2 and worker-3 are
#     created; the pods there before are the same pods), worker-3 pushes its first gradient,
#     then 4 → 1 (workers 1-3 deleted; the chief and the ps stay). Each scale is a Scaled event;
#     the job still trains every example once per epoch and learns W = 2, b = 10.
pods_with_uids() {
    k get pods -n "$JOB_NAMESPACE" -l "$JOB_SELECTOR" -o json |
        jq -r '.items[] | "\(.metadata.name) \(.metadata.uid)"' | sort
}

# The container runtime's time of the first line of pod $1 that contains $2 (fails if none).
first_logged() {
    local logs line
    logs=$(k logs -n "$JOB_NAMESPACE" "$1" --timestamps 2>/dev/null) || return 1
    line=$(grep -m1 -F -- "$2" <<<"$logs") || return 1
    echo "${line%% *}"
}

# Waits (observing the job) until `$@` succeeds; dies if the job ends first or after JOB_TIMEOUT.
wait_until() {
    local what=$1 deadline=$(($(now) + JOB_TIMEOUT))
    shift
    while ! "$@"; do
        observe
        [[ -z $JOB_STATE ]] || die "TFJob $JOB ended ($JOB_STATE: $JOB_MESSAGE) before $what; raise --num_epochs in ${SCALE_MANIFEST#"$repo"/}"
        (($(now) < deadline)) || die "TFJob $JOB: no $what in ${JOB_TIMEOUT}s"
        sleep 1
    done
}

workers_1_to_3_gone() {
    local names
    names=$(k get pods -n "$JOB_NAMESPACE" -l "$JOB_SELECTOR" -o name)
    ! grep -qE "/$JOB-worker-[123]\$" <<<"$names"
}

run_elastic_scale() {
    local before after missing t created events report chief
    apply_job "$SCALE_MANIFEST"
    wait_until "first gradient of $JOB-worker-0" first_logged "$JOB-worker-0" 'first gradient accepted'
    before=$(pods_with_uids)
    k scale -n "$JOB_NAMESPACE" "tfjob/$JOB" --replicas=4
    mark "scaled Worker 2 → 4" "$(now)"
    log "kubectl scale tfjob/$JOB --replicas=4"
    wait_until "first gradient of $JOB-worker-3" first_logged "$JOB-worker-3" 'first gradient accepted'
    created=$(k get pods -n "$JOB_NAMESPACE" "$JOB-worker-2" "$JOB-worker-3" -o json |
        jq -r '[.items[].metadata.creationTimestamp] | max')
    mark "pods created ($JOB-worker-2, $JOB-worker-3)" "$(epoch_of "$created")"
    t=$(first_logged "$JOB-worker-3" 'first gradient accepted')
    mark "first gradient ($JOB-worker-3)" "$(epoch_of "$t")"
    after=$(pods_with_uids)
    missing=$(comm -23 <(echo "$before") <(echo "$after"))
    [[ -z $missing ]] || die "the scale-up replaced pods that were there before: $missing"
    k scale -n "$JOB_NAMESPACE" "tfjob/$JOB" --replicas=1
    mark "scaled Worker 4 → 1" "$(now)"
    log "kubectl scale tfjob/$JOB --replicas=1"
    wait_until "deletion of $JOB-worker-1..3" workers_1_to_3_gone
    mark "pods deleted ($JOB-worker-1..3)" "$(now)"
    after=$(pods_with_uids)
    grep -q "^$JOB-worker-0 " <<<"$after" && grep -q "^$JOB-ps-0 " <<<"$after" ||
        die "the scale-down took more than workers 1-3: $after"
    wait_job Succeeded
    events=$(k get events -n "$JOB_NAMESPACE" --field-selector "involvedObject.name=$JOB,reason=Scaled" \
        -o jsonpath='{.items[*].message}')
    [[ $events == *"Worker 2 → 4"* && $events == *"Worker 4 → 1"* ]] ||
        die "TFJob $JOB: expected Scaled events 'Worker 2 → 4' and 'Worker 4 → 1', got: $events"
    chief=$(chief_pod)
    report=$(final_report "$chief")
    jq -e --argjson e "$SCALE_EPOCHS" --argjson n "$SCALE_EXAMPLES" \
        '.epochs_completed == $e and .examples_trained == $n' <<<"$report" >/dev/null ||
        die "$chief: expected epochs_completed=$SCALE_EPOCHS and examples_trained=$SCALE_EXAMPLES: $report"
    log "$chief: $(jq -r '"epochs_completed=\(.epochs_completed) examples_trained=\(.examples_trained) shards_redone=\(.shards_redone)"' <<<"$report")"
    check_linear "$chief"
    delete_job
}

# 5d. The ps set of a training job patched 1 → 2 → 1 (spec.tfReplicaSpecs.PS.replicas; the
#     scale subresource stays on Worker): only ps-1 is created, the chief moves the state to
#     2 ps tasks at a step boundary; then ps-1's pod is deleted, it asks ps-0 to leave, hands
#     its part over and exits; every other pod keeps its UID; Scaled events `PS 1 → 2` and
#     `PS 2 → 1`; every example of every epoch trained once.
patch_ps() {
    k patch tfjob -n "$JOB_NAMESPACE" "$JOB" --type=merge -p "{\"spec\":{\"tfReplicaSpecs\":{\"PS\":{\"replicas\":$1}}}}"
}

ps_1_gone() {
    local names
    names=$(k get pods -n "$JOB_NAMESPACE" -l "$JOB_SELECTOR" -o name)
    ! grep -qE "/$JOB-ps-1\$" <<<"$names"
}

run_ps_scale() {
    local file=$1 before after missing t chief events report ps0_log
    apply_job "$file"
    wait_until "first gradient of $JOB-worker-0" first_logged "$JOB-worker-0" 'first gradient accepted'
    before=$(pods_with_uids)
    chief=$(chief_pod)
    patch_ps 2
    mark "patched PS 1 → 2" "$(now)"
    log "kubectl patch tfjob/$JOB: PS replicas 1 → 2"
    wait_until "the move to 2 ps tasks" first_logged "$chief" "moved the job's state from 1 to 2 ps task(s)"
    t=$(first_logged "$chief" "moved the job's state from 1 to 2 ps task(s)")
    mark "moved to 2 ps ($chief)" "$(epoch_of "$t")"
    after=$(pods_with_uids)
    missing=$(comm -23 <(echo "$before") <(echo "$after"))
    [[ -z $missing ]] || die "the PS patch replaced pods that were there before: $missing"
    grep -q "^$JOB-ps-1 " <<<"$after" || die "PS 1 → 2 created no $JOB-ps-1: $after"
    patch_ps 1
    mark "patched PS 2 → 1" "$(now)"
    log "kubectl patch tfjob/$JOB: PS replicas 2 → 1"
    wait_until "the move back to 1 ps task" first_logged "$chief" "moved the job's state from 2 to 1 ps task(s)"
    t=$(first_logged "$chief" "moved the job's state from 2 to 1 ps task(s)")
    mark "moved to 1 ps ($chief)" "$(epoch_of "$t")"
    wait_until "deletion of $JOB-ps-1" ps_1_gone
    mark "pod deleted ($JOB-ps-1)" "$(now)"
    after=$(pods_with_uids)
    missing=$(comm -23 <(echo "$before") <(echo "$after"))
    [[ -z $missing ]] || die "the PS patches replaced pods that were there before: $missing"
    # The log captured first: `grep -q` closing the pipe early would fail it under pipefail.
    ps0_log=$(k logs -n "$JOB_NAMESPACE" "$JOB-ps-0")
    grep -q "ps:1 leaves" <<<"$ps0_log" || die "$JOB-ps-1 did not ask ps-0 to leave when its pod was deleted"
    wait_job Succeeded
    events=$(k get events -n "$JOB_NAMESPACE" --field-selector "involvedObject.name=$JOB,reason=Scaled" \
        -o jsonpath='{.items[*].message}')
    [[ $events == *"PS 1 → 2"* && $events == *"PS 2 → 1"* ]] ||
        die "TFJob $JOB: expected Scaled events 'PS 1 → 2' and 'PS 2 → 1', got: $events"
    report=$(k logs -n "$JOB_NAMESPACE" "$chief" | jq -R -c 'fromjson? | objects | select(has("epochs_completed"))' | tail -n 1)
    jq -e --argjson e "$PS_SCALE_EPOCHS" --argjson n "$PS_SCALE_EXAMPLES" \
        '.epochs_completed == $e and .examples_trained == $n and .auc > 0.85' <<<"$report" >/dev/null ||
        die "$chief: expected epochs_completed=$PS_SCALE_EPOCHS, examples_trained=$PS_SCALE_EXAMPLES, auc > 0.85: $report"
    log "$chief: $(jq -r '"epochs_completed=\(.epochs_completed) examples_trained=\(.examples_trained) auc=\(.auc)"' <<<"$report")"
    delete_job
}

for example in "${EXAMPLES[@]}"; do
    run_example "$example"
done
run_worker_restart
run_elastic_scale
run_exit_code_failure

# ---------------------------------------------------------------------------------------------
# 8. helm uninstall: nothing of the release is left, the leader-election Lease included (the
#    chart renders it; the operator only takes it). The CRD stays (helm.sh/resource-policy: keep:
#    deleting it would delete every TFJob).

begin_subject "helm release $RELEASE_NAMESPACE/$RELEASE"
helm get manifest "$RELEASE" -n "$RELEASE_NAMESPACE" >"$work/release.yaml"
mark "helm uninstall" "$(now)"
helm uninstall "$RELEASE" -n "$RELEASE_NAMESPACE" --wait --timeout 120s
deadline=$(($(now) + 120))
while :; do
    left=$(
        k get -f "$work/release.yaml" -n "$RELEASE_NAMESPACE" -o name --ignore-not-found |
            { grep -v "^customresourcedefinition" || true; }
        k get deployments,replicasets,pods,serviceaccounts,services,roles,rolebindings \
            -n "$RELEASE_NAMESPACE" -l "app.kubernetes.io/instance=$RELEASE" -o name
        k get clusterroles,clusterrolebindings -l "app.kubernetes.io/instance=$RELEASE" -o name
    )
    [[ -n $left ]] || break
    (($(now) < deadline)) || die "helm uninstall left: $(tr '\n' ' ' <<<"$left")"
    sleep 1
done
mark "release gone" "$(now)"
log "helm uninstall: no Deployment, pod, ServiceAccount, Service, (Cluster)Role or binding of the release is left"
k get "crd/$CRD" -o name >/dev/null || die "helm uninstall deleted the CRD $CRD (the chart marks it helm.sh/resource-policy: keep)"
log "CRD $CRD kept (helm.sh/resource-policy: keep; delete it by hand: kubectl delete crd $CRD)"
if lease=$(k get lease -n "$RELEASE_NAMESPACE" "$RELEASE" -o name 2>/dev/null); then
    log "note: $lease in $RELEASE_NAMESPACE remains: the operator's leader-election Lease, created at run time, not by Helm"
fi

finished=1
