"""What went wrong in a training job, from what it saved: `diagnose(trial)` and its plain-text account.

It gathers, without running the job again:

- the rules that fired (`rules/<rule>/status.json` of `tensortap run`, `rules/<rule>/offline/` of
  `tensortap rules run`) and where; and the built-in rules that need no parameter of the user's
  (DIAGNOSE_RULES), run here at their defaults on what the job saved, unless the job records them already (run
  "diagnose", nothing written);
- the first non-finite value: the flight recorder's incident when the job has one (`Trial.first_nonfinite()`,
  which names the producing module or parameter), else the earliest saved step where a tensor held NaN or inf;
- loss and total-gradient-norm spikes (tensortap.analysis.spikes, the method and defaults of the LossSpike and
  GradNormSpike rules), each with the layers whose gradient norm, or whose output's kurtosis (the flight
  recorder's full statistics), moved first;
- plateaus: a training loss (TRAIN steps, and steps saved without a mode) of at least PLATEAU_MIN_VALUES saved
  values that never fell, or that levels off (the latter is said, not counted as a finding);
- workers whose loss or gradient norm diverge from the others' (tensortap.analysis.ranks, RankDivergence's);
- the GradScaler's skipped steps and scale (AmpScaleCollapse's defaults);
- suggestions, worded as such, for what was found.

`Diagnosis.findings` counts what was found (a converged plateau and the rules that found nothing are not
findings); `to_dict()` is plain JSON data; `to_text()` is the account `tensortap diagnose` prints and writes to
`OUT_DIR/diagnosis.md`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.analysis.ranks import DivergenceTracker
from tensortap.analysis.spikes import ACTIVATION_KURTOSIS, attribute_all, find_spikes, spike_events
from tensortap.analysis.stats import kurtosis_series

__all__ = ["Diagnosis", "diagnose", "DIAGNOSIS_KEY", "PLATEAU_SEGMENTS", "PLATEAU_TOLERANCE"]

#: the name of a module output (tensortap's names: `<module>_output_<i>`)
_OUTPUT = re.compile(r"_output_\d+$")
#: where `tensortap diagnose` writes the account, in the job's out_dir
DIAGNOSIS_KEY = "diagnosis.md"
#: a TRAIN loss is cut into this many runs of saved values; their medians say whether it fell or levels off
PLATEAU_SEGMENTS = 10
#: medians of the last runs within this relative band: the loss levels off there
PLATEAU_TOLERANCE = 0.03
#: a loss whose last run's median is not this much below its first run's never fell
NEVER_FELL = 0.10
#: plateaus are judged on losses with at least this many saved TRAIN values (a short run may not have fallen yet)
PLATEAU_MIN_VALUES = 50
#: at most this many items of one kind are listed in the text
LIST_LIMIT = 5
#: built-in rules diagnose does not run itself: they need the user's parameters, a second job or wall time, or
#: diagnose makes the same judgement (spikes, workers, the GradScaler)
NOT_RUN = ("all_zero", "tensor_variance", "similar_across_runs", "stalled_training_rule", "loss_spike",
           "grad_norm_spike", "rank_divergence", "amp_scale_collapse")
#: what to try when a built-in rule fired (the non-finite, spike, worker and GradScaler findings have their own)
RULE_SUGGESTIONS = {
    "vanishing_gradient": "Gradients vanish: consider the initialisation (He for ReLU, Xavier for tanh), "
                          "non-saturating activations, normalisation layers or residual connections",
    "weight_update_ratio": "Weight updates are out of proportion to the weights: if tiny or zero, check that the "
                           "optimizer was given the model's parameters and the learning rate is not 0; if large, "
                           "lower the learning rate",
    "unchanged_tensor": "Weights do not change: check that the optimizer was given the model's parameters, that "
                        "they require gradients, and the learning rate",
    "loss_not_decreasing": "The loss does not fall: check the learning rate (too small, or too large), the "
                           "initialisation, and that labels match their inputs",
    "dead_relu": "Many ReLUs never fire: consider a lower learning rate, another initialisation of the weights and "
                 "biases, or LeakyReLU/GELU",
    "saturated_activation": "tanh/sigmoid units saturate: check the initialisation and the scale of the inputs; "
                            "consider normalisation layers",
    "poor_weight_initialization": "Check the initialisation: activations or gradients are badly scaled from the "
                                  "first steps",
    "overfit": "The model overfits: consider early stopping, weight decay or dropout, or more training data",
    "overtraining": "The model stopped improving: consider early stopping (the best evaluation is earlier)",
    "class_imbalance": "Classes are imbalanced: consider re-weighting the loss or resampling the data",
    "confusion": "Some classes are mostly mispredicted: check their labels and their share of the data",
    "check_input_images": "Normalise the input images (about mean 0 and unit variance per channel)",
    "nlp_sequence_ratio": "The sequences are mostly padding: consider bucketing them by length or trimming",
    "tree_depth": "Trees are deeper than max_depth would allow: check max_depth and the grow policy",
    "feature_importance_overweight": "A few features hold nearly all the importance: check for a label leak",
    "exploding_tensor": "Tensors hold NaN or inf: see the first non-finite value above",
}
#: GradScaler: skipped steps in a row, and the scale below which it collapsed (AmpScaleCollapse's defaults)
AMP_CONSECUTIVE_SKIPS = 10
AMP_MIN_SCALE = 1.0


@dataclass
class Diagnosis:
    """What `diagnose` found in one job (see the module docstring)."""

    path: str
    workers: list[str] = field(default_factory=list)
    steps: dict[str, Any] = field(default_factory=dict)
    rules: list[dict[str, Any]] = field(default_factory=list)
    nonfinite: dict[str, Any] | None = None
    incidents: dict[str, int] = field(default_factory=dict)
    incident_lines: list[str] = field(default_factory=list)
    spikes: list[dict[str, Any]] = field(default_factory=list)
    plateaus: list[dict[str, Any]] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    amp: dict[str, Any] | None = None
    suggestions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def findings(self) -> int:
        """How many problems were found: rules that fired, a non-finite value, spikes, a loss that never fell,
        diverging workers, a collapsed GradScaler."""
        return (sum(r["status"] == "IssuesFound" for r in self.rules) + (self.nonfinite is not None)
                + len(self.spikes) + sum(p["kind"] == "never fell" for p in self.plateaus) + len(self.ranks)
                + bool(self.amp and self.amp.get("collapsed")))

    def to_dict(self) -> dict[str, Any]:
        return _jsonable({
            "path": self.path, "findings": self.findings, "workers": self.workers, "steps": self.steps,
            "rules": self.rules, "first_nonfinite": self.nonfinite, "incidents": self.incidents,
            "incident_lines": self.incident_lines,
            "spikes": self.spikes, "plateaus": self.plateaus, "diverging_ranks": self.ranks, "amp": self.amp,
            "suggestions": self.suggestions, "notes": self.notes,
        })

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Diagnosis:
        """The Diagnosis whose `to_dict` is `doc` (as `tensortap diagnose --json` writes it)."""
        return cls(path=doc["path"], workers=list(doc.get("workers") or []), steps=dict(doc.get("steps") or {}),
                   rules=list(doc.get("rules") or []), nonfinite=doc.get("first_nonfinite"),
                   incidents=dict(doc.get("incidents") or {}), incident_lines=list(doc.get("incident_lines") or []),
                   spikes=list(doc.get("spikes") or []), plateaus=list(doc.get("plateaus") or []),
                   ranks=list(doc.get("diverging_ranks") or []), amp=doc.get("amp"),
                   suggestions=list(doc.get("suggestions") or []), notes=list(doc.get("notes") or []))

    def headline(self) -> str:
        if not self.findings:
            judged = sum(r["status"] == "NoIssuesFound" for r in self.rules)
            return "nothing wrong found" + (f" ({judged} rule{'s' if judged != 1 else ''} judged the data and "
                                            f"found no issue)" if judged else "")
        parts = []
        if self.nonfinite is not None:
            parts.append(f"non-finite values from step {self.nonfinite['step']}")
        n_sp = len(self.spikes)
        if n_sp:
            parts.append(f"{n_sp} spike" + ("s" if n_sp > 1 else ""))
        if self.ranks:
            ws = sorted({w for r in self.ranks for w in r["workers"]})
            parts.append("diverging " + ("worker " if len(ws) == 1 else "workers ") + ", ".join(ws))
        if any(p["kind"] == "never fell" for p in self.plateaus):
            parts.append("a loss that never fell")
        if self.amp and self.amp.get("collapsed"):
            parts.append("the GradScaler collapsed")
        fired = [r["name"] for r in self.rules if r["status"] == "IssuesFound"]
        if fired:
            parts.append("rules fired: " + ", ".join(sorted(set(fired))))
        return f"{self.findings} finding{'s' if self.findings != 1 else ''}: " + "; ".join(parts)

    def to_text(self) -> str:
        """The account: headline, then each kind of finding, then suggestions."""
        out = [f"# Diagnosis of {self.path}", ""]
        st = self.steps
        span = f"global steps {st.get('first')}..{st.get('last')}" if st.get("count") else "no steps"
        out.append(f"{self.headline()}.")
        out.append(f"({st.get('count', 0)} saved steps, {span}; workers: {', '.join(self.workers) or '-'})")
        out.append("")
        if self.nonfinite is not None:
            out += ["## First non-finite value", "", self.nonfinite["text"], ""]
            for line in self.nonfinite.get("inputs_text", []):
                out.append(f"- {line}")
            if self.nonfinite.get("inputs_text"):
                out.append("")
        fired = [r for r in self.rules if r["status"] == "IssuesFound"]
        if self.rules:
            out += ["## Rules", ""]
            for r in fired:
                steps = r.get("fired_steps") or []
                where = (f"first at step {steps[0]}" + (f", {len(steps)} steps in all" if len(steps) > 1 else "")
                         if steps else "")
                out.append(f"- {r['name']} ({r['run']}): IssuesFound {where}")
                if r.get("message"):
                    out.append(f"  {r['message']}")
            quiet: dict[str, list[str]] = {}
            for r in self.rules:
                if r["status"] != "IssuesFound":
                    quiet.setdefault(r["status"], []).append(r["name"])
            if quiet:
                said = "; ".join(f"{st}: {', '.join(names)}" for st, names in sorted(quiet.items()))
                out.append(("- " if fired else "- no rule fired. ") + said)
            out.append("")
        if self.spikes:
            out += ["## Spikes", ""]
            for sp in self.spikes[:LIST_LIMIT * 2]:
                out.append(f"- {sp['text']}")
                for m in sp["movers"]:
                    how = "non-finite" if m["ratio"] == "inf" else f"x{m['ratio']:.3g} its median before"
                    what = m.get("statistic") or "gradient norm"
                    out.append(f"  moved first: the {what} of {m['tensor']} at step {m['step']} ({how})")
            if len(self.spikes) > LIST_LIMIT * 2:
                out.append(f"- ... and {len(self.spikes) - LIST_LIMIT * 2} more (--json lists them all)")
            out.append("")
        if self.ranks:
            out += ["## Diverging workers", ""]
            out += [f"- {r['text']}" for r in self.ranks[:LIST_LIMIT]]
            out.append("")
        if self.amp is not None:
            out += ["## Mixed precision (GradScaler)", "", self.amp["text"], ""]
        if self.plateaus:
            out += ["## Plateaus", ""]
            out += [f"- {p['text']}" for p in self.plateaus[:LIST_LIMIT]]
            out.append("")
        if self.incidents:
            kinds = ", ".join(f"{k}: {n}" for k, n in sorted(self.incidents.items()))
            out += ["## Flight recorder incidents", "", kinds]
            out += [f"- {x}" for x in self.incident_lines[:LIST_LIMIT]]
            if len(self.incident_lines) > LIST_LIMIT:
                out.append(f"- ... and {len(self.incident_lines) - LIST_LIMIT} more (Trial.incidents())")
            out.append("")
        if self.suggestions:
            out += ["## What to try", ""]
            out += [f"- {s}" for s in self.suggestions]
            out.append("")
        if self.notes:
            out += ["## Notes", ""]
            out += [f"- {n}" for n in self.notes]
            out.append("")
        return "\n".join(out).rstrip() + "\n"


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


# --- reading -----------------------------------------------------------------------------------


def _storage(trial: Any) -> Any:
    storage = getattr(trial.source, "storage", None)
    if storage is None:
        from tensortap.storage import open_storage

        storage = open_storage(trial.path)
    return storage


class _Series:
    """Per-step values of the job's scalars and statistics, read once in bulk (Trial's column extract)."""

    def __init__(self, trial: Any, names: list[str]):
        from tensortap.trials.columns import STATISTICS

        self.stat_index = {s: i for i, s in enumerate(STATISTICS)}
        self.trial = trial
        self.s = None
        if names:
            with np.errstate(all="ignore"):
                self.s = trial._extract(names, None, None, _modes.GLOBAL).scalars()

    def series(self, name: str, stats: tuple[str, ...], worker: str | None = None, train: bool = True
               ) -> tuple[np.ndarray, np.ndarray]:
        """(global steps, values) of `name`: the first of `stats` present at each step (TRAIN and steps without
        a mode when `train`), of `worker` (default the first worker that saved it)."""
        s = self.s
        empty = (np.empty(0, np.int64), np.empty(0))
        if s is None or name not in s.tensors:
            return empty
        code = s.tensors.index(name)
        a, b = (int(x) for x in np.searchsorted(s.tensor, [code, code + 1]))  # rows come sorted by tensor
        mode, wk, stat, step, value = (s.mode[a:b], s.worker[a:b], s.statistic[a:b], s.step[a:b], s.value[a:b])
        rows = np.ones(b - a, dtype=bool)
        if train:
            rows &= (mode == _modes.TRAIN.value) | (mode == _modes.GLOBAL.value)
        if worker is None:
            if not rows.any():
                return empty
            rows &= wk == wk[rows].min()
        else:
            if worker not in s.workers:
                return empty
            rows &= wk == s.workers.index(worker)
        st_parts, v_parts = [], []
        for name_ in stats:  # in order: the first statistic present at a step wins
            i = self.stat_index.get(name_)
            if i is None:
                continue
            sel = rows & (stat == i)
            st_parts.append(step[sel])
            v_parts.append(value[sel])
        if not st_parts or not sum(len(p) for p in st_parts):
            return empty
        steps, first = np.unique(np.concatenate(st_parts), return_index=True)
        return steps.astype(np.int64), np.concatenate(v_parts)[first].astype(np.float64)


def _names(trial: Any, collection: str, prefixes: tuple[str, ...] = ()) -> list[str]:
    """Tensors of `collection`, and those of the flight recorder's collection that belong to it (same name, or
    a name starting with one of `prefixes`)."""
    colls = trial.collections()
    out = set(trial.tensor_names(collection=collection)) if collection in colls else set()
    if "flight" in colls:
        for n in trial.tensor_names(collection="flight"):
            if n in out or (prefixes and n.startswith(prefixes)):
                out.add(n)
    return sorted(out)


def diagnose(trial: Any, *, window: int = 50, z_threshold: float = 6.0, min_ratio: float = 2.0,
             max_factor: float = 10.0, min_history: int = 10, ratio_threshold: float = 2.0,
             rank_window: int = 5, refresh: bool = True, rules: bool = True) -> Diagnosis:
    """The diagnosis of `trial` (a Trial or a path), after reading what the job wrote since (unless not
    `refresh`); with `rules`, the built-in rules the job does not record are run at their defaults. Spike
    parameters are LossSpike's / GradNormSpike's, `ratio_threshold` and `rank_window` RankDivergence's."""
    if isinstance(trial, str):
        from tensortap.trials import create_trial

        trial = create_trial(trial)
    if refresh:
        trial.refresh_data()
    steps = trial.steps(show_incomplete_steps=True)
    d = Diagnosis(str(trial.path), list(trial.workers()),
                  {"count": len(steps), "first": steps[0] if steps else None, "last": steps[-1] if steps else None,
                   "ended": bool(trial.loaded_all_steps)})
    storage = _storage(trial)
    _rules(d, storage)
    if rules:
        _run_rules(d, trial)
    losses = _names(trial, "losses")
    grads = _names(trial, "gradients", ("gradient/", "gradients/"))
    scaler = [n for n in ("grad_scaler/scale", "grad_scaler/skipped") if n in set(trial.tensor_names())]
    acts = [n for n in _names(trial, "flight") if _OUTPUT.search(n)]
    data = _Series(trial, sorted(set(losses) | set(grads) | set(scaler) | set(acts)))
    layers = {g: data.series(g, ("l2", "abs_l2")) for g in grads}
    layers = {g: v for g, v in layers.items() if len(v[0])}
    kurt = _kurtosis(trial, data, acts)
    _nonfinite(d, trial)
    spike = {"window": window, "z_threshold": z_threshold, "min_ratio": min_ratio, "max_factor": max_factor,
             "min_history": min_history}
    for name in losses:
        # a scalar loss's own value; at steps only the flight recorder's ring has, its l2 (|loss|)
        st, vals = data.series(name, ("value", "mean", "l2"))
        _spikes(d, "loss", name, st, vals, layers, kurt, spike)
        _plateau(d, name, st, vals)
    total = _total_norm(layers)
    if total is not None:
        _spikes(d, "gradient norm", "total gradient norm", total[0], total[1], layers, kurt, spike)
    if len(d.workers) > 1:
        _ranks(d, data, losses, grads, ratio_threshold, rank_window)
    if scaler:
        _amp(d, data)
    d.spikes.sort(key=lambda s: s["step"])
    d.rules.sort(key=lambda r: (r["status"] != "IssuesFound", (r.get("fired_steps") or [math.inf])[0], r["name"]))
    _suggest(d)
    if not losses:
        d.notes.append("no loss was saved (the `losses` collection): spikes and plateaus of the loss are not "
                       "judged")
    if not grads:
        d.notes.append("no gradient was saved (the `gradients` collection): gradient-norm spikes are not judged "
                       "and spikes are not attributed to layers")
    return d


def _rules(d: Diagnosis, storage: Any) -> None:
    from tensortap.trials.summary import rule_runs

    try:
        runs = rule_runs(storage)
    except Exception as e:  # noqa: BLE001 - the diagnosis goes on without the rules' files
        d.notes.append(f"the rules' statuses could not be read: {e}")
        return
    for r in runs:
        msg = ""
        expl = r.get("explanations") or {}
        if expl:
            first = min(expl)
            msg = "; ".join(expl[first])[:400]
        d.rules.append({"name": r["name"], "run": r.get("run", "live"), "status": r["status"],
                        "fired_steps": list(r.get("fired_steps") or [])[:1000],
                        "message": msg or (r.get("message") or "")[:400]})


def _run_rules(d: Diagnosis, trial: Any) -> None:
    """The built-in rules at their defaults over the job's complete steps, in memory (nothing written)."""
    from tensortap.rules import invoke_rule
    from tensortap.rules.builtin import BUILTIN_RULES, snake_name

    recorded = {r["name"].split("/")[0] for r in d.rules}
    last = trial.last_complete_step  # (a property)
    if last < 0:
        return
    for cls in BUILTIN_RULES:
        name = snake_name(cls)
        if name in NOT_RUN or name in recorded:
            continue
        try:
            rep = invoke_rule(cls(trial), start_step=0, end_step=last + 1, stop_at_job_end=True)
        except Exception as e:  # noqa: BLE001 - one rule failing leaves the others' verdicts
            d.notes.append(f"rule {name} could not be evaluated: {type(e).__name__}: {e}")
            continue
        msg = rep.first_violations[0].condition if rep.first_violations else ""
        if rep.first_violations and rep.first_violations[0].tensor:
            msg = f"{rep.first_violations[0].tensor}: {msg}"
        d.rules.append({"name": name, "run": "diagnose", "status": rep.status,
                        "fired_steps": list(rep.fired_steps)[:1000], "message": msg[:400]})


def _nonfinite(d: Diagnosis, trial: Any) -> None:
    inc = None
    try:
        for i in trial.incidents():
            d.incidents[str(i.get("kind"))] = d.incidents.get(str(i.get("kind")), 0) + 1
            d.incident_lines.append(_incident_line(i))
        inc = trial.first_nonfinite()
    except Exception as e:  # noqa: BLE001 - the saved data still says where values went non-finite
        d.notes.append(f"the flight recorder's incidents could not be read: {e}")
    if inc:
        d.nonfinite = _from_incident(inc)
        return
    found = _scan_nonfinite(trial)
    if found is not None:
        d.nonfinite = found


def _incident_line(i: dict[str, Any]) -> str:
    """One incident in a line: step, worker, kind and what its detail says."""
    det = i.get("detail") or {}
    kind = i.get("kind")
    if kind == "exception":
        what = f"{det.get('type')}: {det.get('message')}"
    elif kind in ("rule", "stop"):
        what = f"{det.get('rule')}: {det.get('message') or det.get('reason') or ''}"
    elif kind in ("loss_spike", "grad_norm_spike"):
        what = (f"{det.get('tensor') or ''} {_g(det.get('value'))} ({det.get('why') or ''}; median "
                f"{_g(det.get('median'))})")
    elif kind == "non_finite":
        what = f"{det.get('phase')}: {det.get('module') or det.get('parameter') or det.get('tensor')}"
    else:
        what = ""
    return f"step {i.get('step')} ({i.get('worker')}): {kind} {what}".strip()[:300]


def _from_incident(inc: dict[str, Any]) -> dict[str, Any]:
    det = inc.get("detail") or {}
    phase = det.get("phase")
    producer = det.get("module") or det.get("parameter") or det.get("tensor")
    counts = ", ".join(f"{det[k]} {k}" for k in ("nan", "posinf", "neginf") if det.get(k))
    what = {"forward": "the output of module", "backward": "the gradient of parameter", "loss": "the loss",
            "weights": "the weight"}.get(phase or "", "tensor")
    text = (f"step {inc.get('step')} ({inc.get('mode')} step {inc.get('mode_step')}, {inc.get('worker')}): "
            f"{what} {producer!s} went non-finite first" + (f" in the {phase} pass" if phase else "")
            + (f" ({counts})" if counts else "") + (f"; tensor {det['tensor']}" if det.get("tensor")
                                                   and det.get("tensor") != producer else ""))
    inputs = []
    for i in det.get("inputs") or []:
        inputs.append(f"input {i.get('name')}: {i.get('nonfinite', 0)} of {i.get('count')} values non-finite, "
                      f"max |x| {_g(i.get('max_abs'))}, mean |x| {_g(i.get('mean_abs'))}, L2 {_g(i.get('l2'))}")
    ring = inc.get("ring")
    if ring:
        text += (f". The flight recorder saved steps {ring.get('first_step')}..{ring.get('last_step')} before it "
                 f"(collection `flight`)")
    return {"source": "flight recorder", "step": inc.get("step"), "mode": inc.get("mode"),
            "mode_step": inc.get("mode_step"), "worker": inc.get("worker"), "phase": phase,
            "module": det.get("module"), "parameter": det.get("parameter"), "tensor": det.get("tensor"),
            "nan": det.get("nan"), "posinf": det.get("posinf"), "neginf": det.get("neginf"),
            "inputs": det.get("inputs") or [], "ring": ring, "text": text + ".", "inputs_text": inputs}


def _g(v: Any) -> str:
    try:
        return f"{float(v):.4g}"
    except (TypeError, ValueError):
        return str(v)


def _scan_nonfinite(trial: Any) -> dict[str, Any] | None:
    """The earliest saved step (over every worker) where a tensor's value or saved statistics were not finite,
    with the tensors that were non-finite there."""
    from tensortap.trials.columns import STATISTICS

    names = list(trial.tensor_names())
    if not names:
        return None
    with np.errstate(all="ignore"):  # statistics of non-finite values are what is looked for here
        s = trial._extract(names, None, None, _modes.GLOBAL).scalars()
    nf = STATISTICS.index("nonfinite")
    bad = np.where(s.statistic == nf, s.value > 0, ~np.isfinite(s.value))
    if not bad.any():
        return None
    first = int(s.step[bad].min())
    at = bad & (s.step == first)
    tensors = sorted({s.tensors[int(t)] for t in s.tensor[at]})
    workers = sorted({s.workers[int(w)] for w in s.worker[at]})
    mode = _modes.ModeKeys(int(s.mode[at][0])).name if len(s.mode[at]) else None
    ms = int(s.mode_step[at][0])
    colls = trial.collections()
    kinds = {}
    for c in ("losses", "gradients", "weights", "biases"):
        if c in colls:
            for n in trial.tensor_names(collection=c):
                kinds.setdefault(n, c)
    others = [t for t in tensors if t not in kinds]
    shown = ", ".join(tensors[:8]) + (f" and {len(tensors) - 8} more" if len(tensors) > 8 else "")
    text = (f"step {first} ({mode} step {ms}, {', '.join(workers)}): the first saved step with a NaN or inf, in "
            f"{shown}. Saved data only: where it was produced is known at the saved steps, not in between; the "
            f"flight recorder (on by default in `tensortap run`) names the first module or parameter")
    if others and len(others) < len(tensors):
        text += f"; of these, outputs/other tensors: {', '.join(others[:5])}"
    return {"source": "saved data", "step": first, "mode": mode, "mode_step": ms, "worker": workers[0],
            "workers": workers, "tensors": tensors, "phase": None, "module": None, "parameter": None,
            "tensor": tensors[0], "text": text + "."}


def _kurtosis(trial: Any, data: _Series, outputs: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{module output: (steps, kurtosis)} where the job saved its l2 and l4 (the flight recorder's full
    statistics)."""
    out = {}
    for name in outputs:
        l4 = data.series(name, ("l4",))
        if not len(l4[0]):
            continue
        numel = {s: int(np.prod(sh)) for s, sh in trial.tensor(name).shapes().items()}
        series = kurtosis_series(data.series(name, ("l2",)), l4, numel)
        if len(series[0]):
            out[name] = series
    return out


def _spikes(d: Diagnosis, kind: str, name: str, steps: np.ndarray, vals: np.ndarray,
            layers: dict[str, tuple[np.ndarray, np.ndarray]], kurt: dict[str, tuple[np.ndarray, np.ndarray]],
            params: dict[str, Any]) -> None:
    if len(steps) <= params["min_history"]:
        return
    events = spike_events(find_spikes(steps, vals, **params), steps)
    for ev in events:
        ev.movers = attribute_all(ev.step, layers, kurt, since=ev.previous_step, window=params["window"])
        what = "loss " + name if kind == "loss" else name
        text = f"{kind} spike: " + ev.describe(what)
        if ev.end_step is not None and ev.end_step != ev.step:
            text += f"; spiky until step {ev.end_step} (peak {ev.peak_value:.4g} at step {ev.peak_step})"
        dd = ev.to_dict()
        dd.update(kind=kind, tensor=name, text=text)
        d.spikes.append(dd)


def _total_norm(layers: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray] | None:
    """The total norm at the steps where every layer has a norm."""
    if not layers:
        return None
    common = None
    for st, _ in layers.values():
        common = set(st.tolist()) if common is None else common & set(st.tolist())
    if not common:
        return None
    steps = np.asarray(sorted(common), np.int64)
    total = np.zeros(len(steps))
    for st, v in layers.values():
        pos = {int(s): i for i, s in enumerate(st.tolist())}
        total += np.asarray([v[pos[int(s)]] for s in steps]) ** 2
    with np.errstate(all="ignore"):
        return steps, np.sqrt(total)


def _plateau(d: Diagnosis, name: str, steps: np.ndarray, vals: np.ndarray) -> None:
    ok = np.isfinite(vals)
    steps, vals = steps[ok], vals[ok]
    n = len(vals)
    if n < max(PLATEAU_MIN_VALUES, 2 * PLATEAU_SEGMENTS):
        return
    cuts = np.array_split(np.arange(n), PLATEAU_SEGMENTS)
    med = [float(np.median(vals[c])) for c in cuts]
    first, last = med[0], med[-1]
    if first > 0 and last >= first * (1 - NEVER_FELL):
        d.plateaus.append({"kind": "never fell", "tensor": name, "from_step": int(steps[0]),
                           "to_step": int(steps[-1]), "start": first, "end": last,
                           "text": f"the training loss {name} never fell: median {first:.4g} over its first saved "
                                   f"values (steps {int(steps[cuts[0][0]])}-{int(steps[cuts[0][-1]])}), "
                                   f"{last:.4g} over its last (steps {int(steps[cuts[-1][0]])}-"
                                   f"{int(steps[-1])})"})
        return
    k = PLATEAU_SEGMENTS - 1
    while k > 0:
        band = med[k - 1:]
        lo, hi = min(band), max(band)
        if hi - lo > PLATEAU_TOLERANCE * max(abs(hi), 1e-12):
            break
        k -= 1
    if PLATEAU_SEGMENTS - k >= 3:  # the last 30 % of the run or more
        at = int(steps[cuts[k][0]])
        share = 100 * (PLATEAU_SEGMENTS - k) // PLATEAU_SEGMENTS
        fell = 100 * (first - med[k]) / abs(first) if first else 0.0
        d.plateaus.append({"kind": "levels off", "tensor": name, "from_step": at, "to_step": int(steps[-1]),
                           "start": first, "end": last,
                           "text": f"the training loss {name} levels off from about step {at} at {med[k]:.4g} (the "
                                   f"last {share}% of its saved values within {100 * PLATEAU_TOLERANCE:g}%), after "
                                   f"falling {fell:.0f}% from {first:.4g}"})


def _ranks(d: Diagnosis, data: _Series, losses: list[str], grads: list[str], ratio: float, window: int) -> None:
    curves: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for name in losses:
        curves[f"the loss {name}"] = {w: data.series(name, ("value", "mean"), worker=w) for w in d.workers}
    per_worker_layers = {w: {g: data.series(g, ("l2", "abs_l2"), worker=w) for g in grads} for w in d.workers}
    totals = {}
    for w, lay in per_worker_layers.items():
        t = _total_norm({g: v for g, v in lay.items() if len(v[0])})
        if t is not None:
            totals[w] = t
    if totals:
        curves["the total gradient norm"] = totals
    for what, per in curves.items():
        by_step: dict[int, dict[str, float]] = {}
        for w, (st, v) in per.items():
            for s, x in zip(st.tolist(), v.tolist(), strict=True):
                by_step.setdefault(int(s), {})[w] = x
        tr = DivergenceTracker(ratio, window)
        first = None
        count = 0
        for s in sorted(by_step):
            if len(by_step[s]) < 2:
                continue
            div = tr.add(s, by_step[s])
            if div is not None:
                count += 1
                first = first or div
        if first is not None:
            dd = first.to_dict()
            dd.update(curve=what, diverging_steps=count,
                      text=first.describe(what) + (f"; {count} judged steps diverge in all" if count > 1 else ""))
            d.ranks.append(dd)


def _amp(d: Diagnosis, data: _Series) -> None:
    sk_st, sk_v = data.series("grad_scaler/skipped", ("value",), train=False)
    sc_st, sc_v = data.series("grad_scaler/scale", ("value",), train=False)
    skipped = sk_st[sk_v > 0].tolist()
    best_run, run_start, run, prev = 0, None, 0, None
    best_at = None
    for s in skipped:
        if prev is not None and s == prev + 1:
            run += 1
        else:
            run, run_start = 1, s
        if run > best_run:
            best_run, best_at = run, (run_start, s)
        prev = s
    low = [(int(s), float(v)) for s, v in zip(sc_st.tolist(), sc_v.tolist(), strict=True) if v < AMP_MIN_SCALE]
    collapsed = best_run >= AMP_CONSECUTIVE_SKIPS or bool(low)
    parts = [f"{len(skipped)} optimizer steps skipped by the GradScaler"]
    if best_run > 1 and best_at is not None:
        parts.append(f"the longest run {best_run} in a row (steps {best_at[0]}-{best_at[1]})")
    if len(sc_v):
        parts.append(f"scale from {sc_v[0]:.4g} (step {int(sc_st[0])}) to {sc_v[-1]:.4g} (step {int(sc_st[-1])})")
    if low:
        parts.append(f"below {AMP_MIN_SCALE:g} from step {low[0][0]} ({low[0][1]:.4g})")
    text = "; ".join(parts) + (": it collapsed" if collapsed else "") + "."
    d.amp = {"skipped": len(skipped), "longest_run": best_run, "run_steps": list(best_at) if best_at else None,
             "first_scale": float(sc_v[0]) if len(sc_v) else None, "last_scale": float(sc_v[-1]) if len(sc_v)
             else None, "collapsed": collapsed, "text": text}


def _suggest(d: Diagnosis) -> None:
    s = d.suggestions
    nf = d.nonfinite
    if nf is not None:
        where = nf.get("module") or nf.get("parameter") or nf.get("tensor")
        if nf.get("phase") == "forward":
            s.append(f"Look at the forward of {where} at step {nf['step']}: its inputs' statistics above say whether "
                     f"it received non-finite or huge values (then the layer before it, or the data) or made them "
                     f"itself (an overflow: a division, exp or log, or fp16 range; consider float32/bf16 there)")
        elif nf.get("phase") == "backward":
            s.append(f"The gradient of {where} overflowed first at step {nf['step']}: consider clipping gradients "
                     f"(torch.nn.utils.clip_grad_norm_) and lowering the learning rate")
        elif nf.get("source") == "saved data":
            s.append(f"Values went non-finite by step {nf['step']} (the first saved step with any): consider "
                     f"checking the data of the steps before it, lowering the learning rate and clipping gradients; "
                     f"rerun under `tensortap run` (its flight recorder names the first module or parameter)")
        else:
            s.append(f"Values went non-finite at step {nf['step']} ({where}): consider checking the data of that "
                     f"step, lowering the learning rate and clipping gradients")
        if nf["step"] in (0, None) or (d.steps.get("first") is not None and nf["step"] == d.steps["first"]):
            s.append("Non-finite from the first step: check the initialisation and the input data "
                     "(a NaN in the inputs, an unnormalised feature)")
    loss_spikes = [x for x in d.spikes if x["kind"] == "loss"]
    norm_spikes = [x for x in d.spikes if x["kind"] == "gradient norm"]
    if loss_spikes or norm_spikes:
        steps = sorted({x["step"] for x in d.spikes})[:LIST_LIMIT]
        s.append("Consider lowering the learning rate (or a longer warm-up): spikes at steps "
                 + ", ".join(map(str, steps)))
        if norm_spikes:
            base = norm_spikes[0]["baseline"]
            s.append(f"Consider clipping gradients (torch.nn.utils.clip_grad_norm_), at a norm near the typical "
                     f"total norm ({_g(base)} before the first spike)")
        else:
            s.append("Consider clipping gradients (torch.nn.utils.clip_grad_norm_)")
        s.append("Check the data of the batches at those steps (outliers, mislabelled or corrupt samples)")
        firsts = [x["movers"][0] for x in d.spikes if x["movers"]]  # (what moved first at each spike)
        if firsts:
            names = [m["tensor"] for m in firsts]
            top = max(names, key=names.count)  # (ties: the earlier spike's)
            if next(m for m in firsts if m["tensor"] == top).get("statistic") == ACTIVATION_KURTOSIS:
                s.append(f"The outputs of {top.rsplit('_output_', 1)[0]} grew outliers (their kurtosis moved first) "
                         f"before a spike: consider a normalisation layer before or after it, a longer warm-up or "
                         f"a lower learning rate, weight decay, and checking the inputs of those steps for outliers")
            else:
                s.append(f"Look at {top} first: its gradient norm moved before the others at a spike (its "
                         f"initialisation, normalisation, or a learning rate of its own)")
    if d.ranks:
        ws = sorted({w for r in d.ranks for w in r["workers"]})
        s.append(f"Check {', '.join(ws)}: its data shard, its hardware, and anything that changes its gradients "
                 f"after the all-reduce (in data-parallel training every rank steps with the same gradients)")
    if any(p["kind"] == "never fell" for p in d.plateaus):
        s.append("The loss never fell: check the learning rate (too small, or too large), the initialisation, and "
                 "that labels match their inputs")
    for r in d.rules:
        if r["status"] == "IssuesFound":
            tip = RULE_SUGGESTIONS.get(r["name"].split("/")[0])
            if tip and tip not in s and not (r["name"] == "loss_not_decreasing" and any("never fell" in x for x in s)):
                s.append(tip)
    if d.amp and d.amp.get("collapsed"):
        s.append("The GradScaler kept skipping steps: the gradients are non-finite at any scale; find the first "
                 "non-finite value (the flight recorder names it), consider bf16 instead of fp16, or a lower "
                 "learning rate")
