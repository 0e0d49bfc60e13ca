"""Group administration through the SDK's admin client and ``eos groups``, on a cluster of
two coordinators (PostgreSQL) and two storage nodes.

Each group here is owned by the first coordinator while the clients start from the
second: listing and describing are answered there, deleting and resetting reach the
owner (found with ``key_type=consumer_group``, or followed from a ``NOT_COORDINATOR``).
A member is made with a raw heartbeat, so the group is non-empty exactly as long as the
test wants. Lag is checked against what was produced and committed; each reset target is
checked in the committed offsets a consumer reads back.

The command line's usage mistakes (no reset target or two, a time that does not parse)
are refused before any request, with exit status 2; those tests are pure.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from eos_cli import group_commands
from eos_cli.group_commands import _print_description, parse_datetime_ms
from eos_cli.main import app
from eos_protocol.groups import GroupDescription
from sdk import (
    AdminClient,
    AsyncAdminClient,
    Consumer,
    GroupIdNotFoundError,
    NonEmptyGroupError,
    Producer,
    TopicPartition,
)
from tests.support.cluster import Cluster, ClusterFactory
from tests.support.leases import wait_balanced

PARTITIONS = 3
runner = CliRunner()


@pytest.fixture(scope="module")
def cluster(module_cluster_factory: ClusterFactory) -> Iterator[Cluster]:
    made = module_cluster_factory(database="postgres", coordinators=2)
    wait_balanced(made.coordinators)
    yield made


@pytest.fixture(autouse=True)
def _no_ambient_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EOS_TOKEN", raising=False)
    monkeypatch.delenv("EOS_BOOTSTRAP", raising=False)


def _owner(cluster: Cluster, group: str) -> str:
    answer = httpx.get(f"{cluster.coordinator_url(1)}/v1/coordinators", timeout=30,
                       params={"key": group, "key_type": "consumer_group"})  # fmt: skip
    answer.raise_for_status()
    return str(answer.json()["url"]).rstrip("/")


def _group_of_first(cluster: Cluster, prefix: str) -> str:
    """A fresh group id the first coordinator owns (clients start from the second)."""
    first = cluster.coordinator_url(0).rstrip("/")
    for _ in range(200):
        group = f"{prefix}-{uuid.uuid4().hex[:8]}"
        if _owner(cluster, group) == first:
            return group
    raise AssertionError("the first coordinator owns no group id")


class Member:
    """One group member as raw heartbeats to the group's coordinator."""

    def __init__(self, cluster: Cluster, group: str, topic: str) -> None:
        self.url = f"{_owner(cluster, group)}/v1/groups/{group}/heartbeat"
        self.answer = self._beat({"member_epoch": 0, "subscribed_topic_names": [topic],
                                  "owned_partitions": []})  # fmt: skip
        self.member_id = str(self.answer["member_id"])

    def _beat(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = httpx.post(self.url, json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def beat(self) -> None:
        """Heartbeat now, so the session cannot lapse on a slow machine mid-check."""
        self.answer = self._beat({"member_id": self.member_id,
                                  "member_epoch": self.answer["member_epoch"]})  # fmt: skip

    def leave(self) -> None:
        self._beat({"member_id": self.member_id, "member_epoch": -1})


def _produce(cluster: Cluster, topic: str, per_partition: int, tag: str) -> None:
    with Producer(cluster.url) as producer:
        for p in range(PARTITIONS):
            for i in range(per_partition):
                producer.send(topic, f"{tag}-{i}", partition=p)
        producer.flush()


def _after_now_ms() -> int:
    """A time strictly after every record produced so far (and before any produced next)."""
    mark = int(time.time() * 1000) + 1
    while int(time.time() * 1000) <= mark:
        time.sleep(0.002)
    return mark


def _commit(cluster: Cluster, group: str, topic: str, offset: int) -> None:
    with Consumer(cluster.url, group_id=group) as consumer:
        consumer.commit({TopicPartition(topic, p): offset for p in range(PARTITIONS)})


def _committed(cluster: Cluster, group: str, topic: str) -> dict[int, int | None]:
    with Consumer(cluster.url, group_id=group) as consumer:
        found = consumer.committed([(topic, p) for p in range(PARTITIONS)])
    return {tp.partition: (o.offset if o else None) for tp, o in found.items()}


def _every(value: int) -> dict[int, int | None]:
    return dict.fromkeys(range(PARTITIONS), value)


# --- the SDK ---------------------------------------------------------------------------


@pytest.mark.slow
def test_admin_client_lists_describes_resets_and_deletes(cluster: Cluster) -> None:
    topic = cluster.create_topic(PARTITIONS, "gadmin")
    group = _group_of_first(cluster, "gadmin")
    _produce(cluster, topic, 5, "early")
    middle = _after_now_ms()
    _produce(cluster, topic, 5, "late")
    _commit(cluster, group, topic, 2)
    member = Member(cluster, group, topic)
    second = cluster.coordinator_url(1)

    with AdminClient(second) as admin:
        listed = {g.group_id: g for g in admin.list_groups()}
        assert (listed[group].members, listed[group].state) == (1, "stable")
        described = admin.describe_group(group)
        [only] = described.members
        assert only.member_id == member.member_id and len(only.assignment) == PARTITIONS
        assert described.lag_error is None
        rows = {(r.topic, r.partition): r for r in described.lag}
        assert sorted(rows) == [(topic, p) for p in range(PARTITIONS)]
        for row in rows.values():  # 10 produced, 2 committed
            assert (row.committed_offset, row.last_stable_offset, row.lag) == (2, 10, 8)
            assert row.owner == member.member_id
        bare = admin.describe_group(group, lag=False)
        assert bare.lag == [] and bare.lag_error is None and len(bare.members) == 1

        member.beat()
        with pytest.raises(NonEmptyGroupError):
            admin.reset_group_offsets(group, [topic], to_earliest=True)
        with pytest.raises(NonEmptyGroupError):
            admin.delete_group(group)
        assert _committed(cluster, group, topic) == _every(2)
        member.leave()

        # a stale owner in the cache: the real NOT_COORDINATOR names the owner, followed
        admin._metadata.set_group_coordinator(group, second)
        for targets, expected in (
            ({"to_earliest": True}, 0),
            ({"to_latest": True}, 10),
            ({"to_offset": 3}, 3),
            ({"to_offset": 99}, 10),  # clamped to what each partition holds
            ({"to_timestamp_ms": middle}, 5),
        ):
            written = admin.reset_group_offsets(group, topic, **targets)
            assert sorted((o.topic, o.partition, o.offset) for o in written) == [
                (topic, p, expected) for p in range(PARTITIONS)
            ], targets
            assert _committed(cluster, group, topic) == _every(expected), targets
        owner = admin._metadata.group_coordinator(group)
        assert owner == cluster.coordinator_url(0).rstrip("/")
        after = admin.describe_group(group)
        assert {(r.committed_offset, r.lag, r.owner) for r in after.lag} == {(5, 5, None)}
        assert after.members == [] and after.state == "empty"
        with pytest.raises(ValueError, match="exactly one"):
            admin.reset_group_offsets(group, [topic], to_earliest=True, to_offset=1)

        admin.delete_group(group)
        with pytest.raises(GroupIdNotFoundError):
            admin.describe_group(group)
        with pytest.raises(GroupIdNotFoundError):
            admin.delete_group(group)
        assert group not in {g.group_id for g in admin.list_groups()}
    # the offsets outlive the group's state on the coordinator
    assert _committed(cluster, group, topic) == _every(5)


@pytest.mark.slow
def test_async_admin_client_describes_and_resets(cluster: Cluster) -> None:
    topic = cluster.create_topic(PARTITIONS, "gasync")
    group = _group_of_first(cluster, "gasync")
    _produce(cluster, topic, 4, "r")
    Member(cluster, group, topic).leave()  # on record, empty

    async def run() -> tuple[list[str], list[int], list[int | None]]:
        async with AsyncAdminClient(cluster.coordinator_url(1)) as admin:
            listed = [g.group_id for g in await admin.list_groups()]
            written = await admin.reset_group_offsets(group, [topic], to_offset=1)
            described = await admin.describe_group(group)
            await admin.delete_group(group)
        return listed, [o.offset for o in written], [r.lag for r in described.lag]

    listed, written, lags = asyncio.run(run())
    assert group in listed and written == [1] * PARTITIONS and lags == [3] * PARTITIONS


# --- the command line ------------------------------------------------------------------


def _eos(cluster: Cluster, *args: str) -> Result:
    # The command's consoles took their width when the module was imported (from COLUMNS,
    # if the environment had it then): wide ones for the tables here, whatever it was.
    with mock.patch.object(group_commands, "out", Console(width=240)), \
            mock.patch.object(group_commands, "err", Console(width=240, stderr=True)):
        return runner.invoke(app, [*args, "--bootstrap", cluster.coordinator_url(1)],
                             env={"COLUMNS": "240"})  # fmt: skip


@pytest.mark.slow
def test_groups_commands(cluster: Cluster) -> None:
    topic = cluster.create_topic(PARTITIONS, "gcli")
    group = _group_of_first(cluster, "gcli")
    _produce(cluster, topic, 4, "early")
    middle = _after_now_ms()
    _produce(cluster, topic, 2, "late")
    _commit(cluster, group, topic, 1)
    member = Member(cluster, group, topic)

    listed = _eos(cluster, "groups", "list")
    assert listed.exit_code == 0, listed.output
    [line] = [x for x in listed.stdout.splitlines() if group in x]
    assert [c.strip() for c in line.split("│")[1:4]] == [group, "stable", "1"], line
    as_json = json.loads(_eos(cluster, "groups", "list", "--json").stdout)
    [ours] = [g for g in as_json if g["group_id"] == group]
    assert (ours["state"], ours["members"]) == ("stable", 1) and ours["group_epoch"] > 0

    shown = _eos(cluster, "groups", "describe", group)
    assert shown.exit_code == 0, shown.output
    text = shown.stdout
    assert f"group {group}: stable" in text and "1 members" in text
    assert member.member_id in text and f"{topic}:0,1,2" in text
    lag_rows = [x.split("│")[1:-1] for x in text.splitlines() if x.startswith(f"│ {topic}")]
    assert [[c.strip() for c in r] for r in lag_rows] == [
        [topic, str(p), "1", "6", "5", member.member_id] for p in range(PARTITIONS)
    ]
    assert "total lag 15" in text and "lag unavailable" not in shown.output
    bare = _eos(cluster, "groups", "describe", group, "--no-lag")
    assert bare.exit_code == 0 and member.member_id in bare.stdout
    assert "total lag" not in bare.stdout
    described = json.loads(_eos(cluster, "groups", "describe", group, "--json").stdout)
    assert [r["lag"] for r in described["lag"]] == [5] * PARTITIONS

    member.beat()
    busy = _eos(cluster, "groups", "reset", group, "--topic", topic, "--to-earliest")
    assert busy.exit_code == 1 and "NON_EMPTY_GROUP" in busy.output, busy.output
    kept = _eos(cluster, "groups", "delete", group)
    assert kept.exit_code == 1 and "NON_EMPTY_GROUP" in kept.output, kept.output
    member.leave()

    stamp = datetime.fromtimestamp(middle / 1000, UTC).isoformat()
    for flags, expected in (
        (["--to-latest"], 6),
        (["--to-earliest"], 0),
        (["--to-offset", "3"], 3),
        (["--to-datetime", stamp], 4),
        (["--to-timestamp-ms", str(middle)], 4),
    ):
        done = _eos(cluster, "groups", "reset", group, "-t", topic, *flags)
        assert done.exit_code == 0, done.output
        rows = [x.split("│")[1:-1] for x in done.stdout.splitlines() if f"│ {topic}" in x]
        assert [[c.strip() for c in r] for r in rows] == [
            [topic, str(p), str(expected)] for p in range(PARTITIONS)
        ], flags
        assert _committed(cluster, group, topic) == _every(expected), flags
    written = json.loads(
        _eos(cluster, "groups", "reset", group, "-t", topic, "--to-offset", "2", "--json").stdout
    )
    assert written == [{"topic": topic, "partition": p, "offset": 2} for p in range(PARTITIONS)]
    missing_topic = _eos(cluster, "groups", "reset", group, "-t", "no-such-topic", "--to-latest")
    assert missing_topic.exit_code == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing_topic.output

    deleted = _eos(cluster, "groups", "delete", group)
    assert deleted.exit_code == 0 and f"deleted group {group}" in deleted.stdout
    again = _eos(cluster, "groups", "delete", group)
    assert again.exit_code == 1 and "GROUP_ID_NOT_FOUND" in again.output
    gone = _eos(cluster, "groups", "describe", group)
    assert gone.exit_code == 1 and "GROUP_ID_NOT_FOUND" in gone.output


@pytest.mark.unit
@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ([], "exactly one of"),
        (["--to-earliest", "--to-latest"], "got --to-earliest, --to-latest"),
        (["--to-offset", "3", "--to-timestamp-ms", "5"], "got --to-timestamp-ms, --to-offset"),
        (["--to-datetime", "yesterday"], "not an ISO 8601 time"),
        (["--to-datetime", "1969-12-31T23:00:00Z"], "before 1970"),
        (["--to-offset", "-1"], "--to-offset"),
    ],
)
def test_reset_usage_errors_exit_2_before_any_request(flags: list[str], says: str) -> None:
    # a bootstrap nothing listens on: a request would fail differently (and the unit
    # guard would stop it)
    result = runner.invoke(app, ["groups", "reset", "g", "-t", "t", *flags,
                                 "--bootstrap", "http://127.0.0.1:9"],
                           env={"COLUMNS": "240"})  # fmt: skip
    assert result.exit_code == 2, result.output
    assert says in result.output


@pytest.mark.unit
def test_reset_and_describe_need_their_arguments() -> None:
    no_topic = runner.invoke(app, ["groups", "reset", "g", "--to-latest"])
    assert no_topic.exit_code == 2 and "--topic" in no_topic.output
    no_group = runner.invoke(app, ["groups", "describe"])
    assert no_group.exit_code == 2


@pytest.mark.unit
def test_datetimes_are_read_as_iso_8601() -> None:
    assert parse_datetime_ms("2024-05-01T12:00:00Z") == 1_714_564_800_000
    assert parse_datetime_ms("2024-05-01T14:00:00+02:00") == 1_714_564_800_000
    assert parse_datetime_ms("2024-05-01T12:00:00.250+00:00") == 1_714_564_800_250
    local = datetime(2024, 5, 1, 12, 0).astimezone()  # no zone: the local one
    assert parse_datetime_ms("2024-05-01T12:00:00") == int(local.timestamp() * 1000)


@pytest.mark.unit
def test_describe_shows_unknown_lag_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    """A node that did not answer: the partitions it leads show no LSO and no lag, the
    total says how many are unknown, and the reason goes to stderr."""
    described = GroupDescription.model_validate({
        "group_id": "g", "state": "empty", "group_epoch": 3, "assignment_epoch": 3,
        "members": [], "lag_error": "node 2 did not answer",
        "lag": [{"topic": "t", "partition": 0, "committed_offset": 4,
                 "last_stable_offset": 9, "lag": 5, "owner": None},
                {"topic": "t", "partition": 1, "committed_offset": None,
                 "last_stable_offset": None, "lag": None, "owner": None}],
    })  # fmt: skip
    _print_description(described, lag=True)
    shown = capsys.readouterr()
    rows = [[c.strip() for c in x.split("│")[1:-1]] for x in shown.out.splitlines()
            if x.startswith("│ t ")]  # fmt: skip
    assert rows == [["t", "0", "4", "9", "5", ""], ["t", "1", "-", "-", "-", ""]]
    assert "total lag 5 (1 partitions unknown)" in shown.out
    assert "lag unavailable: node 2 did not answer" in shown.err
