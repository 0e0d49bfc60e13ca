"""The coordinators a storage node asks, with failover: no single one is needed.

A node asks coordinators KIP-890's verification of a transactional batch and the ACL
snapshot, and tells them its heartbeats and ISR changes. Any instance answers all of these
from the shared database, so the node needs *an* instance, never a particular one. It is
configured with a list (``--coordinator-url http://c1:8080,http://c2:8080``), learns the
live instances from ``GET /internal/v1/coordinators`` every refresh, and asks them in
order of preference:

* the instance that answered last comes first (its connections are warm);
* an instance that did not answer — refused connection, reset, or no answer within
  ``timeout_s``, which is how a paused process that still holds its sockets shows — is
  set aside for ``down_s`` and the next one is asked at once, within the same request;
* when every instance is set aside the node still tries them all, soonest-back first,
  rather than refusing without asking;
* a request the preferred instance has not answered within ``hedge_s`` is also sent to
  the next one, and the first answer wins (reads, and writes that are harmless twice: a
  beat, an ISR change its partition epoch refuses the second time).
  A paused instance therefore costs a request ``hedge_s`` rather than ``timeout_s``,
  while a healthy one, answering in a millisecond or two, is never asked twice.

So losing the instance the node was started with costs the requests in flight to it a
fraction of a second, and none after that.

One request is a write that only one instance may make: under transaction version 2 the
node adds a partition to a producer's transaction (``post_to_owner``). It goes to the
instance the caller expects to own it, else to the usual order; an instance that does
not own it answers NOT_COORDINATOR naming the owner, and the owner is asked next. Such an
answer says nothing bad of the instance, so it is not set aside. A write cannot be hedged
(no other instance may make it), so an owner that is set aside — most likely paused or
dead, its lease about to pass to another instance — is given only ``hedge_s`` to answer:
until its lease runs out, each attempt then costs a fraction of a second rather than
``timeout_s``, and the producer retries (COORDINATOR_NOT_AVAILABLE) until the new owner
answers.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable

import httpx
import orjson

from eos_protocol.addresses import AddressError, check_url
from eos_protocol.errors import CoordinatorNotAvailableError
from eos_server.internal import internal_headers
from eos_server.keepalive import KeepAliveClient

log = logging.getLogger("eos.node.coordinators")

Answer = tuple[int, bytes]

#: How long an instance the cluster no longer names is still asked (when others fail).
FORGET_AFTER_S = 300.0

#: Answers that say "this instance cannot serve now" (a proxy, a dying server): try the next.
_UNAVAILABLE = frozenset({502, 503, 504})

#: How many NOT_COORDINATOR answers one write follows (an owner that moves meanwhile
#: may send it round once more).
MAX_REDIRECTS = 3


def _error_code(content: bytes) -> tuple[str | None, dict[str, object]]:
    """The code and details of an error envelope, (None, {}) when it is not one."""
    try:
        error = orjson.loads(content)["error"]
        details = error.get("details") or {}
        return str(error["code"]), details if isinstance(details, dict) else {}
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None, {}


class CoordinatorPool:
    """Every known coordinator, the preferred first; ``get`` falls over between them."""

    def __init__(
        self,
        urls: list[str],
        internal_token: str | None,
        *,
        timeout_s: float,
        down_s: float = 5.0,
        verify: ssl.SSLContext | bool = True,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.configured = list(urls)
        self._learned: dict[str, float] = {}  # URL -> when the cluster last named it
        self._preferred: str | None = self.configured[0] if self.configured else None
        self._down_until: dict[str, float] = {}
        self._down_s = down_s
        self._hedge_s = min(timeout_s / 4, 0.25)
        self._clock = clock
        self._headers = {**internal_headers(internal_token), "accept": "application/json"}
        self._fast: KeepAliveClient | None = None
        if client is None:
            # one connection per concurrent verification, kept for the next ones
            self._fast = KeepAliveClient(timeout_s=timeout_s, max_idle_per_host=64)
        self._client = client or httpx.AsyncClient(
            timeout=timeout_s, headers=internal_headers(internal_token), verify=verify
        )

    # --- membership ----------------------------------------------------------------------

    @property
    def known(self) -> list[str]:
        """Configured instances first (in their order), then the learned ones."""
        return self.configured + [u for u in self._learned if u not in self.configured]

    def candidates(self) -> list[str]:
        """The order in which to ask: preferred, then the others that are not set aside,
        then the set-aside ones, the soonest back first."""
        now = self._clock()
        known = self.known
        if self._preferred in known:
            known.remove(self._preferred)
            known.insert(0, self._preferred)
        up = [u for u in known if self._down_until.get(u, 0.0) <= now]
        down = sorted(
            (u for u in known if self._down_until.get(u, 0.0) > now),
            key=lambda u: self._down_until[u],
        )
        return up + down

    def learn(self, urls: list[str]) -> None:
        """Add the live instances the cluster named (the configured ones always stay). An
        instance left out of one answer (a heartbeat late by a moment) is kept until it
        has gone unnamed for ``FORGET_AFTER_S``: forgetting the only other live instance
        just before the preferred one dies would leave the node with none."""
        now = self._clock()
        for url in urls:
            try:
                self._learned[check_url(url)] = now
            except AddressError as exc:
                log.warning("a coordinator advertises an unusable URL: %s", exc)
        for url, seen in list(self._learned.items()):
            if now - seen > FORGET_AFTER_S:
                del self._learned[url]

    def set_aside(self, url: str) -> None:
        self._down_until[url] = self._clock() + self._down_s
        if self._preferred == url:
            self._preferred = None

    # --- requests ------------------------------------------------------------------------

    async def _send(self, url: str) -> Answer:
        if self._fast is not None and self._fast.supports(url):
            return await self._fast.request("GET", url, headers=self._headers)
        response = await self._client.get(url)
        return response.status_code, response.content

    async def get(self, path: str) -> Answer:
        """GET ``path`` from the first coordinator that answers; the answer as it is.

        Raises COORDINATOR_NOT_AVAILABLE when none did, naming what each one did.
        """
        return await self._hedged(path, self._send)

    async def post(self, path: str, body: object) -> Answer:
        """POST a JSON ``body`` to the first coordinator that answers, hedged as ``get``
        is. Heartbeats and ISR changes are cheap to repeat, and a coordinator that cannot
        reach its database holds a write until the node's own timeout: sent to it alone,
        a heartbeat came after the controller's session timeout and the node was taken
        for dead (seen in the Jepsen-style runs, fault ``pg-cut``). A repeated ISR change
        is refused by its partition epoch, and the next proposal round settles it."""
        content = orjson.dumps(body)

        async def send(url: str) -> Answer:
            response = await self._client.post(
                url, content=content, headers={"content-type": "application/json"}
            )
            return response.status_code, response.content

        return await self._hedged(path, send)

    async def _hedged(self, path: str, send: Callable[[str], Awaitable[Answer]]) -> Answer:
        """``send`` to the candidates in order, the next one as well whenever those asked
        have not answered within the hedge delay; the first usable answer wins."""
        if not self.configured and not self._learned:
            raise CoordinatorNotAvailableError(
                "this node has no coordinator URL (--coordinator-url)"
            )
        order = self.candidates()
        asked: dict[asyncio.Task[Answer], str] = {}
        failures: list[str] = []

        next_index = 0

        def ask() -> None:
            nonlocal next_index
            base = order[next_index]
            next_index += 1
            asked[asyncio.ensure_future(send(base + path))] = base

        ask()
        try:
            while asked:
                more = next_index < len(order)
                done, _ = await asyncio.wait(
                    asked, timeout=self._hedge_s if more else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )  # fmt: skip
                if not done:
                    ask()  # the ones asked are slow: ask the next one as well
                    continue
                for task in done:
                    base = asked.pop(task)
                    answer = self._judge(base, task, failures)
                    if answer is not None:
                        return answer
                if not asked and next_index < len(order):
                    ask()
        finally:
            for task in asked:
                task.cancel()
        raise CoordinatorNotAvailableError("no coordinator answered: " + "; ".join(failures))

    async def post_to_owner(
        self, path: str, body: object, *, first: str | None = None
    ) -> tuple[int, bytes, str]:
        """POST to the instance that owns what ``path`` names: ``first`` if given, else
        the usual order, following NOT_COORDINATOR to the owner it names. Returns the
        answer and the instance that gave it (the owner, when it is a success). An
        answer with an error envelope is the caller's to read, 503 ones included
        (CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS): the instance served.
        """
        if not self.configured and not self._learned:
            raise CoordinatorNotAvailableError(
                "this node has no coordinator URL (--coordinator-url)"
            )
        content = orjson.dumps(body)
        order = self.candidates()
        if first is not None and not self._is_aside(first):
            order = [first, *(u for u in order if u != first)]
        failures: list[str] = []
        asked: set[str] = set()
        failed: set[str] = set()  # not asked again in this call, whoever names them
        redirects = 0
        while order:
            base = order.pop(0)
            if base in asked:
                continue
            asked.add(base)
            failed.add(base)
            try:
                if self._is_aside(base):
                    async with asyncio.timeout(self._hedge_s):
                        status, answer = await self._post_once(base + path, content)
                else:
                    status, answer = await self._post_once(base + path, content)
            except TimeoutError:
                self._failed(base, f"no answer within {self._hedge_s:.2f} s", failures)
                continue
            except httpx.HTTPError as exc:
                self._failed(base, f"{exc or type(exc).__name__}", failures)
                continue
            code, details = _error_code(answer)
            if code is None and status in _UNAVAILABLE:
                self._failed(base, f"HTTP {status}", failures)
                continue
            failed.discard(base)
            self._down_until.pop(base, None)  # it served
            owner = details.get("coordinator_url") if code == "NOT_COORDINATOR" else None
            if isinstance(owner, str) and redirects < MAX_REDIRECTS:
                try:
                    owner = check_url(owner.rstrip("/"))
                except AddressError as exc:
                    failures.append(f"{base}: names an unusable owner: {exc}")
                    continue
                redirects += 1
                if owner not in failed:
                    asked.discard(owner)  # the owner may have moved back
                    order.insert(0, owner)
                failures.append(f"{base}: not the owner, {owner} is")
                continue
            return status, answer, base
        raise CoordinatorNotAvailableError("no coordinator answered: " + "; ".join(failures))

    def _is_aside(self, url: str) -> bool:
        return self._down_until.get(url, 0.0) > self._clock()

    async def _post_once(self, url: str, content: bytes) -> Answer:
        if self._fast is not None and self._fast.supports(url):
            headers = {**self._headers, "content-type": "application/json"}
            return await self._fast.request("POST", url, content, headers=headers)
        response = await self._client.post(
            url, content=content, headers={"content-type": "application/json"}
        )
        return response.status_code, response.content

    def _judge(self, base: str, task: asyncio.Task[Answer], failures: list[str]) -> Answer | None:
        """The answer of ``base`` if it is one to give back; else note the failure."""
        try:
            status, content = task.result()
        except httpx.HTTPError as exc:
            self._failed(base, f"{exc or type(exc).__name__}", failures)
            return None
        return (status, content) if self._usable(base, status, failures) else None

    def _failed(self, base: str, why: str, failures: list[str]) -> None:
        failures.append(f"{base}: {why}")
        self.set_aside(base)

    def _usable(self, base: str, status: int, failures: list[str]) -> bool:
        """An answer from ``base`` with ``status``: one to give back (and ``base`` is
        preferred from now on), or one that says the instance cannot serve now."""
        if status in _UNAVAILABLE:
            self._failed(base, f"HTTP {status}", failures)
            return False
        if self._preferred != base:
            log.info("asking coordinator %s from now on", base)
        self._preferred = base
        self._down_until.pop(base, None)
        return True

    async def refresh_members(self) -> bool:
        """Learn the live instances; a failure keeps the list as it was (False)."""
        try:
            status, content = await self.get("/internal/v1/coordinators")
            if status != 200:
                raise CoordinatorNotAvailableError(f"HTTP {status}")
            urls = [str(item["url"]) for item in orjson.loads(content)["coordinators"]]
        except (CoordinatorNotAvailableError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
            log.warning("live coordinators not refreshed: %s", exc)
            return False
        if not set(urls) <= set(self._learned):
            log.info("live coordinators: %s", ", ".join(urls) or "(none)")
        self.learn(urls)
        return True

    async def run_forever(self, interval_s: float) -> None:
        """Refresh every ``interval_s``; until the first refresh succeeds, every half
        second, so a node started before its coordinators learns them as they come."""
        settled = False
        while True:
            settled = await self.refresh_members() or settled
            await asyncio.sleep(interval_s if settled else min(interval_s, 0.5))

    async def close(self) -> None:
        if self._fast is not None:
            await self._fast.close()
        await self._client.aclose()

