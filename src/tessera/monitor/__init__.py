"""``tessera monitor``: a node's per-share GPU metrics for Prometheus.

* :mod:`tessera.monitor.regions` - the region directory the node driver keeps (one usage
  region per claim, with optional metadata) and its reader;
* :mod:`tessera.monitor.nvml` - device-level figures through nvidia-ml-py;
* :mod:`tessera.monitor.allocation` - what the API server allocated on the node's GPUs;
* :mod:`tessera.monitor.metrics` - every exported metric (Tessera's and HAMi's names);
* :mod:`tessera.monitor.collector` - the Prometheus collector joining the three;
* :mod:`tessera.monitor.server` - the HTTP endpoint and the API refresher.

See ``docs/monitoring.md``.
"""

#: HAMi's vGPU monitor NodePort, kept so existing scrape configs keep working.
DEFAULT_PORT = 31995
