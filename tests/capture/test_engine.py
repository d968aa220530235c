"""The step engine (tensortap.capture.engine): its listeners, plan cache, tallies and late identity."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tensortap as tp
from tensortap.capture.engine import PlanCache, Tally
from tensortap.exceptions import InvalidConfiguration
from tensortap.hooks.base import Hook


def test_add_listener_names_the_allowed_events(tmp_path):
    hook = Hook(str(tmp_path / "run"))
    with pytest.raises(InvalidConfiguration, match="step_begin, forward_end, backward_end, optimizer_step, step_end"):
        hook.add_listener("epoch_end", print)
    with pytest.raises(InvalidConfiguration, match="must be callable"):
        hook.add_listener("step_end", 3)
    hook.close()


def test_plan_cache_makes_one_plan_per_answer_and_key():
    made = []

    def make(now, key):
        made.append((tuple(now), key))
        return object()

    cache = PlanCache()
    a, b = ["a"], ["b"]
    p1 = cache.get(a, True, make)
    assert cache.get(a, True, make) is p1
    p2 = cache.get(a, False, make)
    assert p2 is not p1
    assert cache.get(b, True, make) is not p1
    assert cache.get(a, True, make) is p1
    assert len(made) == 3
    cache.clear()
    assert cache.get(a, True, make) is not p1


def test_a_python_tally_counts_only_inside_its_window():
    import time

    t = Tally()
    assert not t.take()
    t.left, t.deadline = 2, time.monotonic() + 60
    assert t.take() and t.take() and not t.take()
    assert t.skipped == 2
    t.left, t.deadline = 5, time.monotonic() - 1
    assert not t.take()


class _LateHook(Hook):
    found: tuple[int, int] | None = None

    @staticmethod
    def identity_source():
        return _LateHook.found


def test_a_rank_learned_after_the_hook_is_adopted_once_and_its_folder_claimed_then(tmp_path, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    out = str(tmp_path / "run")
    _LateHook.found = None
    hook = _LateHook(out, include_workers="all", save_config=tp.SaveConfig(save_interval=1), writer="thread")
    assert (hook.rank, hook.worker) == (0, "worker_0")
    assert not os.path.exists(os.path.join(out, "tensortap", "worker_0"))  # (nothing claimed yet)
    _LateHook.found = (1, 2)
    hook.save_tensor("x", np.arange(3.0))
    _LateHook.found = (0, 2)  # (asked once: a later answer is not taken)
    hook.next_step()
    hook.save_tensor("x", np.arange(3.0))
    hook.close()
    assert (hook.rank, hook.world_size, hook.worker, hook.num_workers) == (1, 2, "worker_1", 2)
    assert os.path.exists(os.path.join(out, "tensortap", "worker_1", "claim.json"))
    assert not os.path.exists(os.path.join(out, "tensortap", "worker_0"))


def test_a_rank_the_caller_gives_is_never_replaced(tmp_path):
    _LateHook.found = (1, 2)
    hook = _LateHook(str(tmp_path / "run"), rank=0, world_size=1, writer="thread")
    hook.save_tensor("x", np.arange(3.0))
    hook.close()
    assert (hook.rank, hook.world_size, hook.worker) == (0, 1, "worker_0")
