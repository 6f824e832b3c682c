"""tessera.inventory (work in progress)."""
