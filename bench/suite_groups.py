"""The ``groups`` part of ``eos bench``: consumer groups as a user meets them, with the
coordinator's default group settings (session 45 s, heartbeat 5 s).

    python -m eos_bench.suite_groups [--quick] [--json]
    (or python -m bench.suite_groups from the source tree; eos bench --only groups)

On one cluster of ``eos up``'s shape (three nodes, one coordinator, SQLite), four figures:

1. **rebalance after a kill**: two members read a 12-partition topic that is written all
   the time; one, a process of its own, is SIGKILLed; the time until the survivor reads a
   record of a partition the dead one owned. The bar is the session timeout + 1 s: a
   member is only known dead when its session ends.
2. **join to first record**: a third member joins the two; the time from its
   ``subscribe`` to its first record (the others revoke, then it is given their
   partitions).
3. **heartbeat cost**: 1,000 members of one group heartbeating as the SDK does (each
   heartbeat held by the coordinator up to the interval), raw HTTP from this process: the
   coordinator's CPU per heartbeat and its share of one core.
4. **exactly-once copy**: a consume-transform-produce copy of 12 partitions in one
   transaction per poll with its offsets (``send_offsets_to_transaction`` with
   ``group_metadata()``), by one member, then by three (three processes): records per
   second until every input record is copied.

The machine's cores are shared by the services, the members and this process; the figures
are one round each, and rough.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from eos_bench.harness import cpu_seconds
from eos_cli.launcher import ClusterPlan, LocalCluster
from sdk import Consumer, Producer, TopicPartition, TransactionalProducer

Progress = Callable[[str], None]
PARTITIONS = 12
MEMBERS = 1_000
HEARTBEAT_S = 20.0


def _topic(url: str, name: str, partitions: int = PARTITIONS) -> None:
    answer = httpx.post(f"{url}/v1/topics", json={"name": name, "partitions": partitions,
                                                  "replication_factor": 1}, timeout=120)
    answer.raise_for_status()


class Feeder:
    """Writes a record to every partition of a topic, round after round, until stopped."""

    def __init__(self, url: str, topic: str, pause_s: float = 0.01) -> None:
        self.url, self.topic, self.pause_s = url, topic, pause_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with Producer(self.url) as producer:
            while not self.stop.is_set():
                for p in range(PARTITIONS):
                    producer.send(self.topic, "x" * 100, partition=p)
                producer.flush()
                self.stop.wait(self.pause_s)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def _member_process(url: str, group: str, topic: str, out: Path) -> subprocess.Popen[bytes]:
    """A member in a process of its own, which writes its assignment to ``out``."""
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from sdk import Consumer\n"
        "url, group, topic, out = sys.argv[1:5]\n"
        "with Consumer(url, group) as c:\n"
        "    c.subscribe([topic])\n"
        "    while True:\n"
        "        c.poll(timeout=0.5)\n"
        "        Path(out).write_text(json.dumps(sorted(tp.partition for tp in c.assignment())))\n"
    )
    return subprocess.Popen([sys.executable, "-c", code, url, group, topic, str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def rebalance_and_join(url: str, root: Path, progress: Progress) -> dict[str, Any]:
    topic, group = f"rb-{uuid.uuid4().hex[:6]}", f"rb-{uuid.uuid4().hex[:6]}"
    _topic(url, topic)
    feeder = Feeder(url, topic)
    out = root / "victim.json"
    victim = _member_process(url, group, topic, out)
    res: dict[str, Any] = {}
    try:
        with Consumer(url, group) as survivor:
            survivor.subscribe([topic])
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                survivor.poll(timeout=0.5)
                theirs = json.loads(out.read_text() or "[]") if out.exists() else []
                if len(theirs) == PARTITIONS // 2 and len(survivor.assignment()) == 6:
                    break
            else:
                raise RuntimeError("the two members never shared the partitions")
            progress("groups: SIGKILL one of two members")
            killed = time.monotonic()
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            moved = set(theirs)
            while time.monotonic() < killed + 180:
                records = survivor.poll(timeout=0.5)
                if any(r.partition in moved for r in records):
                    res["rebalance_after_kill_s"] = round(time.monotonic() - killed, 2)
                    break
            progress("groups: a third member joins")
            with Consumer(url, group) as joiner:
                started = time.monotonic()
                joiner.subscribe([topic])
                while time.monotonic() < started + 60:
                    survivor.poll(timeout=0.05)  # the survivor lets go when asked
                    if joiner.poll(timeout=0.05):
                        res["join_to_first_record_s"] = round(time.monotonic() - started, 2)
                        break
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        feeder.close()
    return res


class RawMember:
    """One member on one kept-alive connection, speaking HTTP/1.1 by hand: httpx costs this
    process about a millisecond of CPU per request, and a thousand members of it would
    measure the client, not the coordinator."""

    def __init__(self, host: str, port: int, group: str, topic: str) -> None:
        self.host, self.port, self.group, self.topic = host, port, group, topic
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.member_id = uuid.uuid4().hex
        self.epoch = 0
        self.owned: list[dict[str, Any]] = []

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        for _ in range(5):
            try:
                if self.writer is None:
                    self.reader, self.writer = await asyncio.open_connection(self.host,
                                                                             self.port)
                assert self.reader is not None
                data = json.dumps(body).encode()
                self.writer.write(
                    f"POST /v1/groups/{self.group}/heartbeat HTTP/1.1\r\nhost: {self.host}\r\n"
                    f"content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
                    .encode() + data)
                head = await self.reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                return dict(json.loads(await self.reader.readexactly(length)))
            except (OSError, asyncio.IncompleteReadError, StopIteration):
                if self.writer is not None:
                    self.writer.close()
                self.reader = self.writer = None
        raise RuntimeError("a heartbeat failed five times")

    async def join(self) -> None:
        self.member_id, self.epoch, self.owned = uuid.uuid4().hex, 0, []
        answer = await self._post({"member_id": self.member_id, "member_epoch": 0,
                                   "subscribed_topic_names": [self.topic],
                                   "owned_partitions": []})
        self.epoch, self.owned = answer["member_epoch"], answer["assignment"]

    async def beat(self, max_wait_ms: int) -> str | None:
        """One heartbeat; the error code when the member had to join again."""
        answer = await self._post({"member_id": self.member_id, "member_epoch": self.epoch,
                                   "owned_partitions": self.owned, "max_wait_ms": max_wait_ms})
        if "error" in answer:
            await self.join()
            return str(answer["error"]["code"])
        self.epoch, self.owned = answer["member_epoch"], answer["assignment"]
        return None


async def _heartbeats(url: str, group: str, topic: str, seconds: float, coordinator_pid: int
                      ) -> dict[str, Any]:
    address = httpx.URL(url)
    members = [RawMember(address.host, address.port or 80, group, topic)
               for _ in range(MEMBERS)]
    joined = time.monotonic()
    for start in range(0, MEMBERS, 50):  # 50 joins at a time, as copies starting together
        await asyncio.gather(*(m.join() for m in members[start:start + 50]))
    join_s = time.monotonic() - joined
    interval = 5_000
    count = 0
    codes: dict[str, int] = {}
    phase = {"stop": float("inf")}

    async def member(m: RawMember) -> None:
        nonlocal count
        while time.monotonic() < phase["stop"]:
            code = await m.beat(interval)
            if code is not None:
                codes[code] = codes.get(code, 0) + 1
            count += 1

    async def until_stable() -> float:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            while True:
                described = (await client.get(f"/v1/groups/{group}",
                                              params={"lag": "false"})).json()
                if described.get("state") == "stable":
                    return time.monotonic() - joined
                await asyncio.sleep(1.0)

    loops = [asyncio.create_task(member(m)) for m in members]
    stable_s = await asyncio.wait_for(until_stable(), 600)
    cpu0, count0, t0 = cpu_seconds(coordinator_pid), count, time.monotonic()
    phase["stop"] = t0 + seconds
    await asyncio.gather(*loops)
    cpu, wall, beats = cpu_seconds(coordinator_pid) - cpu0, time.monotonic() - t0, count - count0
    for m in members:
        if m.writer is not None:
            m.writer.close()
    return {"members": MEMBERS, "joins_s": round(join_s, 1),
            "join_to_stable_s": round(stable_s, 1), "rejoin_causes": codes,
            "heartbeat_interval_ms": interval, "steady_window_s": round(wall, 1),
            "heartbeats": beats, "heartbeats_per_s": round(beats / wall, 1),
            "coordinator_cpu_per_heartbeat_us": round(cpu / max(beats, 1) * 1e6, 1),
            "coordinator_core_share": round(cpu / wall, 3)}


def heartbeat_cost(url: str, coordinator_pid: int, seconds: float) -> dict[str, Any]:
    topic, group = f"hb-{uuid.uuid4().hex[:6]}", f"hb-{uuid.uuid4().hex[:6]}"
    _topic(url, topic, 100)
    return asyncio.run(_heartbeats(url, group, topic, seconds, coordinator_pid))


def copier_main(argv: list[str]) -> int:
    """One copy (``--copier URL GROUP SOURCE SINK TID UNTIL_IDLE_S``)."""
    url, group, source, sink, tid, idle_s = argv
    producer = TransactionalProducer(url, tid)
    producer.init_transactions()
    with Consumer(url, group, max_poll_records=500) as consumer:
        consumer.subscribe([source])
        last = time.monotonic()
        while time.monotonic() - last < float(idle_s):
            records = consumer.poll(timeout=0.5)
            if not records:
                continue
            last = time.monotonic()
            producer.begin_transaction()
            offsets: dict[TopicPartition, int] = {}
            for r in records:
                producer.send(sink, r.value, key=r.key, partition=r.partition)
                offsets[TopicPartition(r.topic, r.partition)] = r.offset + 1
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            producer.commit_transaction()
    producer.close()
    return 0


def copy_rate(url: str, copies: int, records: int) -> dict[str, Any]:
    source, sink = f"cp-in-{uuid.uuid4().hex[:6]}", f"cp-out-{uuid.uuid4().hex[:6]}"
    group = f"cp-{uuid.uuid4().hex[:6]}"
    _topic(url, source)
    _topic(url, sink)
    with Producer(url) as producer:
        for i in range(records):
            producer.send(source, "x" * 100, partition=i % PARTITIONS)
        producer.flush()
    started = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "eos_bench.suite_groups", "--copier", url,
                               group, source, sink, f"{group}-{i}", "10"])
             for i in range(copies)]
    try:
        with Consumer(url, group) as probe:
            while time.monotonic() - started < 600:
                done = probe.committed([(source, p) for p in range(PARTITIONS)],
                                       require_stable=False)
                total = sum(o.offset for o in done.values() if o is not None)
                if total >= records:
                    break
                time.sleep(0.2)
        elapsed = time.monotonic() - started
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return {"copies": copies, "records": records, "seconds": round(elapsed, 1),
            "records_per_s": round(records / elapsed, 1)}


def run_groups(quick: bool, progress: Progress) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="eos-bench-groups-"))
    plan = ClusterPlan(root, nodes=3, coordinators=1, port_base=None)
    cluster = LocalCluster(plan).start()
    res: dict[str, Any] = {"settings": "coordinator defaults: session 45 s, heartbeat 5 s",
                           "layout": "3 nodes, 1 coordinator (SQLite), RF 1"}
    try:
        url = cluster.url
        coordinator = cluster.coordinators[0].pid
        assert coordinator is not None
        for key, step in (
            ("rebalance", lambda: rebalance_and_join(url, root, progress)),
            ("heartbeats", lambda: heartbeat_cost(url, coordinator, 10.0 if quick
                                                  else HEARTBEAT_S)),
            ("copy_1", lambda: copy_rate(url, 1, 20_000 if quick else 60_000)),
            ("copy_3", lambda: copy_rate(url, 3, 20_000 if quick else 60_000)),
        ):
            progress(f"groups: {key}")
            try:
                res[key] = step()
            except Exception as exc:
                res[key] = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    one, three = res.get("copy_1", {}), res.get("copy_3", {})
    if one.get("records_per_s") and three.get("records_per_s"):
        res["copy_3_over_1"] = round(three["records_per_s"] / one["records_per_s"], 2)
    return res


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--copier":
        return copier_main(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    res = run_groups(args.quick, lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
