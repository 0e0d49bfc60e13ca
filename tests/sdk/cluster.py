"""The SDK tests' cluster is the tests' one cluster (``tests.support.cluster``): a
coordinator on SQLite and two storage nodes verifying transactional batches with it. The
name stays importable from here for the SDK test modules."""

from __future__ import annotations

from tests.support.cluster import Cluster

__all__ = ["Cluster"]
