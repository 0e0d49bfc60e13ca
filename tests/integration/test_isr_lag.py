"""A follower that stops keeping up leaves the ISR, by the leader's own proposal
(AlterPartition), and comes back once it has caught up — real processes, the fetches cut by
the fault proxy while every heartbeat goes on (so the controller never takes a node for
dead: this is the lag rule, not the liveness rule).

Node 1 leads, and its followers reach it only through the proxy. The liveness rule is made
slow here (a node is dead after 20 s without a heartbeat, not 2 s), so that a heartbeat
delayed by a loaded machine cannot move the leadership away from node 1 while the test
watches the lag rule act. With both followers cut
off for longer than ``replica_lag_time_max_ms`` the ISR shrinks to node 1 alone, below
``min_insync_replicas`` (2), and acks=all produces are refused with NOT_ENOUGH_REPLICAS
before anything is written. Healed, the followers catch up, the leader proposes them back,
and produces are acknowledged again.
"""

from __future__ import annotations

import httpx
import pytest

from tests.support.cluster import ClusterFactory
from tests.support.processes import wait_until
from tests.support.proxy import NO_FAULTS, FaultPlan

pytestmark = pytest.mark.slow


def test_a_lagging_follower_leaves_the_isr_and_comes_back(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(
        nodes=3, replication_factor=3, proxied_node=1, fsync=True,
        node_flags=("--replica-lag-time-max-ms", "1000",
                    "--controller-session-timeout-ms", "30000"),
        coordinator_flags=("--node-session-timeout-ms", "20000"),
    )  # fmt: skip
    proxy = cluster.node_proxy
    assert proxy is not None
    with httpx.Client(base_url=cluster.url, timeout=30) as client:
        client.post("/v1/topics", json={"name": "lag", "partitions": 3}).raise_for_status()

        def state(p: int) -> dict[str, object]:
            answer: dict[str, object] = client.get("/v1/topics/lag").json()["partitions"][p]
            return answer

        (partition,) = [p for p in range(3) if state(p)["replicas"][0] == 1]  # type: ignore[index]
        wait_until(lambda: sorted(state(partition)["isr"]) == [1, 2, 3],  # type: ignore[type-var]
                   timeout=20, what="every replica in sync")  # fmt: skip
        leader = str(state(partition)["leader"]["url"])  # type: ignore[index]

        def produce(value: str) -> httpx.Response:
            return httpx.post(f"{leader}/v1/partitions/lag/{partition}/records", timeout=40,
                              json={"records": [{"value": value}]})  # fmt: skip

        assert produce("before").status_code == 200
        proxy.set_plan(FaultPlan(paths=("/internal/v1/replicas/",), cut_rate=1.0))
        try:
            seen: list[dict[str, object]] = []

            def only_the_leader_in_sync() -> bool:
                seen[:] = [state(partition)]
                return seen[0]["isr"] == [1]

            try:
                wait_until(only_the_leader_in_sync, timeout=20,
                           what="the leader to drop both lagging followers")  # fmt: skip
            except AssertionError as exc:
                raise AssertionError(f"{exc}; the partition's last state: {seen}") from None
            assert state(partition)["leader"]["node_id"] == 1  # type: ignore[index]
            refused = produce("too few in sync")
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "NOT_ENOUGH_REPLICAS"
        finally:
            proxy.set_plan(NO_FAULTS)
        wait_until(lambda: sorted(state(partition)["isr"]) == [1, 2, 3],  # type: ignore[type-var]
                   timeout=20, what="the followers back in the ISR")  # fmt: skip
        # acknowledged again (retried as a client would: on a loaded machine a follower
        # can lag out once more, and the write is then refused, retriably)
        answers: list[httpx.Response] = []
        wait_until(lambda: answers.append(produce("after")) or answers[-1].status_code == 200,
                   timeout=60, what="a produce acknowledged after the heal")  # fmt: skip
        assert all(a.json()["error"]["retriable"] for a in answers[:-1]), answers[0].text
        assert proxy.counts["cut"] > 0
