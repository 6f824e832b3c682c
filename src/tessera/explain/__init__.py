"""``tessera explain``: why a pod or claim is pending, per node and device (``tessera lint``
is :mod:`tessera.lint`)."""
