"""Where the launcher picks service ports (``EOS_PORT_RANGE``): side-by-side starters, the
suite's workers among them, each in a slice of their own, so a port one of them left free
while its service was down is never handed to another."""

from __future__ import annotations

import pytest

from eos_cli.launcher import DEFAULT_PORT_RANGE, PORT_RANGE_ENV, free_port, port_range
from tests.support.processes import free_port_base


@pytest.mark.unit
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("20000-25000", (20_000, 25_000)),
        ("", DEFAULT_PORT_RANGE),
        ("25000-20000", DEFAULT_PORT_RANGE),  # empty
        ("80-2000", DEFAULT_PORT_RANGE),  # privileged ports
        ("20000", DEFAULT_PORT_RANGE),
        ("a-b", DEFAULT_PORT_RANGE),
    ],
)
def test_the_range_is_read_or_the_default_kept(
    value: str, expected: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, value)
    assert port_range() == expected


def test_ports_and_port_bases_stay_in_the_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Binds sockets to try the ports: not a unit test."""
    monkeypatch.setenv(PORT_RANGE_ENV, "23050-23400")
    assert all(23_050 <= free_port() < 23_400 for _ in range(100))
    for _ in range(20):
        base = free_port_base()
        assert base % 100 == 0 and base >= 23_100 and base + 13 < 23_400


def test_a_port_is_not_handed_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The services of one cluster get their ports before any binds: two of them must not
    be given the same one. Ten ports in the range (one may be held by a service of another
    test): different answers, then a clear refusal."""
    monkeypatch.setenv(PORT_RANGE_ENV, "23500-23510")
    ports: list[int] = []
    with pytest.raises(RuntimeError, match="no free port"):
        for _ in range(11):
            ports.append(free_port())
    assert len(ports) >= 8 and len(set(ports)) == len(ports)
    assert all(23_500 <= port < 23_510 for port in ports)
