"""Two steps of tools/image/build.sh, with the standard library only (the host's python3).

``pip-conf OUT CA CA_IN_BUILD``
    Write the pip configuration the image build's pip step reads (build secret ``pip.conf``):
    the host's ``/etc/pip.conf`` with the index, certificate, timeout and proxy settings of
    the host's ``PIP_*`` environment over it, ``cert`` set to ``CA_IN_BUILD`` (where the
    build secret ``ca-certificates.crt`` is mounted) when the host's bundle ``CA`` exists,
    and without settings naming host paths (``find-links``, ``cache-dir``, ``log``).

``archive LAYOUT ARCHIVE REF``
    Name the image of the OCI image layout directory ``LAYOUT`` (``buildah push oci:...``)
    for containerd as well (``io.containerd.image.name`` = ``REF`` beside the OCI
    ``org.opencontainers.image.ref.name``), then write the layout as one tar, ``ARCHIVE``:
    ``oci-layout``, ``index.json``, then the blobs by digest, with uid/gid 0 and a fixed
    mtime, so that the same image gives the same archive.
"""

from __future__ import annotations

import configparser
import json
import os
import sys
import tarfile

_PIP_ENV = (
    ("PIP_INDEX_URL", "index-url"),
    ("PIP_EXTRA_INDEX_URL", "extra-index-url"),
    ("PIP_TRUSTED_HOST", "trusted-host"),
    ("PIP_DEFAULT_TIMEOUT", "timeout"),
    ("PIP_PROXY", "proxy"),
)
_HOST_PATHS = ("find-links", "cache-dir", "log")


def pip_conf(out: str, ca: str, ca_in_build: str) -> None:
    conf = configparser.ConfigParser(interpolation=None)
    conf.read("/etc/pip.conf")
    if not conf.has_section("global"):
        conf.add_section("global")
    for env, key in _PIP_ENV:
        if os.environ.get(env):
            conf.set("global", key, os.environ[env])
    if os.path.isfile(ca):
        conf.set("global", "cert", ca_in_build)
    else:
        conf.remove_option("global", "cert")
    for section in conf.sections():
        for key in _HOST_PATHS:
            conf.remove_option(section, key)
    with open(out, "w") as f:
        conf.write(f)


def archive(layout: str, out: str, ref: str) -> None:
    index_path = os.path.join(layout, "index.json")
    with open(index_path) as f:
        index = json.load(f)
    for m in index["manifests"]:
        m.setdefault("annotations", {})["io.containerd.image.name"] = ref
    with open(index_path, "w") as f:
        json.dump(index, f, separators=(",", ":"), sort_keys=True)
    blobs = os.path.join(layout, "blobs", "sha256")
    names = ["oci-layout", "index.json"] + [f"blobs/sha256/{b}" for b in sorted(os.listdir(blobs))]

    def fixed(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 1
        info.mode = 0o644
        return info

    tmp = out + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as t:
        for name in names:
            t.add(os.path.join(layout, name), arcname=name, filter=fixed)
    os.replace(tmp, out)


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "pip-conf":
        pip_conf(*argv[1:])
    elif len(argv) == 4 and argv[0] == "archive":
        archive(*argv[1:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
