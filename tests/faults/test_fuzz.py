"""Property-based fuzz of every public constructor and reader entry point: each call either works or raises
a tensortap error whose message names the bad value (or its parameter), never a raw TypeError,
AttributeError, IndexError, KeyError or ValueError from inside."""

from __future__ import annotations

import contextlib
import inspect
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensortap as tt
from tensortap.collection import Collection
from tensortap.exceptions import TensorTapError
from tensortap.rules.actions.base import Actions, parse_action_str
from tensortap.rules.actions.command import Command
from tensortap.rules.actions.email import Email
from tensortap.rules.actions.log import Log
from tensortap.rules.actions.stop import StopTraining
from tensortap.rules.actions.webhook import Webhook
from tensortap.rules.builtin import BUILTIN_RULES

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
FEW = settings(FUZZ, max_examples=25)

# Junk and near-misses: what a careless caller or a bad config file hands over.
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.sampled_from(["", " ", "1", "-1", "0.5", "abc", "mean", "l2", "TRAIN", "x*", "(", "all", "one", "1e9"]),
    st.binary(max_size=4),
)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(), st.text(max_size=6))
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=4), scalars, max_size=2),
                   st.tuples(scalars, scalars))


def _parts(v: Any, depth: int = 0) -> list[Any]:
    """`v` and, for containers, the values inside it (an error may name the one bad item)."""
    out = [v]
    if depth < 2 and isinstance(v, list | tuple | set):
        for x in v:
            out += _parts(x, depth + 1)
    elif depth < 2 and isinstance(v, dict):
        for k, x in v.items():
            out += [k, *_parts(x, depth + 1)]
    return out


def _names_a_bad_value(msg: str, given_args: dict[str, Any]) -> bool:
    for k, v in given_args.items():
        if k in msg:
            return True
        for part in _parts(v):
            r = repr(part)
            if r[:40] in msg or (isinstance(part, str) and part and part in msg):
                return True
    return False


def _names_a_missing_parameter(fn: Any, msg: str, given_args: dict[str, Any]) -> bool:
    """A parameter that was required and not given (AllZero without collection_names or tensor_regex) is named."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return any(re.search(rf"\b{re.escape(p)}\b", msg) for p in params if p not in given_args)


def _works_or_clear_error(fn: Any, /, *args: Any, _allowed: tuple[type[BaseException], ...] = (), **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except TensorTapError as e:
        given_args = {**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs}
        assert str(e), f"{fn.__qualname__}: an error without a message"
        if not (set(kwargs) & {"self"}) and given_args:
            assert (_names_a_bad_value(str(e), given_args) or _names_a_missing_parameter(fn, str(e), given_args)
                    or not isinstance(e, tt.exceptions.InvalidConfiguration)), (
                f"{fn.__qualname__}({given_args!r}): {e} names neither the value nor the parameter")
        return None
    except _allowed:
        return None


def _kwargs_for(fn: Any, skip: tuple[str, ...] = ()) -> st.SearchStrategy[dict[str, Any]]:
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.name not in ("self", "args", "kwargs", *skip) and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return st.fixed_dictionaries({}, optional={p.name: values for p in params})


# --- configuration objects --------------------------------------------------------------------------------

@FUZZ
@given(_kwargs_for(tt.SaveConfig))
def test_save_config(kw):
    _works_or_clear_error(tt.SaveConfig, **kw)


@FUZZ
@given(_kwargs_for(tt.ReductionConfig))
def test_reduction_config(kw):
    _works_or_clear_error(tt.ReductionConfig, **kw)


@FUZZ
@given(values, _kwargs_for(Collection, skip=("name",)))
def test_collection(name, kw):
    _works_or_clear_error(Collection, name, **kw)


# --- the hook's constructor -------------------------------------------------------------------------------

HOOK_SKIP = ("out_dir", "writer")  # every other constructor argument is fuzzed; the writer kind is drawn below


@FEW
@given(_kwargs_for(tt.Hook, skip=HOOK_SKIP), st.sampled_from(["thread", "process", "auto"]))
def test_hook_constructor(tmp_path_factory, monkeypatch, kw, writer):
    out = tmp_path_factory.mktemp("hook")
    monkeypatch.chdir(out)  # whatever a bad argument makes the hook write stays in here
    hook = _works_or_clear_error(tt.Hook, str(out / "job"), writer=writer, **kw)
    if hook is not None:
        hook.close()


# --- reading ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def job(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("fuzz") / "job")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1),
                   reduction_config=tt.ReductionConfig(reductions=["mean"], save_raw_tensor=True))
    for s in range(4):
        hook.set_mode(tt.modes.TRAIN if s < 3 else tt.modes.EVAL)
        hook.next_step()
        hook.save_tensor("w", np.full((2, 2), s, dtype=np.float32), "weights")
        hook.save_scalar("loss", float(s))
    hook.close()
    return out


@FUZZ
@given(values, values, values, values)
def test_create_trial(job, path, name, range_steps, refresh_interval):
    for p in (path, job):
        trial = _works_or_clear_error(tt.create_trial, p, name=name, range_steps=range_steps,
                                      refresh_interval=refresh_interval)
        if trial is not None:  # what was accepted must work afterwards too
            trial.steps()
            trial.tensor_names()
            repr(trial)
            with contextlib.suppress(tt.exceptions.StepNotYetAvailable, tt.exceptions.NoMoreData):
                trial.wait_for_steps([0], timeout=0.01)


@FUZZ
@given(st.sampled_from(["steps", "modes", "mode", "mode_step", "mode_modestep", "global_step", "workers",
                        "workers_for_step", "tensor_names", "has_tensor", "tensor", "collections", "collection",
                        "has_passed_step", "wait_for_steps", "to_dataframe"]),
       st.lists(values, max_size=2), st.dictionaries(st.sampled_from(
           ["mode", "step", "regex", "collection", "show_incomplete_steps", "timeout", "names", "reductions"]),
           values, max_size=2))
def test_trial_queries(job, method, args, kwargs):
    trial = tt.create_trial(job)
    fn = getattr(trial, method)
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return  # a call Python itself refuses (wrong arity): not ours to check
    if method == "wait_for_steps":
        kwargs = {**kwargs, "timeout": 0.01} if "timeout" not in kwargs else kwargs
        if kwargs["timeout"] is None:
            return
    _works_or_clear_error(fn, *args, **kwargs, _allowed=(KeyError,) if method == "collection" else ())


@FUZZ
@given(st.sampled_from(["steps", "value", "values", "stacked", "reduction_value", "reduction_values",
                        "reductions", "shape", "shapes", "prev_steps", "workers"]),
       st.lists(values, max_size=3), st.dictionaries(st.sampled_from(
           ["mode", "worker", "abs", "show_incomplete_steps", "n", "step_num", "reduction_name"]), values,
           max_size=2))
def test_tensor_queries(job, method, args, kwargs):
    trial = tt.create_trial(job)
    fn = getattr(trial.tensor("w"), method)
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return
    _works_or_clear_error(fn, *args, **kwargs)


# --- rules and actions ------------------------------------------------------------------------------------

@FUZZ
@given(st.sampled_from(BUILTIN_RULES), st.data())
def test_rule_constructors(job, cls, data):
    trial = tt.create_trial(job)
    kw = data.draw(_kwargs_for(cls, skip=("base_trial", "other_trials", "actions")))
    if "other_trials" in inspect.signature(cls).parameters:
        kw["other_trials"] = trial
    _works_or_clear_error(cls, trial, **kw)


ACTIONS = (Webhook, Command, Email, Log, StopTraining)


@FUZZ
@given(st.sampled_from(ACTIONS), st.data())
def test_action_constructors(cls, data):
    kw = data.draw(_kwargs_for(cls))
    first = next(iter(inspect.signature(cls).parameters.values()))
    if first.default is inspect.Parameter.empty and first.name not in kw:
        kw[first.name] = data.draw(values)
    with contextlib.suppress(NotImplementedError):
        _works_or_clear_error(cls, **kw)


@FUZZ
@given(st.one_of(values, st.text(max_size=40), st.builds(
    lambda d: __import__("json").dumps(d), st.dictionaries(st.sampled_from(["name", "timeout", "url", "command",
                                                                            "endpoint", "level"]), json_scalars))))
def test_action_strings_and_lists(spec):
    _works_or_clear_error(Actions, spec)
    if isinstance(spec, str):
        _works_or_clear_error(parse_action_str, spec)


def test_the_fuzz_can_fail():
    """The checker itself: a raw error from inside is not accepted."""
    def broken(x):
        return x["key"]
    with pytest.raises(TypeError):
        _works_or_clear_error(broken, 3)
    assert re.search("x", "x")
