"""The client's list of coordinators (``sdk._metadata.CoordinatorEndpoints``), no I/O: the
order it asks them in, setting aside one that did not answer, learning and forgetting."""

from __future__ import annotations

import pytest

from eos_protocol.addresses import AddressError
from sdk._metadata import MEMBERS_MAX_AGE_S, SET_ASIDE_S, CoordinatorEndpoints, MetadataCache

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_list_in_any_spelling() -> None:
    assert CoordinatorEndpoints("http://a:1, http://b:2/").configured == [
        "http://a:1", "http://b:2",
    ]  # fmt: skip
    assert CoordinatorEndpoints(["http://a:1", "http://a:1"]).configured == ["http://a:1"]
    for bad in ("", "a:1", "http://a:1 http://b:2", ["http://a:1", "ftp://b"]):
        with pytest.raises(AddressError):
            CoordinatorEndpoints(bad)


def test_an_instance_that_did_not_answer_is_passed_over_for_a_while() -> None:
    clock = Clock()
    ends = CoordinatorEndpoints("http://a:1,http://b:1", clock)
    assert ends.current() == "http://a:1"
    ends.set_aside("http://a:1/")
    assert ends.current() == "http://b:1"
    ends.set_aside("http://b:1")
    assert ends.current() == "http://a:1", "all set aside: the soonest back"
    clock.now += SET_ASIDE_S + 0.1
    assert ends.current() == "http://a:1"
    ends.set_aside("http://elsewhere:1")  # not a coordinator of ours: nothing changes
    assert ends.known == ["http://a:1", "http://b:1"]


def test_learned_instances_are_kept_through_a_late_heartbeat() -> None:
    clock = Clock()
    ends = CoordinatorEndpoints("http://a:1", clock)
    assert ends.learn_due()
    ends.learn(["http://a:1", "http://b:1", "not a url"])
    assert ends.known == ["http://a:1", "http://b:1"]
    assert not ends.learn_due()
    ends.learn(["http://a:1"])  # b's heartbeat was late once
    assert ends.known == ["http://a:1", "http://b:1"]
    ends.set_aside("http://a:1")
    assert ends.current() == "http://b:1"
    assert ends.learn_due(), "an instance stopped answering: learn the members again"
    clock.now += MEMBERS_MAX_AGE_S + 1
    ends.learn(["http://a:1"])
    assert ends.known == ["http://a:1"], "unnamed for the max age: forgotten"


def test_the_metadata_answer_teaches_the_live_coordinators() -> None:
    cache = MetadataCache(["http://a:1"])
    cache.update_metadata(
        {"topics": [], "coordinators": [{"node_id": 2, "url": "http://b:1"}]}
    )
    cache.unreachable("http://a:1")
    assert cache.bootstrap_url == "http://b:1"
