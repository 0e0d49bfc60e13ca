"""``eos_server.path_segments``: an id percent-encoded as one segment (the contract's
``quote(name, safe="")``) is routed as one segment and read back whole, whatever it holds."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
from starlette.convertors import CONVERTOR_TYPES

from eos_server.path_segments import (
    RestConvertor,
    SegmentConvertor,
    read_back,
    routable_path,
)

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


def test_every_route_of_both_services_reads_its_parameters_back(tmp_path: Path) -> None:
    """Whatever order the modules were imported in: a route compiled before the
    convertors were installed would answer an escaped ``/`` in an id with a 404."""
    from fastapi.routing import iter_route_contexts

    from coordinator_service.app import create_app as coordinator_app
    from coordinator_service.settings import CoordinatorSettings
    from partition_service.app import create_app as node_app
    from partition_service.settings import NodeSettings

    assert isinstance(CONVERTOR_TYPES["str"], SegmentConvertor)
    assert isinstance(CONVERTOR_TYPES["path"], RestConvertor)
    assert CONVERTOR_TYPES["str"].convert("team%2Fa%25") == "team/a%"
    apps = (
        coordinator_app(CoordinatorSettings(data_dir=tmp_path / "c", internal_token="t" * 32)),
        node_app(NodeSettings(data_dir=tmp_path / "n", internal_token="t" * 32)),
    )
    checked = 0
    for app in apps:
        for context in iter_route_contexts(app.router.routes):
            convertors = getattr(context, "param_convertors", None) or {}
            for name, convertor in convertors.items():
                assert isinstance(convertor, SegmentConvertor | RestConvertor), (context, name)
                checked += 1
    assert checked > 20
