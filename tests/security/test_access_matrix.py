"""The access matrix, against running services: each principal on each endpoint, allowed or
denied with Kafka's code; every denied request changes nothing (the cluster's whole visible
state is read back before and after it); no token ever reaches a log."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.cluster import Cluster as SecureCluster
from tests.support.cluster import ClusterFactory
from tests.support.nodes import INTERNAL_TOKEN

pytestmark = pytest.mark.slow

ADMIN = "admin"
GROUPS = ("etl-group", "readers")


@dataclass(frozen=True)
class Case:
    what: str
    role: str | None
    method: str
    path: str
    status: int
    code: str | None = None
    body: Any = None
    where: str = "coordinator"  # or a topic (its partition 0's leader) or "group:<id>"


@pytest.fixture(scope="module")
def cluster(module_cluster_factory: ClusterFactory) -> SecureCluster:
    """Authentication on, on PostgreSQL; debug logs, so that every refusal is logged."""
    running = module_cluster_factory(database="postgres", auth=True, log_level="debug")
    _grant(running)
    return running


def _grant(cluster: SecureCluster) -> None:
    def rule(principal: str, rtype: str, name: str, op: str, pattern: str = "literal",
             permission: str = "allow") -> dict[str, str]:
        return {"principal": f"User:{principal}", "resource_type": rtype,
                "resource_name": name, "pattern_type": pattern, "operation": op,
                "permission": permission}

    with cluster.client(ADMIN) as admin:
        for topic in ("in-1", "out-1", "out-secret"):
            assert admin.post("/v1/topics", json={"name": topic, "partitions": 1}).status_code \
                == 201
        acls = [
            rule("etl", "transactional_id", "etl-", "write", "prefixed"),
            rule("etl", "topic", "out-", "write", "prefixed"),
            rule("etl", "topic", "out-", "create", "prefixed"),
            rule("etl", "topic", "out-new", "delete"),
            rule("etl", "topic", "in-1", "read"),
            rule("etl", "group", "etl-group", "read"),
            rule("etl", "topic", "out-secret", "write", permission="deny"),
            rule("reader", "topic", "out-", "read", "prefixed"),
            rule("reader", "group", "readers", "read"),
            rule("writer", "topic", "out-1", "write"),
        ]
        assert admin.post("/v1/acls", json={"acls": acls}).status_code == 201


def _base(cluster: SecureCluster, where: str) -> str:
    if where == "coordinator":
        return cluster.url
    with cluster.client(ADMIN) as admin:
        if where.startswith("group:"):
            key = where.partition(":")[2]
            found = admin.get("/v1/coordinators", params={"key_type": "group", "key": key})
            return str(found.json()["url"])
        topic = admin.get(f"/v1/topics/{where}").json()
    return str(topic["partitions"][0]["leader"]["url"])


def fingerprint(cluster: SecureCluster) -> dict[str, Any]:
    """Everything a request could have changed, read back by the admin and the internal
    token: topics, ACLs, transactions, every partition's offsets and producers, every
    node's partitions and both groups' committed offsets."""
    state: dict[str, Any] = {}
    with cluster.client(ADMIN) as admin:
        metadata = admin.get("/v1/metadata").json()
        state["topics"] = metadata["topics"]
        state["acls"] = admin.get("/v1/acls").json()
        listing = admin.get("/v1/transactions").json()["transactions"]
        state["transactions"] = {
            t["transactional_id"]: admin.get(f"/v1/transactions/{t['transactional_id']}").json()
            for t in listing
        }
        for topic in metadata["topics"]:
            for p in topic["partitions"]:
                base = p["leader"]["url"]
                where = f"{base}/v1/partitions/{topic['name']}/{p['partition']}"
                state[f"offsets {topic['name']}-{p['partition']}"] = admin.get(
                    f"{where}/offsets").json()
                state[f"producers {topic['name']}-{p['partition']}"] = admin.get(
                    f"{where}/producers").json()
        for group in GROUPS:
            state[f"group {group}"] = admin.get(
                f"{_base(cluster, 'group:' + group)}/v1/groups/{group}/offsets",
                params={"require_stable": "false"},
            ).json()
    with cluster.client("internal") as internal:
        for node in cluster.nodes:
            state[node.name] = internal.get(
                f"{node.url}/internal/v1/partitions").json()
    return state


def run_cases(cluster: SecureCluster, cases: list[Case]) -> list[str]:
    """Run each case; a denied one must leave ``fingerprint`` as it was."""
    problems = []
    for case in cases:
        denied = case.status in (401, 403)
        before = fingerprint(cluster) if denied else None
        with cluster.client(case.role, _base(cluster, case.where)) as client:
            answer = client.request(case.method, case.path, json=case.body)
        got_code = None
        if answer.status_code >= 400:
            got_code = answer.json()["error"]["code"]
        if answer.status_code != case.status or (case.code and got_code != case.code):
            problems.append(
                f"{case.what} ({case.role}): wanted {case.status} {case.code or ''}, got "
                f"{answer.status_code} {answer.text[:200]}"
            )
        if answer.status_code == 401 and "bearer" not in answer.headers.get(
            "www-authenticate", "").lower():
            problems.append(f"{case.what}: 401 without a WWW-Authenticate challenge")
        if before is not None and fingerprint(cluster) != before:
            problems.append(f"{case.what} ({case.role}): a denied request changed state")
    return problems


def _txn(cluster: SecureCluster) -> dict[str, int]:
    with cluster.client("etl") as etl:
        answer = etl.post("/v1/transactions/etl-1/init", json={"transaction_timeout_ms": 60000})
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


def test_every_principal_on_every_endpoint(cluster: SecureCluster) -> None:
    ids = _txn(cluster)
    offsets = [{"topic": "in-1", "partition": 0, "offset": 1}]
    rec = {"records": [{"key": "k", "value": "v"}]}
    txn_offsets = {"transactional_id": "etl-1", **ids, "offsets": offsets}
    acl = {"acls": [{"principal": "User:etl", "resource_type": "cluster",
                     "resource_name": "cluster", "operation": "all"}]}
    end = {**ids, "wait_for_markers": True}
    txn_batch = {**ids, "base_sequence": 0, "transactional": True, **rec}
    marker_body = {"markers": [{**ids, "coordinator_epoch": 0, "result": "ABORT",
                                "partitions": [{"topic": "out-1", "partition": 0}]}]}
    cases = [
        # open probes and the document
        Case("healthz", None, "GET", "/healthz", 200),
        Case("readyz", None, "GET", "/readyz", 200),
        Case("openapi", None, "GET", "/openapi.json", 200),
        Case("node healthz", None, "GET", "/healthz", 200, where="out-1"),
        # authentication
        Case("metadata", None, "GET", "/v1/metadata", 401, "UNAUTHENTICATED"),
        Case("metadata", "bogus", "GET", "/v1/metadata", 401, "UNAUTHENTICATED"),
        Case("metadata", "internal", "GET", "/v1/metadata", 401, "UNAUTHENTICATED"),
        Case("metadata", "outsider", "GET", "/v1/metadata", 200),
        # topics
        Case("create topic", "reader", "POST", "/v1/topics", 403, "TOPIC_AUTHORIZATION_FAILED",
             {"name": "out-r", "partitions": 1}),
        Case("create topic", "etl", "POST", "/v1/topics", 403, "TOPIC_AUTHORIZATION_FAILED",
             {"name": "in-2", "partitions": 1}),
        Case("create topic", "etl", "POST", "/v1/topics", 201, None,
             {"name": "out-new", "partitions": 1}),
        Case("describe topic", "reader", "GET", "/v1/topics/in-1", 403,
             "TOPIC_AUTHORIZATION_FAILED"),
        Case("describe topic", "etl", "GET", "/v1/topics/in-1", 200),
        Case("delete topic", "reader", "DELETE", "/v1/topics/out-new", 403,
             "TOPIC_AUTHORIZATION_FAILED"),
        Case("delete topic", "etl", "DELETE", "/v1/topics/out-1", 403,
             "TOPIC_AUTHORIZATION_FAILED"),
        # FindCoordinator and producer ids
        Case("find txn coordinator", "reader", "GET", "/v1/coordinators?key=etl-1", 403,
             "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"),
        Case("find txn coordinator", "etl", "GET", "/v1/coordinators?key=etl-1", 200),
        Case("find group coordinator", "etl", "GET",
             "/v1/coordinators?key_type=group&key=readers", 403, "GROUP_AUTHORIZATION_FAILED"),
        Case("find group coordinator", "reader", "GET",
             "/v1/coordinators?key_type=group&key=readers", 200),
        Case("idempotent producer id", "reader", "POST", "/v1/producers", 403,
             "CLUSTER_AUTHORIZATION_FAILED", {}),
        Case("idempotent producer id", "outsider", "POST", "/v1/producers", 403,
             "CLUSTER_AUTHORIZATION_FAILED", {}),
        Case("idempotent producer id", "etl", "POST", "/v1/producers", 200, None, {}),
        # the transaction lifecycle
        Case("init", "reader", "POST", "/v1/transactions/etl-1/init", 403,
             "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", {"transaction_timeout_ms": 60000}),
        Case("init", "etl", "POST", "/v1/transactions/other-1/init", 403,
             "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", {"transaction_timeout_ms": 60000}),
        Case("add denied topic", "etl", "POST", "/v1/transactions/etl-1/partitions", 403,
             "TOPIC_AUTHORIZATION_FAILED",
             {**ids, "partitions": [{"topic": "out-1", "partition": 0},
                                    {"topic": "out-secret", "partition": 0}]}),
        Case("add unwritable topic", "etl", "POST", "/v1/transactions/etl-1/partitions", 403,
             "TOPIC_AUTHORIZATION_FAILED", {**ids, "partitions": [{"topic": "in-1",
                                                                    "partition": 0}]}),
        Case("add partitions", "reader", "POST", "/v1/transactions/etl-1/partitions", 403,
             "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
             {**ids, "partitions": [{"topic": "out-1", "partition": 0}]}),
        Case("add partitions", "etl", "POST", "/v1/transactions/etl-1/partitions", 200, None,
             {**ids, "partitions": [{"topic": "out-1", "partition": 0}]}),
        Case("add offsets", "etl", "POST", "/v1/transactions/etl-1/offsets", 403,
             "GROUP_AUTHORIZATION_FAILED", {**ids, "group_id": "readers"}),
        Case("add offsets", "etl", "POST", "/v1/transactions/etl-1/offsets", 200, None,
             {**ids, "group_id": "etl-group"}),
        Case("txn offsets", "reader", "POST", "/v1/groups/etl-group/txn-offsets", 403,
             "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", txn_offsets, "group:etl-group"),
        Case("txn offsets", "etl", "POST", "/v1/groups/etl-group/txn-offsets", 200, None,
             txn_offsets, "group:etl-group"),
        Case("commit", "reader", "POST", "/v1/transactions/etl-1/commit", 403,
             "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", end),
        Case("commit", "etl", "POST", "/v1/transactions/etl-1/commit", 200, None, end),
        # a transactional batch needs write on its transactional id too (checked when it
        # opens the transaction on the partition)
        Case("add partitions", "etl", "POST", "/v1/transactions/etl-1/partitions", 200, None,
             {**ids, "partitions": [{"topic": "out-1", "partition": 0}]}),
        Case("transactional produce", "writer", "POST", "/v1/partitions/out-1/0/records", 403,
             "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", txn_batch, "out-1"),
        Case("transactional produce", "etl", "POST", "/v1/partitions/out-1/0/records", 200,
             None, txn_batch, "out-1"),
        Case("commit", "etl", "POST", "/v1/transactions/etl-1/commit", 200, None, end),
        Case("describe txn", "reader", "GET", "/v1/transactions/etl-1", 403,
             "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"),
        Case("describe txn", "etl", "GET", "/v1/transactions/etl-1", 200),
        Case("force abort", "etl", "POST", "/v1/admin/transactions/etl-1/abort", 403,
             "CLUSTER_AUTHORIZATION_FAILED", {}),
        Case("hanging txns", "etl", "GET", "/v1/admin/hanging-transactions", 403,
             "CLUSTER_AUTHORIZATION_FAILED"),
        Case("hanging txns", ADMIN, "GET", "/v1/admin/hanging-transactions", 200),
        Case("abort hanging", "etl", "POST", "/v1/admin/hanging-transactions/abort", 403,
             "CLUSTER_AUTHORIZATION_FAILED",
             {"topic": "out-1", "partition": 0, "producer_id": 1, "producer_epoch": 0}),
        # ACL administration and metrics
        Case("list acls", "etl", "GET", "/v1/acls", 403, "CLUSTER_AUTHORIZATION_FAILED"),
        Case("list acls", ADMIN, "GET", "/v1/acls", 200),
        Case("create acls", "etl", "POST", "/v1/acls", 403, "CLUSTER_AUTHORIZATION_FAILED", acl),
        Case("delete acls", "reader", "POST", "/v1/acls/delete", 403,
             "CLUSTER_AUTHORIZATION_FAILED", {"filters": [{"principal": "User:etl"}]}),
        Case("metrics", None, "GET", "/metrics", 401, "UNAUTHENTICATED"),
        Case("metrics", "etl", "GET", "/metrics", 403, "CLUSTER_AUTHORIZATION_FAILED"),
        Case("metrics", ADMIN, "GET", "/metrics", 200),
        # the coordinator's internal endpoints: the internal token only
        Case("verification", ADMIN, "GET", "/internal/v1/producers/1/transaction", 403,
             "CLUSTER_AUTHORIZATION_FAILED"),
        Case("verification", None, "GET", "/internal/v1/producers/1/transaction", 401,
             "UNAUTHENTICATED"),
        Case("verification", "internal", "GET",
             f"/internal/v1/producers/{ids['producer_id']}/transaction", 200),
        Case("acl snapshot", "etl", "GET", "/internal/v1/acls", 403,
             "CLUSTER_AUTHORIZATION_FAILED"),
        Case("acl snapshot", "internal", "GET", "/internal/v1/acls", 200),
        # storage nodes: records
        Case("produce", None, "POST", "/v1/partitions/out-1/0/records", 401, "UNAUTHENTICATED",
             rec, "out-1"),
        Case("produce", "reader", "POST", "/v1/partitions/out-1/0/records", 403,
             "TOPIC_AUTHORIZATION_FAILED", rec, "out-1"),
        Case("produce", "outsider", "POST", "/v1/partitions/out-1/0/records", 403,
             "TOPIC_AUTHORIZATION_FAILED", rec, "out-1"),
        Case("produce", "etl", "POST", "/v1/partitions/out-secret/0/records", 403,
             "TOPIC_AUTHORIZATION_FAILED", rec, "out-secret"),
        Case("produce", "etl", "POST", "/v1/partitions/out-1/0/records", 200, None, rec,
             "out-1"),
        Case("fetch", "etl", "GET", "/v1/partitions/out-1/0/records", 403,
             "TOPIC_AUTHORIZATION_FAILED", None, "out-1"),
        Case("fetch", "reader", "GET", "/v1/partitions/out-1/0/records", 200, None, None,
             "out-1"),
        Case("fetch", "etl", "GET", "/v1/partitions/in-1/0/records", 200, None, None, "in-1"),
        Case("offsets", "outsider", "GET", "/v1/partitions/out-1/0/offsets", 403,
             "TOPIC_AUTHORIZATION_FAILED", None, "out-1"),
        Case("offsets", "reader", "GET", "/v1/partitions/out-1/0/offsets", 200, None, None,
             "out-1"),
        Case("producers", "outsider", "GET", "/v1/partitions/out-1/0/producers", 403,
             "TOPIC_AUTHORIZATION_FAILED", None, "out-1"),
        Case("producers", "etl", "GET", "/v1/partitions/out-1/0/producers", 200, None, None,
             "out-1"),
        # storage nodes: group offsets
        Case("commit offsets", "reader", "POST", "/v1/groups/readers/offsets", 403,
             "TOPIC_AUTHORIZATION_FAILED", {"offsets": offsets}, "group:readers"),
        Case("commit offsets", "etl", "POST", "/v1/groups/readers/offsets", 403,
             "GROUP_AUTHORIZATION_FAILED", {"offsets": offsets}, "group:readers"),
        Case("commit offsets", "reader", "POST", "/v1/groups/readers/offsets", 200, None,
             {"offsets": [{"topic": "out-1", "partition": 0, "offset": 1}]}, "group:readers"),
        Case("fetch offsets", "etl", "GET", "/v1/groups/readers/offsets", 403,
             "GROUP_AUTHORIZATION_FAILED", None, "group:readers"),
        Case("fetch offsets", "reader", "GET", "/v1/groups/readers/offsets", 200, None, None,
             "group:readers"),
        # storage nodes: internal endpoints and metrics
        Case("markers", ADMIN, "POST", "/internal/v1/markers", 403,
             "CLUSTER_AUTHORIZATION_FAILED", marker_body, "out-1"),
        Case("markers", "etl", "POST", "/internal/v1/markers", 403,
             "CLUSTER_AUTHORIZATION_FAILED", marker_body, "out-1"),
        Case("open transactions", ADMIN, "GET", "/internal/v1/open-transactions", 403,
             "CLUSTER_AUTHORIZATION_FAILED", None, "out-1"),
        Case("open transactions", "internal", "GET", "/internal/v1/open-transactions", 200,
             None, None, "out-1"),
        Case("create partition", "etl", "PUT", "/internal/v1/partitions/hack/0", 403,
             "CLUSTER_AUTHORIZATION_FAILED", None, "out-1"),
        Case("create partition", None, "PUT", "/internal/v1/partitions/hack/0", 401,
             "UNAUTHENTICATED", None, "out-1"),
        Case("delete topics on node", ADMIN, "POST", "/internal/v1/topics/delete", 403,
             "CLUSTER_AUTHORIZATION_FAILED", {"topics": ["out-1"]}, "out-1"),
        Case("delete topics on node", None, "POST", "/internal/v1/topics/delete", 401,
             "UNAUTHENTICATED", {"topics": ["out-1"]}, "out-1"),
        Case("delete topics on node", "internal", "POST", "/internal/v1/topics/delete", 200,
             None, {"topics": ["never-made"]}, "out-1"),
        Case("node metrics", "reader", "GET", "/metrics", 403, "CLUSTER_AUTHORIZATION_FAILED",
             None, "out-1"),
        Case("node metrics", ADMIN, "GET", "/metrics", 200, None, None, "out-1"),
        # last: the nodes remove the deleted topic's replicas in the background, which a
        # denied case's before/after comparison after it could take for its own doing
        Case("delete topic", "etl", "DELETE", "/v1/topics/out-new", 200),
    ]
    problems = run_cases(cluster, cases)
    assert not problems, "\n".join(problems)


def test_lists_show_only_what_the_caller_may_describe(cluster: SecureCluster) -> None:
    _txn(cluster)
    with cluster.client("outsider") as outsider:
        assert outsider.get("/v1/metadata").json()["topics"] == []
        assert outsider.get("/v1/transactions").json()["transactions"] == []
    with cluster.client("reader") as reader:
        names = {t["name"] for t in reader.get("/v1/metadata").json()["topics"]}
        assert names and all(name.startswith("out-") for name in names)
        assert reader.get("/v1/transactions").json()["transactions"] == []
    with cluster.client("etl") as etl:
        listed = {t["transactional_id"] for t in etl.get("/v1/transactions").json()[
            "transactions"]}
        assert listed == {"etl-1"}


def test_a_grant_works_at_once_and_a_revocation_within_the_refresh(
    cluster: SecureCluster,
) -> None:
    from tests.support.processes import wait_until

    node = _base(cluster, "in-1")
    with cluster.client("outsider", node) as outsider, cluster.client(ADMIN) as admin:
        path = "/v1/partitions/in-1/0/offsets"
        assert outsider.get(path).status_code == 403
        grant = {"principal": "User:outsider", "resource_type": "topic",
                 "resource_name": "in-1", "operation": "describe"}
        assert admin.post("/v1/acls", json={"acls": [grant]}).status_code == 201
        # the node re-reads its rules on a denial, so the grant is seen by the next request
        wait_until(lambda: outsider.get(path).status_code == 200, timeout=3,
                   what="the grant to reach the node")
        deleted = admin.post("/v1/acls/delete", json={"filters": [grant]}).json()["deleted"]
        assert len(deleted) == 1
        wait_until(lambda: outsider.get(path).status_code == 403, timeout=10,
                   what="the revocation to reach the node")


def test_a_token_added_to_the_file_is_honoured_without_a_restart(
    cluster: SecureCluster,
) -> None:
    from tests.support.processes import wait_until

    token = cluster.add_token("User:late")
    headers = {"authorization": f"Bearer {token}"}
    wait_until(
        lambda: httpx.get(f"{cluster.url}/v1/metadata", headers=headers).status_code == 200,
        timeout=10, what="the new token to be accepted",
    )


def test_logs_name_each_refusal_but_never_a_token(cluster: SecureCluster, tmp_path: Path) -> None:
    """Runs last in the module: by now every principal has called every endpoint."""
    logs = cluster.logs(lines=None)
    assert logs.strip(), "the services wrote no log at all: the check would prove nothing"
    assert "denied: User:reader may not write topic 'out-1'" in logs  # the node's audit line
    assert "denied: User:etl may not alter the cluster" in logs  # the coordinator's
    secrets = [*cluster.tokens.values(), *cluster.extra_tokens, INTERNAL_TOKEN,
               "eos_not-a-real-token"]
    leaked = [s[:8] + "…" for s in secrets if s in logs]
    assert not leaked, f"tokens found in the logs: {leaked}"
