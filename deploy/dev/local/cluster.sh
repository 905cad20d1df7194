#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# kubewasm's local Kubernetes cluster: etcd + kube-apiserver + kube-controller-manager on
# loopback, built from Debian's own packages, and optionally one real node (kube-scheduler,
# containerd, a local image registry and the kubelet). See deploy/dev/local/README.md.
#
#   cluster.sh install                 install missing Debian packages (idempotent)
#   cluster.sh build                   build and cache kube-apiserver, kube-controller-manager,
#                                      kube-scheduler, the kubelet (and the static pause)
#   cluster.sh up [--node] [--watch-pid PID] [STATE_DIR]
#                                      start a control plane; the LAST line of stdout is
#                                      `export KUBECONFIG=...`. With --node, also a node
#                                      (one per machine), Ready when `up` returns. With
#                                      --watch-pid, a detached watchdog stops it all once
#                                      process PID is gone.
#   cluster.sh down [STATE_DIR]        stop it (no process, port, mount, cgroup, iptables rule
#                                      or sysctl change left behind)
#   cluster.sh env [STATE_DIR]         print `export KUBECONFIG=...` of a running control plane
#   cluster.sh status [STATE_DIR]      say what runs
#   cluster.sh images                  build (once) the pause and busybox images; print their paths
#   cluster.sh image-push ARCHIVE NAME[:TAG]
#                                      put a docker-save or OCI archive into the local registry,
#                                      where the node's containerd finds NAME (e.g. `busybox`,
#                                      `kubewasm/runtime:dev`); works with or without a node
#
# STATE_DIR defaults to $KUBEWASM_CLUSTER_DIR, else $KUBEWASM_CACHE/clusters/default.
# Only `export` lines go to stdout; everything else goes to stderr.
set -euo pipefail

K8S_VERSION=1.20.2
CACHE=${KUBEWASM_CACHE:-${HOME:-/root}/.cache/kubewasm}
K8S_DIR=$CACHE/k8s-v$K8S_VERSION
BIN_DIR=$K8S_DIR/bin
UP_TIMEOUT=${KUBEWASM_UP_TIMEOUT:-90}
NODE= # set by `up --node`
SELF=$(readlink -f "${BASH_SOURCE[0]}")
HERE=$(dirname "$SELF")

# etcd-server only when no envtest etcd is given; the build packages only until the
# binaries are cached. The node's packages (`up --node`): containerd and runc run the
# containers, the CNI plugins (which need iptables) wire them, docker-registry serves the
# images, busybox-static is the busybox image, gcc + libc6-dev build the static pause; jq,
# iproute2 and nftables (to delete the empty nftables table iptables-nft leaves) for `down`.
TOOL_PACKAGES=(openssl curl)
BUILD_PACKAGES=(golang-go rsync jq make dpkg-dev golang-github-modern-go-reflect2-dev)
NODE_PACKAGES=(containerd runc containernetworking-plugins iptables nftables iproute2
    busybox-static docker-registry gcc libc6-dev jq)
# The binaries a build makes (one `make WHAT=...`); the control plane alone needs the first two.
K8S_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
# Names how the cached binaries were made; a cache with another (or no) stamp is rebuilt.
BUILD_STAMP="v$K8S_VERSION debian-source reflect2-1.0.2 cgo-off"

log() { printf 'cluster.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# shellcheck source=node.sh
. "$HERE/node.sh"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else die "need root to run: $*"
    fi
}

# ---------------------------------------------------------------------------------------
# install

missing_packages() {
    local p
    for p in "$@"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' \
            || printf '%s\n' "$p"
    done
}

APT_UPDATED=
apt_update_once() {
    [ -n "$APT_UPDATED" ] && return 0
    log "apt-get update"
    as_root apt-get update -qq >&2
    APT_UPDATED=1
}

apt_install() {
    local missing
    missing=$(missing_packages "$@")
    [ -z "$missing" ] && return 0
    # shellcheck disable=SC2086
    log "installing: "$missing
    apt_update_once
    # Packages with a service (docker-registry, containerd) must not start it: the node runs
    # its own instances. Where no policy-rc.d says so already (containers have one), one
    # says it for the time of the install.
    local policy=/usr/sbin/policy-rc.d added=
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# kubewasm cluster.sh: no service starts during apt-get install\nexit 101\n' |
            as_root tee "$policy" >/dev/null
        as_root chmod 755 "$policy"
        added=1
    fi
    # shellcheck disable=SC2086
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >&2 ||
        { [ -z "$added" ] || as_root rm -f "$policy"; die "apt-get install failed"; }
    [ -z "$added" ] || as_root rm -f "$policy"
}

# `apt-get source` needs a deb-src entry for Debian's archive; add one next to the deb ones.
ensure_deb_src() {
    if apt-cache showsrc kubernetes 2>/dev/null | grep -q '^Package: kubernetes$'; then
        return 0
    fi
    if [ -e /etc/apt/sources.list.d/kubewasm-src.sources ]; then
        apt_update_once # our entry is there, the source lists are not (yet)
        return 0
    fi
    local suite
    # shellcheck disable=SC1091
    suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
    log "adding a deb-src entry for Debian $suite (/etc/apt/sources.list.d/kubewasm-src.sources)"
    as_root tee /etc/apt/sources.list.d/kubewasm-src.sources >/dev/null <<EOF
# Added by kubewasm deploy/dev/local/cluster.sh: Kubernetes is built from Debian's source package.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    APT_UPDATED=
    apt_update_once
}

envtest_apiserver() {
    if [ -n "${TEST_ASSET_KUBE_APISERVER:-}" ] && [ -x "$TEST_ASSET_KUBE_APISERVER" ]; then
        echo "$TEST_ASSET_KUBE_APISERVER"
    elif [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/kube-apiserver" ]; then
        echo "$KUBEBUILDER_ASSETS/kube-apiserver"
    fi
}

envtest_etcd() {
    if [ -n "${TEST_ASSET_ETCD:-}" ] && [ -x "$TEST_ASSET_ETCD" ]; then
        echo "$TEST_ASSET_ETCD"
    elif [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/etcd" ]; then
        echo "$KUBEBUILDER_ASSETS/etcd"
    fi
}

# The stamp is written last, after every binary was renamed into place: a build that
# stopped half-way leaves no stamp and is not taken for a finished one. A cache made before
# the node existed has the stamp but no kubelet or kube-scheduler: `build` (and `up --node`)
# rebuild it, a plain `up` is content with it.
control_plane_cached() {
    [ -x "$BIN_DIR/kube-apiserver" ] && [ -x "$BIN_DIR/kube-controller-manager" ] &&
        [ "$(cat "$BIN_DIR/.stamp" 2>/dev/null)" = "$BUILD_STAMP" ]
}

binaries_cached() {
    local b
    control_plane_cached || return 1
    for b in "${K8S_BINARIES[@]}" pause; do
        [ -x "$BIN_DIR/$b" ] || return 1
    done
}

cmd_install() {
    local pkgs=("${TOOL_PACKAGES[@]}" "${NODE_PACKAGES[@]}")
    [ -z "$(envtest_etcd)" ] && pkgs+=(etcd-server)
    if [ -z "$(envtest_apiserver)" ] && ! binaries_cached; then
        pkgs+=("${BUILD_PACKAGES[@]}")
        ensure_deb_src
    fi
    apt_install "${pkgs[@]}"
    if [ -z "$(envtest_etcd)" ] && ! command -v etcd >/dev/null; then
        die "etcd-server is installed but no etcd binary is on PATH"
    fi
}

# ---------------------------------------------------------------------------------------
# build

cmd_build() {
    if [ -n "$(envtest_apiserver)" ]; then
        log "using envtest kube-apiserver $(envtest_apiserver); nothing to build"
        return 0
    fi
    if binaries_cached; then
        log "${K8S_BINARIES[*]} v$K8S_VERSION and pause cached in $BIN_DIR"
        return 0
    fi
    cmd_install
    mkdir -p "$K8S_DIR"
    # One build at a time per cache; a second caller waits and then finds the binaries.
    # (A subshell, so that no process started later inherits the lock.)
    (
        flock 9
        if binaries_cached; then
            log "binaries built by another process meanwhile"
        else
            build_locked
        fi
    ) 9>"$K8S_DIR/build.lock"
}

build_locked() {
    local started=$SECONDS work=$K8S_DIR/work
    rm -rf "$work"
    mkdir -p "$work/src"
    log "downloading Debian's kubernetes $K8S_VERSION source package into $work/src"
    (cd "$work/src" && apt-get source --download-only kubernetes >&2) \
        || die "apt-get source kubernetes failed (is there a deb-src entry?)"
    # Debian calls it e.g. 1.20.5+really1.20.2-1.1+deb12u1: the 1.20.2 tree with patches.
    local dsc
    dsc=$(find "$work/src" -maxdepth 1 -name "kubernetes_*$K8S_VERSION-*.dsc" | head -n1)
    [ -n "$dsc" ] || die "Debian's kubernetes source is not version $K8S_VERSION: $(ls "$work/src")"
    log "unpacking $(basename "$dsc")"
    dpkg-source --no-check -x "$dsc" "$work/tree" >&2
    patch_vendor "$work/tree"
    build_in_tree "$work"
    build_pause "$work"
    # Binaries land atomically: each is copied to a temporary name and renamed, and
    # the cache counts as built only when every final name and the stamp exist.
    mkdir -p "$BIN_DIR"
    rm -f "$BIN_DIR/.stamp"
    local b out
    for b in "${K8S_BINARIES[@]}" pause; do
        if [ "$b" = pause ]; then
            out=$work/pause
        else
            out=$(find "$work/tree/_output" -type f -name "$b" -perm -u+x | head -n1)
        fi
        [ -n "$out" ] || die "build produced no $b"
        cp "$out" "$BIN_DIR/.$b.tmp.$$"
        mv -f "$BIN_DIR/.$b.tmp.$$" "$BIN_DIR/$b"
    done
    echo "$BUILD_STAMP" >"$BIN_DIR/.stamp.tmp.$$"
    mv -f "$BIN_DIR/.stamp.tmp.$$" "$BIN_DIR/.stamp"
    # Removing the work tree (GOCACHE and all) takes a minute: do it in the background,
    # out of the lock (it must not inherit the lock's fd 9), so that nobody waits for it.
    mv "$work" "$work.done.$$"
    setsid rm -rf "$work.done.$$" >/dev/null 2>&1 </dev/null 9>&- &
    log "built ${K8S_BINARIES[*]} v$K8S_VERSION and pause in $((SECONDS - started))s -> $BIN_DIR"
}

# The pod sandbox's `pause`, as the Kubernetes image is made (build/pause/Makefile): the
# tree's pause.c, static. The node tags its image as the kubelet's default sandbox image.
build_pause() {
    local work=$1 src=$1/tree/build/pause/linux/pause.c
    [ -f "$src" ] || die "no $src in the Kubernetes tree"
    command -v gcc >/dev/null || die "gcc is missing (cluster.sh install installs gcc and libc6-dev)"
    gcc -Os -Wall -Werror -static -DVERSION=v$K8S_VERSION-kubewasm -o "$work/pause" "$src" >&2 ||
        die "compiling $src with gcc -static failed (is libc6-dev installed?)"
    strip "$work/pause" 2>/dev/null || true
}

# Kubernetes 1.20 vendors reflect2 1.0.1, which breaks on Go >= 1.18: kube-apiserver then
# panics decoding any JSON body with a map in it (labels, data...) — every kube-rs write.
# (kubectl and kube-controller-manager speak protobuf and never notice.) Debian's
# golang-github-modern-go-reflect2-dev is 1.0.2, the release that fixed it, same API.
patch_vendor() {
    local tree=$1 fixed=/usr/share/gocode/src/github.com/modern-go/reflect2
    local vendored=$tree/vendor/github.com/modern-go/reflect2
    [ -f "$fixed/go_above_118.go" ] || die "no reflect2 >= 1.0.2 in $fixed (golang-github-modern-go-reflect2-dev)"
    [ -d "$vendored" ] || die "no vendored reflect2 in $vendored"
    log "replacing the vendored reflect2 1.0.1 with Debian's $(dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev)"
    rm -rf "$vendored"
    mkdir -p "$vendored"
    find "$fixed" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) ! -name '*_test.go' \
        -exec cp {} "$vendored/" \;
    [ -f "$fixed/LICENSE" ] && cp "$fixed/LICENSE" "$vendored/"
    return 0
}

# Build the way Debian's debian/rules does: a GOPATH whose src/k8s.io/kubernetes is the
# tree, vendored modules, no cgo, no git, no network.
build_in_tree() {
    local work=$1 gopath=$1/gopath
    mkdir -p "$gopath/src/k8s.io" "$work/gocache"
    ln -sfn "$work/tree" "$gopath/src/k8s.io/kubernetes"
    log "building ${K8S_BINARIES[*]} (a few minutes; log: $work/build.log)"
    if ! (
        cd "$gopath/src/k8s.io/kubernetes"
        export GOPATH=$gopath GOCACHE=$work/gocache GO111MODULE=on GOFLAGS=-mod=vendor \
            GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local CGO_ENABLED=0 \
            KUBE_GIT_TREE_STATE=clean KUBE_GIT_VERSION=v$K8S_VERSION \
            KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=${K8S_VERSION#1.}
        KUBE_GIT_MINOR=${KUBE_GIT_MINOR%%.*}
        export KUBE_GIT_MINOR
        make WHAT="${K8S_BINARIES[*]/#/cmd/}" >"$work/build.log" 2>&1
    ); then
        tail -n 40 "$work/build.log" >&2
        die "build failed; full log in $work/build.log"
    fi
}

# ---------------------------------------------------------------------------------------
# processes and ports

# Alive and not a zombie (pid 1 here may not reap orphans).
alive() {
    local pid=$1 stat
    [ -n "$pid" ] && stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [ "${stat%% *}" != Z ]
}

# Start time of a process in clock ticks, to tell a pid from its reuse.
start_time() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    # shellcheck disable=SC2086
    set -- $stat
    echo "${20}"
}

port_in_use() {
    local hex
    hex=$(printf ':%04X' "$1")
    # Listening (state 0A) sockets on any address, IPv4 or IPv6.
    awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# A random free loopback port below the ephemeral range, so outgoing connections never take it.
PICKED=" "
free_port() {
    local port tries=0
    while :; do
        port=$((20000 + RANDOM % 12000))
        if [[ $PICKED != *" $port "* ]] && ! port_in_use "$port"; then
            PICKED+="$port "
            echo "$port"
            return 0
        fi
        tries=$((tries + 1))
        [ "$tries" -lt 200 ] || die "found no free port"
    done
}

# Start a component in its own session with every stream redirected, so that whoever runs
# `up` (a test harness reading our stdout to its end) is never held by it.
start_component() {
    local name=$1
    shift
    check_watched
    setsid "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null &
    echo $! >"$STATE/pids/$name.pid"
    log "started $name (pid $!, log $STATE/logs/$name.log)"
}

component_pid() { cat "$STATE/pids/$1.pid" 2>/dev/null || true; }

# Wait for `probe` to succeed; on timeout or death of the component, say what did not
# become ready, show the end of its log, stop everything and fail.
wait_ready() {
    local name=$1 what=$2 probe=$3 deadline=$((SECONDS + UP_TIMEOUT)) pid
    pid=$(component_pid "$name")
    while :; do
        if eval "$probe" >/dev/null 2>&1; then
            log "$name ready ($what) after $((SECONDS - UP_STARTED))s"
            return 0
        fi
        check_watched
        if ! alive "$pid"; then
            not_ready "$name" "$what" "$name exited"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            not_ready "$name" "$what" "timed out after ${UP_TIMEOUT}s (KUBEWASM_UP_TIMEOUT)"
        fi
        sleep 0.2
    done
}

# The last lines of a log before any Go stack dump (a fatal klog line is followed by the
# stacks of every goroutine).
log_tail() {
    awk '/^goroutine [0-9]+ \[/ { exit } { print }' "$1" 2>/dev/null | tail -n "$2"
}

# With --watch-pid: once the watched process is gone, `up` gives up (its EXIT trap stops
# what it started) rather than start more behind the watchdog's back.
WATCH_PID=
WATCH_START=
watched_alive() { alive "$1" && [ "$(start_time "$1")" = "$2" ]; }
check_watched() {
    if [ -n "$WATCH_PID" ] && ! watched_alive "$WATCH_PID" "$WATCH_START"; then
        die "watched pid $WATCH_PID is gone: giving up"
    fi
}

# EXIT trap of `up`: whatever made it stop before the end (an error, a signal, a component
# that did not become ready), it leaves nothing running.
up_exit() {
    local status=$?
    if [ "$status" -ne 0 ]; then
        log "up failed (status $status): stopping what it started"
        stop_all
    fi
    rm -f "$STATE/up.pid"
}

not_ready() {
    local name=$1 what=$2 why=$3
    log "error: $name did not become ready ($what): $why. Last lines of $STATE/logs/$name.log:"
    log_tail "$STATE/logs/$name.log" 25 >&2 || true
    if grep -qE '^[EF][0-9]{4} ' "$STATE/logs/$name.log" 2>/dev/null; then
        log "its last error lines (klog E/F):"
        grep -E '^[EF][0-9]{4} ' "$STATE/logs/$name.log" | tail -n 8 >&2 || true
    fi
    if [ "$name" = kubelet ]; then
        node_not_ready_help
    fi
    if [ "$name" = kube-apiserver ] && alive "$(component_pid kube-apiserver)"; then
        log "checks that /readyz reports failing:"
        curl -sS --max-time 5 --cacert "$STATE/pki/ca.crt" -H "Authorization: Bearer $TOKEN" \
            "https://127.0.0.1:$APISERVER_PORT/readyz?verbose" 2>&1 | grep -v '^\[+\]' >&2 || true
    fi
    stop_all
    exit 1
}

# ---------------------------------------------------------------------------------------
# state directory

resolve_state() {
    STATE=${1:-${KUBEWASM_CLUSTER_DIR:-$CACHE/clusters/default}}
    mkdir -p "$STATE"
    STATE=$(cd "$STATE" && pwd -P)
    KUBECONFIG_FILE=$STATE/kubeconfig
}

# Every process we start names the state directory in its arguments: a recorded pid whose
# command line does not is a reused pid, never ours to signal.
owned_by_state() {
    tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$STATE"
}

running_pids() {
    local f pid
    for f in "$STATE"/pids/*.pid; do
        [ -e "$f" ] || continue
        pid=$(cat "$f")
        if alive "$pid" && owned_by_state "$pid"; then echo "$pid"; fi
    done
    return 0
}

is_running() { [ -n "$(running_pids)" ]; }

stop_pid() {
    local name=$1 pid=$2 deadline
    alive "$pid" && owned_by_state "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    deadline=$((SECONDS + 15))
    while alive "$pid"; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            log "$name (pid $pid) ignored SIGTERM for 15s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            deadline=$((SECONDS + 5))
        fi
        sleep 0.1
    done
}

stop_all() {
    local name pid
    # The watchdog's pid file goes first: a watchdog that sees it gone exits by itself.
    pid=$(component_pid watchdog)
    rm -f "$STATE/pids/watchdog.pid"
    # The node first (the kubelet, its containers, containerd...), while the API still answers.
    if [ -d "$STATE/node" ] || [ "$(owner_dir)" = "$STATE" ]; then
        node_down
    fi
    for name in kube-controller-manager kube-apiserver etcd; do
        stop_pid "$name" "$(component_pid "$name")"
        rm -f "$STATE/pids/$name.pid"
    done
    # Never signal ourselves: the watchdog runs stop_all too.
    if [ -n "$pid" ] && [ "$pid" != "$$" ]; then
        stop_pid watchdog "$pid"
    fi
    rm -rf "$STATE/etcd-data"
}

# ---------------------------------------------------------------------------------------
# up

resolve_binaries() {
    APISERVER=$(envtest_apiserver)
    ETCD=$(envtest_etcd)
    KCM=
    if [ -n "$APISERVER" ]; then
        log "using envtest kube-apiserver $APISERVER"
        local dir
        dir=$(dirname "$APISERVER")
        if [ -n "${TEST_ASSET_KUBE_CONTROLLER_MANAGER:-}" ] && [ -x "$TEST_ASSET_KUBE_CONTROLLER_MANAGER" ]; then
            KCM=$TEST_ASSET_KUBE_CONTROLLER_MANAGER
        elif [ -x "$dir/kube-controller-manager" ]; then
            KCM=$dir/kube-controller-manager
        else
            log "no kube-controller-manager next to it: running without one" \
                "(no Deployments -> Pods, no garbage collection, no default ServiceAccounts)"
        fi
    else
        # A plain control plane is content with a cache made before the node existed.
        if [ -n "$NODE" ] || ! control_plane_cached; then
            cmd_build
        fi
        APISERVER=$BIN_DIR/kube-apiserver
        KCM=$BIN_DIR/kube-controller-manager
    fi
    if [ -n "$NODE" ]; then
        [ -z "$(envtest_apiserver)" ] ||
            die "up --node runs the kubelet and kube-scheduler built by 'cluster.sh build', not envtest binaries: unset KUBEBUILDER_ASSETS/TEST_ASSET_*"
        [ -n "$KCM" ] || die "up --node needs kube-controller-manager"
    fi
    local b
    for b in "${TOOL_PACKAGES[@]}"; do
        command -v "$b" >/dev/null || cmd_install
    done
    if [ -z "$ETCD" ]; then
        command -v etcd >/dev/null || cmd_install
        ETCD=$(command -v etcd)
    fi
}

# Minor version of a Kubernetes binary ("Kubernetes v1.20.2" -> 20).
minor_version() {
    "$1" --version 2>/dev/null | sed -nE 's/^Kubernetes v1\.([0-9]+).*/\1/p'
}

make_pki() {
    local pki=$STATE/pki
    mkdir -p "$pki"
    (
        cd "$pki"
        # A CA and a leaf signed by it: rustls (kube-rs) refuses a self-signed server cert.
        openssl ecparam -name prime256v1 -genkey -noout -out ca.key
        openssl req -x509 -new -key ca.key -sha256 -days 3650 -subj "/CN=kubewasm-local-ca" \
            -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.crt
        openssl ecparam -name prime256v1 -genkey -noout -out apiserver.key
        openssl req -new -key apiserver.key -subj "/CN=kube-apiserver" -out apiserver.csr
        {
            echo "basicConstraints=critical,CA:FALSE"
            echo "keyUsage=critical,digitalSignature,keyEncipherment"
            echo "extendedKeyUsage=serverAuth"
            echo "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
        } >apiserver.ext
        openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
            -sha256 -days 3650 -extfile apiserver.ext -out apiserver.crt
        # The aggregation layer's front proxy: a CA of its own (what an extension API server
        # such as kubewasm's log server trusts, read from the ConfigMap
        # kube-system/extension-apiserver-authentication) and the client certificate the
        # kube-apiserver presents when it proxies to one.
        openssl ecparam -name prime256v1 -genkey -noout -out front-proxy-ca.key
        openssl req -x509 -new -key front-proxy-ca.key -sha256 -days 3650 \
            -subj "/CN=kubewasm-local-front-proxy-ca" \
            -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign" -out front-proxy-ca.crt
        openssl ecparam -name prime256v1 -genkey -noout -out front-proxy-client.key
        openssl req -new -key front-proxy-client.key -subj "/CN=front-proxy-client" \
            -out front-proxy-client.csr
        {
            echo "basicConstraints=critical,CA:FALSE"
            echo "keyUsage=critical,digitalSignature,keyEncipherment"
            echo "extendedKeyUsage=clientAuth"
        } >front-proxy-client.ext
        openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt \
            -CAkey front-proxy-ca.key -CAcreateserial -sha256 -days 3650 \
            -extfile front-proxy-client.ext -out front-proxy-client.crt
        # ServiceAccount token signing key (TokenRequest, and the token controller before 1.24).
        openssl genrsa -out sa.key 2048
        openssl rsa -in sa.key -pubout -out sa.pub
    ) >"$STATE/logs/pki.log" 2>&1 || { cat "$STATE/logs/pki.log" >&2; die "openssl failed"; }
    chmod 600 "$pki"/*.key
}

write_kubeconfig() {
    local file=$1 token=$2 name
    name=kubewasm-$(basename "$STATE")
    (
        umask 077
        printf '%s\n' \
            "apiVersion: v1" \
            "kind: Config" \
            "clusters:" \
            "- name: $name" \
            "  cluster:" \
            "    server: https://127.0.0.1:$APISERVER_PORT" \
            "    certificate-authority-data: $(base64 -w0 <"$STATE/pki/ca.crt")" \
            "users:" \
            "- name: admin" \
            "  user:" \
            "    token: $token" \
            "contexts:" \
            "- name: $name" \
            "  context:" \
            "    cluster: $name" \
            "    user: admin" \
            "current-context: $name" >"$file.tmp"
        mv -f "$file.tmp" "$file"
    )
}

# GET a path on the API server as admin; fails unless HTTP 2xx.
api_get() {
    curl -fsS --max-time 5 --cacert "$STATE/pki/ca.crt" -H "Authorization: Bearer $TOKEN" \
        "https://127.0.0.1:$APISERVER_PORT$1"
}

cmd_up() {
    local watch_pid=
    NODE=
    while [ $# -gt 0 ]; do
        case "$1" in
            --node) NODE=1; shift ;;
            --watch-pid) watch_pid=${2:?--watch-pid needs a pid}; shift 2 ;;
            --watch-pid=*) watch_pid=${1#*=}; shift ;;
            -*) die "up: unknown option $1" ;;
            *) break ;;
        esac
    done
    [ $# -le 1 ] || die "up: one state directory only (got: $*)"
    resolve_state "${1:-}"
    # A control plane started by an older cluster.sh has no aggregation layer (no front-proxy
    # CA): stopped and started again with it, rather than reused without it.
    if is_running && [ ! -f "$STATE/pki/front-proxy-ca.crt" ]; then
        log "the control plane in $STATE predates the aggregation layer: restarting it"
        stop_all
    fi
    if is_running; then
        if [ -n "$watch_pid" ]; then
            die "a control plane already runs in $STATE; run '$0 down $STATE' first"
        fi
        if [ -n "$NODE" ] && [ "$(owner_dir)" != "$STATE" ]; then
            die "a control plane without a node runs in $STATE; run '$0 down $STATE' first"
        fi
        log "a control plane already runs in $STATE"
        echo "export KUBECONFIG=$KUBECONFIG_FILE"
        return 0
    fi
    [ -z "$NODE" ] || require_root "up --node"
    if [ -n "$watch_pid" ] && ! alive "$watch_pid"; then
        die "--watch-pid $watch_pid: no such process"
    fi
    if [ -n "$watch_pid" ]; then
        WATCH_PID=$watch_pid
        WATCH_START=$(start_time "$watch_pid")
    fi
    resolve_binaries
    UP_STARTED=$SECONDS
    echo $$ >"$STATE/up.pid"
    trap up_exit EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    if [ -n "$NODE" ]; then
        # One node per machine; also cleans up after a node that was not stopped.
        node_claim
    elif [ -d "$STATE/node" ] && [ "$(owner_dir)" = "$STATE" ]; then
        stop_all # what is left of a node that ran in this directory
    fi
    # A fresh state every time: data, keys, token, logs.
    rm -rf "$STATE/etcd-data" "$STATE/pki" "$STATE/logs" "$STATE/pids" "$STATE/node" \
        "$KUBECONFIG_FILE" "$STATE/cluster.env" "$STATE/tokens.csv"
    mkdir -p "$STATE/logs" "$STATE/pids"
    if [ -n "$NODE" ]; then
        node_preflight
        node_images
        node_record
    fi
    make_pki
    [ -z "$NODE" ] || node_pki
    TOKEN=$(openssl rand -hex 24)
    (umask 077 && printf '%s,admin,admin,"system:masters"\n' "$TOKEN" >"$STATE/tokens.csv")

    local etcd_port etcd_peer_port minor
    etcd_port=$(free_port)
    etcd_peer_port=$(free_port)
    APISERVER_PORT=$(free_port)

    # The watchdog first, so that even an `up` that fails or is killed leaves nothing behind.
    if [ -n "$watch_pid" ]; then
        setsid "$SELF" __watchdog "$WATCH_PID" "$WATCH_START" "$STATE" \
            >"$STATE/logs/watchdog.log" 2>&1 </dev/null &
        echo $! >"$STATE/pids/watchdog.pid"
        log "watchdog (pid $!) stops this control plane once pid $watch_pid is gone"
    fi

    start_component etcd "$ETCD" --name default --data-dir "$STATE/etcd-data" \
        --listen-client-urls "http://127.0.0.1:$etcd_port" \
        --advertise-client-urls "http://127.0.0.1:$etcd_port" \
        --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
        --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
        --initial-cluster "default=http://127.0.0.1:$etcd_peer_port" \
        --initial-cluster-state new --unsafe-no-fsync
    wait_ready etcd "GET http://127.0.0.1:$etcd_port/health" \
        "curl -fsS --max-time 2 http://127.0.0.1:$etcd_port/health | grep -q '\"health\":\"true\"'"

    local apiserver_args=(
        --etcd-servers="http://127.0.0.1:$etcd_port"
        --bind-address=127.0.0.1 --advertise-address=127.0.0.1
        --secure-port="$APISERVER_PORT"
        --cert-dir="$STATE/pki"
        --tls-cert-file="$STATE/pki/apiserver.crt" --tls-private-key-file="$STATE/pki/apiserver.key"
        --token-auth-file="$STATE/tokens.csv"
        --authorization-mode="$([ -n "$NODE" ] && echo Node,RBAC || echo RBAC)"
        --service-account-key-file="$STATE/pki/sa.pub"
        --service-account-signing-key-file="$STATE/pki/sa.key"
        --service-account-issuer=https://kubernetes.default.svc
        --api-audiences=https://kubernetes.default.svc
        --service-cluster-ip-range=10.0.0.0/24
        --allow-privileged=true
        # KUBEWASM_APISERVER_PROFILING=true serves /debug/pprof (e.g. to see what a bench costs it).
        --profiling="${KUBEWASM_APISERVER_PROFILING:-false}"
        # The aggregation layer (APIServices such as logs.kubewasm.dev): the front proxy's
        # client certificate and the headers that carry the user to the extension server;
        # routing to the Endpoints' addresses, as there is no kube-proxy.
        --requestheader-client-ca-file="$STATE/pki/front-proxy-ca.crt"
        --requestheader-allowed-names=front-proxy-client
        --requestheader-username-headers=X-Remote-User
        --requestheader-group-headers=X-Remote-Group
        --requestheader-extra-headers-prefix=X-Remote-Extra-
        --proxy-client-cert-file="$STATE/pki/front-proxy-client.crt"
        --proxy-client-key-file="$STATE/pki/front-proxy-client.key"
        --enable-aggregator-routing=true
    )
    minor=$(minor_version "$APISERVER")
    # 1.20 still serves plain HTTP on 8080 unless told not to (the flag is gone in 1.24).
    if [ -n "$minor" ] && [ "$minor" -lt 24 ]; then
        apiserver_args+=(--insecure-port=0)
    fi
    # Without kube-controller-manager nobody creates the `default` ServiceAccount (nor, before
    # 1.24, its token Secret), and the ServiceAccount admission plugin would reject every Pod.
    if [ -z "$KCM" ]; then
        apiserver_args+=(--disable-admission-plugins=ServiceAccount)
    fi
    if [ -n "$NODE" ]; then
        # Node identities (Node authorizer, NodeRestriction), the kubelet's client certificate
        # and serving CA, and its InternalIP for logs/exec (no name to resolve).
        local a
        while IFS= read -r a; do apiserver_args+=("$a"); done < <(node_apiserver_args)
    fi
    start_component kube-apiserver "$APISERVER" "${apiserver_args[@]}"
    wait_ready kube-apiserver "GET https://127.0.0.1:$APISERVER_PORT/readyz as admin" \
        "api_get /readyz | grep -qx ok"
    write_kubeconfig "$KUBECONFIG_FILE" "$TOKEN"

    if [ -n "$KCM" ]; then
        # With a node, also the node lifecycle controller (only it removes the kubelet's
        # not-ready taint), attach/detach and TTL.
        local controllers='*,-nodelifecycle,-nodeipam,-cloud-node-lifecycle,-route,-service,-attachdetach,-persistentvolume-expander,-horizontalpodautoscaling,-csrsigning,-csrapproving,-csrcleaner,-ttl'
        [ -z "$NODE" ] || controllers='*,-nodeipam,-cloud-node-lifecycle,-route,-service,-persistentvolume-expander,-horizontalpodautoscaling,-csrsigning,-csrapproving,-csrcleaner'
        # KUBEWASM_NO_TOKEN_CONTROLLER=1: no token Secret per ServiceAccount, as from 1.24 on
        # (the density bench: 1.20's token controller writes 20,000 of them for 10,000
        # namespaces, ~7 a second, for most of an hour). Pods then cannot be created in 1.20.
        [ "${KUBEWASM_NO_TOKEN_CONTROLLER:-}" != 1 ] || controllers="$controllers,-serviceaccount-token"
        local kcm_args=(
            --kubeconfig="$KUBECONFIG_FILE"
            --leader-elect=false
            --use-service-account-credentials=false
            --service-account-private-key-file="$STATE/pki/sa.key"
            --root-ca-file="$STATE/pki/ca.crt"
            --cluster-name="kubewasm-$(basename "$STATE")"
            # No nodes, no cloud, no CSRs, no metrics: what a control plane without a kubelet
            # can do (Deployments, ReplicaSets, GC, namespaces, ServiceAccounts, Jobs...).
            --controllers="$controllers"
            --secure-port=0
        )
        [ -z "$NODE" ] || kcm_args+=(--node-monitor-period=2s)
        minor=$(minor_version "$KCM")
        if [ -n "$minor" ] && [ "$minor" -lt 22 ]; then
            kcm_args+=(--port=0)
        fi
        start_component kube-controller-manager "$KCM" "${kcm_args[@]}"
        # Its serviceaccount controller creating default/default shows that it works.
        wait_ready kube-controller-manager "ServiceAccount default/default created" \
            "api_get /api/v1/namespaces/default/serviceaccounts/default"
    fi
    [ -z "$NODE" ] || node_up

    {
        echo "KUBEWASM_APISERVER_PORT=$APISERVER_PORT"
        echo "KUBEWASM_ETCD_PORT=$etcd_port"
        echo "KUBEWASM_ETCD_PEER_PORT=$etcd_peer_port"
        echo "KUBEWASM_KUBE_CONTROLLER_MANAGER=$([ -n "$KCM" ] && echo true || echo false)"
        echo "KUBEWASM_KUBE_VERSION=$("$APISERVER" --version 2>/dev/null | awk '{print $2}')"
        if [ -n "$NODE" ]; then
            echo "KUBEWASM_NODE=true"
            echo "KUBEWASM_NODE_NAME=$NODE_NAME"
            echo "KUBEWASM_NODE_IP=$NODE_IP"
            echo "KUBEWASM_REGISTRY=$REGISTRY_ADDR"
            echo "KUBEWASM_CONTAINERD_SOCK=$CONTAINERD_SOCK"
            echo "KUBEWASM_POD_SUBNET=$POD_SUBNET"
            echo "KUBEWASM_NODE_READY_SECONDS=$NODE_READY_AFTER"
        else
            echo "KUBEWASM_NODE=false"
        fi
    } >"$STATE/cluster.env"
    trap - EXIT INT TERM
    rm -f "$STATE/up.pid"
    if [ -n "$NODE" ]; then
        log "cluster with node $NODE_NAME up in $((SECONDS - UP_STARTED))s: https://127.0.0.1:$APISERVER_PORT (state in $STATE)"
    else
        log "control plane up in $((SECONDS - UP_STARTED))s: https://127.0.0.1:$APISERVER_PORT (state in $STATE)"
    fi
    echo "export KUBECONFIG=$KUBECONFIG_FILE"
}

# Runs detached (setsid): polls the watched pid and stops the control plane once it is gone
# (or its pid was reused), or exits quietly once the control plane was stopped otherwise.
cmd_watchdog() {
    local pid=$1 started=$2
    resolve_state "$3"
    while watched_alive "$pid" "$started"; do
        sleep 1
        [ -e "$STATE/pids/watchdog.pid" ] || exit 0
    done
    log "watched pid $pid is gone: stopping the control plane in $STATE"
    stop_all
    # An `up` still under way notices too and stops what it started; make sure of it.
    local up_pid deadline=$((SECONDS + 60))
    up_pid=$(cat "$STATE/up.pid" 2>/dev/null || true)
    if [ -n "$up_pid" ] && alive "$up_pid"; then
        log "waiting for the unfinished 'up' (pid $up_pid) to end"
        while alive "$up_pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
        stop_all
    fi
    log "stopped"
}

cmd_down() {
    resolve_state "${1:-}"
    if is_running; then
        stop_all
        log "stopped the control plane in $STATE"
    else
        stop_all
        log "no control plane runs in $STATE"
    fi
}

cmd_env() {
    resolve_state "${1:-}"
    is_running || die "no control plane runs in $STATE (start one with: $0 up $STATE)"
    echo "export KUBECONFIG=$KUBECONFIG_FILE"
}

cmd_status() {
    resolve_state "${1:-}"
    local name pid
    for name in etcd kube-apiserver kube-controller-manager "${NODE_COMPONENTS[@]}" watchdog; do
        pid=$(component_pid "$name")
        if [ -z "$pid" ] && { [ "$name" = watchdog ] || [[ " ${NODE_COMPONENTS[*]} " == *" $name "* ]]; }; then
            continue
        elif alive "$pid" && owned_by_state "$pid"; then
            log "$name: running (pid $pid)"
        else
            log "$name: not running"
        fi
    done
    is_running
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    install) cmd_install ;;
    build) cmd_build ;;
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    env) cmd_env "$@" ;;
    status) cmd_status "$@" ;;
    images) cmd_images "$@" ;;
    image-push) cmd_image_push "$@" ;;
    __watchdog) cmd_watchdog "$@" ;;
    *) die "usage: cluster.sh install | build | up [--node] [--watch-pid PID] [DIR] | down [DIR] | env [DIR] | status [DIR] | images | image-push ARCHIVE NAME[:TAG]" ;;
esac
