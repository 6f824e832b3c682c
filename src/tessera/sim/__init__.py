"""In-memory cluster for `tessera simulate` and `tessera explain`."""
