"""What a record costs the garbage collector while it waits in a producer.

A producer's buffer holds hundreds of thousands of records. Two things made them costly
for the collector, about a third of a producer's CPU between them
(``docs/benchmarks.md``): each pending future was four objects for it to walk, and a
produce request's ``trace`` callback kept the request's batches — every record and
future of them — alive after the answer, because httpx keeps each response in a
reference cycle with its stream, freed only when the collector gets to it (for a request
in flight across two collections, its oldest generation). Both are checked here with the
collector switched off, so only reference counting can free anything."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures import ALL_COMPLETED
from concurrent.futures import wait as wait_futures

import httpx
import pytest

from sdk._config import RetryConfig
from sdk._record_futures import RecordFuture
from sdk._transport import AsyncTransport, SyncTransport

pytestmark = pytest.mark.unit

URL = "http://node1/v1/topics/t/partitions/0/records"


@pytest.fixture
def no_collector() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def answer(_request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"offset": 0})


class Batches:
    """Stands for a request's batches: what ``on_wire`` reaches."""

    def __init__(self) -> None:
        self.told = 0

    def on_wire(self) -> None:
        self.told += 1


def test_a_pending_record_future_is_one_object_for_the_collector() -> None:
    condition = threading.Condition()
    future: RecordFuture[int] = RecordFuture(condition)
    others = [o for o in gc.get_referents(future)
              if gc.is_tracked(o) and o is not condition and not isinstance(o, type)]  # fmt: skip
    assert others == [], f"a pending future holds {[type(o).__name__ for o in others]}"
    # the lists are made when asked for, and work as a Future's
    told: list[object] = []
    future.add_done_callback(told.append)
    waiting = RecordFuture[int](condition)
    future.set_result(1)
    done, pending = wait_futures([future, waiting], timeout=0.01, return_when=ALL_COMPLETED)
    assert (done, pending) == ({future}, {waiting})
    assert told == [future] and future.result(0) == 1


def test_a_produce_request_lets_go_of_its_batches_once_answered(no_collector: None) -> None:
    transport = SyncTransport(RetryConfig(), transport=httpx.MockTransport(answer))
    batches = Batches()
    gone = weakref.ref(batches)
    assert transport.send_once("POST", URL, json={"records": []}, on_wire=batches.on_wire)
    del batches
    assert gone() is None, "the answered request still holds its batches"
    transport.client.close()


def test_an_async_produce_request_lets_go_of_its_batches_once_answered(
    no_collector: None,
) -> None:
    async def scenario() -> weakref.ref[Batches]:
        transport = AsyncTransport(RetryConfig(), transport=httpx.MockTransport(answer))
        batches = Batches()
        gone = weakref.ref(batches)
        await transport.send_once("POST", URL, json={"records": []}, on_wire=batches.on_wire)
        await transport.client.aclose()
        return gone

    gone = asyncio.run(scenario())
    assert gone() is None, "the answered request still holds its batches"
