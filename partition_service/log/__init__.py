"""The log engine: segments, indexes, producer state and transactions, with no HTTP in it."""
