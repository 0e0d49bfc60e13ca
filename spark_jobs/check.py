"""Did a run deliver every input exactly once? The checker the tests and the demo use.

A pipeline run is correct when the output topics, read ``read_committed``, hold one output
per input (nothing duplicated, nothing lost, nothing made up) and the group's committed
offsets equal the end of the input. ``compare`` answers the first question for any
identity of records (the tests use the input value each output carries); ``read_all`` and
``offsets_at_end`` fetch what it needs from a cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sdk import AdminClient, Consumer, ConsumerRecord, TopicPartition
from spark_jobs.reader import iter_range


@dataclass(frozen=True)
class CheckReport:
    """Expected against delivered identities."""

    expected: int
    delivered: int
    duplicates: dict[str, int]
    lost: list[str]
    unexpected: list[str]

    @property
    def ok(self) -> bool:
        return not (self.duplicates or self.lost or self.unexpected)

    def __str__(self) -> str:
        state = "exactly once" if self.ok else "NOT exactly once"
        return (
            f"{state}: {self.expected} expected, {self.delivered} delivered, "
            f"{len(self.duplicates)} duplicated, {len(self.lost)} lost, "
            f"{len(self.unexpected)} unexpected"
            + (f" (e.g. duplicated {sorted(self.duplicates)[:3]})" if self.duplicates else "")
            + (f" (e.g. lost {self.lost[:3]})" if self.lost else "")
        )


def compare(expected: Iterable[str], delivered: Iterable[str]) -> CheckReport:
    """Each expected identity must be delivered exactly once."""
    want = Counter(expected)
    got = Counter(delivered)
    duplicates = {k: n for k, n in got.items() if n > want.get(k, 0) and k in want}
    lost = sorted(k for k in want if got.get(k, 0) < want[k])
    unexpected = sorted(k for k in got if k not in want)
    return CheckReport(sum(want.values()), sum(got.values()), duplicates, lost, unexpected)


def read_all(
    bootstrap_url: str, topic: str, *, isolation_level: str = "read_committed"
) -> list[ConsumerRecord]:
    """Every record of ``topic`` up to its end now (the LSO for read_committed)."""
    with AdminClient(bootstrap_url) as admin:
        count = len(admin.describe_topic(topic).partitions)
        tps = [TopicPartition(topic, p) for p in range(count)]
        bounds = {tp: admin.list_offsets(tp) for tp in tps}
    records: list[ConsumerRecord] = []
    with Consumer(
        bootstrap_url, isolation_level=isolation_level, max_poll_records=5000
    ) as consumer:
        for tp in tps:
            consumer.assign([tp])
            b = bounds[tp]
            end = b.last_stable_offset if isolation_level == "read_committed" else b.high_watermark
            records.extend(iter_range(consumer, tp, b.log_start_offset, end))
    return records


def offsets_at_end(bootstrap_url: str, topic: str, group_id: str) -> dict[int, tuple[int, int]]:
    """Partition -> (committed offset, end of the partition), -1 for no commit."""
    with AdminClient(bootstrap_url) as admin:
        count = len(admin.describe_topic(topic).partitions)
        tps = [TopicPartition(topic, p) for p in range(count)]
        ends = {tp: admin.list_offsets(tp).high_watermark for tp in tps}
    with Consumer(bootstrap_url, group_id) as consumer:
        committed = consumer.committed(tps, require_stable=True)
    return {
        tp.partition: (-1 if committed[tp] is None else committed[tp].offset, ends[tp])  # type: ignore[union-attr]
        for tp in tps
    }


def check_topics(
    bootstrap_url: str,
    topics: Iterable[str],
    expected: Iterable[str],
    identity: Callable[[ConsumerRecord], str],
) -> CheckReport:
    """``compare`` the expected identities with those of the topics' committed records."""
    delivered = [identity(r) for t in topics for r in read_all(bootstrap_url, t)]
    return compare(expected, delivered)
