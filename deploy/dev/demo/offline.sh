#!/usr/bin/env bash
# The two seed scenarios, offline: each WebAssembly controller runs once in the kubewasm
# sandbox on the objects in deploy/dev/demo/, and we say in plain words what it would do in a
# cluster. No cluster needed. `make demo` builds everything and runs this.
set -euo pipefail

cd "$(dirname "$0")/../../.."
demo=deploy/dev/demo
kubewasm=${KUBEWASM:-target/debug/kubewasm}
# The Rust controllers as shipped: built without WASI.
guests=${KUBEWASM_GUEST_DIR_NO_WASI:-target/wasm32-unknown-unknown/guest}

fail() {
    echo "demo FAILED: $*" >&2
    exit 1
}

[[ -x $kubewasm ]] || fail "$kubewasm is missing; run \`make demo\` (it builds it)"
for guest in hello_world configmap_restarter; do
    [[ -f $guests/$guest.wasm ]] || fail "$guests/$guest.wasm is missing; run \`make guests\`"
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [[ -t 1 ]]; then bold=$'\033[1m' plain=$'\033[0m'; else bold='' plain=''; fi
heading() { printf '\n%s== %s%s\n\n' "$bold" "$*" "$plain"; }
say() { printf '  → %s\n' "$*"; }
indent() { sed 's/^/    | /'; }

# A ConfigMap holding a guest module, as `kubectl create configmap NAME
# --from-file=KEY=guest.wasm` makes it: that is how a controller's module reaches a cluster.
module_configmap() { # name namespace key wasm
    printf 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\n  namespace: %s\nbinaryData:\n  %s: %s\n' \
        "$1" "$2" "$3" "$(base64 -w0 "$4")"
}

# Runs one offline reconcile; its output goes to $tmp/out, its log to $tmp/log.
reconcile() {
    if ! "$kubewasm" reconcile "$@" >"$tmp/out" 2>"$tmp/log"; then
        cat "$tmp/log" >&2
        fail "kubewasm reconcile $*"
    fi
    indent <"$tmp/out"
}

expect() { # pattern what
    grep -qF -- "$1" "$tmp/out" || fail "expected $2 (\`$1\`) in the output above"
}

# ---------------------------------------------------------------------------------------
heading "1. HelloWorld: a controller that makes a Pod"

module_configmap hello-world-module default hello_world.wasm "$guests/hello_world.wasm" \
    >"$tmp/hello-world-module.yaml"
echo "The object ($demo/hello-world.yaml):"
grep -v '^#' "$demo/hello-world.yaml" | indent
echo
echo "What the hello-world controller answers (objects to apply, other actions as comments):"
reconcile --controller "$demo/hello-world-controller.yaml" --object "$demo/hello-world.yaml" \
    --state "$tmp/hello-world-module.yaml"
expect "kind: Pod" "a Pod"
expect "name: your-name" "the Pod named your-name"
expect "- Hello, Your Name!" "the greeting"
echo
say "kubewasm would create the Pod \`your-name\`, owned by the HelloWorld (delete the"
say "HelloWorld and Kubernetes deletes the Pod)."
say "The Pod runs \`echo \"Hello, Your Name!\"\` once and prints: Hello, Your Name!"
say "It records \`status.pods\` (Pods seen so far) on the HelloWorld."

# ---------------------------------------------------------------------------------------
heading "2. ConfigMap restarter: restart Pods when their ConfigMap changes"

module_configmap configmap-restarter-module test-space configmap_restarter.wasm \
    "$guests/configmap_restarter.wasm" >"$tmp/restarter-module.yaml"
restarter() { # object [saved state]
    reconcile --controller "$demo/configmap-restarter-controller.yaml" --object "$1" \
        --state "$tmp/restarter-module.yaml" --state "$demo/pods.yaml" ${2:+--saved "$2"}
}

echo "The ConfigMap ($demo/frontend-config.yaml):"
grep -v '^#' "$demo/frontend-config.yaml" | indent
echo
echo "2a. First sighting. The controller answers:"
restarter "$demo/frontend-config.yaml"
expect "save state for ConfigMap test-space/frontend-config: sha256:" "the saved digest"
grep -q "delete" "$tmp/out" && fail "a first sighting must not delete anything"
digest=$(grep -o 'sha256:[0-9a-f]*' "$tmp/out")
echo
say "It has never seen this data, so it restarts nothing: it only saves the digest of the"
say "data as its state for this ConfigMap (the runtime keeps it in a WasmControllerState of"
say "the restarter's namespace, so the restarter needs no write on ConfigMaps):"
say "$digest"

# The same ConfigMap after someone edited its data.
sed -e 's|^  TEXT1: Greetings$|  TEXT1: Good morning|' \
    "$demo/frontend-config.yaml" >"$tmp/frontend-config-changed.yaml"
grep -q 'Good morning' "$tmp/frontend-config-changed.yaml" || fail "could not edit the ConfigMap"

echo
echo "2b. Someone changes TEXT1 to \"Good morning\". The ConfigMap is now:"
grep -v '^#' "$tmp/frontend-config-changed.yaml" | indent
echo
echo "The Pods in test-space ($demo/pods.yaml):"
grep '^metadata' "$demo/pods.yaml" | indent
echo
echo "The controller, with the saved digest of the old data, answers:"
restarter "$tmp/frontend-config-changed.yaml" "$digest"
expect 'delete every Pod (v1) in namespace test-space matching `app=frontend`' "the restart"
expect "PodsRestarted" "the PodsRestarted Event"
new_digest=$(grep -o 'sha256:[0-9a-f]*' "$tmp/out" | head -1)
[[ $new_digest != "$digest" ]] || fail "the new digest should differ from the old one"
matching=$(grep 'app: frontend' "$demo/pods.yaml" | grep -o 'name: [a-z0-9-]*' | cut -d' ' -f2 | paste -sd, | sed 's/,/, /g')
echo
say "The data no longer matches the saved digest, so it would delete every Pod in"
say "test-space labelled app=frontend: here $matching (backend-1 is left alone);"
say "their Deployment recreates them and they read the new data. It first saves"
say "pending:<digest>@<newest of those Pods' creation times>, so that a runtime killed"
say "mid-restart deletes only those, never their replacements, when it comes back; then"
say "the new digest, and it records an Event PodsRestarted."

echo
echo "2c. The next reconcile of the same ConfigMap (new digest saved) answers:"
restarter "$tmp/frontend-config-changed.yaml" "$new_digest"
expect "nothing to do" "nothing to do"
echo
say "Nothing changed since the last restart, so nothing happens: the controller compares"
say "data with the saved digest, so a change made while it was down is not missed either."

heading "Done: both controllers ran in the kubewasm sandbox, offline."
