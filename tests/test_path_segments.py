"""``eos_server.path_segments``: an id percent-encoded as one segment (the contract's
``quote(name, safe="")``) is routed as one segment and read back whole, whatever it holds."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from starlette.convertors import CONVERTOR_TYPES

from eos_server.path_segments import SegmentConvertor, read_back, routable_path

pytestmark = pytest.mark.unit

IDS = ["etl/orders", "/", "a/b/", "100%", "g%2F", "%252F", "é/ü", "x y", "%", "a%2fb", "..a/.."]


@pytest.mark.parametrize("name", IDS)
def test_an_id_is_one_routed_segment_read_back_whole(name: str) -> None:
    routed = routable_path(f"/v1/groups/{quote(name, safe='')}/offsets".encode())
    empty, v1, groups, segment, offsets = routed.split("/")  # one segment, whatever it holds
    assert (empty, v1, groups, offsets) == ("", "v1", "groups", "offsets")
    assert read_back(segment) == name


def test_only_the_two_escapes_stay_and_are_upper_cased() -> None:
    assert routable_path(b"/v1/a%20b/c%2fd/e%25f/%C3%A9") == "/v1/a b/c%2Fd/e%25f/é"
    assert routable_path(b"/v1/plain") == "/v1/plain"


def test_every_route_reads_its_str_parameters_back() -> None:
    import eos_server  # noqa: F401  (installs the convertor)

    assert isinstance(CONVERTOR_TYPES["str"], SegmentConvertor)
    assert CONVERTOR_TYPES["str"].convert("team%2Fa%25") == "team/a%"
