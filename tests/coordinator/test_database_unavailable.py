"""A coordinator whose database goes away while it serves answers COORDINATOR_NOT_AVAILABLE
(503, retriable), never INTERNAL_ERROR, and serves again once the database is back.

The database is taken away for real: PostgreSQL is told to refuse new connections to it
and to end the coordinator's sessions, as a restart of the server or a failover of its
host would. A 500 there used to end a client's transaction (the chaos run's PostgreSQL
restart showed a copier answered INTERNAL_ERROR to an abort); a retriable answer lets
the client try again.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

from tests.support.cluster import ClusterFactory
from tests.support.coordinators import _admin
from tests.support.processes import wait_until


def _allow_connections(database: str, allow: bool) -> None:
    with _admin() as conn:
        conn.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS {str(allow).lower()}')
        if not allow:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            )


def _init(client: httpx.Client, tid: str) -> httpx.Response:
    return client.post(f"/v1/transactions/{tid}/init", json={})


def test_a_lost_database_is_answered_retriable_and_served_again(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(nodes=1, database="postgres")
    assert cluster.database_url is not None
    database = urlsplit(cluster.database_url).path.lstrip("/")
    with cluster.client(None) as client:
        assert _init(client, "before").status_code == 200
        _allow_connections(database, False)
        try:
            answer = _init(client, "during")
            assert answer.status_code == 503, answer.text
            error = answer.json()["error"]
            assert error["code"] == "COORDINATOR_NOT_AVAILABLE", error
            assert error["retriable"] is True, error
        finally:
            _allow_connections(database, True)
        wait_until(
            lambda: _init(client, "during").status_code == 200,
            timeout=30,
            what="the coordinator to serve again once its database is back",
        )
        described = client.get("/v1/transactions/during").json()
        assert described["state"] == "Empty", described
    assert "INTERNAL_ERROR" not in cluster.coordinator.tail(200)
