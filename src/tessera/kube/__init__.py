"""Kubernetes adapters: a local control plane (``cluster``), a REST client (``client``),
workload helpers for tests (``workloads``) and the upstream-allocator harness (``harness``)."""
