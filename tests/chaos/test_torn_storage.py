"""Torn storage: a node's files damaged while it is down (a segment cut at a random byte,
an index deleted, the checkpoint with its producer-state snapshot corrupted); it must start,
repair or rebuild, and serve only whole, committed data.

The node gets a mix of interleaved transactions (committed, aborted, one left open) and
plain batches, written by hand so every offset is known: data batches, and each marker's
offset (the log end just after it). After the damage, read_committed must return exactly
what the surviving log makes committed and stable: the records of plain batches and of
transactions whose COMMIT marker survived, below the first offset of a transaction whose
marker did not (it is open again); never a record of an aborted transaction. What survives
is computed from the files, not from the node: every frame wholly before the cut (read
with the node's own frame decoder) and nothing after it, so a node that drops more than the
cut took, or keeps anything after it, fails.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from partition_service.log.batch import CorruptBatchError, decode_header
from tests.support.nodes import NodeProcess
from tests.support.processes import wait_until

TOPIC = "torn"
pytestmark = pytest.mark.slow


@dataclass
class Txn:
    pid: int
    outcome: str | None = None  # "COMMIT", "ABORT", or None while open
    marker: int | None = None  # offset of its marker
    offsets: list[int] = field(default_factory=list)


@dataclass
class Written:
    """What the node acknowledged: value by offset, and who wrote each offset."""

    values: dict[int, str] = field(default_factory=dict)
    owner: dict[int, Txn | None] = field(default_factory=dict)  # None: a plain batch
    txns: list[Txn] = field(default_factory=list)
    end: int = 0

    def expected_committed(self, survived: int) -> list[tuple[int, str]]:
        """What read_committed may show when offsets below ``survived`` are left."""
        stable = survived
        for txn in self.txns:
            reopened = txn.marker is None or txn.marker >= survived
            if txn.offsets and txn.offsets[0] < survived and reopened:
                stable = min(stable, txn.offsets[0])  # open again: holds the LSO
        shown = []
        for offset in sorted(self.values):
            txn = self.owner[offset]
            if offset >= stable:
                break
            if txn is None or (txn.outcome == "COMMIT" and (txn.marker or 0) < survived):
                shown.append((offset, self.values[offset]))
        return shown


def write_mix(node: NodeProcess, rng: random.Random, steps: int = 120) -> Written:
    """Interleaved transactions of five producers, plain batches between them, and one
    transaction left open at the end."""
    written = Written()
    sequences: dict[int, int] = {}
    open_txns: dict[int, Txn] = {}
    with node.client() as client, node.internal() as internal:

        def produce(pid: int | None, values: list[str], txn: Txn | None) -> None:
            body: dict[str, object] = {"records": [{"value": v} for v in values]}
            if pid is not None:
                body |= {"producer_id": pid, "producer_epoch": 0,
                         "base_sequence": sequences.get(pid, 0), "transactional": True}  # fmt: skip
                sequences[pid] = sequences.get(pid, 0) + len(values)
            answer = client.post(f"/v1/partitions/{TOPIC}/0/records", json=body)
            assert answer.status_code == 200, answer.text
            base = answer.json()["base_offset"]
            for i, value in enumerate(values):
                written.values[base + i] = value
                written.owner[base + i] = txn
                if txn is not None:
                    txn.offsets.append(base + i)

        def end(txn: Txn, outcome: str) -> None:
            marker = {
                "producer_id": txn.pid, "producer_epoch": 0, "coordinator_epoch": 0,
                "result": outcome, "partitions": [{"topic": TOPIC, "partition": 0}],
            }  # fmt: skip
            internal.post("/internal/v1/markers", json={"markers": [marker]}).raise_for_status()
            offsets = client.get(f"/v1/partitions/{TOPIC}/0/offsets").json()
            txn.outcome, txn.marker = outcome, offsets["high_watermark"] - 1

        for step in range(steps):
            roll = rng.random()
            values = [
                f"s{step}-{i}-" + "x" * rng.randrange(5, 60) for i in range(rng.randint(1, 4))
            ]
            if roll < 0.15:
                produce(None, values, None)
            elif roll < 0.7 or not open_txns:
                pid = rng.choice(range(100, 105))
                txn = open_txns.get(pid)
                if txn is None:
                    txn = open_txns[pid] = Txn(pid)
                    written.txns.append(txn)
                produce(pid, [f"{v}-{'p' + str(pid)}" for v in values], txn)
            else:
                pid = rng.choice(sorted(open_txns))
                end(open_txns.pop(pid), "COMMIT" if rng.random() < 0.65 else "ABORT")
        for pid in sorted(open_txns):
            end(open_txns.pop(pid), "COMMIT")
        left_open = Txn(109)  # holds the LSO across the restart
        written.txns.append(left_open)
        produce(109, ["left-open"], left_open)
        written.end = client.get(f"/v1/partitions/{TOPIC}/0/offsets").json()["high_watermark"]
    assert any(t.outcome == "ABORT" for t in written.txns)
    assert any(t.outcome is None for t in written.txns)
    return written


def read_committed(node: NodeProcess) -> list[tuple[int, str]]:
    shown: list[tuple[int, str]] = []
    offset = 0
    with node.client() as client:
        while True:
            body = client.get(f"/v1/partitions/{TOPIC}/0/records", params={
                "offset": offset, "max_records": 500, "isolation_level": "read_committed",
            }).json()  # fmt: skip
            shown += [(r["offset"], r["value"]) for r in body["records"]]
            if body["next_offset"] == offset:
                return shown
            offset = body["next_offset"]


def surviving_end(segment: Path, cut: int) -> int:
    """The log end after cutting ``segment`` at byte ``cut``: the next offset after the
    last frame wholly before the cut (the segment's base offset if there is none)."""
    data = segment.read_bytes()[:cut]
    end, position = int(segment.stem), 0
    while True:
        try:
            header = decode_header(data, position, position, verify=True)
        except CorruptBatchError:
            return end
        end, position = header.next_offset, position + header.frame_size


@pytest.fixture
def node(tmp_path: Path, node_factory: type[NodeProcess]) -> NodeProcess:
    made = node_factory(
        tmp_path / "data",
        extra=["--segment-bytes", "4096", "--checkpoint-interval-ms", "50"],
    )
    made.start()
    made.create_partition(TOPIC, 0)
    return made


def _directory(node: NodeProcess) -> Path:
    return node.data_dir / f"{TOPIC}-0"


def _restart_check(node: NodeProcess, written: Written, survived: int) -> None:
    node.start()
    assert read_committed(node) == written.expected_committed(survived)
    with node.client() as client:
        offsets = client.get(f"/v1/partitions/{TOPIC}/0/offsets").json()
        assert offsets["high_watermark"] == survived
        more = client.post(f"/v1/partitions/{TOPIC}/0/records",
                           json={"records": [{"value": "after-repair"}]})  # fmt: skip
        assert more.status_code == 200 and more.json()["base_offset"] == survived, more.text


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_segment_cut_at_a_random_byte_leaves_only_whole_committed_data(
    node: NodeProcess, seed: int
) -> None:
    rng = random.Random(seed)
    written = write_mix(node, rng)
    if seed % 2:
        node.kill()
    else:
        node.stop()
    segments = sorted(_directory(node).glob("*.log"))
    assert len(segments) > 2, "the mix should span several segments"
    victim = segments[-1] if seed <= 2 else rng.choice(segments[:-1])
    cut = rng.randrange(1, victim.stat().st_size)
    survived = surviving_end(victim, cut)
    with open(victim, "r+b") as f:
        f.truncate(cut)
    assert survived < written.end
    _restart_check(node, written, survived)


@pytest.mark.parametrize("which", ["offset indexes", "aborted-transaction index"])
def test_a_deleted_index_is_rebuilt(node: NodeProcess, which: str) -> None:
    written = write_mix(node, random.Random(which))
    wait_for_checkpoint(node)
    node.stop()
    pattern = "*.index" if which == "offset indexes" else "aborted.txnindex"
    deleted = list(_directory(node).glob(pattern))
    assert deleted
    for path in deleted:
        path.unlink()
    _restart_check(node, written, written.end)
    full = read_committed(node)
    with node.client() as client:  # reads from the middle find their place without the index
        for start in random.Random(5).sample(range(written.end), 10):
            body = client.get(f"/v1/partitions/{TOPIC}/0/records", params={
                "offset": start, "max_records": 5, "isolation_level": "read_committed",
            }).json()  # fmt: skip
            want = [(o, v) for o, v in full if o >= start][: len(body["records"])]
            assert [(r["offset"], r["value"]) for r in body["records"]] == want


@pytest.mark.parametrize("damage", ["garbage", "cut in half", "one byte flipped", "emptied"])
def test_a_corrupt_checkpoint_is_ignored_and_the_state_rebuilt(
    node: NodeProcess, damage: str
) -> None:
    written = write_mix(node, random.Random(damage))
    wait_for_checkpoint(node)
    node.kill()
    checkpoint = _directory(node) / "checkpoint.json"
    raw = bytearray(checkpoint.read_bytes())
    rng = random.Random(damage)
    if damage == "garbage":
        raw = bytearray(rng.randbytes(len(raw)))
    elif damage == "cut in half":
        raw = raw[: len(raw) // 2]
    elif damage == "one byte flipped":
        at = rng.randrange(len(raw) // 2)  # inside the body, in the producer state or before
        raw[at] ^= 0x01
    else:
        raw = bytearray()
    checkpoint.write_bytes(bytes(raw))
    _restart_check(node, written, written.end)
    with node.client() as client:  # the open transaction is still open: it holds the LSO
        open_txn = next(t for t in written.txns if t.outcome is None)
        offsets = client.get(f"/v1/partitions/{TOPIC}/0/offsets").json()
        assert offsets["last_stable_offset"] == open_txn.offsets[0]
        producers = client.get(f"/v1/partitions/{TOPIC}/0/producers").json()["producers"]
        assert {p["producer_id"] for p in producers} >= {t.pid for t in written.txns}


def wait_for_checkpoint(node: NodeProcess) -> None:
    """Until the node has checkpointed everything written (so the damage hits a checkpoint
    that covers the whole log)."""
    path = _directory(node) / "checkpoint.json"
    with httpx.Client(base_url=node.url, timeout=10) as client:
        end = client.get(f"/v1/partitions/{TOPIC}/0/offsets").json()["high_watermark"]

    def covered() -> bool:
        try:
            return f'"next_offset":{end},'.encode() in path.read_bytes()
        except OSError:
            return False

    wait_until(covered, timeout=30, what="a checkpoint covering the whole log")
