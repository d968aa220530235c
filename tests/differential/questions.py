"""The questions the differential test asks a trial: the same code runs against smdebug 1.0.34's trial (in its
own venv, tests/differential/smdebug_side.py) and against tensortap's (in the test), and answers in JSON.

Only the standard library and numpy here: this file is imported by both environments. `modes` is the library's
ModeKeys enum (smdebug.core.modes.ModeKeys or tensortap.modes.ModeKeys); both have TRAIN/EVAL/PREDICT/GLOBAL.
An exception becomes {"error": "<class name>"}: the classes have the same names in both libraries.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MODE_NAMES = ("TRAIN", "EVAL", "PREDICT", "GLOBAL")


def _value(v: Any) -> Any:
    a = np.asarray(v)
    if a.dtype.kind in "US":
        return {"dtype": "str", "shape": list(a.shape), "data": a.tolist()}
    return {"dtype": str(a.dtype), "shape": list(a.shape), "data": a.tolist()}


def _scalar(v: Any) -> Any:
    a = np.asarray(v, dtype=np.float64).reshape(-1)
    return float(a[0]) if a.size == 1 else a.tolist()


def _try(fn: Any, conv: Any = lambda x: x) -> Any:
    try:
        return {"ok": conv(fn())}
    except Exception as e:  # noqa: BLE001 - the class of the exception is the answer
        return {"error": type(e).__name__}


def ask(trial: Any, modes: Any, q: dict[str, Any]) -> dict[str, Any]:
    """Answer the questions in `q` on `trial`:

    steps: steps() of every mode (complete, and with incomplete ones), workers, loaded_all_steps,
    last_complete_step, tensor_names (all, per collection, per regex), has_passed_step of q["probe_steps"] in
    every mode, and for each tensor in q["tensors"] (all tensors if absent): steps, value / reduction_value /
    workers at each step (incomplete ones included; l2 only for q["l2_tensors"]: smdebug computes an unsaved
    l2 of a matrix as its spectral norm, tensortap as the vector norm, docs/format.md). q["values"] False
    skips values; q["wait"] is a list of [step, mode] for wait_for_steps; q["missing"] asks for missing data.
    """
    M = {n: getattr(modes, n) for n in MODE_NAMES}
    out: dict[str, Any] = {}
    out["steps"] = {n: trial.steps(M[n]) for n in MODE_NAMES}
    out["steps_incomplete"] = {n: trial.steps(M[n], show_incomplete_steps=True) for n in MODE_NAMES}
    out["workers"] = list(trial.workers())
    out["loaded_all_steps"] = bool(trial.loaded_all_steps)
    out["last_complete_step"] = int(trial.last_complete_step)
    names = trial.tensor_names()
    out["tensor_names"] = names
    colls = q.get("collections") or sorted(trial.collections())
    out["tensor_names_by_collection"] = {c: _try(lambda c=c: trial.tensor_names(collection=c)) for c in colls}
    out["tensor_names_by_regex"] = {
        r: _try(lambda r=r: trial.tensor_names(regex=r)) for r in q.get("regexes", [".*weight", "loss", "^zzz$"])
    }
    probe = q.get("probe_steps")
    if probe is None:
        top = max(out["steps_incomplete"]["GLOBAL"], default=-1)
        probe = list(range(0, top + 3))
    out["has_passed_step"] = {
        n: {str(s): _try(lambda s=s, n=n: trial.has_passed_step(s, M[n]).name) for s in probe} for n in MODE_NAMES
    }
    out["mode_modestep"] = {}
    for g in out["steps_incomplete"]["GLOBAL"]:
        m, ms = trial.mode_modestep(g)
        out["mode_modestep"][str(g)] = [m.name if m is not None else None, ms]
    tensors = q.get("tensors")
    if tensors is None:
        tensors = names
    out["tensors"] = {}
    for name in tensors:
        try:
            t = trial.tensor(name)
        except Exception as e:  # noqa: BLE001
            out["tensors"][name] = {"error": type(e).__name__}
            continue
        out["tensors"][name] = _ask_tensor(t, name, q, M, out["steps_incomplete"]["GLOBAL"])
    waits = {}
    for s, n in q.get("wait", []):
        # a step that may still come would block (smdebug has no timeout): only its state is compared
        if trial.has_passed_step(s, M[n]).name == "NOT_YET_AVAILABLE":
            waits[f"{n}:{s}"] = {"would_wait": True}
        else:
            waits[f"{n}:{s}"] = _try(lambda s=s, n=n: trial.wait_for_steps([s], M[n]))
    out["wait_for_steps"] = waits
    if hasattr(trial, "dynamic_refresh"):
        # smdebug's wait_for_steps leaves its trial with dynamic_refresh False (its bug 10.15): the trial would
        # no longer see new steps. tensortap's does not do that; restore it so that later questions compare.
        trial.dynamic_refresh = True
    miss: dict[str, Any] = {}
    for key, (name, s, n) in (q.get("missing") or {}).items():
        def get(name=name, s=s, n=n):
            return trial.tensor(name).value(s, mode=M[n])
        miss[key] = _try(get, _value)
    out["missing"] = miss
    if q.get("new_collection"):
        c = trial.collection("new_for_test")
        c.include(q["new_collection"])
        out["new_collection"] = {
            "tensor_names": sorted(c.tensor_names),
            "include_regex": list(c.include_regex),
            "matched": trial.tensor_names(collection="new_for_test"),
        }
    return out


def _ask_tensor(t: Any, name: str, q: dict[str, Any], M: dict[str, Any], trial_steps: list[int]) -> dict[str, Any]:
    t_ans: dict[str, Any] = {"steps": t.steps()}
    if q.get("tensor_mode_steps", True):
        t_ans["steps_by_mode"] = {n: t.steps(M[n]) for n in MODE_NAMES}
    all_steps = t.steps(show_incomplete_steps=True)
    t_ans["steps_incomplete"] = all_steps
    if not q.get("values", True):
        return t_ans
    t_ans["value"] = {str(s): _try(lambda s=s: t.value(s), _value) for s in all_steps}
    t_ans["workers"] = {str(s): _try(lambda s=s: sorted(t.workers(s))) for s in trial_steps}
    reds = [("mean", False), ("max", False), ("min", False), ("mean", True)]
    if name in q.get("l2_tensors", []):
        reds.append(("l2", False))
    t_ans["reduction"] = {
        f"{s}/{red}/{ab}": _try(lambda s=s, red=red, ab=ab: t.reduction_value(s, red, abs=ab), _scalar)
        for s in all_steps
        for red, ab in reds
    }
    for s in all_steps:
        for w in q.get("per_worker_values", []):
            t_ans["value"][f"{s}@{w}"] = _try(lambda s=s, w=w: t.value(s, worker=w), _value)
    for n in q.get("value_modes", []):
        for s in t.steps(M[n], show_incomplete_steps=True):
            t_ans["value"][f"{n}:{s}"] = _try(lambda s=s, n=n: t.value(s, mode=M[n]), _value)
    return t_ans
