#!/usr/bin/env python3
"""Writes the kubewasm runtime image as one tarball, without any container daemon.

The image is what deploy/dev/image/Dockerfile builds: FROM scratch, one layer holding the static
`kubewasm` binary at /kubewasm (root-owned, 0755), run as 65532:65532 with entrypoint
["/kubewasm"] and command ["run"]. The tarball is laid out the way `docker save` (Docker 25+)
writes it, which is at once
  - a docker-archive: manifest.json + repositories (`docker load`, `podman load`,
    `kind load image-archive`, `skopeo copy docker-archive:...`), and
  - an OCI image layout: oci-layout + index.json + blobs/sha256/... (`ctr images import`,
    `skopeo copy oci-archive:...`, `crane`, registries' upload tools);
both name the same blobs, so nothing is stored twice. The layer is an uncompressed tar (what
docker-archive holds), so its digest is also its diff_id.

Everything is deterministic: file times are SOURCE_DATE_EPOCH (or --created), owners 0:0, and
the JSON is written with sorted keys, so the same binary always gives the same image digest.

Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import io
import json
import os
import struct
import sys
import tarfile

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"

# Kept in step with deploy/dev/image/Dockerfile (its final stage).
BINARY_PATH = "kubewasm"  # /kubewasm in the image
USER = "65532:65532"
ENTRYPOINT = ["/kubewasm"]
CMD = ["run"]
EXPOSED = {"8080/tcp": {}}
# The CA bundle (from the build machine, Debian's ca-certificates) for modules pulled from
# registries over HTTPS: the image has nothing else, and rustls reads SSL_CERT_FILE.
CA_BUNDLE_PATH = "etc/ssl/certs/ca-certificates.crt"
ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
       "SSL_CERT_FILE=/" + CA_BUNDLE_PATH]


def canonical_json(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def add_file(tar: tarfile.TarFile, name: str, data: bytes, mtime: int, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = mtime
    info.mode = mode
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def add_dir(tar: tarfile.TarFile, name: str, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mtime = mtime
    info.mode = 0o755
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info)


def layer_tar(binary: bytes, ca_bundle: bytes, mtime: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_file(tar, BINARY_PATH, binary, mtime, mode=0o755)
        for d in ("etc", "etc/ssl", "etc/ssl/certs"):
            add_dir(tar, d, mtime)
        add_file(tar, CA_BUNDLE_PATH, ca_bundle, mtime)
    return buf.getvalue()


def has_interpreter(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF file asks for a dynamic loader (PT_INTERP)."""
    if elf[4] != 2 or elf[5] != 1:  # ELFCLASS64, ELFDATA2LSB
        return False
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    return any(struct.unpack_from("<I", elf, phoff + i * phentsize)[0] == 3  # PT_INTERP
               for i in range(phnum))


def split_ref(ref: str) -> tuple[str, str]:
    """`kubewasm/runtime:dev` -> (`kubewasm/runtime`, `dev`); the tag defaults to latest."""
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:
        return ref, "latest"
    return name, tag


def full_name(repo: str) -> str:
    """The name containerd stores: docker.io/library/x for x, docker.io/a/b for a/b."""
    first = repo.split("/", 1)[0]
    if "/" in repo and ("." in first or ":" in first or first == "localhost"):
        return repo
    if "/" not in repo:
        return "docker.io/library/" + repo
    return "docker.io/" + repo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True, help="the static kubewasm executable")
    parser.add_argument("--tag", default="kubewasm/runtime:dev", help="image name:tag")
    parser.add_argument("--out", required=True, help="tarball to write")
    parser.add_argument("--arch", default="amd64", help="OCI architecture (amd64, arm64)")
    parser.add_argument(
        "--created",
        type=int,
        default=int(os.environ.get("SOURCE_DATE_EPOCH", "0")),
        help="image creation time and file times, seconds since the epoch "
        "(default SOURCE_DATE_EPOCH, else 0)",
    )
    parser.add_argument("--revision", default="", help="source revision label (git commit)")
    parser.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt",
                        help="PEM CA bundle put at /etc/ssl/certs/ca-certificates.crt in the image")
    args = parser.parse_args()
    try:
        with open(args.ca_bundle, "rb") as f:
            ca_bundle = f.read()
    except OSError as e:
        print(f"write-image: cannot read the CA bundle {args.ca_bundle} ({e}); "
              "install Debian's ca-certificates or pass --ca-bundle", file=sys.stderr)
        return 1

    with open(args.binary, "rb") as f:
        binary = f.read()
    if not binary.startswith(b"\x7fELF"):
        print(f"write-image: {args.binary} is not an ELF executable", file=sys.stderr)
        return 1
    # A dynamically linked binary would not start in a scratch image: it has no loader.
    if has_interpreter(binary):
        print(f"write-image: {args.binary} is dynamically linked; build it for a musl target",
              file=sys.stderr)
        return 1

    created = dt.datetime.fromtimestamp(args.created, dt.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    repo, tag = split_ref(args.tag)

    layer = layer_tar(binary, ca_bundle, args.created)
    layer_digest = sha256(layer)

    labels = {
        "org.opencontainers.image.title": "kubewasm runtime",
        "org.opencontainers.image.description":
            "WebAssembly-sandboxed Kubernetes controller runtime (kubewasm run)",
        "org.opencontainers.image.licenses": "Apache-2.0",
    }
    if args.revision:
        labels["org.opencontainers.image.revision"] = args.revision
    config = canonical_json({
        "architecture": args.arch,
        "os": "linux",
        "created": created,
        "config": {
            "User": USER,
            "Env": ENV,
            "Entrypoint": ENTRYPOINT,
            "Cmd": CMD,
            "WorkingDir": "/",
            "ExposedPorts": EXPOSED,
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + layer_digest]},
        "history": [{
            "created": created,
            "created_by": "COPY kubewasm /kubewasm (deploy/dev/image/write-image.py)",
        }],
    })
    config_digest = sha256(config)

    manifest = canonical_json({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": "sha256:" + config_digest,
                   "size": len(config)},
        "layers": [{"mediaType": OCI_LAYER, "digest": "sha256:" + layer_digest,
                    "size": len(layer)}],
    })
    manifest_digest = sha256(manifest)

    index = canonical_json({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [{
            "mediaType": OCI_MANIFEST,
            "digest": "sha256:" + manifest_digest,
            "size": len(manifest),
            "platform": {"architecture": args.arch, "os": "linux"},
            "annotations": {
                # What `docker save` writes: containerd (ctr import, kind) takes the full
                # name, OCI tools the short ref.
                "io.containerd.image.name": f"{full_name(repo)}:{tag}",
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    })
    docker_manifest = canonical_json([{
        "Config": f"blobs/sha256/{config_digest}",
        "RepoTags": [f"{repo}:{tag}"],
        "Layers": [f"blobs/sha256/{layer_digest}"],
    }])
    repositories = canonical_json({repo: {tag: layer_digest}})

    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    tmp = args.out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_dir(tar, "blobs", args.created)
        add_dir(tar, "blobs/sha256", args.created)
        for digest, data in sorted([(layer_digest, layer), (config_digest, config),
                                    (manifest_digest, manifest)]):
            add_file(tar, f"blobs/sha256/{digest}", data, args.created)
        add_file(tar, "index.json", index, args.created)
        add_file(tar, "manifest.json", docker_manifest, args.created)
        add_file(tar, "oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"}),
                 args.created)
        add_file(tar, "repositories", repositories, args.created)
    os.replace(tmp, args.out)

    print(f"image {repo}:{tag}  id sha256:{config_digest}  manifest sha256:{manifest_digest}",
          file=sys.stderr)
    print(f"  layer {len(layer):,} bytes, tarball {os.path.getsize(args.out):,} bytes",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
