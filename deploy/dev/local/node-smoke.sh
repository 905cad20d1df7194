#!/usr/bin/env bash
# shellcheck disable=SC2016 # wait conditions and in-Pod commands are expanded later, on purpose
# Smoke check of the local cluster's node (deploy/dev/local/README.md, "The node"):
#
#   node-smoke.sh [RUNS]      (make node-smoke; RUNS defaults to 1)
#
# Each run: `cluster.sh up --node` in a fresh temporary state directory; a busybox Pod that
# echoes "Hello, Your Name!" runs to Succeeded and `kubectl logs` prints it; a 2-replica
# busybox Deployment gets both Pods Running, `kubectl exec` works in one and reaches the API
# server through the kubernetes Service (https://10.0.0.1), a deleted Pod is
# replaced by a Running one; `cluster.sh down`; then nothing of the node is left: no kubelet,
# containerd, shim or registry process, no mount, no kubepods cgroup, no bridge, the same
# iptables rules and sysctls as before. Prints timings. Needs root and kubectl.
# KUBEWASM_SMOKE_NAME replaces "Your Name".
set -euo pipefail

HERE=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
CLUSTER=$HERE/cluster.sh
RUNS=${1:-1}
WHO=${KUBEWASM_SMOKE_NAME:-Your Name}
TIMEOUT=${KUBEWASM_SMOKE_TIMEOUT:-90}

log() { printf 'node-smoke: %s\n' "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (the node runs containerd, runc, the kubelet)"
command -v kubectl >/dev/null || die "kubectl is not on PATH"
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "usage: node-smoke.sh [RUNS]"

# Time in milliseconds, and a duration as seconds with one decimal.
now_ms() { date +%s%3N; }
secs() { awk -v ms="$1" 'BEGIN { printf "%.1f s", ms / 1000 }'; }

# Wait (up to TIMEOUT s) for a shell condition; on timeout, say what and fail.
wait_for() {
    local what=$1 cond=$2 deadline=$((SECONDS + TIMEOUT))
    until eval "$cond" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || die "timed out after ${TIMEOUT}s waiting for $what"
        sleep 0.2
    done
}

# What the machine looks like, for comparing before and after.
snapshot() {
    local out=$1
    {
        echo "## sysctl"
        for k in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops \
            kernel/keys/root_maxkeys kernel/keys/root_maxbytes net/ipv4/ip_forward \
            net/ipv6/conf/all/forwarding; do
            echo "$k=$(cat "/proc/sys/$k" 2>/dev/null)"
        done
        echo "## iptables"
        for f in iptables-save ip6tables-save; do
            if command -v "$f" >/dev/null; then
                "$f" 2>/dev/null | sed -E -e '/^#/d' -e 's/\[[0-9]+:[0-9]+\]//'
            fi
        done
        echo "## links"
        ip -o link show | awk -F': ' '{ print $2 }' | sed 's/@.*//' | sort
        echo "## cgroups"
        awk '$9 == "cgroup" || $9 == "cgroup2" { print $5 }' /proc/self/mountinfo | sort -u |
            while IFS= read -r d; do if [ -d "$d/kubepods" ]; then echo "$d/kubepods"; fi; done
        echo "## paths"
        for p in /var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni /run/containerd \
            /run/kubewasm-node /var/lib/kubewasm-node; do
            # shellcheck disable=SC2012
            if [ -e "$p" ]; then echo "$p: $(ls -A "$p" | tr '\n' ' ')"; fi
        done
        echo "## mounts"
        awk '{ print $5 }' /proc/self/mountinfo | grep -E '^(/var/lib/kubewasm-node|/run/kubewasm-node|/var/lib/kubelet|/run/containerd)' || true
        echo "## processes"
        for p in /proc/[0-9]*; do
            case "$(cat "$p/comm" 2>/dev/null)" in
                kubelet | containerd | containerd-shim* | docker-registry | kube-scheduler | runc | pause)
                    echo "$(cat "$p/comm") ${p#/proc/}" ;;
            esac
        done
    } >"$out"
}

DIR=
cleanup() {
    local status=$?
    if [ -n "$DIR" ] && [ -d "$DIR" ]; then
        if [ "$status" -ne 0 ]; then
            log "stopping the cluster; its logs stay in $DIR/logs"
            bash "$CLUSTER" down "$DIR" || true
        fi
    fi
}
trap cleanup EXIT

one_run() {
    local run=$1 t0 t1 up_ms pod_ms dep_ms replace_ms down_ms before after
    DIR=$(mktemp -d "${TMPDIR:-/tmp}/kubewasm-node-smoke.XXXXXX")
    before=$DIR/machine.before
    after=$DIR/machine.after
    snapshot "$before"
    log "run $run: cluster.sh up --node $DIR"

    t0=$(now_ms)
    local out
    out=$(bash "$CLUSTER" up --node --watch-pid $$ "$DIR" 2> >(tee "$DIR/up.log" >&2)) ||
        die "cluster.sh up --node failed (see above; logs in $DIR/logs)"
    t1=$(now_ms)
    up_ms=$((t1 - t0))
    eval "$(tail -n1 <<<"$out")"
    [ -n "${KUBECONFIG:-}" ] || die "up printed no KUBECONFIG"
    kubectl get nodes -o wide >&2 2>/dev/null
    local ready_after_kubelet
    ready_after_kubelet=$(sed -n 's/^KUBEWASM_NODE_READY_SECONDS=//p' "$DIR/cluster.env")

    # A Pod that says hello, pulled with `imagePullPolicy: Always` from the local registry.
    kubectl apply -f - >/dev/null 2>&1 <<EOF || die "creating Pod your-name failed"
apiVersion: v1
kind: Pod
metadata:
  name: your-name
spec:
  restartPolicy: Never
  containers:
  - name: hello
    image: busybox
    imagePullPolicy: Always
    command: ["echo", "Hello, $WHO!"]
EOF
    t0=$(now_ms)
    local phase=
    local deadline=$((SECONDS + TIMEOUT))
    while :; do
        phase=$(kubectl get pod your-name -o jsonpath='{.status.phase}' 2>/dev/null || true)
        [ "$phase" = Succeeded ] && break
        [ "$phase" = Failed ] && { kubectl describe pod your-name >&2 2>/dev/null; die "Pod your-name Failed"; }
        if [ "$SECONDS" -ge "$deadline" ]; then
            kubectl describe pod your-name >&2 2>/dev/null || true
            die "Pod your-name is $phase, not Succeeded, after ${TIMEOUT}s"
        fi
        sleep 0.2
    done
    t1=$(now_ms)
    pod_ms=$((t1 - t0))
    local said
    said=$(kubectl logs your-name 2>/dev/null) || die "kubectl logs your-name failed"
    [ "$said" = "Hello, $WHO!" ] || die "kubectl logs your-name printed '$said', not 'Hello, $WHO!'"
    log "kubectl logs your-name: $said"

    # A Deployment of two; one Pod deleted is replaced.
    t0=$(now_ms)
    kubectl create deployment sleeper --image=busybox --replicas=2 -- sleep 3600 >/dev/null 2>&1 ||
        die "creating Deployment sleeper failed"
    running() {
        kubectl get pods -l app=sleeper -o jsonpath='{range .items[*]}{.metadata.name} {.status.phase} {.metadata.deletionTimestamp}{"\n"}{end}' 2>/dev/null |
            awk '$2 == "Running" && $3 == "" { print $1 }'
    }
    wait_for "2 Running Pods of Deployment sleeper" '[ "$(running | wc -l)" -eq 2 ]'
    t1=$(now_ms)
    dep_ms=$((t1 - t0))
    local victim survivor
    victim=$(running | head -n1)
    survivor=$(running | tail -n1)
    [ "$(kubectl exec "$survivor" -- echo exec works 2>/dev/null)" = "exec works" ] ||
        die "kubectl exec $survivor failed"
    log "kubectl exec $survivor -- echo exec works: ok"
    # In-cluster clients reach the API server through the kubernetes Service.
    local version
    version=$(kubectl exec "$survivor" -- sh -c \
        'wget -q -O- --no-check-certificate https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/version' 2>/dev/null) ||
        die "a Pod could not reach the API server at https://\$KUBERNETES_SERVICE_HOST:\$KUBERNETES_SERVICE_PORT"
    grep -q '"gitVersion"' <<<"$version" || die "GET /version from a Pod returned: $version"
    log "a Pod reached the API server through the kubernetes Service: ok"
    t0=$(now_ms)
    kubectl delete pod "$victim" --wait=false >/dev/null 2>&1 || die "deleting Pod $victim failed"
    wait_for "a Running replacement of Pod $victim" \
        '[ "$(running | grep -vx "$victim" | wc -l)" -eq 2 ]'
    t1=$(now_ms)
    replace_ms=$((t1 - t0))

    t0=$(now_ms)
    bash "$CLUSTER" down "$DIR" 2>"$DIR/down.log" || { cat "$DIR/down.log" >&2; die "cluster.sh down failed"; }
    t1=$(now_ms)
    down_ms=$((t1 - t0))
    sed 's/^/  /' "$DIR/down.log" >&2

    snapshot "$after"
    if ! diff -u "$before" "$after" >"$DIR/machine.diff"; then
        cat "$DIR/machine.diff" >&2
        die "the machine is not as before the run (diff above, $DIR/machine.diff)"
    fi
    local leftovers
    leftovers=$(for p in /proc/[0-9]*; do { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -F -- "$DIR" | head -c 150 && echo; done | grep -v '^$' || true)
    [ -z "$leftovers" ] || die "processes of $DIR are left: $leftovers"
    log "run $run: nothing left after down (processes, mounts, cgroups, links, iptables, sysctls, paths)"

    printf '%s\n' \
        "run $run timings:" \
        "  cluster.sh up --node (nothing running -> node Ready): $(secs "$up_ms") (kubelet start -> Ready: ${ready_after_kubelet:-?} s)" \
        "  Pod your-name created -> Succeeded:                    $(secs "$pod_ms")" \
        "  Deployment sleeper created -> 2 Pods Running:          $(secs "$dep_ms")" \
        "  Pod deleted -> replacement Running:                    $(secs "$replace_ms")" \
        "  cluster.sh down:                                       $(secs "$down_ms")" | tee -a "${SMOKE_SUMMARY:-/dev/null}"
    rm -rf "$DIR"
    DIR=
}

for run in $(seq 1 "$RUNS"); do
    one_run "$run"
done
log "PASSED ($RUNS run(s))"
