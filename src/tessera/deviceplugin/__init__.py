"""Legacy mode's node agent: a kubelet device plugin (``v1beta1``) that advertises HAMi's
``nvidia.com/gpu`` slots, publishes the node's GPUs in HAMi's ``hami.io/node-nvidia-register``
annotation and, at ``Allocate``, hands the container what a DRA share gets (the node driver's
own plan and files: :mod:`tessera.driver.prepare`). See ``docs/legacy.md``, "Device plugin".

Modules: :mod:`.register` (slots and the register annotation), :mod:`.allocate` (the pod and
container entry an ``Allocate`` serves, and its plan), :mod:`.plugin` (the gRPC service, the
kubelet registration, health, clean-up).
"""
