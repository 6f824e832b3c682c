"""What kube-scheduler and the resourceclaim controller decide, with no loop and no I/O.

- :mod:`tessera.scheduler.nodes`: the node filters before allocation (NodeAffinity,
  TaintToleration, a claim allocated for other nodes): one :func:`~tessera.scheduler.nodes.node_refusal`.
- :mod:`tessera.scheduler.claims`: which ResourceClaim a pod's claim entry names (the
  resourceclaim controller's claims made from templates).
- :mod:`tessera.scheduler.policies`: node and GPU orders (first-fit, binpack, spread,
  topology; HAMi's policy annotations), prioritized-list scores, placement ranks.
- :mod:`tessera.scheduler.extended`: extended resources served by a DeviceClass (KEP-5004):
  which a pod requests, the claim the scheduler makes for them and its name.
- :mod:`tessera.scheduler.usage`: memory, cores and shared counters allocated per device.
- :mod:`tessera.scheduler.words`: the allocator's refusal record in words (explain and the
  pending reasons say a refusal the same way).

Used by the simulation (:mod:`tessera.sim`), ``explain``/``lint``, the monitor and the
scheduler extender alike, so each decision is made in one place (docs/architecture.md).
"""
