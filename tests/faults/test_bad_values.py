"""Values handed over while training runs that cannot be saved (None, a string, a dict, an object, a list of
objects, a many-valued "scalar", a bad name) are skipped, counted in dropped_records and logged once per
tensor naming it and the value's type; nothing raises into the training loop, the hook stays on and every
good value is saved bit for bit. Arguments given when the hook is made still raise."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import tensortap as tt
from tensortap.exceptions import InvalidConfiguration

STEPS = 6


class Opaque:
    pass


def _bad_handovers(hook, step: int, torch=None) -> list[tuple[str, str]]:
    """Hand over the bad values of one step; returns (name in the log, type name in the log) of each."""
    bad = [
        (lambda: hook.save_scalar("none", None), "scalar/none", "NoneType"),
        (lambda: hook.save_scalar("text", "0.5"), "scalar/text", "str"),
        (lambda: hook.save_scalar("many", [1.0, 2.0]), "scalar/many", "list"),
        (lambda: hook.save_scalar("dict", {"a": 1}), "scalar/dict", "dict"),
        (lambda: hook.save_scalar(None, 1.0), "None", "float"),
        (lambda: hook.save_tensor("object", Opaque()), "object", "Opaque"),
        (lambda: hook.save_tensor("dict_t", {"w": np.ones(2)}), "dict_t", "dict"),
        (lambda: hook.save_tensor("objects", np.array([Opaque(), 1], dtype=object)), "objects", "ndarray"),
        (lambda: hook.save_tensor("nothing", None), "nothing", "NoneType"),
        (lambda: hook.save_tensor("", np.ones(2)), "''", "ndarray"),
        (lambda: hook.save_tensor("bad_coll", np.ones(2), collections_to_write=[3]), "bad_coll", "ndarray"),
    ]
    if torch is not None:
        bad.append((lambda: hook.save_scalar("vector", torch.ones(3)), "scalar/vector", "Tensor"))
    for call, _, _ in bad:
        call()
    return [(name, typ) for _, name, typ in bad]


def _check(hook, trial, caplog, bad: list[tuple[str, str]]) -> None:
    assert not hook.disabled and hook.error_count == 0
    assert hook.dropped_records == len(bad) * STEPS
    messages = [r.getMessage() for r in caplog.records if r.name == "tensortap" and "not saved" in r.getMessage()]
    for name, typ in bad:
        shown = name if name in ("None", "''") else repr(name)
        said = [m for m in messages if m.startswith(f"tensortap: {shown} not saved")]
        assert len(said) == 1, (name, messages)
        assert typ in said[0] and "dropped_records" in said[0], said[0]
    assert trial.tensor("scalar/loss").steps() == list(range(STEPS))
    for s in range(STEPS):
        assert trial.tensor("scalar/loss").value(s) == np.float64(1.0 / (s + 1))
        assert np.array_equal(trial.tensor("w").value(s), np.full((3, 4), s, dtype=np.float32))
    assert not any(trial.has_tensor(n) for n in ("object", "dict_t", "objects", "nothing", "scalar/none"))


def test_generic_hook_skips_and_counts_bad_values(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="tensortap")
    out = str(tmp_path / "job")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1))
    for step in range(STEPS):  # the training loop: nothing of tensortap's may end it
        hook.next_step()
        bad = _bad_handovers(hook, step)
        hook.save_scalar("loss", 1.0 / (step + 1))
        hook.save_tensor("w", np.full((3, 4), step, dtype=np.float32))
    hook.close()
    _check(hook, tt.create_trial(out), caplog, bad)


def test_pytorch_hook_skips_and_counts_bad_values(tmp_path, caplog):
    torch = pytest.importorskip("torch")
    from tensortap.pytorch import Hook

    caplog.set_level(logging.WARNING, logger="tensortap")
    out = str(tmp_path / "job")
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = Hook(out, save_config=tt.SaveConfig(save_interval=1), include_collections=[])
    hook.register_module(model)
    for step in range(STEPS):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        bad = _bad_handovers(hook, step, torch)
        hook.save_scalar("loss", torch.tensor(1.0 / (step + 1), dtype=torch.float64))
        hook.save_tensor("w", np.full((3, 4), step, dtype=np.float32))
    hook.close()
    _check(hook, tt.create_trial(out), caplog, bad)


@pytest.mark.parametrize("kw", [{"save_config": "every step"}, {"include_workers": "some"}, {"writer": "fast"},
                                {"flush_interval": -1}])
def test_construction_arguments_still_raise(tmp_path, kw):
    with pytest.raises(InvalidConfiguration):
        tt.Hook(str(tmp_path / "job"), **kw)
