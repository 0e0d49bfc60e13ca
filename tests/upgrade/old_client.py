"""A client run by an EARLIER release's Python (``tests/support/releases.py``): it imports
that release's SDK, never the current one, and uses only what every release listed there
offers. It prints one JSON object on stdout.

* ``write URL TOKEN``: what a user of the old release leaves behind — a topic of three
  partitions, four transactions of one transactional id (the third aborted), the input
  group's offsets committed inside the last transaction and a plain commit of another
  group, an ACL for a second principal — and says exactly what it wrote.
* ``transact URL TOKEN TID``: one committed transaction of ten records with this release's
  SDK (the old client of a new cluster), read back read_committed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from sdk import (
    AclBinding,
    AdminClient,
    Consumer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    TransactionalProducer,
)

TOPIC = "orders"
TRANSACTIONAL_ID = "upgrader"
READER = "User:reader"
PARTITIONS = 3


def write(url: str, token: str) -> dict[str, Any]:
    with AdminClient(url, token=token) as admin:
        admin.create_topic(TOPIC, PARTITIONS)
        admin.create_acls([AclBinding(
            principal=READER, resource_type=ResourceType.TOPIC, resource_name=TOPIC,
            pattern_type=PatternType.LITERAL, operation=Operation.READ,
            permission=Permission.ALLOW,
        )])  # fmt: skip
    committed: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    aborted: list[str] = []
    producer = TransactionalProducer(url, TRANSACTIONAL_ID, token=token)
    producer.init_transactions()
    for txn in range(4):
        producer.begin_transaction()
        values = {p: [f"t{txn}-p{p}-{i}" for i in range(25)] for p in range(PARTITIONS)}
        for p, batch in values.items():
            for value in batch:
                producer.send(TOPIC, value, key=f"k{p}", partition=p)
        if txn == 3:
            producer.send_offsets_to_transaction({(TOPIC, 0): 40, (TOPIC, 1): 41}, "g-txn")
        producer.flush()
        if txn == 2:
            producer.abort_transaction()
            aborted += [v for batch in values.values() for v in batch]
        else:
            producer.commit_transaction()
            for p, batch in values.items():
                committed[p] += batch
    producer.close()
    with Consumer(url, "g-plain", token=token) as consumer:
        consumer.commit({(TOPIC, 2): 17})
    return {
        "topic": TOPIC, "transactional_id": TRANSACTIONAL_ID, "reader": READER,
        "committed": committed, "aborted": aborted,
        "group_offsets": {"g-txn": {"0": 40, "1": 41}, "g-plain": {"2": 17}},
    }  # fmt: skip


def transact(url: str, token: str, transactional_id: str) -> dict[str, Any]:
    values = [f"{transactional_id}-{i}" for i in range(10)]
    producer = TransactionalProducer(url, transactional_id, token=token)
    producer.init_transactions()
    producer.begin_transaction()
    for value in values:
        producer.send(TOPIC, value, partition=0)
    producer.commit_transaction()
    producer.close()
    seen: list[str] = []
    with Consumer(url, token=token) as consumer:
        consumer.assign([(TOPIC, 0)])
        consumer.seek((TOPIC, 0), 0)
        for _ in range(50):
            seen += [str(r.value) for r in consumer.poll(timeout=1.0)]
            if all(v in seen for v in values):
                break
    return {"written": values, "read": [v for v in seen if v in values]}


def main() -> None:
    command, url, token, *rest = sys.argv[1:]
    answer = write(url, token) if command == "write" else transact(url, token, rest[0])
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
