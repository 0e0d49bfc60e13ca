"""The unit layer's guard catches what it promises to: planted violations (a process, a
connection, a listening socket, PostgreSQL, SQLite, one swallowed by the code, one made on
a thread) each fail their test, while pure tests and tests of the other layers pass.

The planted tests run in an inner pytest session in this process (``pytester``); the
tripwires never let a planted call through, so nothing here leaves the process either.
"""

from __future__ import annotations

import pytest

from tests.support.unit_guard import UnitGuard

pytestmark = pytest.mark.unit

# the inner sessions load plugins as this one does (schemathesis' would import urllib3,
# whose import probes IPv6 by binding a socket: a tripwire in a unit test)
INNER = ("-p", "no:cacheprovider", "-p", "no:schemathesis")

PLANTED = '''
import socket
import sqlite3
import subprocess
import sys
import threading

import psycopg
import pytest

pytestmark = pytest.mark.unit


def test_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_connects():
    socket.create_connection(("127.0.0.1", 9), timeout=1)


def test_listens():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))


def test_opens_postgres():
    psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres")


def test_opens_postgres_through_the_class():
    psycopg.Connection.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres")


def test_opens_sqlite(tmp_path):
    sqlite3.connect(tmp_path / "x.db")


def test_opens_sqlite_through_sqlalchemy(tmp_path):
    import sqlalchemy

    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with engine.connect():
        pass


def test_swallows_the_error():
    try:
        subprocess.run(["true"])
    except Exception:
        pass


def test_connects_on_a_thread():
    def reach():
        try:
            socket.create_connection(("127.0.0.1", 9), timeout=1)
        except Exception:
            pass

    thread = threading.Thread(target=reach)
    thread.start()
    thread.join()


@pytest.fixture
def server():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock


def test_uses_a_fixture_that_listens(server):
    pass


def test_pure(tmp_path):
    (tmp_path / "f").write_text("files are fine")
    assert sorted([3, 1, 2]) == [1, 2, 3]
'''


def test_every_planted_violation_fails_its_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_planted=PLANTED)
    result = pytester.runpytest_inprocess(*INNER, plugins=[UnitGuard()])
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 1, result.stdout.str()
    assert outcomes.get("failed") == 9, result.stdout.str()
    assert outcomes.get("errors") == 1, result.stdout.str()  # the fixture, in setup
    text = result.stdout.str()
    for what in (
        "starts a process: ",
        "opens a connection to 127.0.0.1:9",
        "listens on 127.0.0.1:0",
        "opens a PostgreSQL connection",
        "opens an SQLite database",
    ):
        assert what in text, what
    assert text.count("UnitLayerViolation: ") >= 10  # each for the guard's own reason


def test_tests_of_other_layers_are_left_alone(pytester: pytest.Pytester) -> None:
    """The tripwires are up only around unit tests: compared by identity, so nothing is
    opened to find out."""
    pytester.makepyfile(
        test_layers="""
import subprocess

import pytest

BEFORE = subprocess.Popen.__init__


def test_other_layer_sees_popen_untouched():
    assert subprocess.Popen.__init__ is BEFORE


@pytest.mark.unit
def test_unit_layer_sees_the_tripwire():
    assert subprocess.Popen.__init__ is not BEFORE
"""
    )
    result = pytester.runpytest_inprocess(*INNER, plugins=[UnitGuard()])
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize(
    ("markexpr", "imported"),
    [("unit", False), ("(unit) and not heavy", False), ("unit or slow", True), ("slow", True)],
)
def test_unit_runs_skip_modules_that_mark_nothing_unit(
    pytester: pytest.Pytester, markexpr: str, imported: bool
) -> None:
    """A module without the unit mark is not even imported when the run selects only
    unit tests (this one would fail on import); any other selection imports it."""
    pytester.makepyfile(
        test_pure="import pytest\n\n@pytest.mark.unit\ndef test_pure():\n    pass\n",
        test_other="import pytest\n\nraise ImportError('imported')\n\n"
        "@pytest.mark.slow\ndef test_other():\n    pass\n",
    )
    result = pytester.runpytest_inprocess(
        *INNER, "--co", "-m", markexpr, plugins=[UnitGuard()]
    )
    assert ("ImportError: imported" in result.stdout.str()) is imported, result.stdout.str()
