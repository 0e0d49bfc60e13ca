"""The consumer groups pages of the console, against a real coordinator on PostgreSQL.

The storage nodes are ``GroupNodes`` (an httpx transport): they answer a group's committed
offsets and their partition lists from numbers set here, and record every call with the
token it carried. Checked: the list shows each group's state, members and epoch as
``GET /v1/groups`` does, and links each group's page, also for ids that hold ``<script>``
or ``/``; a group's page shows its members' assignments and each partition's lag as
``GET /v1/groups/{id}`` does, asking one list of each node and never a partition at a time;
offsets that cannot be read cost the lag table, not the page; bad input is a clear 4xx; with
authentication on, the nodes are shown the viewer's own token (from the console's cookie),
a group the viewer may not describe is neither listed nor shown, and the lag sampler,
which has no token, is not started.
"""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from coordinator_service.groups.lag_sampler import LagSampler
from eos_protocol.groups import GroupHeartbeatRequest
from eos_protocol.partitioning import group_offsets_partition
from eos_protocol.paths import segment
from eos_security.access import CONSOLE_COOKIE
from eos_security.tokens import token_entry
from tests.support.coordinators import InProcessCoordinator, coordinator_settings, temp_database
from tests.support.group_nodes import GroupNodes, Member, settle

EVIL = "<script>alert(1)</script>"
SLASHED = "a/b"
OFFSETS_PARTITIONS = 5


def heartbeat_in_process(running: InProcessCoordinator, group: str, **body: object) -> str:
    """A heartbeat handed to the group coordinator directly: an id holding ``/`` cannot
    travel in the API's path, but the console must still show such a group."""
    request = GroupHeartbeatRequest.model_validate(body)
    answer = running.call(lambda: running.services.groups.heartbeat(group, request))
    return answer.member_id


@pytest.fixture(scope="module")
def nodes() -> GroupNodes:
    return GroupNodes()


@pytest.fixture(scope="module")
def coordinator(nodes: GroupNodes) -> Iterator[InProcessCoordinator]:
    """``enrichers``: two members on ``orders`` (4 partitions); ``EVIL``: one member on
    ``audit``; ``a/b``: joined and left, so empty."""
    with temp_database() as url:
        settings = coordinator_settings(url, nodes.spec,
                                        group_offset_partitions=OFFSETS_PARTITIONS)
        running = InProcessCoordinator(settings, node_transport=nodes.transport,
                                       background=False).start()
        try:
            with running.client() as c:
                for name, count in (("orders", 4), ("audit", 2)):
                    body = {"name": name, "partitions": count}
                    assert c.post("/v1/topics", json=body).status_code == 201
                members = [Member(c, "enrichers", ["orders"]) for _ in range(2)]
                settle(members)
            heartbeat_in_process(running, EVIL, member_epoch=0,
                                 subscribed_topic_names=["audit"], owned_partitions=[])
            gone = heartbeat_in_process(running, SLASHED, member_epoch=0,
                                        subscribed_topic_names=["audit"], owned_partitions=[])
            heartbeat_in_process(running, SLASHED, member_id=gone, member_epoch=-1)
            yield running
        finally:
            running.stop()


@pytest.fixture
def client(coordinator: InProcessCoordinator, nodes: GroupNodes) -> Iterator[httpx.Client]:
    nodes.down.clear()
    nodes.refused.clear()
    nodes.stable.clear()
    nodes.committed.clear()
    with coordinator.client() as c:
        nodes.forget_calls()
        yield c


def rows(page: str, table: str, key: str) -> dict[str, dict[str, str]]:
    """The rows of table ``table`` by their ``data-{key}`` (and ``data-partition``),
    unescaped, each as its classed cells' text."""
    body = page.split(f'<table id="{table}">', 1)[1].split("</table>", 1)[0]
    found = {}
    for attrs, inner in re.findall(rf"<tr (data-{key}=[^>]*)>(.*?)</tr>", body, re.S):
        name = html.unescape(re.search(rf'data-{key}="([^"]*)"', attrs).group(1))  # type: ignore[union-attr]
        partition = re.search(r'data-partition="(\d+)"', attrs)
        if partition:
            name += f"/{partition.group(1)}"
        cells = {}
        for classes, text in re.findall(r'<td class="([^"]*)">(.*?)</td>', inner, re.S):
            plain = html.unescape(re.sub(r"<[^>]+>", "", text)).strip()
            for cls in classes.split():
                cells[cls] = plain
        found[name] = cells
    return found


def heading(page: str) -> str:
    found = re.search(r'<h2 id="group-id" class="mono">(.*?)</h2>', page, re.S)
    assert found, page
    return html.unescape(found.group(1))


def test_the_groups_page_lists_each_group_as_the_api_does_and_links_its_page(
    client: httpx.Client,
) -> None:
    answer = client.get("/console/groups")
    assert answer.status_code == 200, answer.text
    assert '<a href="/console/groups" aria-current="page">Groups</a>' in answer.text
    assert EVIL not in answer.text  # escaped wherever it lands
    shown = rows(answer.text, "groups", "group")
    api = {g["group_id"]: g for g in client.get("/v1/groups").json()["groups"]}
    assert set(shown) == set(api) == {"enrichers", EVIL, SLASHED}
    for group_id, listed in api.items():
        assert shown[group_id]["state"] == listed["state"]
        assert shown[group_id]["members"] == str(listed["members"])
        assert shown[group_id]["epoch"] == str(listed["group_epoch"])
    assert (shown["enrichers"]["state"], shown["enrichers"]["members"]) == ("stable", "2")
    assert (shown[SLASHED]["state"], shown[SLASHED]["members"]) == ("empty", "0")

    links = [html.unescape(h) for h in re.findall(r'<td class="mono group"><a href="([^"]*)"',
                                                  answer.text)]
    assert set(links) == {f"/console/groups/{segment(g)}" for g in api}
    assert "/console/groups/a%2Fb" in links
    for link in links:
        page = client.get(link)
        assert page.status_code == 200, (link, page.text)
        assert heading(page.text) in api
        assert f"/console/groups/{segment(heading(page.text))}" == link
    assert EVIL not in client.get(f"/console/groups/{segment(EVIL)}").text


def test_a_group_page_shows_members_and_lag_as_the_api_does_from_one_list_per_node(
    client: httpx.Client, nodes: GroupNodes
) -> None:
    nodes.stable.update({("orders", p): 10 + p for p in range(4)})
    nodes.committed["enrichers"] = {("orders", 0): 4, ("orders", 1): 11, ("orders", 2): 20}
    answer = client.get("/console/groups/enrichers")
    assert answer.status_code == 200, answer.text
    kinds = nodes.kinds()
    assert kinds.get("offsets") == 1 and "bounds" not in kinds  # nothing per partition
    assert 1 <= kinds.get("list", 0) <= 3  # one list from each leader of orders
    assert not nodes.bearers() - {None}  # authentication off: no token to show

    described = client.get("/v1/groups/enrichers").json()
    lag = rows(answer.text, "lag", "topic")
    assert set(lag) == {f"orders/{p}" for p in range(4)}
    for row in described["lag"]:
        shown = lag[f"{row['topic']}/{row['partition']}"]
        assert shown["committed"] == ("—" if row["committed_offset"] is None
                                      else str(row["committed_offset"]))
        assert shown["lso"] == str(row["last_stable_offset"])
        assert shown["lag"] == str(row["lag"])
        assert shown["owner"] == row["owner"]
    # 10-4, 11-11, 12-20 (ahead: 0), 13-nothing committed
    assert [lag[f"orders/{p}"]["lag"] for p in range(4)] == ["6", "0", "0", "13"]
    assert "lag 19" in answer.text

    members = rows(answer.text, "members", "member-id")
    assert set(members) == {m["member_id"] for m in described["members"]}
    for m in described["members"]:
        shown = members[m["member_id"]]
        assert shown["epoch"] == str(m["member_epoch"]) and shown["state"] == m["state"]
        assert shown["subscription"] == "orders"
        assert shown["assigned"] == ", ".join(
            f"{tp['topic']}/{tp['partition']}" for tp in m["assignment"])
        assert shown["pending"] == "—"
    assert f"group epoch {described['group_epoch']}" in answer.text
    fragment = client.get("/console/groups/enrichers?fragment=1").text
    assert "<html" not in fragment and 'id="lag"' in fragment


def test_offsets_that_cannot_be_read_cost_the_lag_table_not_the_page(
    client: httpx.Client, nodes: GroupNodes
) -> None:
    nodes.refused.add("enrichers")
    page = client.get("/console/groups/enrichers")
    assert page.status_code == 200
    error = re.search(r'<p class="notice error" id="lag-error" role="alert">(.*?)</p>',
                      page.text, re.S)
    assert error and "Lag could not be read" in error.group(1)
    assert "no read on enrichers" in error.group(1)
    assert 'id="members"' in page.text and 'id="lag"' not in page.text

    nodes.refused.clear()
    nodes.down.update(nodes.urls)  # every node away: answered at once, with why
    page = client.get("/console/groups/enrichers")
    assert page.status_code == 200 and 'id="lag-error"' in page.text

    # one leader of an orders partition away, the node of the group's offsets up
    nodes.down.clear()
    topics = {t: client.get(f"/v1/topics/{t}").json() for t in ("orders", "__consumer_offsets")}
    home = group_offsets_partition("enrichers", OFFSETS_PARTITIONS)
    offsets_node = topics["__consumer_offsets"]["partitions"][home]["leader"]["node_id"]
    leaders = {p["partition"]: p["leader"]["node_id"] for p in topics["orders"]["partitions"]}
    away = next(n for n in sorted(set(leaders.values())) if n != offsets_node)
    nodes.down.add(away)
    page = client.get("/console/groups/enrichers")
    assert page.status_code == 200
    lag = rows(page.text, "lag", "topic")
    unread = [p for p, n in leaders.items() if n == away]
    for p, node in leaders.items():
        assert (lag[f"orders/{p}"]["lso"] == "—") == (node == away)
    assert f"({len(unread)} partition" in page.text
    assert f'<li data-node-id="{away}">' in page.text


def test_bad_addresses_get_a_page_that_says_why(client: httpx.Client) -> None:
    missing = client.get("/console/groups/no-such-group")
    assert missing.status_code == 404 and "No consumer group" in missing.text
    assert client.get("/console/groups?page=0").status_code == 400
    assert client.get("/console/groups?page=2").status_code == 404
    past = client.get("/console/groups/enrichers?page=3")
    assert past.status_code == 404 and "no page 3" in past.text


# --- authentication on ---------------------------------------------------------------------

ADMIN, READER = "admin-token-" + "a" * 24, "reader-token-" + "r" * 24


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[InProcessCoordinator, GroupNodes]]:
    """Authentication on (``User:admin`` a super user, ``User:reader`` may describe the
    group ``seen``), background loops running."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(token_entry("User:admin", ADMIN) + token_entry("User:reader", READER))
    fake = GroupNodes()
    with temp_database() as url:
        settings = coordinator_settings(url, fake.spec, auth_tokens_file=tokens,
                                        super_users="User:admin", group_lag_interval_ms=1_000)
        running = InProcessCoordinator(settings, node_transport=fake.transport).start()
        try:
            with running.client() as c:
                c.headers["authorization"] = f"Bearer {ADMIN}"
                assert c.post("/v1/topics", json={"name": "orders", "partitions": 2}
                              ).status_code == 201
                for group in ("seen", "hidden"):
                    Member(c, group, ["orders"])
                rule = {"principal": "User:reader", "resource_type": "group",
                        "resource_name": "seen", "pattern_type": "literal",
                        "operation": "describe", "permission": "allow"}
                assert c.post("/v1/acls", json={"acls": [rule]}).status_code == 201
            running.call(running.services.acl_rules.reload)
            yield running, fake
        finally:
            running.stop()


def test_with_authentication_the_nodes_see_the_viewers_token_and_acls_filter(
    secured: tuple[InProcessCoordinator, GroupNodes],
) -> None:
    running, fake = secured
    fake.tokens = {ADMIN, READER}
    fake.stable.update({("orders", 0): 5, ("orders", 1): 7})
    fake.forget_calls()
    with httpx.Client(base_url=running.url, cookies={CONSOLE_COOKIE: READER}) as reader:
        listing = reader.get("/console/groups")
        assert listing.status_code == 200
        assert set(rows(listing.text, "groups", "group")) == {"seen"}
        page = reader.get("/console/groups/seen")
        assert page.status_code == 200 and 'id="lag-error"' not in page.text
        assert rows(page.text, "lag", "topic")["orders/1"]["lag"] == "7"
        refused = reader.get("/console/groups/hidden")
        assert refused.status_code == 403 and "may not describe group" in refused.text
    assert fake.bearers() == {f"Bearer {READER}"}  # the cookie's token, as a bearer header

    async def loops() -> set[str]:
        return {task.get_name() for task in asyncio.all_tasks()}

    names = running.call(loops)
    assert "groups" in names and "group-lag" not in names  # no token to sample lag with
    assert isinstance(running.services.group_lag, LagSampler)
