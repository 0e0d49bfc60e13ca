"""How a service process is run (eos_server/process.py): the collector set for serving."""

from __future__ import annotations

import gc

import pytest

from eos_server.process import YOUNG_COLLECTION_EVERY, tune_collector

pytestmark = pytest.mark.unit


def test_a_started_service_freezes_what_it_built_and_collects_the_young_less_often() -> None:
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    try:
        tune_collector()
        assert gc.get_threshold() == (YOUNG_COLLECTION_EVERY, *before[1:])
        assert before[0] < YOUNG_COLLECTION_EVERY
        assert gc.get_freeze_count() > 10_000  # the imported modules' objects, out of walks
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
