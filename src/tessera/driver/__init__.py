"""``tessera driver``: the DRA node driver (kubelet plugin) of ``gpu.tessera.dev``.

One module per job (``docs/driver.md``):

* :mod:`~tessera.driver.protos` - build step: the ``k8s.io/kubelet`` protos -> gRPC stubs;
* :mod:`~tessera.driver.discovery` - GPUs through NVML (``nvidia-ml-py``) or ``nvidia-smi -q -x``,
  health, XID events;
* :mod:`~tessera.driver.publish` - the GPU registry (stable device names) and the ResourceSlice
  publisher (generation, stale slices, taints);
* :mod:`~tessera.driver.backend` - the enforcement backend of the node (library or driver-native);
* :mod:`~tessera.driver.prepare` - a claim's plan: limits file, usage region, CDI spec;
* :mod:`~tessera.driver.checkpoint` - prepared claims, for restarts;
* :mod:`~tessera.driver.kubelet` - registration and DRA gRPC servers on unix sockets;
* :mod:`~tessera.driver.node` - :class:`~tessera.driver.node.NodeDriver`, which runs it all.
"""
