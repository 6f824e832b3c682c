#!/usr/bin/env bash
# Make the Debian bookworm base image from Debian's packages (mmdebstrap), for building
# deploy/images/Dockerfile where its digest-pinned upstream base (debian:bookworm-slim)
# cannot be pulled: no container registry is contacted.
#
# The root filesystem is mmdebstrap's `minbase` variant (Priority: required packages and
# apt), merged-/usr like the upstream image, with the same dpkg path excludes as a slim
# image (no manuals, docs except copyright files, locales), without device nodes. Its apt
# sources are the host's when the host is Debian bookworm (/etc/apt/sources.list and
# sources.list.d/*.list|*.sources, or TESSERA_IMAGE_APT_SOURCES="file ..."), else Debian's
# own mirrors; the host's apt.conf.d files that set Acquire:: options (how apt reaches its
# mirrors) are used while it is made and not kept in the image.
#
# Cached: the base is named tessera.local/debian:bookworm-<hash of its inputs> in buildah's
# storage; when that image exists, nothing is done. The root filesystem tarball is kept in
# build/image/base/ so that an image removed from the storage is imported again in seconds.
#
# Usage: tools/image/base.sh          prints the base image reference on stdout (last line)
# Needs: root, buildah and mmdebstrap (tools/image/install.sh).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
suite=bookworm
out="$repo/build/image/base"

log() { echo "base.sh: $*" >&2; }

# The host's apt sources and Acquire options, when the host runs the image's Debian release.
host_codename="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
sources=()
aptopts=()
if [[ "$host_codename" == "$suite" ]]; then
  if [[ -n "${TESSERA_IMAGE_APT_SOURCES:-}" ]]; then
    read -r -a sources <<<"$TESSERA_IMAGE_APT_SOURCES"
  else
    if [[ -s /etc/apt/sources.list ]] && grep -q '^[[:space:]]*deb' /etc/apt/sources.list; then
      sources+=(/etc/apt/sources.list)
    fi
    for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
      [[ -f "$f" ]] && sources+=("$f")
    done
  fi
  for f in /etc/apt/apt.conf.d/*; do
    [[ -f "$f" ]] && grep -q '^[[:space:]]*Acquire::' "$f" && aptopts+=("$f")
  done
fi

dpkgopts=(
  'path-exclude=/usr/share/man/*'
  'path-exclude=/usr/share/info/*'
  'path-exclude=/usr/share/doc/*'
  'path-include=/usr/share/doc/*/copyright'
  'path-exclude=/usr/share/locale/*'
  'path-include=/usr/share/locale/locale.alias'
  'path-exclude=/usr/share/lintian/*'
)

# Every input of the base: this script, the suite, the sources and apt options it is made
# with. (The packages themselves follow the mirror: a newer point release makes a new base
# only when an input changes or the image is removed.)
hash="$(
  {
    sha256sum <"${BASH_SOURCE[0]}"  # its content, whatever path it was called by
    echo "$suite"
    for f in ${sources[@]+"${sources[@]}"} ${aptopts[@]+"${aptopts[@]}"}; do
      echo "$f"
      cat "$f"
    done
  } | sha256sum | cut -c1-12
)"
ref="tessera.local/debian:$suite-$hash"
tarball="$out/debian-$suite-$hash.tar"

if buildah inspect --type image "$ref" >/dev/null 2>&1; then
  echo "$ref"
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  log "making the base image needs root (mmdebstrap --mode=root, buildah's storage)"
  exit 1
fi
for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || {
    log "$tool is not installed: run tools/image/install.sh"
    exit 1
  }
done

mkdir -p "$out"
if [[ ! -s "$tarball" ]]; then
  log "making $suite with mmdebstrap (apt sources: ${sources[*]:-deb.debian.org})"
  args=(--variant=minbase --mode=root --format=tar --skip=output/dev
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr)
  for o in "${dpkgopts[@]}"; do args+=("--dpkgopt=$o"); done
  for o in ${aptopts[@]+"${aptopts[@]}"}; do args+=("--aptopt=$o"); done
  # --aptopt options land in /etc/apt/apt.conf.d/99mmdebstrap: the host's, not the image's.
  args+=(--customize-hook='rm -f "$1/etc/apt/apt.conf.d/99mmdebstrap"')
  rm -f "$tarball.tmp"
  if ! mmdebstrap --verbose "${args[@]}" "$suite" "$tarball.tmp" ${sources[@]+"${sources[@]}"} \
      >"$out/mmdebstrap.log" 2>&1; then
    tail -n 40 "$out/mmdebstrap.log" >&2
    log "mmdebstrap failed (whole log: $out/mmdebstrap.log)"
    exit 1
  fi
  mv "$tarball.tmp" "$tarball"
fi

log "importing $tarball as $ref"
ctr="$(buildah from --pull-never scratch)"
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
buildah add --quiet "$ctr" "$tarball" / >/dev/null
buildah config --os linux --arch "$(dpkg --print-architecture)" \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --cmd bash \
  --label "org.opencontainers.image.description=Debian $suite minbase made by tools/image/base.sh (mmdebstrap)" \
  "$ctr"
buildah commit --quiet --rm "$ctr" "$ref" >/dev/null
trap - EXIT
# Older tarballs of this checkout are no longer used. (Older base images stay in buildah's
# storage, which other checkouts share: `buildah rmi` removes them.)
find "$out" -name "debian-$suite-*.tar" ! -name "$(basename "$tarball")" -delete
echo "$ref"
