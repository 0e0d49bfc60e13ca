"""The web console in a real browser: Debian's chromium driven by Playwright.

Against one cluster with authentication on and PostgreSQL: the pages load behind the
login form; the numbers on them are the API's (high watermark, LSO and its lag, the state
of an open transaction, the producers); the live refresh brings a change in without a
reload; the abort button aborts and the page shows it; a read-only principal gets no
button and a forged form is refused with 403; the topics list hides the internal topics
until asked and links each topic's page; the groups list links a group's page, whose lag
is the API's; a storage node that is down shows as down while
the pages still render. The storage nodes' partition list, which the topics pages read
with the viewer's token, is checked against the ACLs here too. Chromium that cannot start
fails the module, never skips it.

``EOS_CONSOLE_SCREENSHOTS=<dir>`` saves a PNG of each main page there as the tests pass
(docs/console/ holds the ones of docs/console.md).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright

import sdk
from eos_protocol.paths import segment
from tests.support.cluster import Cluster, ClusterFactory

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
SHOTS = os.environ.get("EOS_CONSOLE_SCREENSHOTS")
T = TypeVar("T")


def poll(read: Callable[[], T], until: Callable[[T], bool], what: str, timeout: float = 20.0
         ) -> T:
    """Read until the value is as wanted; fail with the last value at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if until(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last seen: {value!r}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    """Debian's chromium, or a failure that says why: a console test that cannot run must
    never pass for one that did."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (scripts/test.sh "
                    "installs it when run as root)", pytrace=False)
    try:
        started = playwright.chromium.launch(executable_path=CHROMIUM, timeout=60_000)
    except Exception as exc:
        pytest.fail(f"chromium at {CHROMIUM} could not start: {exc}", pytrace=False)
    yield started
    started.close()


@pytest.fixture(scope="module")
def cluster(module_cluster_factory: ClusterFactory) -> Cluster:
    """Authentication on (``User:admin`` is a super user), on PostgreSQL. ``reader`` may
    describe everything and alter nothing."""
    running = module_cluster_factory(database="postgres", auth=True)
    rules = [
        {"principal": "User:reader", "resource_type": rtype, "resource_name": name,
         "pattern_type": "literal", "operation": "describe", "permission": "allow"}
        for rtype, name in (("cluster", "cluster"), ("topic", "*"), ("transactional_id", "*"))
    ]
    with running.client("admin") as admin:
        assert admin.post("/v1/acls", json={"acls": rules}).status_code == 201
    return running


def log_in(browser: Browser, cluster: Cluster, role: str, base_url: str | None = None
           ) -> BrowserContext:
    """A browser session logged in through the console's form as ``role`` (on the first
    coordinator, or on ``base_url``)."""
    context = browser.new_context(base_url=base_url or cluster.url,
                                  viewport={"width": 1440, "height": 900})
    context.set_default_timeout(20_000)
    page = context.new_page()
    page.goto("/console")
    assert page.url.endswith("/console/login"), page.url  # no token: sent to the form
    shoot(page, "login")
    page.fill("#token", cluster.tokens[role])
    page.click("#login button[type=submit]")
    page.wait_for_url("**/console")
    assert page.locator(".principal").inner_text() == f"User:{role}"
    page.close()
    return context


def shoot(page: Page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def open_transaction(cluster: Cluster, topic: str, tid: str, records: int = 3
                     ) -> sdk.TransactionalProducer:
    """A producer whose transaction on ``topic``/0 stays open (records written, no end)."""
    producer = sdk.TransactionalProducer(
        cluster.url, tid, token=cluster.tokens["admin"], transaction_timeout_ms=600_000
    )
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(records):
        producer.send(topic, f"open-{i}", partition=0)
    producer.flush()
    return producer


def commit_some(cluster: Cluster, topic: str, count: int) -> None:
    """``count`` committed records on ``topic``/0, their commit marker written."""
    tid = f"committer-{uuid.uuid4().hex[:8]}"
    producer = sdk.TransactionalProducer(cluster.url, tid, token=cluster.tokens["admin"])
    try:
        producer.init_transactions()
        with producer.transaction():
            for i in range(count):
                producer.send(topic, f"c{i}", partition=0)
    finally:
        producer.close()
    poll(lambda: api(cluster, f"/v1/transactions/{tid}")["state"],
         lambda s: s == "CompleteCommit", "the commit's markers")


def api(cluster: Cluster, path: str, base_url: str | None = None) -> Any:
    with cluster.client("admin", base_url=base_url) as client:
        answer = client.get(path)
        answer.raise_for_status()
        return answer.json()


def api_offsets(cluster: Cluster, topic: str, partition: int) -> dict[str, int]:
    leader = api(cluster, f"/v1/topics/{topic}")["partitions"][partition]["leader"]["url"]
    found: dict[str, int] = api(cluster, f"/v1/partitions/{topic}/{partition}/offsets",
                                base_url=leader)
    return found


def settled_offsets(page: Page, cluster: Cluster, topic: str, partition: int
                    ) -> tuple[dict[str, int], dict[str, str]]:
    """The API's offsets and the topics page's row, read when the API answered the same
    before and after the page loaded (so they describe the same moment)."""

    def read() -> tuple[dict[str, int], dict[str, str], dict[str, int]]:
        before = api_offsets(cluster, topic, partition)
        page.goto(f"/console/topics/{topic}")
        shown = cells(page, partition_row(topic, partition))
        return before, shown, api_offsets(cluster, topic, partition)

    before, shown, _ = poll(read, lambda r: r[0] == r[2], "the offsets to stay still")
    return before, shown


def cells(page: Page, row: str) -> dict[str, str]:
    """The texts of a table row's classed cells (``hw``, ``lso``, ``state``, ...)."""
    found = page.locator(row)
    assert found.count() == 1, f"{row}: {found.count()} rows"
    texts: dict[str, str] = found.evaluate(
        "row => Object.fromEntries([...row.querySelectorAll('td[class]')].flatMap("
        "td => [...td.classList].map(c => [c, td.innerText.trim()])))"
    )
    return texts


def partition_row(topic: str, partition: int) -> str:
    return f'#partitions tr[data-topic="{topic}"][data-partition="{partition}"]'


def topic_row(topic: str) -> str:
    return f'#topics tr[data-topic="{topic}"]'


def test_cluster_page_shows_coordinators_leases_and_nodes(browser: Browser, cluster: Cluster
                                                          ) -> None:
    context = log_in(browser, cluster, "admin")
    page = context.new_page()
    page.goto("/console")
    metadata = api(cluster, "/v1/metadata?include_topics=false")
    coordinator = metadata["coordinators"][0]["node_id"]
    row = cells(page, f'#coordinators tr[data-node-id="{coordinator}"]')
    assert row["status"] == "alive" and "this one" in page.locator(
        f'#coordinators tr[data-node-id="{coordinator}"]').inner_text()
    leases = page.locator("#leases li")
    assert leases.count() >= 2  # the controller's and the log partitions'
    held = page.locator("#leases li.up .owner", has_text=f"coordinator {coordinator}")
    assert held.count() == leases.count()  # the one instance holds every lease
    partitions = row["partitions"].split("(")[0].strip().split(", ")
    assert len(partitions) == leases.count() - 1  # all but the controller's lease
    for node in metadata["nodes"]:
        assert cells(page, f'#nodes tr[data-node-id="{node["node_id"]}"]')["status"] == "ready"
    shoot(page, "cluster")
    context.close()


def test_numbers_match_the_api_and_refresh_live(browser: Browser, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=2, prefix="console")
    commit_some(cluster, topic, 5)
    tid = f"console-open-{uuid.uuid4().hex[:8]}"
    producer = open_transaction(cluster, topic, tid)
    try:
        context = log_in(browser, cluster, "admin")
        page = context.new_page()
        cluster = cluster
        offsets, shown = settled_offsets(page, cluster, topic, 0)
        assert shown["hw"] == str(offsets["high_watermark"])
        assert shown["lso"] == str(offsets["last_stable_offset"])
        lag = offsets["high_watermark"] - offsets["last_stable_offset"]
        assert lag > 0 and shown["lag"] == str(lag)  # the open transaction holds the LSO back
        assert cells(page, partition_row(topic, 1))["hw"] == str(
            api_offsets(cluster, topic, 1)["high_watermark"])
        described = api(cluster, f"/v1/transactions/{tid}")
        producers = cells(page, f'#producers tr[data-topic="{topic}"]'
                                f'[data-producer-id="{described["producer_id"]}"]')
        assert producers["txn-start"] == str(offsets["last_stable_offset"])
        shoot(page, "topic")

        # the list: one row for the topic, its LSO lag the sum of its partitions'
        page.goto("/console/topics")
        listed = cells(page, topic_row(topic))
        assert listed["partitions"] == "2" and listed["offline"] == "0"
        assert listed["lag"] == str(lag)  # partition 1 has no open transaction
        shoot(page, "topics")

        page.goto("/console/transactions")
        row = cells(page, f'#open-transactions tr[data-tid="{tid}"]')
        assert row["state"] == described["state"] == "Ongoing"
        assert f"{topic}/0" in row["partitions"]
        shoot(page, "transactions")

        # the live refresh: the transaction commits while the topic's page stays open
        page.goto(f"/console/topics/{topic}")
        producer.commit_transaction()
        after = poll(lambda: cells(page, partition_row(topic, 0)),
                     lambda c: c["lag"] == "0", "the LSO lag to fall to 0 without a reload")
        assert after["hw"] == str(api_offsets(cluster, topic, 0)["high_watermark"])
        assert "updated" in page.locator("#refresh-status").inner_text()
        context.close()
    finally:
        producer.close()


def test_topics_list_hides_internal_topics_until_asked_and_links_each_topic(
    browser: Browser, cluster: Cluster
) -> None:
    topic = cluster.create_topic(partitions=3, prefix="console")
    context = log_in(browser, cluster, "admin")
    page = context.new_page()
    page.goto("/console/topics")
    assert page.locator(topic_row("__consumer_offsets")).count() == 0
    assert cells(page, topic_row(topic))["partitions"] == "3"
    page.click("#internal-toggle")
    page.wait_for_url("**/console/topics?internal=1")
    internal = cells(page, topic_row("__consumer_offsets"))
    offsets_topic = api(cluster, "/v1/topics/__consumer_offsets")
    assert internal["partitions"] == str(len(offsets_topic["partitions"]))
    assert "internal" in internal["topic"]
    names = page.locator("#topics tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.topic)")
    assert names == sorted(names)  # by name, the internal topic among the others
    page.click("#internal-toggle")
    page.wait_for_url("**/console/topics")
    assert page.locator(topic_row("__consumer_offsets")).count() == 0

    page.click(f'{topic_row(topic)} td.topic a')
    page.wait_for_url(f"**/console/topics/{topic}")
    assert page.locator("#partitions tbody tr").count() == 3
    assert page.locator("#topic-name").inner_text() == topic
    answer = page.goto("/console/topics/no-such-topic")
    assert answer is not None and answer.status == 404
    assert "No topic" in page.locator("#refusal").inner_text()
    context.close()


def test_the_groups_page_links_a_groups_members_and_lag(browser: Browser, cluster: Cluster
                                                       ) -> None:
    """An odd group id, listed, followed to its page, whose lag is the API's (read with the
    viewer's token: authentication is on)."""
    topic = cluster.create_topic(partitions=2, prefix="console")
    commit_some(cluster, topic, 3)
    group = f"odd <b>&\"' {uuid.uuid4().hex[:8]}"
    with cluster.client("admin") as admin:
        joined = admin.post(f"/v1/groups/{segment(group)}/heartbeat", json={
            "member_epoch": 0, "subscribed_topic_names": [topic], "owned_partitions": [],
        })  # fmt: skip
        assert joined.status_code == 200, joined.text
    member = joined.json()["member_id"]
    context = log_in(browser, cluster, "admin")
    page = context.new_page()
    page.goto("/console/groups")
    row = page.locator("#groups tr").filter(has=page.locator("td.group", has_text=group))
    assert row.count() == 1 and row.locator("td.members").inner_text() == "1"
    shoot(page, "groups")
    row.locator("td.group a").click()
    page.wait_for_url(f"**/console/groups/{segment(group)}")
    assert page.locator("#group-id").inner_text() == group
    assert page.locator(f'#members tr[data-member-id="{member}"]').count() == 1
    described = api(cluster, f"/v1/groups/{segment(group)}")
    assert described["lag_error"] is None
    for lag in described["lag"]:
        shown = cells(page, f'#lag tr[data-topic="{topic}"][data-partition="{lag["partition"]}"]')
        assert (shown["lso"], shown["lag"], shown["owner"]) == (
            str(lag["last_stable_offset"]), str(lag["lag"]), member)
    first = cells(page, f'#lag tr[data-topic="{topic}"][data-partition="0"]')
    assert first["committed"] == "—" and first["lag"] == first["lso"]  # all of it, marker too
    assert int(first["lag"]) > 3
    shoot(page, "group")
    context.close()


def test_a_node_lists_only_the_partitions_the_caller_may_describe(cluster: Cluster) -> None:
    """The storage nodes' own list (``GET /v1/partitions``), which the topics pages read
    with the viewer's token: filtered by describe on each topic, like the metadata."""
    seen, hidden = (cluster.create_topic(partitions=4, prefix="listed") for _ in range(2))
    rule = {"principal": "User:writer", "resource_type": "topic", "resource_name": seen,
            "pattern_type": "literal", "operation": "describe", "permission": "allow"}
    with cluster.client("admin") as admin:
        assert admin.post("/v1/acls", json={"acls": [rule]}).status_code == 201
    nodes = [n["url"] for n in api(cluster, "/v1/metadata")["nodes"]]

    def listed(role: str, node: str, **params: str) -> httpx.Response:
        with cluster.client(role, base_url=node) as client:
            return client.get("/v1/partitions", params=params)

    def held(role: str) -> set[tuple[str, int]]:
        found = set()
        for node in nodes:
            answer = listed(role, node)
            assert answer.status_code == 200, answer.text
            found |= {(p["topic"], p["partition"]) for p in answer.json()["partitions"]}
        return found

    every = {(t, p) for t in (seen, hidden) for p in range(4)}
    poll(lambda: held("writer"), lambda h: {(seen, p) for p in range(4)} <= h,
         "the rule to reach the nodes")
    assert {t for t, _ in held("writer")} == {seen}
    assert every <= held("admin")
    refused = listed("writer", nodes[0], topic=hidden)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "TOPIC_AUTHORIZATION_FAILED"
    nobody = listed("outsider", nodes[0])
    assert nobody.status_code == 403
    assert nobody.json()["error"]["code"] == "CLUSTER_AUTHORIZATION_FAILED"
    with cluster.client("writer") as console:  # the console takes the header too
        assert console.get(f"/console/topics/{seen}").status_code == 200
        page = console.get(f"/console/topics/{hidden}")
        assert page.status_code == 403 and "may not describe topic" in page.text
        listing = console.get("/console/topics").text
        assert f'data-topic="{seen}"' in listing and f'data-topic="{hidden}"' not in listing

    leader = api(cluster, f"/v1/topics/{seen}")["partitions"][2]["leader"]["url"]
    answer = listed("writer", leader, topic=seen, first_partition="2", last_partition="2",
                    producers="true")
    [row] = answer.json()["partitions"]
    assert (row["topic"], row["partition"], row["leader"]) == (seen, 2, True)
    assert row["producers"] == [] and row["producer_count"] == 0
    offsets = api(cluster, f"/v1/partitions/{seen}/2/offsets", base_url=leader)
    assert {k: row[k] for k in offsets} == offsets


def test_abort_button_aborts_and_the_page_shows_it(browser: Browser, cluster: Cluster) -> None:
    topic = cluster.create_topic(partitions=1, prefix="console")
    # an odd id, escaped on the page and carried back by the form as it is
    tid = f"odd <b>&\"' {uuid.uuid4().hex[:8]}"
    producer = open_transaction(cluster, topic, tid)
    try:
        context = log_in(browser, cluster, "admin")
        page = context.new_page()
        page.goto("/console/transactions")
        row = page.locator("#open-transactions tr").filter(
            has=page.locator("td.tid", has_text=tid))
        assert row.count() == 1 and row.locator("td.tid").inner_text() == tid
        page.once("dialog", lambda dialog: dialog.accept())
        row.locator("form.abort button").click()
        page.wait_for_url("**/console/transactions?notice=*")
        assert tid in page.locator("#notice").inner_text()

        def ended_state() -> str:
            page.goto("/console/transactions")
            ended = page.locator("#ended-transactions tr").filter(
                has=page.locator("td.tid", has_text=tid))
            return ended.locator("td.state").inner_text() if ended.count() == 1 else ""

        poll(ended_state, lambda s: s == "CompleteAbort", "the page to show the abort")
        assert api(cluster, f"/v1/transactions/{segment(tid)}")["state"] == "CompleteAbort"
        assert page.locator("#open-transactions td.tid", has_text=tid).count() == 0
        context.close()
    finally:
        producer.close()


def test_a_read_only_principal_gets_no_button_and_a_forged_form_is_refused(
    browser: Browser, cluster: Cluster
) -> None:
    topic = cluster.create_topic(partitions=1, prefix="console")
    tid = f"console-ro-{uuid.uuid4().hex[:8]}"
    producer = open_transaction(cluster, topic, tid)
    try:
        reader = log_in(browser, cluster, "reader")
        page = reader.new_page()
        page.goto("/console/transactions")
        assert cells(page, f'#open-transactions tr[data-tid="{tid}"]')["state"] == "Ongoing"
        assert page.locator("form.abort").count() == 0
        assert page.locator(".rights").inner_text() == "read-only"
        shoot(page, "transactions-read-only")
        csrf = page.locator("form.inline input[name=csrf]").get_attribute("value")
        assert csrf
        forged = reader.request.post("/console/transactions/abort",
                                     form={"csrf": csrf, "tid": tid}, max_redirects=0)
        assert forged.status == 403, forged.text()
        assert "may not alter" in forged.text()
        with cluster.client("reader") as client:
            direct = client.post(f"/v1/admin/transactions/{tid}/abort", json={})
        assert direct.status_code == 403
        assert direct.json()["error"]["code"] == "CLUSTER_AUTHORIZATION_FAILED"

        # an admin's session, but a form from elsewhere (no or a wrong CSRF token)
        admin = log_in(browser, cluster, "admin")
        for token in ("", "x" * 43):
            refused = admin.request.post("/console/transactions/abort",
                                         form={"csrf": token, "tid": tid}, max_redirects=0)
            assert refused.status == 403 and "CSRF" in refused.text()
        assert api(cluster, f"/v1/transactions/{tid}")["state"] == "Ongoing"
        admin.close()
        reader.close()
    finally:
        producer.close()


def test_a_planted_hanging_transaction_shows_and_its_button_aborts_it(
    browser: Browser, cluster_factory: ClusterFactory
) -> None:
    """A transactional batch written straight to a node (which, verification off, takes
    it) under a producer id the coordinators never issued: the detector's report lists it,
    the page shows it as the report says, and its abort button frees the LSO."""
    planted = cluster_factory(database="postgres", auth=True, nodes=1,
                              node_flags=("--txn-verification", "off"))
    topic = planted.create_topic(partitions=1, prefix="console")
    producer_id = 900_000 + uuid.uuid4().int % 100_000
    leader = api(planted, f"/v1/topics/{topic}")["partitions"][0]["leader"]["url"]
    with planted.client("admin", base_url=leader) as node:
        written = node.post(f"/v1/partitions/{topic}/0/records", json={
            "producer_id": producer_id, "producer_epoch": 0, "base_sequence": 0,
            "transactional": True, "records": [{"value": "stuck"}, {"value": "stuck"}],
        })  # fmt: skip
        assert written.status_code == 200, written.text
    context = log_in(browser, planted, "admin")
    page = context.new_page()
    row = f'#hanging tr[data-producer-id="{producer_id}"]'

    def shown() -> dict[str, str]:
        page.goto("/console/transactions")
        return cells(page, row) if page.locator(row).count() == 1 else {}

    found = poll(shown, bool, "the planted transaction on the page")
    report = api(planted, "/v1/admin/hanging-transactions")
    [hanging] = [h for h in report["hanging"] if h["producer_id"] == producer_id]
    assert found["reason"] == hanging["reason"]
    assert found["first-offset"] == str(hanging["first_offset"])
    assert api_offsets(planted, topic, 0)["last_stable_offset"] == hanging["first_offset"]
    shoot(page, "transactions-hanging")

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator(f"{row} form.abort button").click()
    page.wait_for_url("**/console/transactions?notice=*")
    assert str(producer_id) in page.locator("#notice").inner_text()
    poll(lambda: api_offsets(planted, topic, 0),
         lambda o: o["last_stable_offset"] == o["high_watermark"], "the LSO to move again")
    poll(shown, lambda c: not c, "the planted transaction to leave the page")
    context.close()


def test_two_coordinators_share_the_leases_and_an_abort_reaches_the_owner(
    browser: Browser, cluster_factory: ClusterFactory
) -> None:
    """The cluster page lists both instances and whose each lease is; an abort pressed on
    the coordinator that does not own the id is carried to the one that does."""
    pair = cluster_factory(database="postgres", auth=True, coordinators=2)
    topic = pair.create_topic(partitions=1, prefix="console")
    tid = f"console-pair-{uuid.uuid4().hex[:8]}"
    producer = open_transaction(pair, topic, tid)
    try:
        context = log_in(browser, pair, "admin")
        page = context.new_page()

        def held() -> list[int]:
            page.goto("/console")
            rows = page.locator("#coordinators tbody tr")
            return [int(rows.nth(i).locator(".count").inner_text().strip("()"))
                    for i in range(rows.count())]

        shares = poll(held, lambda h: len(h) == 2 and all(h), "both instances to hold leases")
        assert sum(shares) == page.locator("#leases li").count() - 1  # all but the controller
        shoot(page, "cluster-two-coordinators")
        context.close()

        # the leases shared out, the id's owner stays put: press abort on the other one
        owner = api(pair, f"/v1/coordinators?key={tid}")["url"]
        other = next(u for u in (pair.coordinator_url(0), pair.coordinator_url(1))
                     if u != owner)
        with pair.client("admin", base_url=other) as client:
            direct = client.post(f"/v1/admin/transactions/{tid}/abort", json={})
        assert direct.json()["error"]["code"] == "NOT_COORDINATOR"  # the API alone would not
        context = log_in(browser, pair, "admin", base_url=other)
        page = context.new_page()
        page.goto("/console/transactions")
        page.once("dialog", lambda dialog: dialog.accept())
        page.locator(f'#open-transactions tr[data-tid="{tid}"] form.abort button').click()
        page.wait_for_url("**/console/transactions?notice=*")
        assert "Aborted" in page.locator("#notice").inner_text()
        poll(lambda: api(pair, f"/v1/transactions/{tid}")["state"],
             lambda s: s == "CompleteAbort", "the owner to complete the abort")
        context.close()
    finally:
        producer.close()


def test_a_node_that_is_down_shows_as_down_and_the_pages_render(
    browser: Browser, cluster: Cluster
) -> None:
    """Last in the module: it stops a storage node of the module's cluster."""
    topic = cluster.create_topic(partitions=2, prefix="console")
    context = log_in(browser, cluster, "admin")
    page = context.new_page()
    cluster.node(2).stop()
    started = time.monotonic()
    page.goto("/console")
    assert time.monotonic() - started < 10  # short timeouts, every node asked at once
    assert cells(page, '#nodes tr[data-node-id="2"]')["status"].startswith("down")
    assert cells(page, '#nodes tr[data-node-id="1"]')["status"] == "ready"
    shoot(page, "cluster-node-down")
    page.goto("/console/topics")
    led_by_2 = [p for p in api(cluster, f"/v1/topics/{topic}")["partitions"]
                if p["leader"]["node_id"] == 2]
    listed = cells(page, topic_row(topic))
    assert f"({len(led_by_2)} partition" in listed["lag"]  # unread, not a failed page
    assert page.locator('#node-errors li[data-node-id="2"]').count() == 1
    page.goto(f"/console/topics/{topic}")
    rows = page.locator(f'#partitions tr[data-topic="{topic}"]')
    assert rows.count() == 2
    assert page.locator(f'#partitions tr[data-topic="{topic}"] td.hw', has_text="—").count() >= 1
    shoot(page, "topic-node-down")
    context.close()
