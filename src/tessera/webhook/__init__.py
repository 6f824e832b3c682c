"""The mutating admission webhook (``tessera webhook``): HAMi-style pods become DRA claims at the door.

* :mod:`tessera.webhook.admission`: AdmissionReview in, decision out (conversion by
  :mod:`tessera.convert`, the one code path shared with ``tessera simulate``);
* :mod:`tessera.webhook.templates`: ResourceClaimTemplates named by the hash of their spec, and
  the collector that deletes unused ones;
* :mod:`tessera.webhook.server`: the HTTPS server (Starlette on uvicorn) with certificate reload.

See ``docs/webhook.md``.
"""
