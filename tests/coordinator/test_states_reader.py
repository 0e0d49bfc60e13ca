"""The loops that read every partition's state again and again (heartbeat answers, the
controller's rounds, the metadata cache) build their states anew only when a row changed
(``partition_state.StatesReader``, ``Metadata.refresh``): a cluster of thousands of
partitions left idle spent most of a coordinator's CPU building the same objects each
second. These tests hold both sides: nothing is built again while nothing changed, and a
change made by another writer, by hand here, is seen at the next read."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from coordinator_service.controller.partition_state import StatesReader
from tests.coordinator.helpers import ok, topic


def _set(engine: sa.Engine, statement: str, **params: Any) -> None:
    with engine.begin() as conn:
        assert conn.execute(sa.text(statement), params).rowcount == 1


def test_states_are_built_again_only_when_a_row_changed(
    coordinator_factory: Any, db: sa.Engine
) -> None:
    coordinator = coordinator_factory(background=False)
    with coordinator.client() as client:
        topic(client, "orders", 4)
    reader = StatesReader()
    with db.connect() as conn:
        first, bad, changed = reader(conn)
        assert changed and not bad
        assert {(s.topic, s.partition) for s in first} >= {("orders", p) for p in range(4)}
        again, _bad, changed = reader(conn)
        assert not changed and again is first  # the same objects: nothing was built

    _set(db, "UPDATE topic_partitions SET partition_epoch = partition_epoch + 1 "
             "WHERE topic = 'orders' AND partition = 2")  # fmt: skip
    with db.connect() as conn:
        after, _bad, changed = reader(conn)
    assert changed and after is not first
    epoch = {(s.topic, s.partition): s.partition_epoch for s in after}
    before = {(s.topic, s.partition): s.partition_epoch for s in first}
    assert epoch[("orders", 2)] == before[("orders", 2)] + 1
    assert all(epoch[k] == before[k] for k in before if k != ("orders", 2))


def test_the_metadata_cache_loads_only_a_changed_read_and_sees_another_writers_change(
    coordinator_factory: Any, db: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator = coordinator_factory(background=False)
    metadata = coordinator.services.metadata
    with coordinator.client() as client:
        created = topic(client, "orders", 4)
    leader = created["partitions"][1]["leader"]["node_id"]
    other = next(n for n in metadata.nodes if n != leader)
    coordinator.call(metadata.refresh)  # the first read since the topic was created

    loads: list[int] = []
    real_load = metadata._load

    def counted(topic_rows: Any, rows: Any) -> None:
        loads.append(len(rows))
        real_load(topic_rows, rows)

    monkeypatch.setattr(metadata, "_load", counted)
    coordinator.call(metadata.refresh)
    coordinator.call(metadata.refresh)
    assert loads == []  # nothing changed: the cache stands as it was
    assert metadata.cached_leader("orders", 1) == leader

    # another instance (the controller, say) moved a leader: the next refresh loads it
    _set(db, "UPDATE topic_partitions SET node_id = :n, leader_epoch = leader_epoch + 1, "
             "partition_epoch = partition_epoch + 1 WHERE topic = 'orders' AND partition = 1",
         n=other)  # fmt: skip
    coordinator.call(metadata.refresh)
    assert len(loads) == 1
    assert metadata.cached_leader("orders", 1) == other
    with coordinator.client() as client:
        partitions = ok(client.get("/v1/topics/orders"))["partitions"]
    assert partitions[1]["leader"]["node_id"] == other
