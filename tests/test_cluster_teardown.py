"""A test cluster's teardown notes the services it found gone already, and how they
ended (``logs/exits.txt``, beside the logs the failure report points at): a service found
dead by a failed test says whether it was killed or exited by itself."""

from __future__ import annotations

from tests.support.cluster import ClusterFactory, ClusterSpec


def test_the_teardown_names_a_service_killed_before_it(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(ClusterSpec(nodes=2))
    cluster.node(2).kill()
    cluster.node(2).wait_stopped(0)
    exits = cluster.root / "logs" / "exits.txt"
    assert not exits.exists()
    cluster.stop()
    assert exits.read_text() == "node 2: was killed by SIGKILL before the teardown\n"


def test_a_cluster_whose_services_all_ran_leaves_no_note(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(ClusterSpec(nodes=1))
    cluster.stop()
    assert not (cluster.root / "logs" / "exits.txt").exists()


def test_a_second_stop_keeps_the_first_ones_note(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(ClusterSpec(nodes=2))
    cluster.node(1).kill()
    cluster.stop()
    cluster.stop()  # as the factory does at the end: every service is gone by now
    exits = cluster.root / "logs" / "exits.txt"
    assert exits.read_text() == "node 1: was killed by SIGKILL before the teardown\n"
