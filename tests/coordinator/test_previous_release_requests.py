"""The previous release's clients are served as they are (docs/design.md, "Versions and
compatibility"): the requests its SDK sends, replayed against this release's coordinator.

The bodies are literal JSON, taken from what the SDK of commit 956be73 sent (its producer,
``AdminClient`` and ``Consumer`` run against a recording transport): no field of this
release, no ``transaction_version``. Each must be taken, and answered as that release
answered it; fields this release added to answers are ignored by its readers of producer
and consumer answers (dicts).
"""

from __future__ import annotations

from typing import Any

from eos_protocol.versions import CURRENT_FEATURES
from tests.coordinator.helpers import ok

TID = "old-app"
GROUP = "old-group"


def test_the_previous_release_requests_are_taken(coordinator: Any) -> None:
    with coordinator.client() as c:
        # AdminClient.create_topic("orders", 2)
        created = ok(c.post("/v1/topics", json={"name": "orders", "partitions": 2}))
        assert [p["partition"] for p in created["partitions"]] == [0, 1]
        assert ok(c.get("/v1/topics/orders"))["name"] == "orders"
        metadata = ok(c.get("/v1/metadata"))
        assert {"cluster_id", "nodes", "topics"} <= set(metadata)

        # TransactionalProducer: find the coordinator, init, one transaction
        found = ok(c.get("/v1/coordinators", params={"key": TID, "key_type": "transaction"}))
        assert found["url"] == coordinator.url
        init = ok(c.post(f"/v1/transactions/{TID}/init", json={"transaction_timeout_ms": 60000}))
        assert set(init) == {"producer_id", "producer_epoch"}  # no version 2 answer
        pid, epoch = init["producer_id"], init["producer_epoch"]
        ok(c.post(f"/v1/transactions/{TID}/offsets",
                  json={"producer_id": pid, "producer_epoch": epoch, "group_id": GROUP}))
        added = ok(c.post(f"/v1/transactions/{TID}/partitions", json={
            "producer_id": pid, "producer_epoch": epoch,
            "partitions": [{"topic": "orders", "partition": 0}]}))
        assert added == {"partitions": [{"topic": "orders", "partition": 0, "error": None}]}
        ok(c.get("/v1/coordinators", params={"key": GROUP, "key_type": "group"}))
        committed = ok(c.post(f"/v1/transactions/{TID}/commit",
                              json={"producer_id": pid, "producer_epoch": epoch}))
        assert committed == {"transactional_id": TID, "state": "PrepareCommit"}

        # KIP-360: the epoch bump after an abortable sequence error, then an abort
        bumped = ok(c.post(f"/v1/transactions/{TID}/init", json={
            "transaction_timeout_ms": 60000, "producer_id": pid, "producer_epoch": epoch}))
        assert (bumped["producer_id"], bumped["producer_epoch"]) == (pid, epoch + 1)
        ok(c.post(f"/v1/transactions/{TID}/partitions", json={
            "producer_id": pid, "producer_epoch": epoch + 1,
            "partitions": [{"topic": "orders", "partition": 1}]}))
        aborted = ok(c.post(f"/v1/transactions/{TID}/abort",
                            json={"producer_id": pid, "producer_epoch": epoch + 1}))
        assert aborted == {"transactional_id": TID, "state": "PrepareAbort"}

        # Producer (idempotent), AdminClient's transaction calls and ACLs
        assert set(ok(c.post("/v1/producers", json={}))) == {"producer_id", "producer_epoch"}
        listed = ok(c.get("/v1/transactions"))
        assert TID in {t["transactional_id"] for t in listed["transactions"]}
        assert ok(c.get(f"/v1/transactions/{TID}"))["transactional_id"] == TID
        ok(c.post(f"/v1/admin/transactions/{TID}/abort", json={}))
        acl = {"principal": "User:etl", "resource_type": "topic", "resource_name": "orders",
               "pattern_type": "literal", "operation": "write", "permission": "allow"}
        ok(c.post("/v1/acls", json={"acls": [acl]}))
        assert acl in ok(c.get("/v1/acls", params={"principal": "User:etl"}))["acls"]
        deleted = ok(c.post("/v1/acls/delete", json={"filters": [{"principal": "User:etl"}]}))
        assert deleted == {"deleted": [acl]}


def test_the_metadata_names_the_features(coordinator: Any) -> None:
    with coordinator.client() as c:
        for params in ({}, {"include_topics": "false"}):
            features = ok(c.get("/v1/metadata", params=params))["features"]
            assert features == {
                "release": "0.3.0", "protocol": 4, "transaction_version": {"min": 1, "max": 2}
            }
            assert features == CURRENT_FEATURES.model_dump()
