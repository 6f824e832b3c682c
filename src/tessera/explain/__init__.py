"""``tessera explain`` (why a pod or claim is pending, per node and device) and ``tessera lint``
(mistakes in DeviceClasses, claims and templates before they are applied)."""
