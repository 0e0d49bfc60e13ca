"""The per-transaction fast paths: the fast-path layer (``eos_server/fastpath.py``) answers
exactly as the routes do, the write batcher keeps every write fenced on its own, and
KIP-890's verification is answered from memory only while the lease is certainly live."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx
import sqlalchemy as sa

from coordinator_service.clock import FakeClock
from coordinator_service.transactions import state as st
from coordinator_service.transactions.store import LeaseToken
from eos_protocol.states import TransactionState
from tests.coordinator.helpers import add, end, init, ok, topic, transaction_row
from tests.support.coordinators import INTERNAL_TOKEN, InProcessCoordinator

AUTH = {"Authorization": f"Bearer {INTERNAL_TOKEN}"}


def _verify(client: httpx.Client, pid: Any, headers: dict[str, str] | None = None) -> Any:
    return client.get(f"/internal/v1/producers/{pid}/transaction",
                      headers=AUTH if headers is None else headers)


def _script(client: httpx.Client, tid: str, pid: int, epoch: int) -> list[httpx.Response]:
    """Every kind of answer the fast path may give or hand back to the routes."""
    ident = {"producer_id": pid, "producer_epoch": epoch}
    post = client.post
    return [
        add(client, tid, pid, epoch, 0, 1),
        add(client, tid, pid, epoch, 0, 9),  # unknown partition: an error entry
        add(client, tid, pid, epoch + 1, 0),  # a later epoch
        add(client, tid, 424_242, epoch, 0),  # another producer id
        add(client, "nobody-" + tid, pid, epoch, 0),  # unknown transactional id
        post(f"/v1/transactions/{tid}/partitions", json={**ident, "partitions": []}),  # 422
        post(f"/v1/transactions/{tid}/partitions", content=b"{not json",
             headers={"content-type": "application/json"}),
        post(f"/v1/transactions/{tid}/partitions", content=b'{"producer_id": 1}',
             headers={"content-type": "text/plain"}),
        post(f"/v1/transactions/{tid}/commit", json={"producer_id": "x"}),
        _verify(client, pid),
        _verify(client, f"{pid:03d}"),  # FastAPI reads 007 as 7: left to the route
        _verify(client, 999_999),
        _verify(client, pid, headers={}),
        _verify(client, pid, headers={"Authorization": "Bearer wrong"}),
        _verify(client, -1),
        end(client, tid, pid, epoch, "commit", wait=True),
        end(client, tid, pid, epoch, "commit", wait=True),  # a retry
        end(client, tid, pid, epoch, "abort", wait=True),  # the other decision
        _verify(client, pid),
        add(client, tid, pid, epoch, 2),
        end(client, tid, pid, epoch, "abort", wait=False),
        end(client, tid, pid, epoch - 1 if epoch else epoch + 5, "commit"),
    ]


def _normalised(response: httpx.Response, tid: str, pid: int) -> tuple[int, str, bytes]:
    body = response.content.replace(tid.encode(), b"TID")
    body = re.sub(rb'(producer_id":|producer id |producer )%d(?![0-9])' % pid, rb"\1PID", body)
    return response.status_code, response.headers.get("content-type", ""), body


def test_fast_path_answers_exactly_as_the_routes(coordinator: InProcessCoordinator) -> None:
    stats = coordinator.app.state.fast_paths
    with coordinator.client() as client:
        topic(client, partitions=4)
        tids = ("hot-slow", "hot-fast")
        idents = [init(client, tid) for tid in tids]
        stats.enabled = False
        slow = _script(client, tids[0], *idents[0])
        assert stats.answered == 0
        stats.enabled = True
        fast = _script(client, tids[1], *idents[1])
        assert stats.answered >= 12  # the well-formed calls did take the fast path
        assert stats.replayed >= 6  # and the others were left to the routes
    for i, (a, b) in enumerate(zip(slow, fast, strict=True)):
        expected = _normalised(a, tids[0], idents[0][0])
        assert _normalised(b, tids[1], idents[1][0]) == expected, (i, a.text, b.text)


def _records(coordinator: InProcessCoordinator, *tids: str) -> list[Any]:
    cache = coordinator.services.coordinator.cache
    return [cache[st.txn_log_partition(t, 50)][t] for t in tids]



def _two_partitions(client: httpx.Client) -> tuple[str, str]:
    a = "batch-a"
    b = next(f"batch-b{i}" for i in range(100)
             if st.txn_log_partition(f"batch-b{i}", 50) != st.txn_log_partition(a, 50))
    for tid in (a, b):
        init(client, tid)
    return a, b


def test_batched_writes_are_fenced_one_by_one(
    coordinator: InProcessCoordinator, pg_url: str
) -> None:
    services = coordinator.services
    with coordinator.client() as client:
        a, b = _two_partitions(client)
    rec_a, rec_b = _records(coordinator, a, b)
    token_a = services.leases.token(rec_a.txn_log_partition)
    token_b = services.leases.token(rec_b.txn_log_partition)
    assert token_a is not None and token_b is not None
    # Another instance has taken a's log partition: its writes must change nothing.
    stolen = LeaseToken(token_a.log_partition, token_a.owner, token_a.coordinator_epoch + 7)
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE leases SET coordinator_epoch = :e WHERE log_partition = :p"),
            {"e": stolen.coordinator_epoch, "p": token_a.log_partition},
        )
    engine.dispose()
    before_a = transaction_row(pg_url, a)
    new_a = rec_a.replace(timeout_ms=1234, coordinator_epoch=token_a.coordinator_epoch)
    new_b = rec_b.replace(timeout_ms=4321, coordinator_epoch=token_b.coordinator_epoch)

    async def both() -> list[bool]:
        return await services.writer.write_many([(new_a, token_a, False), (new_b, token_b, False)])

    assert coordinator.call(both) == [False, True]
    assert transaction_row(pg_url, a) == before_a
    assert transaction_row(pg_url, b)["timeout_ms"] == 4321


def test_concurrent_writes_share_transactions_and_a_failure_stays_its_own(
    coordinator: InProcessCoordinator, pg_url: str
) -> None:
    services = coordinator.services
    with coordinator.client() as client:
        tids = [f"many-{i}" for i in range(24)]
        for tid in tids:
            init(client, tid)
    recs = _records(coordinator, *tids)
    writer = services.writer

    async def many(base: int, bad: bool) -> list[Any]:
        calls = []
        for i, rec in enumerate(recs):
            token = services.leases.token(rec.txn_log_partition)
            assert token is not None
            # with ``bad``, the first is an insert of a row that exists: it fails, alone
            insert = bad and i == 0
            calls.append(writer.write(rec.replace(timeout_ms=base + i), token, insert=insert))
        return await asyncio.gather(*calls, return_exceptions=True)

    batches0, writes0 = writer.batches, writer.writes
    assert coordinator.call(lambda: many(5000, False)) == [True] * len(recs)
    assert writer.writes - writes0 == len(recs)
    assert writer.batches - batches0 < len(recs)  # writes did share transactions

    results = coordinator.call(lambda: many(7000, True))
    assert isinstance(results[0], Exception)
    assert results[1:] == [True] * (len(recs) - 1)
    assert transaction_row(pg_url, tids[0])["timeout_ms"] == 5000
    for i, tid in enumerate(tids[1:], start=1):
        assert transaction_row(pg_url, tid)["timeout_ms"] == 7000 + i


def test_verification_from_memory_only_while_the_lease_is_live(
    coordinator_factory: Any, pg_url: str
) -> None:
    lease_clock = FakeClock(int(time.time() * 1000))
    c = coordinator_factory(background=False, lease_ms=8_000, lease_clock=lease_clock)
    services = c.services
    reads: list[int] = []
    store = services.store
    find = store.find_by_producer

    def counting(conn: Any, producer_id: int) -> Any:
        reads.append(producer_id)
        return find(conn, producer_id)

    store.find_by_producer = counting  # type: ignore[method-assign]
    with c.client() as client:
        topic(client)
        pid, epoch = init(client, "mem")
        ok(add(client, "mem", pid, epoch, 0, 1))
        view = ok(_verify(client, pid))
        assert view["state"] == "Ongoing" and len(view["partitions"]) == 2
        assert reads == []  # answered from memory
        # A change another owner made (here: by hand) is invisible to memory while the
        # lease is live, and must be seen once the local lease clock says it may be gone.
        engine = sa.create_engine(pg_url)
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE transactions SET producer_epoch = producer_epoch + 1, "
                        "state = 'PrepareAbort' WHERE transactional_id = 'mem'")
            )
        engine.dispose()
        lease_clock.advance(6_001)  # past expiry less a quarter of the lease
        view = ok(_verify(client, pid))
        assert reads == [pid]
        assert view["producer_epoch"] == epoch + 1
        assert view["state"] == TransactionState.PREPARE_ABORT.value
        assert services.leases.live_token(st.txn_log_partition("mem", 50)) is None
        # A renewal makes the lease live again, and memory authoritative again.
        c.call(services.leases.run_round)
        assert services.leases.live_token(st.txn_log_partition("mem", 50)) is not None
        ok(_verify(client, pid))
        assert reads == [pid]
        # Unknown producer ids always ask the database.
        assert _verify(client, pid + 5000).status_code == 404
        assert reads == [pid, pid + 5000]
