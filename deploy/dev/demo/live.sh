#!/usr/bin/env bash
# make demo: a local control plane, the kubewasm runtime, the four tutorials' controllers and a
# finalizer played step by step, then the HelloWorld controller pushed to a module registry on
# loopback and run from spec.module.image, a second build compared with it in shadow (spec.candidate)
# and promoted, and the same
# controller written in Python (guests/python-hello-world) beside it.
#
#   deploy/dev/demo/live.sh          play both tutorials, then stop everything (exit 0 on success)
#   deploy/dev/demo/live.sh --keep   leave the control plane and the runtime running (make up)
#
# Needs: the guests built (make guests), the debug kubewasm (make build; $KUBEWASM, else
# target/debug/kubewasm), the Kubernetes binaries and Debian's docker-registry (make
# k8s-binaries); `make demo` does all of that first.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
KEEP=false
[ "${1:-}" = "--keep" ] && KEEP=true
CACHE=${KUBEWASM_CACHE:-$HOME/.cache/kubewasm}
STATE=${KUBEWASM_DEMO_DIR:-$CACHE/clusters/demo}
GUESTS=${KUBEWASM_GUEST_DIR:-$ROOT/target/wasm32-wasip2/guest}
# The Rust controllers as shipped: built without WASI (they need neither a clock nor stdio).
SHIPPED=${KUBEWASM_GUEST_DIR_NO_WASI:-$ROOT/target/wasm32-unknown-unknown/guest}
KUBEWASM=${KUBEWASM:-$ROOT/target/debug/kubewasm}
EX=$ROOT/deploy/examples
RUNTIME_PID=
REGISTRY_PID=
# The registry of step 9: its storage and config under $STATE, a free loopback port (set below).
REGISTRY_DIR=$STATE/registry
REG=

say() { printf '\n\033[1m%s\033[0m\n' "$*"; }
step() { printf '  - %s\n' "$*"; }
fail() { printf '\nDEMO FAILED: %s\n' "$*" >&2; [ -f "$STATE/kubewasm.log" ] && { echo "--- last runtime log lines:" >&2; tail -20 "$STATE/kubewasm.log" >&2; }; exit 1; }
k() { kubectl "$@" 2>/dev/null; }

# wait_for SECONDS "what should happen" command...: polls until the command succeeds.
wait_for() {
    local secs=$1 what=$2; shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -ge $end ] && fail "after ${secs}s: $what did not happen"
        sleep 0.5
    done
}

# A registry left by an earlier `make up` (its pid file names it; only a docker-registry is stopped).
stop_registry() {
    local pid=${REGISTRY_PID:-$(cat "$STATE/registry.pid" 2>/dev/null)}
    if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'docker-registry serve'; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$STATE/registry.pid" "$REGISTRY_DIR"
}

# Debian's docker-registry (as runtime/test-support/src/registry.rs runs it) on a free loopback
# port, storage under $REGISTRY_DIR; sets REG=127.0.0.1:<port> and REGISTRY_PID.
start_registry() {
    local try port
    command -v docker-registry >/dev/null || bash "$ROOT/deploy/dev/local/cluster.sh" install
    mkdir -p "$REGISTRY_DIR/storage"
    for try in 1 2 3 4 5; do
        # A port nothing listens on (bash's /dev/tcp connects, or fails: then it is free).
        port=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue
        REG=127.0.0.1:$port
        printf '%s\n' "version: 0.1" "log: {level: warn}" \
            "storage: {filesystem: {rootdirectory: $REGISTRY_DIR/storage}, delete: {enabled: true}}" \
            "http: {addr: $REG}" >"$REGISTRY_DIR/config.yml"
        docker-registry serve "$REGISTRY_DIR/config.yml" >"$REGISTRY_DIR/registry.log" 2>&1 </dev/null &
        REGISTRY_PID=$!
        echo "$REGISTRY_PID" >"$STATE/registry.pid"
        local end=$((SECONDS + 20))
        while kill -0 "$REGISTRY_PID" 2>/dev/null && [ $SECONDS -lt $end ]; do
            curl -fsS --max-time 2 -o /dev/null "http://$REG/v2/" && return 0
            sleep 0.2
        done
        kill "$REGISTRY_PID" 2>/dev/null || true # the port was taken meanwhile, or it did not start
        wait "$REGISTRY_PID" 2>/dev/null || true
    done
    cat "$REGISTRY_DIR/registry.log" >&2
    fail "docker-registry did not serve on a loopback port (log above)"
}

cleanup() {
    [ -n "$RUNTIME_PID" ] && kill "$RUNTIME_PID" 2>/dev/null && wait "$RUNTIME_PID" 2>/dev/null || true
    stop_registry
    bash "$ROOT/deploy/dev/local/cluster.sh" down "$STATE" >/dev/null 2>&1 || true
}

for f in hello_world.wasm configmap_restarter.wasm guitar_reviewer.wasm pod_watcher.wasm hello_finalizer.wasm hello_world_howdy.wasm; do
    [ -f "$SHIPPED/$f" ] || fail "$SHIPPED/$f is missing: run make guests"
done
[ -f "$GUESTS/python_hello_world.wasm" ] || fail "$GUESTS/python_hello_world.wasm is missing: run make guests"
[ -x "$KUBEWASM" ] || fail "$KUBEWASM is missing: run make build"

say "1. Starting a local Kubernetes cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler v1.20 and one real node (kubelet, containerd)"
# A runtime and control plane left by an earlier `make up` go first.
[ -f "$STATE/kubewasm.pid" ] && kill "$(cat "$STATE/kubewasm.pid")" 2>/dev/null || true
rm -f "$STATE/kubewasm.pid"
stop_registry
bash "$ROOT/deploy/dev/local/cluster.sh" down "$STATE" >/dev/null 2>&1 || true
$KEEP || trap cleanup EXIT
eval "$(bash "$ROOT/deploy/dev/local/cluster.sh" up --node "$STATE" 2>"$STATE.up.log" | tail -1)" || { tail -30 "$STATE.up.log" >&2; fail "the cluster did not start (full log: $STATE.up.log)"; }
step "API server ready, node $(k get nodes -o jsonpath='{.items[0].metadata.name}') Ready; KUBECONFIG=$KUBECONFIG"

say "2. Installing kubewasm's CRDs and the two first tutorials' controllers"
k apply -f "$ROOT/deploy/crds/kubewasm.dev.yaml" >/dev/null
k apply -f "$EX/hello-world/crd.yaml" >/dev/null
wait_for 30 "the CRDs becoming established" k wait --for=condition=Established --timeout=1s crd/wasmcontrollers.kubewasm.dev crd/wasmcontrollerstates.kubewasm.dev crd/helloworlds.example.com
k apply -f "$EX/hello-world/rbac.yaml" >/dev/null
k apply -f "$EX/configmap-restarter/rbac.yaml" >/dev/null
k -n hello create configmap hello-controller --from-file=hello_world.wasm="$SHIPPED/hello_world.wasm" >/dev/null
k -n test-space create configmap configmap-restarter --from-file=configmap_restarter.wasm="$SHIPPED/configmap_restarter.wasm" >/dev/null
k apply -f "$EX/hello-world/controller.yaml" >/dev/null
k apply -f "$EX/configmap-restarter/controller.yaml" >/dev/null
step "hello_world.wasm ($(stat -c %s "$SHIPPED/hello_world.wasm") bytes) is in ConfigMap hello/hello-controller"
step "configmap_restarter.wasm ($(stat -c %s "$SHIPPED/configmap_restarter.wasm") bytes) is in ConfigMap test-space/configmap-restarter"

say "3. Starting a module registry and the kubewasm runtime (log: $STATE/kubewasm.log)"
start_registry
step "Debian's docker-registry serves plain HTTP on $REG (storage: $REGISTRY_DIR; step 9 pushes to it)"
# The key step 9 signs with (made with openssl: cosign's key kind, no cosign needed).
KEYS=$STATE/keys
rm -rf "$KEYS" && mkdir -p "$KEYS"
openssl ecparam -name prime256v1 -genkey -noout 2>/dev/null | openssl pkcs8 -topk8 -nocrypt -out "$KEYS/cosign.key"
openssl ec -in "$KEYS/cosign.key" -pubout -out "$KEYS/cosign.pub" 2>/dev/null
step "a signing key pair, made with openssl: $KEYS/cosign.key and cosign.pub (the runtime trusts cosign.pub)"
# Plain HTTP only for the registry named; image tags are resolved again every 2 s; a module
# from a registry runs only when its digest is signed by cosign.pub.
# The log server (step 11, a team's view): the runtime serves logs.kubewasm.dev on this
# machine's address, where the aggregation layer reaches it (deploy/runtime/logs.yaml does the
# same for the installed Deployment).
API_IP=$(hostname -I | awk '{ print $1 }')
API_PORT=
for try in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 40000))
    (exec 3<>"/dev/tcp/$API_IP/$port") 2>/dev/null && continue
    API_PORT=$port && break
done
[ -n "$API_IP" ] && [ -n "$API_PORT" ] || fail "no address and free port for the log server"
"$KUBEWASM" run --insecure-registry "$REG" --module-poll-seconds 2 --verify-key "$KEYS/cosign.pub" --api-addr "$API_IP:$API_PORT" > "$STATE/kubewasm.log" 2>&1 &
RUNTIME_PID=$!
$KEEP && echo "$RUNTIME_PID" > "$STATE/kubewasm.pid" # make down stops it, even after a failure
ready() { [ "$(k -n "$1" get wasmcontroller "$2" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
wait_for 60 "WasmController hello/hello-world becoming Ready" ready hello hello-world
wait_for 60 "WasmController test-space/configmap-restarter becoming Ready" ready test-space configmap-restarter
step "kubewasm run --insecure-registry $REG --module-poll-seconds 2 --verify-key $KEYS/cosign.pub --api-addr $API_IP:$API_PORT (pid $RUNTIME_PID)"
step "both controllers loaded from their ConfigMaps and Ready:"
k get wasmcontrollers -A | sed 's/^/      /'
# The log server behind the aggregation layer: logs.yaml's APIService and RBAC, its Service
# pointed at this machine's runtime (a selector-less Service and its Endpoints).
k get namespace kubewasm-system >/dev/null 2>&1 || k create namespace kubewasm-system >/dev/null
k apply -f "$ROOT/deploy/runtime/logs.yaml" >/dev/null
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: kubewasm-demo-logs, namespace: kubewasm-system}
spec: {ports: [{name: logs, port: 443, targetPort: $API_PORT}]}
---
apiVersion: v1
kind: Endpoints
metadata: {name: kubewasm-demo-logs, namespace: kubewasm-system}
subsets: [{addresses: [{ip: "$API_IP"}], ports: [{name: logs, port: $API_PORT}]}]
EOF
k patch apiservice v1alpha1.logs.kubewasm.dev --type=merge -p '{"spec":{"service":{"name":"kubewasm-demo-logs"}}}' >/dev/null
available() { [ "$(k get apiservice v1alpha1.logs.kubewasm.dev -o jsonpath='{.status.conditions[?(@.type=="Available")].status}')" = True ]; }
wait_for 60 "APIService v1alpha1.logs.kubewasm.dev Available" available
step "APIService v1alpha1.logs.kubewasm.dev Available: the controllers' logs are read with kubectl's credentials (kubewasm logs)"

say "4. The HelloWorld tutorial (Metacontroller's CompositeController example)"
k apply -f "$EX/hello-world/hello.yaml" >/dev/null
step "created HelloWorld 'your-name' with spec.who = 'Your Name'"
pod_cmd() { k -n hello get pod your-name -o jsonpath='{.spec.containers[0].command[1]}'; }
pod_says() { [ "$(pod_cmd)" = "$1" ] && [ "$(k -n hello get pod your-name -o jsonpath='{.status.phase}')" = Succeeded ] && [ "$(k -n hello logs your-name)" = "$1" ]; }
wait_for 60 "Pod your-name printing 'Hello, Your Name!'" pod_says "Hello, Your Name!"
uid1=$(k -n hello get pod your-name -o jsonpath='{.metadata.uid}')
step "the controller created Pod 'your-name'; it ran on the node, and kubectl -n hello logs your-name says:"
k -n hello logs your-name | sed 's/^/      /'
pods_status() { [ "$(k -n hello get helloworld your-name -o jsonpath='{.status.pods}')" = 1 ]; }
wait_for 30 "HelloWorld status.pods becoming 1" pods_status
step "HelloWorld 'your-name' reports status.pods = 1"
k -n hello patch helloworld your-name --type merge -p '{"spec":{"who":"My Name"}}' >/dev/null
step "changed spec.who to 'My Name'"
wait_for 60 "Pod your-name being recreated to print 'Hello, My Name!'" pod_says "Hello, My Name!"
uid2=$(k -n hello get pod your-name -o jsonpath='{.metadata.uid}')
[ "$uid1" != "$uid2" ] || fail "the Pod was not recreated"
step "the old Pod was deleted and a new one created (Recreate); kubectl -n hello logs your-name:"
k -n hello logs your-name | sed 's/^/      /'
k -n hello delete helloworld your-name >/dev/null
gone() { ! k -n hello get pod your-name; }
wait_for 60 "Pod your-name being garbage-collected after its parent was deleted" gone
step "deleted the HelloWorld; Kubernetes garbage-collected its Pod"

say "5. The ConfigMap restarter tutorial (magalix.com/podDeleteMatch)"
k apply -f "$EX/configmap-restarter/frontend.yaml" >/dev/null
k -n test-space run bystander --image=busybox --labels=app=other -- sleep 3600 >/dev/null
frontend_pods() { k -n test-space get pods -l app=frontend --field-selector=status.phase=Running -o go-template='{{range .items}}{{if not .metadata.deletionTimestamp}}{{.metadata.name}} {{end}}{{end}}'; }
two_pods() { [ "$(frontend_pods | wc -w)" = 2 ]; }
wait_for 60 "Deployment frontend getting 2 Running Pods" two_pods
before=$(frontend_pods)
step "Deployment 'frontend' runs Pods: $before (plus Pod 'bystander' with app=other)"
saved() { k -n test-space get wasmcontrollerstates -o jsonpath="{.items[*].spec.entries['test-space/frontend-config']}"; }
has_saved() { [ -n "$(saved)" ]; }
wait_for 30 "the restarter saving the data digest of frontend-config" has_saved
step "it runs as the tutorial's ServiceAccount 'joe' (read ConfigMaps; read and delete Pods; nothing else)"
step "first sighting of ConfigMap 'frontend-config': the restarter saved its data digest as its state"
step "  (kubectl get wasmcontrollerstates -o yaml: $(saved | cut -c1-23)…); Pods untouched: $(frontend_pods)"
bystander=$(k -n test-space get pod bystander -o jsonpath='{.metadata.uid}')
k -n test-space patch configmap frontend-config --type merge -p '{"data":{"TEXT3":"Hello from the new config"}}' >/dev/null
step "changed the ConfigMap's data (TEXT3)"
replaced() { two_pods || return 1; for p in $before; do k -n test-space get pod "$p" && return 1; done; return 0; }
wait_for 60 "the frontend Pods being replaced" replaced
step "the restarter deleted Pods created before the change: $before"
step "the Deployment recreated them as: $(frontend_pods)(Running); the new ones read the new config:"
first_pod=$(frontend_pods | cut -d' ' -f1)
wait_for 30 "the new Pod printing the new TEXT3" bash -c "kubectl -n test-space logs $first_pod 2>/dev/null | grep -q 'Hello from the new config'"
step "  kubectl -n test-space logs $first_pod: $(k -n test-space logs "$first_pod")"
[ "$(k -n test-space get pod bystander -o jsonpath='{.metadata.uid}')" = "$bystander" ] || fail "Pod bystander was touched"
step "Pod 'bystander' (app=other) was left alone"
step "joe may not create Events, so the runtime's log says: $(grep -ao 'Event PodsRestarted on ConfigMap [^ ]* not recorded' "$STATE/kubewasm.log" | head -1)"

say "6. The Guitar reviewer tutorial (a ClusterWasmController over every namespace)"
k apply -f "$EX/guitar-reviewer/crd.yaml" >/dev/null
wait_for 30 "the Guitar CRD becoming established" k wait --for=condition=Established --timeout=1s crd/guitars.kool.karmalabs.local
k apply -f "$EX/guitar-reviewer/rbac.yaml" >/dev/null
k -n guitars create configmap guitar-reviewer --from-file=guitar_reviewer.wasm="$SHIPPED/guitar_reviewer.wasm" >/dev/null
k apply -f "$EX/guitar-reviewer/controller.yaml" >/dev/null
k apply -f "$EX/guitar-reviewer/guitars.yaml" >/dev/null
step "created Guitars: $(k get guit -o jsonpath='{range .items[*]}{.metadata.name} ({.spec.brand}) {end}')"
reviewed() { [ "$(k get guit -o jsonpath='{range .items[*]}{.spec.review}{"\n"}{end}' | grep -c true)" = 3 ]; }
wait_for 60 "the three Guitars being reviewed" reviewed
k get guit -o jsonpath='{range .items[*]}{.metadata.name}: {.spec.comment}{"\n"}{end}' | sed 's/^/      /'
rv=$(k get guit strato -o jsonpath='{.metadata.resourceVersion}')
sleep 2
[ "$(k get guit strato -o jsonpath='{.metadata.resourceVersion}')" = "$rv" ] || fail "a reviewed Guitar was rewritten"
step "each reviewed once: a reviewed Guitar is never rewritten (resourceVersion unchanged)"

say "7. The Chronos pod watcher (read-only: it may not write anything)"
k apply -f "$EX/pod-watcher/rbac.yaml" >/dev/null
k -n chronos create configmap pod-watcher --from-file=pod_watcher.wasm="$SHIPPED/pod_watcher.wasm" >/dev/null
k apply -f "$EX/pod-watcher/controller.yaml" >/dev/null
wait_for 60 "ClusterWasmController pod-watcher becoming Ready" bash -c "[ \"\$(kubectl get clusterwasmcontroller pod-watcher -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}')\" = True ]"
k -n chronos run watched --image=busybox --labels=app=demo -- sleep 3600 >/dev/null
k -n chronos label pod watched tier=web >/dev/null
wait_for 60 "Pod chronos/watched Running" bash -c "[ \"\$(kubectl -n chronos get pod watched -o jsonpath='{.status.phase}')\" = Running ]"
k -n chronos delete pod watched --grace-period=1 --wait=false >/dev/null
logged() { "$KUBEWASM" logs --cluster pod-watcher 2>/dev/null | grep -q "pod chronos/watched $1"; }
wait_for 30 "the pod watcher logging the deletion" logged deleted
step "created Pod chronos/watched (scheduled, started), relabelled and deleted it; kubewasm logs --cluster pod-watcher says:"
"$KUBEWASM" logs --cluster pod-watcher | grep -o 'pod chronos/watched .*' | sed 's/ object=.*//; s/^/      /'

say "8. Finalizers: a HelloWorld that cleans up outside the cluster before it may go"
k -n hello delete wasmcontroller hello-world >/dev/null
step "the HelloWorld tutorial's controller is removed; its successor keeps a record per HelloWorld"
k apply -f "$EX/hello-finalizer/rbac.yaml" >/dev/null
k -n hello create configmap hello-finalizer --from-file=hello_finalizer.wasm="$SHIPPED/hello_finalizer.wasm" >/dev/null
k apply -f "$EX/hello-finalizer/controller.yaml" >/dev/null
k apply -f "$EX/hello-world/hello.yaml" >/dev/null
record() { k -n hello get configmap greeting-your-name; }
wait_for 30 "the greeting record ConfigMap greeting-your-name" record
step "HelloWorld 'your-name' carries finalizer $(k -n hello get helloworld your-name -o jsonpath='{.metadata.finalizers}')"
step "and its controller keeps a record nothing owns: ConfigMap greeting-your-name"
k -n hello delete helloworld your-name --wait=false >/dev/null
hello_gone() { ! k -n hello get helloworld your-name; }
wait_for 30 "the HelloWorld going once its clean-up is done" hello_gone
record && fail "the record outlived its HelloWorld"
step "deleted the HelloWorld: the guest deleted the record first, then said 'finalized'; the runtime removed the finalizer"

say "9. The HelloWorld controller from an OCI registry: push, sign, run by tag; v2 in shadow, compared, promoted"
k apply -f "$EX/hello-world-oci/rbac.yaml" >/dev/null
IMAGE=$REG/hello-oci/hello-world:v1
pushed1=$("$KUBEWASM" push "$SHIPPED/hello_world.wasm" "$IMAGE" --insecure 2>"$STATE/push.log") || { cat "$STATE/push.log" >&2; fail "kubewasm push to $IMAGE failed"; }
digest1=${pushed1##*@}
step "kubewasm push hello_world.wasm $IMAGE --insecure printed:"
echo "      $pushed1"
signed1=$("$KUBEWASM" sign --key "$KEYS/cosign.key" "$IMAGE" --insecure 2>"$STATE/sign.log") || { cat "$STATE/sign.log" >&2; fail "kubewasm sign $IMAGE failed"; }
step "kubewasm sign --key cosign.key $IMAGE --insecure signed $signed1"
# The example names the node's registry (127.0.0.1:5000); this one listens on another port.
sed "s|127.0.0.1:5000/|$REG/|" "$EX/hello-world-oci/controller.yaml" | k apply -f - >/dev/null
step "WasmController hello-oci/hello-world: spec.module.image = $(k -n hello-oci get wc hello-world -o jsonpath='{.spec.module.image}')"
module_msg() { k -n hello-oci get wasmcontroller hello-world -o jsonpath='{.status.conditions[?(@.type=="ModuleReady")].message}'; }
runs_digest() { ready hello-oci hello-world && module_msg | grep -qF "@$1)"; }
wait_for 60 "WasmController hello-oci/hello-world Ready with image digest $digest1" runs_digest "$digest1"
step "kubectl -n hello-oci get wasmcontroller hello-world -o jsonpath='{.status.conditions[?(@.type==\"ModuleReady\")].message}':"
echo "      $(module_msg)"
k apply -f "$EX/hello-world-oci/hello.yaml" >/dev/null
oci_pod_says() { [ "$(k -n hello-oci get pod your-name -o jsonpath='{.spec.containers[0].command[1]}')" = "$1" ] && [ "$(k -n hello-oci get pod your-name -o jsonpath='{.status.phase}')" = Succeeded ] && [ "$(k -n hello-oci logs your-name)" = "$1" ]; }
wait_for 60 "Pod hello-oci/your-name printing 'Hello, Your Name!'" oci_pod_says "Hello, Your Name!"
step "HelloWorld hello-oci/your-name got its Pod; kubectl -n hello-oci logs your-name: $(k -n hello-oci logs your-name)"
IMAGE2=$REG/hello-oci/hello-world:v2
pushed2=$("$KUBEWASM" push "$SHIPPED/hello_world_howdy.wasm" "$IMAGE2" --insecure 2>"$STATE/push.log") || { cat "$STATE/push.log" >&2; fail "kubewasm push to $IMAGE2 failed"; }
digest2=${pushed2##*@}
[ "$digest1" != "$digest2" ] || fail "the second build has the first one's digest"
step "a second build (make guests: HELLO_WORLD_GREETING=Howdy) pushed as v2:"
echo "      $pushed2"
k -n hello-oci patch wasmcontroller hello-world --type merge -p "{\"spec\":{\"candidate\":{\"image\":\"$IMAGE2\"}}}" >/dev/null
step "declared as the controller's candidate, to run in shadow beside v1 (nothing it answers is carried out):"
echo "      kubectl -n hello-oci patch wasmcontroller hello-world --type merge -p '{\"spec\":{\"candidate\":{\"image\":\"$IMAGE2\"}}}'"
rollout_field() { k -n hello-oci get wasmcontroller hello-world -o jsonpath="{.status.rollout.$1}"; }
unsigned() { rollout_field problem | grep -qF "not signed"; }
wait_for 60 "the unsigned candidate $digest2 being refused" unsigned
step "not signed yet: status.rollout.problem says it, and the live module runs on:"
echo "      $(rollout_field problem | cut -c1-200)…"
"$KUBEWASM" sign --key "$KEYS/cosign.key" "$IMAGE2" --insecure >/dev/null 2>"$STATE/sign.log" || { cat "$STATE/sign.log" >&2; fail "kubewasm sign $IMAGE2 failed"; }
step "kubewasm sign --key cosign.key $IMAGE2 --insecure"
differs() { [ "$(rollout_field differing)" -ge 1 ] 2>/dev/null; }
wait_for 60 "the candidate compared with the live module, and differing" differs
step "kubewasm rollout status -n hello-oci hello-world:"
"$KUBEWASM" rollout status -n hello-oci hello-world | sed 's/^/      /'
oci_pod_says "Hello, Your Name!" || fail "the candidate changed the Pod"
step "the Pod still prints '$(k -n hello-oci logs your-name)': the candidate's apply was compared, not carried out"
step "kubewasm rollout promote -n hello-oci hello-world:"
"$KUBEWASM" rollout promote -n hello-oci hello-world | sed 's/^/      /'
step "spec.module is now $(k -n hello-oci get wc hello-world -o jsonpath='{.spec.module.image}'), pinned by spec.module.sha256, and spec.candidate is gone"
wait_for 60 "the status naming the promoted digest $digest2" runs_digest "$digest2"
kill -0 "$RUNTIME_PID" 2>/dev/null || fail "the runtime is gone"
wait_for 60 "Pod hello-oci/your-name being recreated by the promoted module to print 'Howdy, Your Name!'" oci_pod_says "Howdy, Your Name!"
step "the promoted module recreated the Pod (Recreate); kubectl -n hello-oci logs your-name: $(k -n hello-oci logs your-name)"
step "the runtime is the same process (pid $RUNTIME_PID); ConfigMap modules and registry modules side by side"

say "10. The HelloWorld controller in Python, next to the Rust one"
k apply -f "$EX/python-hello-world/rbac.yaml" >/dev/null
PY_IMAGE=$REG/hello-py/hello-world:v1
PY_WASM=$GUESTS/python_hello_world.wasm
step "guests/python-hello-world: the tutorial's sync() in Python, built by componentize-py into a component of $(awk -v b="$(stat -c %s "$PY_WASM")" 'BEGIN { printf "%.1f", b / 1e6 }') MB"
pushed_py=$("$KUBEWASM" push "$PY_WASM" "$PY_IMAGE" --insecure 2>"$STATE/push.log") || { cat "$STATE/push.log" >&2; fail "kubewasm push to $PY_IMAGE failed"; }
"$KUBEWASM" sign --key "$KEYS/cosign.key" "$PY_IMAGE" --insecure >/dev/null 2>"$STATE/sign.log" || { cat "$STATE/sign.log" >&2; fail "kubewasm sign $PY_IMAGE failed"; }
step "pushed and signed: $pushed_py"
sed "s|127.0.0.1:5000/|$REG/|" "$EX/python-hello-world/controller.yaml" | k apply -f - >/dev/null
applied=$SECONDS
# The debug runtime compiles a Python component in 15-25 s (a Rust guest in under a second).
wait_for 240 "WasmController hello-py/hello-world becoming Ready" ready hello-py hello-world
step "WasmController hello-py/hello-world Ready $((SECONDS - applied)) s after it was applied (most of it compiling the interpreter; spec.limits.memory: $(k -n hello-py get wc hello-world -o jsonpath='{.spec.limits.memory}'))"
k apply -f "$EX/python-hello-world/hello.yaml" >/dev/null
py_pod_says() { [ "$(k -n hello-py get pod your-name -o jsonpath='{.status.phase}')" = Succeeded ] && [ "$(k -n hello-py logs your-name)" = "$1" ]; }
wait_for 90 "Pod hello-py/your-name printing 'Hello, Your Name!'" py_pod_says "Hello, Your Name!"
step "HelloWorld hello-py/your-name got its Pod from the Python guest; kubectl -n hello-py logs your-name: $(k -n hello-py logs your-name)"
step "and from the Rust guest of step 9, kubectl -n hello-oci logs your-name: $(k -n hello-oci logs your-name)"
py_status() { [ "$(k -n hello-py get helloworld your-name -o jsonpath='{.status.pods}')" = 1 ]; }
wait_for 30 "HelloWorld hello-py/your-name status.pods becoming 1" py_status
step "HelloWorld hello-py/your-name reports status.pods = 1, as the Rust guest's did"

say "11. A team's view: alice, admin of namespace hello-oci only, reads its controller's log and replays a failure"
# alice: admin of hello-oci and nothing else (impersonated with the admin's credentials, as
# `kubectl --as alice` does); bob: admin of hello-py.
k -n hello-oci create rolebinding alice-admin --clusterrole=admin --user=alice >/dev/null
k -n hello-py create rolebinding bob-admin --clusterrole=admin --user=bob >/dev/null
for user in alice bob; do
    k config view --raw | sed "s/^  user:\$/  user:\n    as: $user/" >"$STATE/$user.kubeconfig"
done
as_user() { local user=$1; shift; KUBECONFIG="$STATE/$user.kubeconfig" "$@"; }
# RBAC's aggregation gives the admin role wasmcontrollers/log within seconds.
alice_reads() { as_user alice "$KUBEWASM" logs -n hello-oci hello-world --tail 3 >"$STATE/alice.out" 2>&1; }
wait_for 60 "alice reading her controller's log" alice_reads
step "kubewasm logs -n hello-oci hello-world --tail 3, as alice (the runtime's lines about her controller):"
cut -c1-160 "$STATE/alice.out" | sed 's/^/      /'
# A HelloWorld whose name is longer than a label value may be (63): the guest labels its Pod
# with the name, and the API server refuses the Pod.
LONG=greetings-to-everyone-who-reads-this-demo-from-beginning-to-end-and-more
k -n hello-oci apply -f - >/dev/null <<EOF
apiVersion: example.com/v1
kind: HelloWorld
metadata: {name: $LONG}
spec: {who: Everyone}
EOF
rm -rf "$STATE/capsules"
fetched() { as_user alice "$KUBEWASM" capsules -n hello-oci hello-world --out "$STATE/capsules" >"$STATE/capsules.out" 2>&1 && [ -f "$STATE/capsules/capsule-1.json" ]; }
wait_for 60 "the failure of HelloWorld $LONG kept as a capsule" fetched
step "its reconcile failed (a label of its Pod is too long); status.failingObjects: $(k -n hello-oci get wc hello-world -o jsonpath='{.status.failingObjects}')"
step "kubewasm capsules -n hello-oci hello-world --out capsules/, as alice:"
head -1 "$STATE/capsules.out" | cut -c1-200 | sed "s|$STATE/||; s/^/      /"
step "kubewasm reconcile --capsule capsules/capsule-1.json --insecure, as alice (the module pulled by the manifest the capsule names, checked against its digest):"
as_user alice "$KUBEWASM" reconcile --capsule "$STATE/capsules/capsule-1.json" --insecure 2>&1 | tail -2 | cut -c1-200 | sed 's/^/      /'
k -n hello-oci delete helloworld "$LONG" >/dev/null
if as_user bob "$KUBEWASM" logs -n hello-oci hello-world >"$STATE/bob.out" 2>&1; then fail "bob read alice's log"; fi
step "bob, admin of hello-py, is refused it: $(grep -o 'forbidden[^(]*' "$STATE/bob.out" | head -1 | cut -c1-120)"

say "12. What the runtime reports"
sleep 3 # the runtime writes each controller's status every 2 s
k get wasmcontrollers,clusterwasmcontrollers -A -o custom-columns='CONTROLLER:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,RECONCILES:.status.reconciles,FAILURES:.status.failures,MODULE:.status.moduleDigest' | sed 's/^/      /'

if $KEEP; then
    say "kubewasm is running (pid $RUNTIME_PID); try:"
    echo "      export KUBECONFIG=$KUBECONFIG"
    echo "      kubectl get wasmcontrollers -A"
    echo "      kubectl -n hello apply -f deploy/examples/hello-world/hello.yaml"
    echo "      kubectl -n hello-oci patch wc hello-world --type merge -p '{\"spec\":{\"candidate\":{\"image\":\"$IMAGE\"}}}'   # the registry (pid $REGISTRY_PID): v1 in shadow"
    echo "      $KUBEWASM rollout status -n hello-oci hello-world   # then: rollout diff, promote or abort"
    echo "  Stop everything with: make down"
else
    say "Demo finished: stopping the runtime and the control plane."
fi
