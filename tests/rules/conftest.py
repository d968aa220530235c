"""Fixtures of the rule tests: jobs written through tensortap's generic Hook."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tensortap as tt
from tensortap.rules import invoke_rule


def _write_job(out_dir: str, n_steps: int, tensors: dict[str, tuple[str, Callable[[int], Any]]],
               mode_of: Callable[[int], Any] | None = None, close: bool = True,
               reduction_config: tt.ReductionConfig | None = None) -> Any:
    """Write `n_steps` steps; tensors = {name: (collection, fn(step) -> value or None)}; returns the trial."""
    colls = sorted({c for c, _ in tensors.values()})
    hook = tt.Hook(out_dir, save_config=tt.SaveConfig(save_interval=1), include_collections=colls,
                   reduction_config=reduction_config)
    for s in range(n_steps):
        hook.set_mode(mode_of(s) if mode_of else tt.modes.TRAIN)
        hook.next_step()
        for name, (coll, fn) in tensors.items():
            v = fn(s)
            if v is not None:
                hook.save_tensor(name, np.asarray(v), coll)
    if close:
        hook.close()
        return tt.create_trial(out_dir)
    hook.flush()
    return hook


@pytest.fixture
def job(tmp_path: Any) -> Callable[..., Any]:
    """job(n_steps, tensors, name="job", mode_of=None) -> Trial of a finished job under tmp_path."""

    def make(n_steps: int, tensors: dict, name: str = "job", **kw: Any) -> Any:
        return _write_job(str(tmp_path / name), n_steps, tensors, **kw)

    return make


@pytest.fixture
def run_rule() -> Callable[..., Any]:
    """run_rule(rule) -> report, evaluated over the whole finished job."""

    def run(rule: Any, **kw: Any) -> Any:
        return invoke_rule(rule, stop_at_job_end=True, **kw)

    return run


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
