"""Crash tests with real processes: SIGKILL mid-load and segment files cut at random bytes."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.nodes import NodeProcess
from tests.support.processes import wait_until

TOPIC = "load"
pytestmark = pytest.mark.slow


@dataclass
class ProducerLog:
    pid: int
    acked: list[tuple[int, int, int, list[str]]] = field(default_factory=list)  # seq, base, last
    in_flight: tuple[int, list[str]] | None = None
    next_seq: int = 0


def run_producer(url: str, log: ProducerLog, stop: threading.Event, batch: int = 20) -> None:
    with httpx.Client(base_url=url, timeout=10.0) as client:
        while not stop.is_set():
            values = [f"p{log.pid}-s{log.next_seq + i}" for i in range(batch)]
            log.in_flight = (log.next_seq, values)
            try:
                response = client.post(
                    f"/v1/partitions/{TOPIC}/0/records",
                    json={
                        "producer_id": log.pid,
                        "producer_epoch": 0,
                        "base_sequence": log.next_seq,
                        "records": [{"value": v} for v in values],
                    },
                )
            except httpx.HTTPError:
                return  # the node is gone: this batch stays in flight, unacknowledged
            assert response.status_code == 200, response.text
            body = response.json()
            log.acked.append((log.next_seq, body["base_offset"], body["last_offset"], values))
            log.in_flight = None
            log.next_seq += batch


def read_all(client: httpx.Client) -> dict[int, str]:
    out: dict[int, str] = {}
    offset = 0
    while True:
        body = client.get(
            f"/v1/partitions/{TOPIC}/0/records", params={"offset": offset, "max_records": 5000}
        ).json()
        for record in body["records"]:
            out[record["offset"]] = record["value"]
        if body["next_offset"] == offset:
            return out
        offset = body["next_offset"]


def test_sigkill_mid_load_loses_nothing_acknowledged(
    tmp_path: Path, node_factory: type[NodeProcess]
) -> None:
    node = node_factory(tmp_path / "data", extra=["--segment-bytes", "65536"])
    node.start()
    node.create_partition(TOPIC, 0)
    with node.client() as client:  # a transaction left open across the crash
        client.post(
            f"/v1/partitions/{TOPIC}/0/records",
            json={
                "producer_id": 99,
                "producer_epoch": 0,
                "base_sequence": 0,
                "transactional": True,
                "records": [{"value": "txn-before-crash"}],
            },
        ).raise_for_status()
    logs = [ProducerLog(pid) for pid in range(1, 5)]
    stop = threading.Event()
    threads = [threading.Thread(target=run_producer, args=(node.url, log, stop)) for log in logs]
    for thread in threads:
        thread.start()
    wait_until(
        lambda: sum(len(log.acked) for log in logs) >= 150,
        timeout=60,
        what="150 acknowledged batches",
    )
    node.kill()
    stop.set()
    for thread in threads:
        thread.join(timeout=15)

    node.start()
    with node.client() as client:
        stored = read_all(client)
        for log in logs:
            for _seq, base, last, values in log.acked:
                assert [stored.get(o) for o in range(base, last + 1)] == values
        for log in logs:
            seq, base, last, values = log.acked[-1]
            retry = client.post(
                f"/v1/partitions/{TOPIC}/0/records",
                json={
                    "producer_id": log.pid,
                    "producer_epoch": 0,
                    "base_sequence": seq,
                    "records": [{"value": v} for v in values],
                },
            ).json()
            assert retry["duplicate"] is True
            assert (retry["base_offset"], retry["last_offset"]) == (base, last)
            if log.in_flight is not None:  # the retry of an unacknowledged batch is accepted once
                seq, values = log.in_flight
                body = {
                    "producer_id": log.pid,
                    "producer_epoch": 0,
                    "base_sequence": seq,
                    "records": [{"value": v} for v in values],
                }
                first = client.post(f"/v1/partitions/{TOPIC}/0/records", json=body).json()
                again = client.post(f"/v1/partitions/{TOPIC}/0/records", json=body).json()
                assert again["duplicate"] is True
                assert again["base_offset"] == first["base_offset"]
        stored = read_all(client)
        assert len(stored) == len(set(stored.values())), "no record is stored twice"
        offsets = client.get(f"/v1/partitions/{TOPIC}/0/offsets").json()
        assert offsets["last_stable_offset"] == 0  # the open transaction survived the crash
    node.stop()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_segment_cut_at_random_byte_then_restart(
    tmp_path: Path, seed: int, node_factory: type[NodeProcess]
) -> None:
    rng = random.Random(seed)
    node = node_factory(tmp_path / "data", extra=["--segment-bytes", "8192"])
    node.start()
    node.create_partition(TOPIC, 0)
    written: list[str] = []
    with node.client() as client:
        for seq in range(150):
            value = f"record-{seq}-" + "x" * rng.randrange(10, 80)
            client.post(
                f"/v1/partitions/{TOPIC}/0/records",
                json={
                    "producer_id": 7,
                    "producer_epoch": 0,
                    "base_sequence": seq,
                    "records": [{"value": value}],
                },
            ).raise_for_status()
            written.append(value)
    if seed == 1:
        node.kill()
    else:
        node.stop()
    directory = tmp_path / "data" / f"{TOPIC}-0"
    segments = sorted(directory.glob("*.log"))
    victim = rng.choice(segments) if seed == 3 else segments[-1]
    cut = rng.randrange(1, victim.stat().st_size)
    with open(victim, "r+b") as f:
        f.truncate(cut)

    node.start()
    with node.client() as client:
        stored = read_all(client)
        survived = [stored[o] for o in sorted(stored)]
        assert survived == written[: len(survived)]
        assert len(survived) < len(written)
        accepted = client.post(
            f"/v1/partitions/{TOPIC}/0/records",
            json={
                "producer_id": 7,
                "producer_epoch": 0,
                "base_sequence": len(survived),
                "records": [{"value": "after-repair"}],
            },
        )
        assert accepted.status_code == 200, accepted.text
        assert accepted.json()["base_offset"] == len(survived)
    node.stop()
