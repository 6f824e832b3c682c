"""Kubernetes adapters: a REST client (``client``), an informer (``watch``), reading a live
cluster for simulate and explain (``live``) and workload helpers (``workloads``: pods, claim
templates, waits; the monitor reads a pod's claim names with it).

The local control plane and real node the tests, ``make demo`` and ``tessera cluster`` use
are :mod:`tessera.localcluster`."""
