"""A metadata refresh whose database read began before a topic was created must not drop
that topic from the instance's view when it finishes afterwards (it used to: the topic's
creator then failed its own answer with a KeyError, a 500, under lease hand-overs, each of
which refreshes the metadata)."""

from __future__ import annotations

import asyncio
from typing import Any

from coordinator_service.controller import metadata as md_module
from tests.coordinator.helpers import topic


def test_a_refresh_that_read_before_a_creation_keeps_the_new_topic(
    coordinator_factory: Any, monkeypatch: Any
) -> None:
    c = coordinator_factory(background=False)
    md = c.services.metadata
    parked = asyncio.Event()
    go = asyncio.Event()
    real_run = md._db.run

    async def slow_run(fn: Any, *args: Any) -> Any:
        result = await real_run(fn, *args)
        if fn is md_module._load_all:  # the snapshot is taken: hold it back
            parked.set()
            await go.wait()
        return result

    monkeypatch.setattr(md._db, "run", slow_run)

    async def start_refresh() -> asyncio.Task[None]:
        task = asyncio.create_task(md.refresh())
        await parked.wait()
        return task

    refresh = c.call(start_refresh)
    monkeypatch.setattr(md._db, "run", real_run)  # the creation reads and writes as usual
    with c.client() as client:
        created = topic(client, "raced", 2)
        assert created["name"] == "raced"

    async def finish() -> None:
        go.set()
        await refresh

    c.call(finish)
    # The instance's own view, as answers built from it read it (no refresh in between).
    assert "raced" in md._topics
    assert md._topic_info("raced").name == "raced"
