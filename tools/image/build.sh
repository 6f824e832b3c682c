#!/usr/bin/env bash
# Build Tessera's image from deploy/images/Dockerfile with buildah (no Docker daemon), and
# write it as an OCI image layout archive that `ctr -n k8s.io images import` accepts.
#
#   IMAGE  the reference (default tessera.local/tessera:<version in pyproject.toml>)
#   BASE   local     a Debian bookworm base made from Debian's packages (tools/image/base.sh);
#                    the default: nothing is pulled from any registry
#          upstream  the Dockerfile's own digest-pinned debian:bookworm-slim (pulled)
#          <ref>     any other base image reference, passed as --build-arg BASE=<ref>
#
# Inside the build, pip and apt use the host's package sources and certificate bundle, and
# nothing of them stays in the image (below: build secrets for pip, a read-only mount of the
# host's apt sources when the host runs Debian bookworm like the image). Proxy variables
# (HTTP_PROXY ...) reach the RUN steps as buildah passes them by default.
#
# Cached: build/image/stamp records a hash of the Dockerfile, .dockerignore, every file the
# build context sends (pyproject.toml, setup.py, compiled-modules.txt, MANIFEST.in,
# README.md, src/, native/), this script, the base image's ID and IMAGE; the image built is
# also named tessera.local/tessera-build:<hash> in buildah's storage. When an image of that
# name exists, nothing is built: IMAGE names it (again, if another checkout sharing the
# storage took the name), and the archive is written if this checkout has none (a second
# when it has; about 20 s for the archive).
#
# Usage: tools/image/build.sh [--force]
# Prints, last on stdout: `image=<ref>` and `archive=<path>`. Needs root (buildah's storage).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
out="$repo/build/image"
force=0
case "${1:-}" in
  --force) force=1 ;;
  "") ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

log() { echo "build.sh: $*" >&2; }
started=$SECONDS

version="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)"
image="${IMAGE:-tessera.local/tessera:$version}"
base="${BASE:-local}"

tools/image/install.sh
if [[ $(id -u) != 0 ]]; then
  log "needs root (buildah's storage /var/lib/containers/storage, mmdebstrap --mode=root)"
  exit 1
fi
if [[ ! -d src/tessera/driver/_generated ]]; then
  log "src/tessera/driver/_generated is missing: run 'make protos' first (make image does)"
  exit 1
fi

mkdir -p "$out"
exec 9>"$out/.lock"
flock 9

# The base.
build_args=()
pull=(--pull-never)
case "$base" in
  local)
    base_ref="$(tools/image/base.sh)"
    build_args+=(--build-arg "BASE=$base_ref")
    base_id="$(buildah inspect --type image --format '{{.FromImageID}}' "$base_ref")"
    ;;
  upstream)
    base_ref="$(sed -n 's/^ARG BASE=//p' deploy/images/Dockerfile)"
    base_id="$base_ref"
    pull=()
    ;;
  *)
    base_ref="$base"
    build_args+=(--build-arg "BASE=$base_ref")
    base_id="$(buildah inspect --type image --format '{{.FromImageID}}' "$base_ref" 2>/dev/null \
               || echo "$base_ref")"
    pull=()
    ;;
esac

# What the build context sends (the Dockerfile's COPY lines; .dockerignore's exclusions).
context_files() {
  find pyproject.toml setup.py compiled-modules.txt MANIFEST.in README.md src native -type f \
    ! -path '*/__pycache__/*' ! -name '*.pyc' ! -name '*.so' ! -path '*.egg-info/*' \
    ! -path 'native/build/*' ! -path 'src/tessera/enforcement/lib/*' -print0 | sort -z
}
stamp="$(
  {
    sha256sum deploy/images/Dockerfile .dockerignore tools/image/build.sh tools/image/oci.py
    context_files | xargs -0 sha256sum
    echo "base $base_id"
    echo "image $image"
  } | sha256sum | cut -d' ' -f1
)"
archive="$out/$(echo "$image" | sed 's|.*/||; s|:|-|').oci.tar"

image_id() { buildah inspect --type image --format '{{.FromImageID}}' "$1" 2>/dev/null; }
# The image built from these inputs is also named by their hash, in buildah's storage: a
# fresh checkout on this machine reuses it, and a name another checkout sharing the storage
# gave to an image of its own since is set back.
inputs_ref="tessera.local/tessera-build:${stamp:0:20}"
write_archive() {
  # OCI image layout, named for containerd (io.containerd.image.name) as well as by its OCI
  # ref.name, then one tar of it with fixed order, owners and times.
  rm -rf "$out/oci"
  buildah push --quiet "$image" "oci:$out/oci:$image" >&2
  python3 tools/image/oci.py archive "$out/oci" "$archive" "$image"
  rm -rf "$out/oci"
  echo "$stamp" >"$out/stamp"
}
report() {
  echo "image=$image"
  echo "archive=$archive"
}
if [[ $force == 0 ]] && built="$(image_id "$inputs_ref")" && [[ -n "$built" ]]; then
  if [[ "$(image_id "$image")" != "$built" ]]; then
    log "naming $inputs_ref $image"
    buildah tag "$inputs_ref" "$image"
  fi
  if [[ -s "$archive" && "$(cat "$out/stamp" 2>/dev/null)" == "$stamp" ]]; then
    log "up to date: $image ($archive)"
  else
    write_archive
    log "up to date: $image; wrote $archive in $((SECONDS - started)) s"
  fi
  report
  exit 0
fi

# The host's package sources and certificate bundle, for the build only.
#   pip: build secrets `pip.conf` and `ca-certificates.crt`, which the Dockerfile mounts for
#        its pip step only: the host's /etc/pip.conf with its PIP_* index, certificate and
#        timeout settings (tools/image/oci.py pip-conf), whose cert is the CA bundle pip
#        trusts here (PIP_CERT, else /etc/pip.conf's cert, else the system bundle).
#   apt: when the host runs Debian bookworm like the image, a copy of its apt sources
#        mounted over /etc/apt/sources.list.d for every RUN step (a directory every Debian
#        image has, so no mount point is left behind in the image).
ca="${PIP_CERT:-}"
if [[ -z "$ca" && -f /etc/pip.conf ]]; then
  ca="$(sed -n 's/^[[:space:]]*cert[[:space:]]*=[[:space:]]*//p' /etc/pip.conf | tail -n 1)"
fi
ca="${ca:-/etc/ssl/certs/ca-certificates.crt}"
python3 tools/image/oci.py pip-conf "$out/pip.conf" "$ca" /run/secrets/ca-certificates.crt
secrets=(--secret "id=pip.conf,src=$out/pip.conf")
if [[ -f "$ca" ]]; then
  secrets+=(--secret "id=ca-certificates.crt,src=$ca")
fi
volumes=()
host_codename="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
if [[ "$host_codename" == bookworm ]]; then
  rm -rf "$out/apt-sources"
  mkdir -p "$out/apt-sources"
  if [[ -s /etc/apt/sources.list ]]; then
    cp /etc/apt/sources.list "$out/apt-sources/host.list"
  fi
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    if [[ -f "$f" ]]; then cp "$f" "$out/apt-sources/"; fi
  done
  volumes+=(--volume "$out/apt-sources:/etc/apt/sources.list.d:ro")
fi

log "building $image from deploy/images/Dockerfile (base $base_ref)"
# --network host: RUN steps reach the package mirrors as the host does, with no bridge or
# CNI network of buildah's own; --layers: unchanged steps (apt) are reused on a rebuild.
buildah bud --layers --network host ${pull[@]+"${pull[@]}"} \
  ${build_args[@]+"${build_args[@]}"} "${secrets[@]}" ${volumes[@]+"${volumes[@]}"} \
  -f deploy/images/Dockerfile -t "$image" . >&2

buildah tag "$image" "$inputs_ref"
write_archive
# The three newest input names stay (the images of other inputs are reused when those come
# back); older ones are dropped, and their images with them unless named otherwise.
mapfile -t olds < <(
  buildah images --noheading --format '{{.CreatedAtRaw}}|{{.Name}}:{{.Tag}}' \
    | grep '|tessera.local/tessera-build:' | sort -r | tail -n +4 | cut -d'|' -f2
)
for old in ${olds[@]+"${olds[@]}"}; do buildah rmi "$old" >/dev/null 2>&1 || true; done
# sed reads every line: `head` would close the pipe early and, under pipefail, buildah's
# SIGPIPE (exit 141) would fail a finished build (seen on a fresh storage, two names listed).
size="$(buildah images --noheading --format '{{.Size}}' "$image" | sed -n 1p)"
log "built $image ($size) and $archive ($(du -h "$archive" | cut -f1)) in $((SECONDS - started)) s"
report
