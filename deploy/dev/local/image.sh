#!/usr/bin/env bash
# Container images without a container engine: kubewasm's local node (deploy/dev/local/cluster.sh
# up --node) runs images built and pushed by this script. No daemon, nothing pulled.
#
#   image.sh build --rootfs DIR --tag NAME:TAG [--entrypoint ARG]... [--cmd ARG]...
#                  [--env K=V]... [--workdir DIR] [--user USER] OUT.tar
#       A FROM-scratch image of one layer (the files of DIR, owned by root, mtimes 0, so the
#       same input gives the same image), written as a `docker save` tarball: what
#       `ctr images import`, `docker load`, `podman load` and `image.sh push` read.
#   image.sh push ARCHIVE NAME[:TAG] HOST:PORT
#       Pushes a `docker save` tarball or an OCI image-layout tarball (`podman save
#       --format oci-archive`, `skopeo copy ... oci-archive:`, `buildah push ... oci-archive:`)
#       to the registry at http://HOST:PORT, as an OCI image (gzip layers). NAME is a
#       repository as Pods name it: `busybox` and `docker.io/library/busybox` both go to
#       `library/busybox`, `kubewasm/runtime` to `kubewasm/runtime`; a registry host in NAME
#       is dropped. Blobs the registry has are not sent again. Prints the manifest digest.
#
# Needs tar, gzip, sha256sum, jq and curl. Only errors and the digest are printed.
set -euo pipefail

log() { printf 'image.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

need() {
    local b
    for b in "$@"; do
        command -v "$b" >/dev/null || die "$b is missing (deploy/dev/local/cluster.sh install installs it)"
    done
}

sha256() { sha256sum "$1" | cut -d' ' -f1; }

TMP=
cleanup() { [ -z "$TMP" ] || rm -rf "$TMP"; }
trap cleanup EXIT

# ---------------------------------------------------------------------------------------
# build

cmd_build() {
    local rootfs='' tag='' workdir='' user='' out=''
    local entrypoint=() cmd_args=() env=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    while [ $# -gt 0 ]; do
        case "$1" in
            --rootfs) rootfs=${2:?--rootfs needs a directory}; shift 2 ;;
            --tag) tag=${2:?--tag needs NAME:TAG}; shift 2 ;;
            --entrypoint) entrypoint+=("${2?--entrypoint needs an argument}"); shift 2 ;;
            --cmd) cmd_args+=("${2?--cmd needs an argument}"); shift 2 ;;
            --env) env+=("${2:?--env needs K=V}"); shift 2 ;;
            --workdir) workdir=${2:?--workdir needs a directory}; shift 2 ;;
            --user) user=${2:?--user needs a user}; shift 2 ;;
            -*) die "build: unknown option $1" ;;
            *) [ -z "$out" ] || die "build: one output file only ($out, $1)"; out=$1; shift ;;
        esac
    done
    [ -n "$rootfs" ] || die "build: --rootfs DIR is required"
    [ -d "$rootfs" ] || die "build: --rootfs $rootfs is not a directory"
    [ -n "$tag" ] || die "build: --tag NAME:TAG is required"
    [ -n "$out" ] || die "build: the output file (OUT.tar) is required"
    need tar jq sha256sum
    TMP=$(mktemp -d)
    mkdir -p "$TMP/image"
    # Reproducible: sorted names, owner root, mtime 0; names without a leading ./
    repro_tar "$rootfs" "$TMP/layer.tar"
    local diff_id config_sha
    diff_id=$(sha256 "$TMP/layer.tar")
    mkdir -p "$TMP/image/$diff_id"
    mv "$TMP/layer.tar" "$TMP/image/$diff_id/layer.tar"
    jq -cn \
        --argjson entrypoint "$(json_array "${entrypoint[@]+"${entrypoint[@]}"}")" \
        --argjson cmd "$(json_array "${cmd_args[@]+"${cmd_args[@]}"}")" \
        --argjson env "$(json_array "${env[@]}")" \
        --arg workdir "$workdir" --arg user "$user" --arg diff_id "sha256:$diff_id" '
        {
          architecture: "amd64", os: "linux", created: "1970-01-01T00:00:00Z",
          config: ({Env: $env}
            + (if ($entrypoint | length) > 0 then {Entrypoint: $entrypoint} else {} end)
            + (if ($cmd | length) > 0 then {Cmd: $cmd} else {} end)
            + (if $workdir != "" then {WorkingDir: $workdir} else {} end)
            + (if $user != "" then {User: $user} else {} end)),
          rootfs: {type: "layers", diff_ids: [$diff_id]},
          history: [{created: "1970-01-01T00:00:00Z", created_by: "kubewasm deploy/dev/local/image.sh build"}]
        }' >"$TMP/config.json"
    config_sha=$(sha256 "$TMP/config.json")
    mv "$TMP/config.json" "$TMP/image/$config_sha.json"
    jq -cn --arg config "$config_sha.json" --arg tag "$(full_tag "$tag")" --arg layer "$diff_id/layer.tar" \
        '[{Config: $config, RepoTags: [$tag], Layers: [$layer]}]' >"$TMP/image/manifest.json"
    mkdir -p "$(dirname "$out")"
    repro_tar "$TMP/image" "$out.tmp.$$"
    mv -f "$out.tmp.$$" "$out"
}

repro_tar() {
    local dir=$1 out=$2 entries=()
    mapfile -t entries < <(cd "$dir" && LC_ALL=C ls -A)
    [ "${#entries[@]}" -gt 0 ] || die "$dir is empty"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
        -C "$dir" -cf "$out" "${entries[@]}"
}

json_array() {
    jq -nc '$ARGS.positional' --args "$@"
}

# NAME[:TAG] -> NAME:TAG with the default tag.
full_tag() {
    local ref=$1 last=${1##*/}
    case "$last" in *:*) echo "$ref" ;; *) echo "$ref:latest" ;; esac
}

# ---------------------------------------------------------------------------------------
# push

# The repository path in the registry of an image reference, the way containerd resolves
# it for docker.io: busybox -> library/busybox, docker.io/x/y -> x/y, quay.io/x/y -> x/y.
repository_of() {
    local name=$1 first
    name=${name%@*}
    local last=${name##*/}
    case "$last" in *:*) name=${name%:*} ;; esac
    first=${name%%/*}
    if [ "$first" != "$name" ] && { [[ $first == *.* ]] || [[ $first == *:* ]] || [ "$first" = localhost ]; }; then
        name=${name#*/}
    fi
    case "$name" in */*) ;; *) name=library/$name ;; esac
    echo "$name"
}

tag_of() {
    local ref=$1 last=${1##*/}
    case "$last" in *:*) echo "${last##*:}" ;; *) echo latest ;; esac
}

REGISTRY=
REPO=

# curl with what went wrong on failure.
http() {
    local out status
    out=$(curl -sS --max-time 300 -o "$TMP/http.body" -D "$TMP/http.headers" -w '%{http_code}' "$@") ||
        die "request failed: curl $*"
    status=$out
    echo "$status"
}

push_blob() {
    local file=$1 digest=$2 status location
    status=$(http -I "http://$REGISTRY/v2/$REPO/blobs/$digest")
    [ "$status" = 200 ] && return 0
    status=$(http -X POST "http://$REGISTRY/v2/$REPO/blobs/uploads/")
    [ "$status" = 202 ] || die "starting the upload of $digest to $REGISTRY/$REPO: HTTP $status $(head -c 300 "$TMP/http.body")"
    location=$(tr -d '\r' <"$TMP/http.headers" | sed -n 's/^[Ll]ocation: //p' | tail -n1)
    [ -n "$location" ] || die "the registry gave no upload location"
    case "$location" in /*) location=http://$REGISTRY$location ;; esac
    case "$location" in *\?*) location="$location&digest=$digest" ;; *) location="$location?digest=$digest" ;; esac
    status=$(http -X PUT -H 'Content-Type: application/octet-stream' --data-binary "@$file" "$location")
    [ "$status" = 201 ] || die "uploading $digest to $REGISTRY/$REPO: HTTP $status $(head -c 300 "$TMP/http.body")"
}

push_manifest() {
    local file=$1 media_type=$2 tag=$3 status
    status=$(http -X PUT -H "Content-Type: $media_type" --data-binary "@$file" \
        "http://$REGISTRY/v2/$REPO/manifests/$tag")
    [ "$status" = 201 ] || die "pushing the manifest to $REGISTRY/$REPO:$tag: HTTP $status $(head -c 300 "$TMP/http.body")"
}

# A `docker save` tarball: manifest.json names the config and the layers (uncompressed tars,
# or gzip ones). Layers are gzipped and the image pushed as an OCI manifest.
push_docker_archive() {
    local dir=$1 tag=$2 config layer i=0 layers='[]' sha size gz
    [ "$(jq length "$dir/manifest.json")" -ge 1 ] || die "manifest.json lists no image"
    [ "$(jq length "$dir/manifest.json")" -eq 1 ] || log "the archive holds several images; pushing the first"
    config=$dir/$(jq -r '.[0].Config' "$dir/manifest.json")
    [ -f "$config" ] || die "the archive has no config $(jq -r '.[0].Config' "$dir/manifest.json")"
    while IFS= read -r layer; do
        [ -f "$dir/$layer" ] || die "the archive has no layer $layer"
        gz=$TMP/layer.$i.gz
        if [ "$(head -c2 "$dir/$layer" | od -An -tx1 | tr -d ' ')" = 1f8b ]; then
            cp "$dir/$layer" "$gz"
        else
            gzip -n -c "$dir/$layer" >"$gz"
        fi
        sha=$(sha256 "$gz")
        size=$(stat -c %s "$gz")
        push_blob "$gz" "sha256:$sha"
        layers=$(jq -c --arg d "sha256:$sha" --argjson s "$size" \
            '. + [{mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $d, size: $s}]' <<<"$layers")
        i=$((i + 1))
    done < <(jq -r '.[0].Layers[]' "$dir/manifest.json")
    sha=$(sha256 "$config")
    push_blob "$config" "sha256:$sha"
    jq -cn --arg d "sha256:$sha" --argjson s "$(stat -c %s "$config")" --argjson layers "$layers" '{
        schemaVersion: 2,
        mediaType: "application/vnd.oci.image.manifest.v1+json",
        config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $d, size: $s},
        layers: $layers
    }' >"$TMP/manifest.json"
    push_manifest "$TMP/manifest.json" application/vnd.oci.image.manifest.v1+json "$tag"
    echo "sha256:$(sha256 "$TMP/manifest.json")"
}

blob_path() { echo "$1/blobs/${2%%:*}/${2#*:}"; }

# An OCI image layout (oci-layout, index.json, blobs/): pushed as it is. From an image
# index, the linux/amd64 image (or the only one) is pushed.
push_oci_layout() {
    local dir=$1 tag=$2 desc media digest manifest
    desc=$(jq -c '.manifests[0]' "$dir/index.json")
    [ "$desc" != null ] || die "index.json lists no image"
    [ "$(jq '.manifests | length' "$dir/index.json")" -eq 1 ] || log "the archive holds several images; pushing the first"
    media=$(jq -r .mediaType <<<"$desc")
    digest=$(jq -r .digest <<<"$desc")
    while [ "$media" = application/vnd.oci.image.index.v1+json ] ||
        [ "$media" = application/vnd.docker.distribution.manifest.list.v2+json ]; do
        desc=$(jq -c '[.manifests[] | select((.platform == null) or (.platform.os == "linux" and .platform.architecture == "amd64"))][0]' \
            "$(blob_path "$dir" "$digest")")
        [ "$desc" != null ] || die "the image index has no linux/amd64 image"
        media=$(jq -r .mediaType <<<"$desc")
        digest=$(jq -r .digest <<<"$desc")
    done
    manifest=$(blob_path "$dir" "$digest")
    [ -f "$manifest" ] || die "the archive has no blob $digest"
    local d
    while IFS= read -r d; do
        [ -f "$(blob_path "$dir" "$d")" ] || die "the archive has no blob $d"
        push_blob "$(blob_path "$dir" "$d")" "$d"
    done < <(jq -r '.layers[].digest, .config.digest' "$manifest")
    [ "$media" != null ] || media=$(jq -r '.mediaType // "application/vnd.oci.image.manifest.v1+json"' "$manifest")
    push_manifest "$manifest" "$media" "$tag"
    echo "$digest"
}

cmd_push() {
    [ $# -eq 3 ] || die "usage: image.sh push ARCHIVE NAME[:TAG] HOST:PORT"
    local archive=$1 name=$2
    REGISTRY=$3
    [ -f "$archive" ] || die "no such image archive: $archive"
    need tar gzip jq curl sha256sum
    REPO=$(repository_of "$name")
    local tag
    tag=$(tag_of "$name")
    TMP=$(mktemp -d)
    mkdir -p "$TMP/archive"
    tar -xf "$archive" -C "$TMP/archive" || die "$archive is not a tar archive"
    curl -fsS --max-time 5 -o /dev/null "http://$REGISTRY/v2/" || die "no registry answers at http://$REGISTRY/v2/"
    if [ -f "$TMP/archive/index.json" ] && [ -f "$TMP/archive/oci-layout" ]; then
        push_oci_layout "$TMP/archive" "$tag"
    elif [ -f "$TMP/archive/manifest.json" ]; then
        push_docker_archive "$TMP/archive" "$tag"
    else
        die "$archive is neither a docker-save tarball (manifest.json) nor an OCI layout (oci-layout, index.json)"
    fi
    log "pushed $archive as $REGISTRY/$REPO:$tag"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    build) cmd_build "$@" ;;
    push) cmd_push "$@" ;;
    repository) repository_of "${1:?usage: image.sh repository NAME}" ;;
    *) die "usage: image.sh build --rootfs DIR --tag NAME:TAG [...] OUT.tar | push ARCHIVE NAME[:TAG] HOST:PORT" ;;
esac
