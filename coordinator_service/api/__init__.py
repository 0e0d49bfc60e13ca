"""HTTP routers of the coordinator: one module per group of endpoints of docs/design.md §4."""
