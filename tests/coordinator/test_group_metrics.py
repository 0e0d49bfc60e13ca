"""The consumer group metrics of a coordinator, scraped from ``/metrics``.

Members, groups and rebalances are read from the group coordinator at each scrape; the lag
of each group is sampled in the background (``groups/lag_sampler.py``) from stand-in
storage nodes (``GroupNodes``) whose offsets the tests set. Checked: the gauges follow
joins and leaves; the sampled lag is the sum of ``GET /v1/groups/{id}``'s per-partition
lag, each partition asked once however many groups read it; a group whose offsets cannot
be read loses its series (and is logged once, not every round) while the others keep
theirs, and gets it back once readable; a partial answer is no sum; and the loop runs on
its own at ``--group-lag-interval-ms``.
"""

from __future__ import annotations

import logging
import re

import httpx
import pytest

from tests.coordinator.conftest import CoordinatorFactory
from tests.support.coordinators import InProcessCoordinator
from tests.support.group_nodes import GroupNodes, Member, settle
from tests.support.processes import wait_until

LAG_LOG = "eos.coordinator.groups.lag"


@pytest.fixture
def fake_nodes() -> GroupNodes:
    return GroupNodes()


def scrape(c: httpx.Client) -> dict[str, float]:
    """Every sample of the coordinator's group metrics, by its line's name and labels."""
    text = c.get("/metrics").text
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^(eos_coordinator_group\S*|eos_coordinator_groups\S*) (\S+)$", text, re.M)}


def api_lag(c: httpx.Client, group: str) -> int:
    return sum(row["lag"] for row in c.get(f"/v1/groups/{group}").json()["lag"])


def test_members_groups_and_rebalances_follow_the_groups(
    coordinator_factory: CoordinatorFactory,
) -> None:
    running = coordinator_factory(background=False)
    with running.client() as c:
        assert c.post("/v1/topics", json={"name": "orders", "partitions": 4}).status_code == 201
        before = scrape(c)
        assert before["eos_coordinator_group_members"] == 0
        assert before["eos_coordinator_groups"] == 0
        assert before["eos_coordinator_group_rebalances_total"] == 0
        one = [Member(c, "one", ["orders"]), Member(c, "one", ["orders"])]
        settle(one)
        Member(c, "two", ["orders"])
        # a heartbeat of no member leaves a stand-in for "ghost" in memory, not a group
        refused = c.post("/v1/groups/ghost/heartbeat",
                         json={"member_id": "nobody", "member_epoch": 3})
        assert refused.json()["error"]["code"] == "UNKNOWN_MEMBER_ID"
        assert running.services.groups.cached("ghost") is not None
        seen = scrape(c)
        assert seen["eos_coordinator_group_members"] == 3
        assert seen["eos_coordinator_groups"] == 2
        rebalances = running.services.groups.rebalances
        assert rebalances >= 3  # each join moved its group's epoch and got new targets
        assert seen["eos_coordinator_group_rebalances_total"] == rebalances
        gone = one.pop()
        left = c.post("/v1/groups/one/heartbeat",
                      json={"member_id": gone.member_id, "member_epoch": -1})
        assert left.status_code == 200
        settle(one)
        after = scrape(c)
        assert after["eos_coordinator_group_members"] == 2
        assert after["eos_coordinator_groups"] == 2  # an empty group is still on record
        assert after["eos_coordinator_group_rebalances_total"] == running.services.groups.rebalances
        assert after["eos_coordinator_group_rebalances_total"] > rebalances


def sample(running: InProcessCoordinator) -> dict[str, int]:
    return running.call(running.services.group_lag.sample_once)


def test_the_sampled_lag_is_the_apis_sum_and_one_unreadable_group_loses_only_its_series(
    coordinator_factory: CoordinatorFactory, fake_nodes: GroupNodes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    running = coordinator_factory(background=False)
    nodes = fake_nodes
    with running.client() as c:
        assert c.post("/v1/topics", json={"name": "orders", "partitions": 4}).status_code == 201
        assert c.post("/v1/topics", json={"name": "audit", "partitions": 2}).status_code == 201
        Member(c, "readers", ["orders"])
        Member(c, "auditors", ["orders", "audit"])
        nodes.stable.update({("orders", p): 100 + p for p in range(4)})
        nodes.stable.update({("audit", 0): 7, ("audit", 1): 9})
        nodes.committed["readers"] = {("orders", 0): 100, ("orders", 1): 51}
        nodes.committed["auditors"] = {("audit", 1): 9, ("orders", 3): 200}
        nodes.forget_calls()
        sampled = sample(running)
        assert sampled == {"readers": 0 + 50 + 102 + 103, "auditors": 100 + 101 + 102 + 0 + 7}
        # each partition asked once for both groups; one offsets call per group
        assert nodes.kinds() == {"offsets": 2, "bounds": 6}
        for group, lag in sampled.items():
            assert api_lag(c, group) == lag
            assert scrape(c)[f'eos_coordinator_group_lag{{group="{group}"}}'] == lag

        caplog.set_level(logging.INFO, logger=LAG_LOG)
        nodes.refused.add("auditors")
        for _ in range(2):
            assert sample(running) == {"readers": 255}
        shown = scrape(c)
        assert 'eos_coordinator_group_lag{group="auditors"}' not in shown
        assert shown['eos_coordinator_group_lag{group="readers"}'] == 255
        warned = [r for r in caplog.records if r.name == LAG_LOG and r.levelname == "WARNING"]
        assert len(warned) == 1 and "auditors" in warned[0].getMessage()  # once, not per round
        assert "no read on auditors" in warned[0].getMessage()

        nodes.refused.clear()
        nodes.committed["auditors"][("audit", 0)] = 7
        assert sample(running)["auditors"] == 303
        assert scrape(c)['eos_coordinator_group_lag{group="auditors"}'] == 303
        assert any(r.levelname == "INFO" and "auditors" in r.getMessage()
                   for r in caplog.records if r.name == LAG_LOG)

        # a leader of orders away: no partial sum for either group
        leader = c.get("/v1/topics/orders").json()["partitions"][0]["leader"]["node_id"]
        nodes.down.add(leader)
        assert sample(running) == {}
        assert not [k for k in scrape(c) if k.startswith("eos_coordinator_group_lag")]


def test_the_loop_samples_on_its_own_at_the_configured_interval(
    coordinator_factory: CoordinatorFactory, fake_nodes: GroupNodes,
) -> None:
    running = coordinator_factory(group_lag_interval_ms=1_000)
    fake_nodes.stable[("orders", 0)] = 42
    with running.client() as c:
        assert c.post("/v1/topics", json={"name": "orders", "partitions": 1}).status_code == 201
        Member(c, "looped", ["orders"])
        series = 'eos_coordinator_group_lag{group="looped"}'
        wait_until(lambda: scrape(c).get(series) == 42, timeout=20,
                   what="the lag sampled by the background loop")
