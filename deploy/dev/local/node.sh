# shellcheck shell=bash
# The local cluster's node, sourced by cluster.sh (`up --node`, and `down`/the watchdog of a
# cluster started so): kube-scheduler, a local registry, containerd and the kubelet. See
# deploy/dev/local/README.md ("The node").
#
# One node per machine: the kubelet's ports (10250, 10248), the kubepods cgroups, the
# iptables rules and the kernel settings it changes are the machine's. A node's files are in
# fixed places (short unix socket paths, whatever the state directory):
#   $NODE_RUN  (/run/kubewasm-node)        containerd's socket and state, runc's state, the
#                                          pods' network namespaces, `owner` (the state dir)
#   $NODE_ROOT (/var/lib/kubewasm-node)    the kubelet's root dir, containerd's root, IPAM
# Both are emptied at `up` and removed at `down`. Configuration, certificates, logs and what
# `down` must restore are in the state directory (node/, pki/, logs/).

NODE_RUN=/run/kubewasm-node
NODE_ROOT=${KUBEWASM_NODE_ROOT:-/var/lib/kubewasm-node}
NODE_LOCK=/run/lock/kubewasm-node.lock
NODE_OWNER=$NODE_RUN/owner
NODE_NAME=${KUBEWASM_NODE_NAME:-kubewasm-node}
REGISTRY_PORT=${KUBEWASM_REGISTRY_PORT:-5000}
REGISTRY_ADDR=127.0.0.1:$REGISTRY_PORT
POD_SUBNET=${KUBEWASM_POD_SUBNET:-10.88.0.0/16}
CNI_NETWORK=kubewasm
CNI_BRIDGE=kubewasm0
CNI_BIN_DIR=/usr/lib/cni
# The `kubernetes` Service's ClusterIP: the first address of the API server's
# --service-cluster-ip-range (10.0.0.0/24).
KUBERNETES_SERVICE_IP=10.0.0.1
# The kubelet's default sandbox image in 1.20 (dockershim's defaultSandboxImage).
PAUSE_IMAGE=k8s.gcr.io/pause:3.2
IMAGES_DIR=$CACHE/images
REGISTRY_STORAGE=$CACHE/registry
CONTAINERD_SOCK=$NODE_RUN/containerd.sock
KUBELET_PORTS=(10250 10248)
# What the kubelet (setupKernelTunables) and the CNI bridge (ip_forward) change.
NODE_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
    kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
    net.ipv6.conf.all.forwarding)
# Paths the kubelet, libcni and containerd-shim use whatever they are told: `down` removes
# them if `up` found them missing, else only the entries `up` did not find there.
NODE_HOST_PATHS=(/var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni /run/containerd)
# shellcheck disable=SC2034 # used by cluster.sh
NODE_COMPONENTS=(kubelet containerd registry kube-scheduler)

require_root() {
    [ "$(id -u)" -eq 0 ] || die "$1 needs root (containerd, runc, mounts, cgroups, iptables)"
}

ctr_() { ctr --address "$CONTAINERD_SOCK" "$@"; }

# ---------------------------------------------------------------------------------------
# one node per machine

# The owner file: the state directory, and the pid + start time of its `up`.
owner_dir() { sed -n 1p "$NODE_OWNER" 2>/dev/null || true; }

# Does anything of the cluster in state directory $1 run (its `up`, or a recorded process)?
state_alive() {
    local dir=$1 up_pid up_start f pid
    if [ "$(owner_dir)" = "$dir" ]; then
        up_pid=$(sed -n 2p "$NODE_OWNER" 2>/dev/null || true)
        up_start=$(sed -n 3p "$NODE_OWNER" 2>/dev/null || true)
        if [ -n "$up_pid" ] && watched_alive "$up_pid" "$up_start"; then return 0; fi
    fi
    for f in "$dir"/pids/*.pid; do
        [ -e "$f" ] || continue
        pid=$(cat "$f")
        if alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir"; then
            return 0
        fi
    done
    return 1
}

# Claims the machine's node for $STATE, or fails naming the state directory of the node that
# runs. A node whose cluster no longer runs (killed, crashed) is cleaned up first.
node_claim() {
    local owner
    mkdir -p "$(dirname "$NODE_LOCK")"
    exec 8>"$NODE_LOCK"
    flock -w 60 8 || die "could not lock $NODE_LOCK within 60s"
    owner=$(owner_dir)
    if [ -n "$owner" ] && [ "$owner" != "$STATE" ] && state_alive "$owner"; then
        exec 8>&-
        die "a node already runs on this machine, in $owner (one node per machine): stop it with '$SELF down $owner'"
    fi
    if [ -n "$owner" ]; then
        log "the node of $owner was not stopped (its processes are gone): cleaning up after it"
        (resolve_state "$owner" && stop_all) || log "warning: cleaning up after the node of $owner failed"
    fi
    mkdir -p "$NODE_RUN"
    printf '%s\n%s\n%s\n' "$STATE" "$$" "$(start_time $$)" >"$NODE_OWNER"
    exec 8>&-
}

# ---------------------------------------------------------------------------------------
# up

# The node's InternalIP: what the API server dials for logs/exec/port-forward. Not loopback
# (the kubelet refuses it): the address of the default route's interface, else any global
# IPv4 address. KUBEWASM_NODE_IP overrides it.
node_ip() {
    local ip=${KUBEWASM_NODE_IP:-}
    if [ -z "$ip" ]; then
        ip=$(ip -4 -o route get 192.0.2.255 2>/dev/null | sed -nE 's/.* src ([0-9.]+).*/\1/p' | head -n1)
    fi
    if [ -z "$ip" ]; then
        ip=$(ip -4 -o addr show scope global 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -n1)
    fi
    [ -n "$ip" ] || die "found no non-loopback IPv4 address for the node; set KUBEWASM_NODE_IP to one of this machine's addresses"
    ip -4 -o addr show 2>/dev/null | awk '{ print $4 }' | cut -d/ -f1 | grep -qxF -- "$ip" ||
        die "KUBEWASM_NODE_IP=$ip is not an address of this machine ($(ip -4 -o addr show | awk '{ print $4 }' | tr '\n' ' '))"
    echo "$ip"
}

# Everything that can fail before a process starts: packages, ports, leftovers of others.
node_preflight() {
    local p b
    for b in containerd ctr runc docker-registry iptables ip jq gzip; do
        command -v "$b" >/dev/null || cmd_install
    done
    for p in bridge host-local portmap loopback; do
        [ -x "$CNI_BIN_DIR/$p" ] || die "no CNI plugin $CNI_BIN_DIR/$p (package containernetworking-plugins)"
    done
    for p in "${KUBELET_PORTS[@]}"; do
        port_in_use "$p" && die "port $p (the kubelet's) is taken: is another kubelet running? ($(port_owner "$p"))"
    done
    port_in_use "$REGISTRY_PORT" &&
        die "port $REGISTRY_PORT (the node's registry, KUBEWASM_REGISTRY_PORT) is taken ($(port_owner "$REGISTRY_PORT"))"
    if ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then
        die "network interface $CNI_BRIDGE exists: left by another node? Remove it with 'ip link del $CNI_BRIDGE'"
    fi
    local d
    for d in $(cgroup_mounts); do
        [ -d "$d/kubepods" ] &&
            die "cgroup $d/kubepods exists: another kubelet runs or ran on this machine (one node per machine)"
    done
    NODE_IP=$(node_ip)
}

port_owner() {
    local inode pid fd
    inode=$(awk -v p="$(printf ':%04X' "$1")" '$4 == "0A" && substr($2, length($2) - 4) == p { print $10; exit }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null)
    [ -n "$inode" ] || { echo "unknown process"; return; }
    for pid in /proc/[0-9]*; do
        for fd in "$pid"/fd/*; do
            if [ "$(readlink "$fd" 2>/dev/null)" = "socket:[$inode]" ]; then
                echo "pid ${pid#/proc/}: $(tr '\0' ' ' <"$pid/cmdline" | cut -c1-120)"
                return
            fi
        done
    done
    echo "unknown process"
}

cgroup_mounts() {
    awk '$9 == "cgroup" || $9 == "cgroup2" { print $5 }' /proc/self/mountinfo 2>/dev/null | sort -u
}

# What `down` restores: the sysctls, the iptables rules, which host paths existed.
node_record() {
    local dir=$STATE/node/before k f
    rm -rf "$dir"
    mkdir -p "$dir"
    for k in "${NODE_SYSCTLS[@]}"; do
        f=/proc/sys/${k//.//}
        [ -r "$f" ] && printf '%s=%s\n' "$k" "$(cat "$f")"
    done >"$dir/sysctl"
    for f in iptables ip6tables; do
        if command -v "$f-save" >/dev/null; then
            "$f-save" >"$dir/$f" 2>/dev/null || rm -f "$dir/$f"
        fi
    done
    for f in "${NODE_HOST_PATHS[@]}"; do
        if [ -e "$f" ]; then
            echo "$f" >>"$dir/paths"
            ls -A "$f" >"$dir/entries${f//\//_}" 2>/dev/null || true
        fi
    done
    touch "$dir/paths"
}

# The node's PKI, signed by the cluster's CA: the kubelet's identity (a client certificate
# for system:node:NAME in system:nodes, which the Node authorizer and NodeRestriction know,
# also its serving certificate) and the API server's client certificate for the kubelet.
node_pki() {
    (
        cd "$STATE/pki"
        openssl ecparam -name prime256v1 -genkey -noout -out kubelet.key
        openssl req -new -key kubelet.key -subj "/O=system:nodes/CN=system:node:$NODE_NAME" -out kubelet.csr
        {
            echo "basicConstraints=critical,CA:FALSE"
            echo "keyUsage=critical,digitalSignature,keyEncipherment"
            echo "extendedKeyUsage=serverAuth,clientAuth"
            echo "subjectAltName=DNS:$NODE_NAME,IP:$NODE_IP,IP:127.0.0.1"
        } >kubelet.ext
        openssl x509 -req -in kubelet.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
            -sha256 -days 3650 -extfile kubelet.ext -out kubelet.crt
        openssl ecparam -name prime256v1 -genkey -noout -out apiserver-kubelet-client.key
        openssl req -new -key apiserver-kubelet-client.key \
            -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" -out apiserver-kubelet-client.csr
        printf '%s\n' "basicConstraints=critical,CA:FALSE" \
            "keyUsage=critical,digitalSignature,keyEncipherment" \
            "extendedKeyUsage=clientAuth" >client.ext
        openssl x509 -req -in apiserver-kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
            -sha256 -days 3650 -extfile client.ext -out apiserver-kubelet-client.crt
    ) >>"$STATE/logs/pki.log" 2>&1 || { cat "$STATE/logs/pki.log" >&2; die "openssl failed (node certificates)"; }
    chmod 600 "$STATE/pki"/*.key
}

# The API server's flags for a cluster with a node.
node_apiserver_args() {
    printf '%s\n' \
        --client-ca-file="$STATE/pki/ca.crt" \
        --enable-admission-plugins=NodeRestriction \
        --kubelet-client-certificate="$STATE/pki/apiserver-kubelet-client.crt" \
        --kubelet-client-key="$STATE/pki/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority="$STATE/pki/ca.crt" \
        --kubelet-preferred-address-types=InternalIP,Hostname
}

# ---------------------------------------------------------------------------------------
# images

# Builds (once per input) the pause and busybox images as `docker save` tarballs in
# $IMAGES_DIR; sets PAUSE_TAR and BUSYBOX_TAR.
node_images() {
    mkdir -p "$IMAGES_DIR"
    PAUSE_TAR=$IMAGES_DIR/pause-3.2.tar
    BUSYBOX_TAR=$IMAGES_DIR/busybox.tar
    (
        flock 9
        build_image_once "$PAUSE_TAR" "$BIN_DIR/pause" build_pause_image
        build_image_once "$BUSYBOX_TAR" /bin/busybox build_busybox_image
    ) 9>"$IMAGES_DIR/.lock"
}

# Rebuilds OUT when the binary it is made of changed (its sha256 is recorded next to it).
build_image_once() {
    local out=$1 input=$2 builder=$3 id
    [ -x "$input" ] || die "$input is missing (cluster.sh build makes pause; busybox-static has /bin/busybox)"
    id="$(sha256sum "$input" | cut -d' ' -f1) $(sha256sum "$HERE/image.sh" | cut -d' ' -f1)"
    if [ -f "$out" ] && [ "$(cat "$out.id" 2>/dev/null)" = "$id" ]; then
        return 0
    fi
    local root
    root=$(mktemp -d)
    "$builder" "$root" "$input" "$out" || { rm -rf "$root"; die "building $out failed"; }
    rm -rf "$root"
    echo "$id" >"$out.id"
    log "built image $out"
}

build_pause_image() {
    local root=$1 pause=$2 out=$3
    cp "$pause" "$root/pause"
    "$HERE/image.sh" build --rootfs "$root" --tag "$PAUSE_IMAGE" --entrypoint /pause \
        --user 65535:65535 "$out"
}

# FROM scratch: the static busybox and a symlink per applet (sh, echo, cat, sleep, ls, env,
# wget, date...), /etc/passwd and /etc/group, /tmp.
build_busybox_image() {
    local root=$1 busybox=$2 out=$3 applet
    file_is_static "$busybox" || die "$busybox is not statically linked (package busybox-static)"
    mkdir -p "$root/bin" "$root/etc" "$root/tmp" "$root/root"
    chmod 1777 "$root/tmp"
    chmod 700 "$root/root"
    cp "$busybox" "$root/bin/busybox"
    while IFS= read -r applet; do
        if [ -z "$applet" ] || [ "$applet" = bin/busybox ]; then continue; fi
        mkdir -p "$root/$(dirname "$applet")"
        ln -sf /bin/busybox "$root/$applet"
    done < <("$busybox" --list-full)
    for applet in sh echo cat sleep ls env wget date; do
        [ -e "$root/bin/$applet" ] || [ -e "$root/usr/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
    done
    printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' \
        >"$root/etc/passwd"
    printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$root/etc/group"
    "$HERE/image.sh" build --rootfs "$root" --tag docker.io/library/busybox:latest --cmd sh "$out"
}

# Statically linked ELF: no PT_INTERP program header.
file_is_static() {
    ! LC_ALL=C readelf -l "$1" 2>/dev/null | grep -q 'INTERP' && [ "$(head -c4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]
}

# ---------------------------------------------------------------------------------------
# components

node_write_configs() {
    local n=$STATE/node
    mkdir -p "$n/cni" "$n/certs.d/docker.io" "$n/certs.d/$REGISTRY_ADDR" "$n/certs.d/localhost:$REGISTRY_PORT"
    cat >"$n/registry.yml" <<EOF
# kubewasm's local registry (cluster.sh up --node), mirror of docker.io for the node.
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $REGISTRY_STORAGE
  delete:
    enabled: true
  cache:
    blobdescriptor: inmemory
http:
  addr: $REGISTRY_ADDR
EOF
    # Images of docker.io (`image: busybox`) come from the local registry; so do images named
    # 127.0.0.1:5000/... or localhost:5000/... (plain http).
    cat >"$n/certs.d/docker.io/hosts.toml" <<EOF
server = "https://registry-1.docker.io"

[host."http://$REGISTRY_ADDR"]
  capabilities = ["pull", "resolve"]
EOF
    local h
    for h in "$REGISTRY_ADDR" "localhost:$REGISTRY_PORT"; do
        cat >"$n/certs.d/$h/hosts.toml" <<EOF
server = "http://$REGISTRY_ADDR"

[host."http://$REGISTRY_ADDR"]
  capabilities = ["pull", "resolve", "push"]
EOF
    done
    cat >"$n/cni/10-$CNI_NETWORK.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$POD_SUBNET" }]],
        "routes": [{ "dst": "0.0.0.0/0" }],
        "dataDir": "$NODE_ROOT/cni/ipam"
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
    cat >"$n/containerd.toml" <<EOF
# kubewasm's node containerd (cluster.sh up --node): its own socket, root and state.
version = 2
root = "$NODE_ROOT/containerd"
state = "$NODE_RUN/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$CONTAINERD_SOCK"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$NODE_ROOT/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$PAUSE_IMAGE"
    # The machine lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj (as the kubelet
    # asks for sandboxes); with this containerd never asks for less than its own.
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          Root = "$NODE_RUN/runc"
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$CNI_BIN_DIR"
      conf_dir = "$n/cni"
      max_conf_num = 1
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "$n/certs.d"
EOF
    cat >"$n/kubelet.yaml" <<EOF
# kubewasm's node kubelet (cluster.sh up --node).
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $STATE/pki/kubelet.crt
tlsPrivateKeyFile: $STATE/pki/kubelet.key
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $STATE/pki/ca.crt
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
failSwapOn: false
nodeStatusUpdateFrequency: 1s
nodeStatusReportFrequency: 10s
syncFrequency: 10s
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
makeIPTablesUtilChains: false
serializeImagePulls: false
resolvConf: /etc/resolv.conf
EOF
    local name
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
            "- name: system:node:$NODE_NAME" \
            "  user:" \
            "    client-certificate-data: $(base64 -w0 <"$STATE/pki/kubelet.crt")" \
            "    client-key-data: $(base64 -w0 <"$STATE/pki/kubelet.key")" \
            "contexts:" \
            "- name: $name" \
            "  context:" \
            "    cluster: $name" \
            "    user: system:node:$NODE_NAME" \
            "current-context: $name" >"$n/kubelet.kubeconfig"
    )
}

node_ready_probe() {
    api_get "/api/v1/nodes/$NODE_NAME" | jq -e '
        ([.status.conditions[]? | select(.type == "Ready" and .status == "True")] | length) == 1
        and ([.spec.taints[]? | select(.key == "node.kubernetes.io/not-ready"
                                   or .key == "node.kubernetes.io/unreachable")] | length) == 0'
}

# After the control plane: kube-scheduler, registry, containerd (with the pause image), the
# busybox image pushed, the kubelet; returns once the Node is Ready and schedulable.
node_up() {
    local sched_port
    sched_port=$(free_port)
    start_component kube-scheduler "$BIN_DIR/kube-scheduler" \
        --kubeconfig="$KUBECONFIG_FILE" \
        --authentication-kubeconfig="$KUBECONFIG_FILE" \
        --authorization-kubeconfig="$KUBECONFIG_FILE" \
        --leader-elect=false --port=0 \
        --bind-address=127.0.0.1 --secure-port="$sched_port"
    wait_ready kube-scheduler "GET https://127.0.0.1:$sched_port/healthz" \
        "curl -ksf --max-time 2 https://127.0.0.1:$sched_port/healthz | grep -qx ok"

    node_write_configs
    mkdir -p "$REGISTRY_STORAGE"
    start_component registry docker-registry serve "$STATE/node/registry.yml"
    wait_ready registry "GET http://$REGISTRY_ADDR/v2/" "curl -fsS --max-time 2 http://$REGISTRY_ADDR/v2/"

    rm -rf "$NODE_ROOT" "${NODE_RUN:?}/containerd" "$NODE_RUN/runc"
    mkdir -p "$NODE_ROOT" "$NODE_RUN"
    start_component containerd containerd --config "$STATE/node/containerd.toml"
    wait_ready containerd "ctr version on $CONTAINERD_SOCK" "ctr_ version"
    ctr_ -n k8s.io images import "$PAUSE_TAR" >"$STATE/logs/images.log" 2>&1 ||
        { cat "$STATE/logs/images.log" >&2; die "ctr images import $PAUSE_TAR failed"; }
    log "imported $PAUSE_IMAGE into containerd after $((SECONDS - UP_STARTED))s"
    "$HERE/image.sh" push "$BUSYBOX_TAR" busybox:latest "$REGISTRY_ADDR" >>"$STATE/logs/images.log" 2>&1 ||
        { cat "$STATE/logs/images.log" >&2; die "pushing busybox to $REGISTRY_ADDR failed"; }
    log "pushed busybox:latest to $REGISTRY_ADDR after $((SECONDS - UP_STARTED))s"

    node_service_network

    start_component kubelet "$BIN_DIR/kubelet" \
        --config="$STATE/node/kubelet.yaml" \
        --kubeconfig="$STATE/node/kubelet.kubeconfig" \
        --container-runtime=remote \
        --container-runtime-endpoint="unix://$CONTAINERD_SOCK" \
        --root-dir="$NODE_ROOT/kubelet" \
        --cert-dir="$NODE_ROOT/kubelet/pki" \
        --hostname-override="$NODE_NAME" \
        --node-ip="$NODE_IP" \
        --pod-infra-container-image="$PAUSE_IMAGE" \
        --v=1
    NODE_STARTED=$SECONDS
    wait_ready kubelet "Node $NODE_NAME Ready, without the not-ready taint" node_ready_probe
    NODE_READY_AFTER=$((SECONDS - NODE_STARTED))
    log "node $NODE_NAME Ready ${NODE_READY_AFTER}s after the kubelet started"
}

# Pods reach the API server as in any cluster, through the `kubernetes` Service
# (https://10.0.0.1:443, the env KUBERNETES_SERVICE_HOST/PORT and the ServiceAccount token
# that in-cluster clients use), without kube-proxy: the pods' bridge, made here before the
# CNI plugin finds it, accepts packets for 127.0.0.1 (route_localnet, a setting of this
# interface only), and one DNAT rule sends what Pods send to 10.0.0.1:443 to the API server
# on 127.0.0.1. Nothing changes for the host's own traffic. hostNetwork Pods are not covered.
node_service_network() {
    ip link add "$CNI_BRIDGE" type bridge || die "could not create the pods' bridge $CNI_BRIDGE"
    ip link set "$CNI_BRIDGE" up
    echo 1 >"/proc/sys/net/ipv4/conf/$CNI_BRIDGE/route_localnet"
    if ! {
        iptables -t nat -N KUBEWASM-SERVICES &&
            iptables -t nat -A KUBEWASM-SERVICES -d "$KUBERNETES_SERVICE_IP/32" -p tcp --dport 443 \
                -m comment --comment "kubewasm: default/kubernetes" \
                -j DNAT --to-destination "127.0.0.1:$APISERVER_PORT" &&
            iptables -t nat -A PREROUTING -i "$CNI_BRIDGE" -j KUBEWASM-SERVICES
    }; then
        die "could not add the iptables rules of the kubernetes Service"
    fi
}

# Extra diagnostics when the kubelet does not get Ready.
node_not_ready_help() {
    log "containerd's last lines ($STATE/logs/containerd.log):"
    tail -n 10 "$STATE/logs/containerd.log" >&2 2>/dev/null || true
    log "Node $NODE_NAME's conditions:"
    api_get "/api/v1/nodes/$NODE_NAME" 2>/dev/null |
        jq -r '.status.conditions[]? | "  \(.type)=\(.status) \(.reason // ""): \(.message // "")"' >&2 || true
}

# ---------------------------------------------------------------------------------------
# down

# Stops the node of $STATE and undoes what it did to the machine. Safe to run more than
# once and on a node that only started half-way. Machine-wide things (containers, mounts,
# cgroups, iptables, sysctls, host paths) are touched only if this state directory owns the
# node (or nobody does) and `up` got as far as recording the machine's state (node/before:
# a preflight that failed on another kubelet's cgroups must not remove them).
node_down() {
    local owner name
    owner=$(owner_dir)
    stop_pid kubelet "$(component_pid kubelet)"
    rm -f "$STATE/pids/kubelet.pid"
    if [ -z "$owner" ] || [ "$owner" = "$STATE" ]; then
        node_remove_containers
    fi
    for name in containerd registry kube-scheduler; do
        stop_pid "$name" "$(component_pid "$name")"
        rm -f "$STATE/pids/$name.pid"
    done
    if [ -n "$owner" ] && [ "$owner" != "$STATE" ]; then
        return 0
    fi
    if [ -d "$STATE/node/before" ]; then
        node_kill_leftovers
        node_unmount
        node_remove_cgroups
        if ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then
            ip link del "$CNI_BRIDGE" || log "warning: could not delete interface $CNI_BRIDGE"
        fi
        node_restore_iptables
        node_restore_sysctls
        node_remove_host_paths
        rm -rf "$NODE_ROOT" "$STATE/node/before"
        rm -rf "$NODE_RUN"
    elif [ "$owner" = "$STATE" ]; then
        rm -f "$NODE_OWNER"
        rmdir "$NODE_RUN" 2>/dev/null || true
    fi
}

# Every container and sandbox of containerd's namespaces, killed and deleted while
# containerd still runs; then its shims exit by themselves (a second or two).
node_remove_containers() {
    local pid ns ids id deadline
    pid=$(component_pid containerd)
    alive "$pid" && owned_by_state "$pid" || return 0
    for ns in $(ctr_ namespaces ls -q 2>/dev/null); do
        for id in $(ctr_ -n "$ns" tasks ls -q 2>/dev/null); do
            ctr_ -n "$ns" tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true
        done
        # CRI deletes the tasks of containers that exited; what it leaves is deleted here.
        deadline=$((SECONDS + 5))
        while [ -n "$(ctr_ -n "$ns" tasks ls -q 2>/dev/null)" ] && [ "$SECONDS" -lt "$deadline" ]; do
            sleep 0.1
        done
        ids=$(ctr_ -n "$ns" tasks ls -q 2>/dev/null || true)
        # shellcheck disable=SC2086
        [ -z "$ids" ] || timeout 30 ctr_ -n "$ns" tasks rm -f $ids >/dev/null 2>&1 || true
        ids=$(ctr_ -n "$ns" containers ls -q 2>/dev/null || true)
        # shellcheck disable=SC2086
        [ -z "$ids" ] || ctr_ -n "$ns" containers rm $ids >/dev/null 2>&1 || true
    done
    deadline=$((SECONDS + 10))
    while [ -n "$(shim_pids)" ] && [ "$SECONDS" -lt "$deadline" ]; do
        sleep 0.1
    done
}

# The shims of our containerd (their command line names its socket).
shim_pids() {
    local f d
    grep -lsF -- "$CONTAINERD_SOCK" /proc/[0-9]*/cmdline 2>/dev/null | while IFS= read -r f; do
        d=${f%/cmdline}
        case "$(cat "$d/comm" 2>/dev/null)" in containerd-shim*) echo "${d#/proc/}" ;; esac
    done
}

# Whatever survived containerd: processes in the kubepods cgroups, shims of our containerd.
node_kill_leftovers() {
    local d pids tries=0
    while :; do
        pids=
        for d in $(cgroup_mounts); do
            [ -d "$d/kubepods" ] || continue
            pids+=" $(find "$d/kubepods" -name cgroup.procs -exec cat {} + 2>/dev/null | tr '\n' ' ')"
        done
        pids+=" $(shim_pids | tr '\n' ' ')"
        pids=$(echo "$pids" | tr ' ' '\n' | sed '/^$/d' | sort -u | tr '\n' ' ')
        [ -n "${pids// /}" ] || return 0
        [ "$tries" -eq 0 ] && log "killing what is left of the node's containers: pids $pids"
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
        tries=$((tries + 1))
        [ "$tries" -lt 50 ] || { log "warning: pids $pids would not die"; return 0; }
        sleep 0.1
    done
}

# Mount points under the node's directories (secrets' tmpfs, sandboxes' shm, rootfs
# overlays, network namespaces), deepest first.
node_unmount() {
    local m tries
    for tries in 1 2 3; do
        local mounts
        mounts=$(awk '{ print $5 }' /proc/self/mountinfo |
            { grep -E "^($NODE_ROOT|$NODE_RUN|/var/lib/kubelet|/run/containerd)/" || true; } | while IFS= read -r m; do
            m=$(printf '%b' "${m//\\/\\0}")
            case "$m" in
                "$NODE_ROOT"/* | "$NODE_RUN"/* | /var/lib/kubelet/* | /run/containerd/*) echo "$m" ;;
            esac
        done | awk '{ print length($0) "\t" $0 }' | sort -rn | cut -f2-)
        [ -n "$mounts" ] || return 0
        while IFS= read -r m; do
            umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
        done <<<"$mounts"
    done
    log "warning: mounts left under the node's directories: ${mounts//$'\n'/ }"
}

node_remove_cgroups() {
    local d tries
    for d in $(cgroup_mounts); do
        [ -d "$d/kubepods" ] || continue
        for tries in 1 2 3 4 5 6 7 8 9 10; do
            find "$d/kubepods" -depth -type d -exec rmdir {} + 2>/dev/null || true
            [ -d "$d/kubepods" ] || break
            sleep 0.2
        done
        [ -d "$d/kubepods" ] && log "warning: could not remove cgroup $d/kubepods"
    done
    return 0
}

# Rules and chains the node added (the CNI plugins' CNI-*, the kubelet's KUBE-*, our
# KUBEWASM-SERVICES), found by
# comparing with what `up` saw; nobody else's rules are touched.
node_restore_iptables() {
    local fam before table now rules
    for fam in iptables ip6tables; do
        before=$STATE/node/before/$fam
        if [ ! -f "$before" ] || ! command -v "$fam" >/dev/null; then continue; fi
        for table in filter nat mangle raw; do
            now=$("$fam" -t "$table" -S 2>/dev/null) || continue
            rules=$(table_rules "$before" "$table")
            local new_chains new_rules script
            new_chains=$({ grep -E '^-N (KUBE-|KUBEWASM-|CNI-)' <<<"$now" || true; } | cut -d' ' -f2 |
                while IFS= read -r c; do grep -qxF -- ":$c" <<<"$rules" || echo "$c"; done)
            new_rules=$({ grep -E '^-A ' <<<"$now" || true; } | { grep -E 'KUBE-|KUBEWASM-|CNI-|'"$CNI_NETWORK" || true; } |
                while IFS= read -r r; do
                    local chain=${r#-A }
                    chain=${chain%% *}
                    grep -qxF -- "$chain" <<<"$new_chains" && continue
                    grep -qxF -- "$r" <<<"$rules" || echo "$r"
                done)
            [ -n "$new_chains$new_rules" ] || continue
            # shellcheck disable=SC2001
            script=$(
                echo "*$table"
                [ -z "$new_rules" ] || sed 's/^-A /-D /' <<<"$new_rules"
                [ -z "$new_chains" ] || sed 's/^/-F /' <<<"$new_chains"
                [ -z "$new_chains" ] || sed 's/^/-X /' <<<"$new_chains"
                echo COMMIT
            )
            if ! "$fam-restore" --noflush <<<"$script" 2>"$STATE/logs/iptables-restore.log"; then
                log "warning: $fam-restore could not remove the node's rules from table $table:" \
                    "$(cat "$STATE/logs/iptables-restore.log")"
                printf '%s\n' "$script" >"$STATE/logs/$fam-$table-cleanup.rules"
            fi
        done
        remove_new_empty_tables "$fam" "$before"
    done
}

# With iptables-nft, the first rule in a table creates the table in nftables, and no
# iptables command deletes it: nft does, if the table did not exist before and is empty now.
remove_new_empty_tables() {
    local fam=$1 before=$2 family table
    command -v nft >/dev/null || return 0
    "$fam" -V 2>/dev/null | grep -q nf_tables || return 0
    family=ip
    [ "$fam" = iptables ] || family=ip6
    for table in $("$fam-save" 2>/dev/null | sed -n 's/^\*//p'); do
        grep -qx -- "\*$table" "$before" && continue
        # Empty: only built-in chains with policy ACCEPT, no rule.
        if "$fam" -t "$table" -S 2>/dev/null | grep -qvE '^-P [A-Z]+ ACCEPT$'; then
            continue
        fi
        nft delete table "$family" "$table" 2>/dev/null ||
            log "warning: could not delete the empty nftables table $family $table"
    done
}

# The `-A` rules and `:CHAIN` names of one table in an iptables-save dump.
table_rules() {
    awk -v t="*$2" '$0 == t { on = 1; next } on && $0 == "COMMIT" { on = 0 } on' "$1" |
        sed -E 's/^(:[^ ]+) .*/\1/'
}

node_restore_sysctls() {
    local f=$STATE/node/before/sysctl k v cur
    [ -f "$f" ] || return 0
    while IFS='=' read -r k v; do
        [ -n "$k" ] || continue
        cur=$(cat "/proc/sys/${k//.//}" 2>/dev/null) || continue
        if [ "$cur" != "$v" ]; then
            echo "$v" >"/proc/sys/${k//.//}" 2>/dev/null || log "warning: could not restore $k=$v (it is $cur)"
        fi
    done <"$f"
}

node_remove_host_paths() {
    local dir=$STATE/node/before p e
    [ -f "$dir/paths" ] || return 0
    for p in "${NODE_HOST_PATHS[@]}"; do
        [ -e "$p" ] || continue
        if ! grep -qxF -- "$p" "$dir/paths"; then
            rm -rf "$p"
        else
            while IFS= read -r e; do
                [ -n "$e" ] || continue
                grep -qxF -- "$e" "$dir/entries${p//\//_}" 2>/dev/null || rm -rf "${p:?}/$e"
            done < <(ls -A "$p" 2>/dev/null)
        fi
    done
    # libcni's cache of results, in a /var/lib/cni that was there before.
    rm -f /var/lib/cni/results/"$CNI_NETWORK"-* 2>/dev/null || true
}

# ---------------------------------------------------------------------------------------
# image-push

# Pushes ARCHIVE as NAME[:TAG] to the node's registry if it runs, else to a registry started
# for the push on the same storage.
cmd_image_push() {
    [ $# -eq 2 ] || die "usage: cluster.sh image-push ARCHIVE NAME[:TAG] (a docker-save or OCI archive)"
    local archive=$1 name=$2 owner addr tmp pid
    [ -f "$archive" ] || die "no such image archive: $archive"
    if ! command -v docker-registry >/dev/null || ! command -v jq >/dev/null; then cmd_install; fi
    owner=$(owner_dir)
    if [ -n "$owner" ] && alive "$(cat "$owner/pids/registry.pid" 2>/dev/null)" &&
        curl -fsS --max-time 2 -o /dev/null "http://$REGISTRY_ADDR/v2/"; then
        "$HERE/image.sh" push "$archive" "$name" "$REGISTRY_ADDR"
        return
    fi
    mkdir -p "$REGISTRY_STORAGE"
    tmp=$(mktemp -d)
    addr=127.0.0.1:$(free_port)
    printf '%s\n' "version: 0.1" "log: {level: warn, accesslog: {disabled: true}}" \
        "storage: {filesystem: {rootdirectory: $REGISTRY_STORAGE}, delete: {enabled: true}}" \
        "http: {addr: $addr}" >"$tmp/registry.yml"
    setsid docker-registry serve "$tmp/registry.yml" >"$tmp/registry.log" 2>&1 </dev/null &
    pid=$!
    local deadline=$((SECONDS + 30)) status=0
    until curl -fsS --max-time 2 -o /dev/null "http://$addr/v2/" 2>/dev/null; do
        if ! alive "$pid" || [ "$SECONDS" -ge "$deadline" ]; then
            cat "$tmp/registry.log" >&2
            kill "$pid" 2>/dev/null || true
            rm -rf "$tmp"
            die "the registry for the push did not start"
        fi
        sleep 0.1
    done
    "$HERE/image.sh" push "$archive" "$name" "$addr" || status=$?
    kill "$pid" 2>/dev/null || true
    while alive "$pid"; do sleep 0.05; done
    rm -rf "$tmp"
    [ "$status" -eq 0 ] || exit "$status"
    log "(no node runs: pushed into $REGISTRY_STORAGE; the node's registry serves it at $REGISTRY_ADDR)"
}

cmd_images() {
    [ -x "$BIN_DIR/pause" ] || cmd_build
    node_images
    echo "$PAUSE_TAR"
    echo "$BUSYBOX_TAR"
}
