"""The features of a real coordinator process, and the SDK's choice from them: a cluster
of this release names its release, protocol and transaction versions in its metadata, and
a producer that asked for no transaction version speaks 2 with it (``test_versions.py``
covers the other releases' answers)."""

from __future__ import annotations

import httpx

from eos_protocol.versions import CURRENT_FEATURES, PROTOCOL_VERSION, RELEASE
from tests.sdk.cluster import Cluster
from tests.sdk.conftest import Twin
from tests.sdk.helpers import uid


def test_the_cluster_names_its_features_and_the_producer_takes_version_2(
    twin: Twin, cluster: Cluster
) -> None:
    answer = httpx.get(f"{cluster.url}/v1/metadata", params={"include_topics": "false"}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["features"] == {
        "release": RELEASE,
        "protocol": PROTOCOL_VERSION,
        "transaction_version": {"min": 1, "max": 2},
    }
    assert twin.admin(cluster.url).describe_cluster().features == CURRENT_FEATURES

    producer = twin.transactional_producer(cluster.url, uid("negotiated"))
    producer.init_transactions()
    core = producer._core
    assert core.init_version == core.txn.transaction_version == 2
