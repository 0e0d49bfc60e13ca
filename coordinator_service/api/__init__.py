"""HTTP routers of the coordinator: one module per group of endpoints of DESIGN.md §4."""
