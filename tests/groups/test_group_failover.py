"""A consumer group through its coordinator's death and through a static member's restart,
with real processes and the SDK's members.

* The coordinator owning the group's lease is SIGKILLed while a second member is joining
  (the first must revoke half of its partitions): the other instance takes the lease and
  the group over from the database, and the members go on to a balanced assignment, no
  partition in both at any moment. The time from the kill to balance is printed (the bar
  is the lease time + 1 s; timings are judged in ``eos bench``, not here).
* Static membership: a member that closes (a static leave) and comes back under the same
  instance id gets exactly its partitions back, and the other member keeps its own
  throughout, with no rebalance callback.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from sdk import Consumer, TopicPartition
from tests.support.cluster import Cluster, ClusterFactory
from tests.support.leases import tid_owned_by, wait_balanced
from tests.support.processes import wait_until

pytestmark = pytest.mark.slow

LEASE_MS = 3_000
PARTITIONS = 12
FLAGS = ("--group-session-timeout-ms", "30000", "--group-heartbeat-interval-ms", "500")


def _topic(cluster: Cluster) -> str:
    name = f"gf-{uuid.uuid4().hex[:8]}"
    answer = httpx.post(f"{cluster.url}/v1/topics", timeout=60,
                        json={"name": name, "partitions": PARTITIONS})
    assert answer.status_code == 201, answer.text
    return name


class Watch:
    """Polls members and checks, at every sample, that no partition is in two of them."""

    def __init__(self, *members: Consumer) -> None:
        self.members = list(members)

    def sample(self) -> list[set[TopicPartition]]:
        for member in self.members:
            member.poll(timeout=0.05)
        owned = [member.assignment() for member in self.members]
        seen: set[TopicPartition] = set()
        for parts in owned:
            assert not (parts & seen), f"a partition in two members: {parts & seen}"
            seen |= parts
        return owned

    def until(self, what: str, done: object, timeout: float = 120) -> None:
        def check() -> bool:
            return bool(done(self.sample()))  # type: ignore[operator]

        wait_until(check, timeout=timeout, what=what)


def _balanced(owned: list[set[TopicPartition]]) -> bool:
    sizes = [len(p) for p in owned]
    return sum(sizes) == PARTITIONS and max(sizes) - min(sizes) <= 1


@pytest.fixture
def two_coordinators(cluster_factory: ClusterFactory) -> Iterator[Cluster]:
    cluster = cluster_factory(database="postgres", coordinators=2, lease_ms=LEASE_MS,
                              coordinator_flags=FLAGS)
    wait_balanced(cluster.coordinators)
    yield cluster


def test_members_go_on_when_the_group_coordinator_dies_mid_rebalance(
    two_coordinators: Cluster,
) -> None:
    cluster = two_coordinators
    doomed, survivor = cluster.coordinators
    group = tid_owned_by(doomed, "group")  # a group id hashes as a transactional id does
    topic = _topic(cluster)
    bootstrap = cluster.every_coordinator()
    with Consumer(bootstrap, group) as first, Consumer(bootstrap, group) as second:
        first.subscribe([topic])
        watch = Watch(first)
        watch.until("the first member owns everything", lambda o: len(o[0]) == PARTITIONS)
        second.subscribe([topic])
        # The second joins while the first is not polled: the first cannot let go of
        # anything (revocation happens in poll), so the rebalance is under way, and must
        # be finished by the other coordinator, when the group's coordinator dies.
        joining = Watch(second)
        joining.until("the second member joined", lambda o: bool(
            second.group_metadata().member_id))
        assert first.assignment() == {TopicPartition(topic, p) for p in range(PARTITIONS)}
        killed = time.monotonic()
        doomed.kill()
        watch.members.append(second)
        watch.until("a balanced group on the surviving coordinator", _balanced)
        took = time.monotonic() - killed
        print(f"coordinator SIGKILL mid-rebalance -> balanced in {took:.2f} s "
              f"(lease {LEASE_MS / 1000:.0f} s)")

        def owned_by_survivor() -> bool:
            owner = httpx.get(f"{survivor.url}/v1/coordinators", timeout=10,
                              params={"key": group, "key_type": "consumer_group"})
            return owner.status_code == 200 and (
                owner.json()["url"].rstrip("/") == survivor.url.rstrip("/"))

        assert owned_by_survivor()  # no second member got partitions from the dead one
        described = httpx.get(f"{survivor.url}/v1/groups/{group}", timeout=30,
                              params={"lag": "false"}).json()
        assert described["state"] == "stable" and len(described["members"]) == 2


def test_a_static_member_comes_back_to_its_own_partitions(two_coordinators: Cluster) -> None:
    cluster = two_coordinators
    topic, group = _topic(cluster), f"static-{uuid.uuid4().hex[:8]}"
    moves: list[str] = []
    with Consumer(cluster.url, group, group_instance_id="copy-b") as b:
        b.subscribe([topic], on_assigned=lambda tps: moves.append("assigned"),
                    on_revoked=lambda tps: moves.append("revoked"))
        a = Consumer(cluster.url, group, group_instance_id="copy-a")
        a.subscribe([topic])
        watch = Watch(a, b)
        watch.until("two static members balanced", _balanced)
        a_had, b_had = a.assignment(), b.assignment()
        moves.clear()
        a.close()  # a static leave: a's partitions wait for it
        watch.members = [b]
        for _ in range(10):
            assert watch.sample() == [b_had]
        again = Consumer(cluster.url, group, group_instance_id="copy-a")
        try:
            again.subscribe([topic])
            watch.members = [again, b]
            watch.until("the restarted copy back in", lambda o: o[0] == a_had)
            assert b.assignment() == b_had and moves == []
        finally:
            again.close()
