"""The local control plane and this machine as a real node, built by the project's tooling.

Used by the tests, ``make demo`` and ``tessera cluster``; no production component (driver,
webhook, monitor, extender, simulate, explain, lint) imports it, and the import-linter contract
in ``pyproject.toml`` keeps it that way.

* ``build``: where the Go binaries ``tools/kube/build.sh`` compiles live, and building them;
* ``cluster``: etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback,
  with simulated GPU nodes;
* ``node``, ``nodenet``: with ``--kubelet``, this machine as a real node (containerd, a kubelet,
  kube-proxy) and its network;
* ``pki``: the certificates and keys of that control plane and node;
* ``images``: container images made from host files, for a node without a registry
  (``node_assets/``: the sources of its pause process and of a CUDA probe);
* ``fake_nvml``: the fake NVML's machine description written from real inventories;
* ``localinstall``: Tessera's chart installed on that node with fake GPUs, and ``demo``
  (``make demo``) on top of it;
* ``harness``: the upstream structured allocator run on a scenario (the conformance tests).

The Kubernetes adapters production uses (REST client, informer, reading a live cluster) are
:mod:`tessera.kube`.
"""
