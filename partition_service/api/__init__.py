"""HTTP routes of the storage node, one module per area."""
