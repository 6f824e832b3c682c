"""The scheduler extender (``tessera extender``): HAMi's node policies under the stock kube-scheduler.

kube-scheduler calls the extender's ``prioritize`` verb with a pod and the nodes that passed its
filters; :func:`tessera.extender.prioritize.prioritize` ranks them by the pod's
``hami.io/node-scheduler-policy`` (``binpack``: most-booked node first; ``spread``: least-booked
first) using the node usage ``tessera simulate`` uses (:func:`tessera.scheduler.policies.node_usage`),
computed from the ResourceSlices and allocated ResourceClaims it watches. Device choice inside
the node stays the scheduler's allocator (first fit). See ``docs/webhook.md``.
"""
