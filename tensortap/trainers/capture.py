"""The capture a trainer callback drives (docs/trainers.md).

A trainer (PyTorch Lightning, the Hugging Face Trainer) runs the loop; its callback tells this capture where a
step begins (`begin`), when the model's weights and gradients are what the optimizer is about to use
(`save_weights`, `save_gradients`), and which scalars the trainer computed (`save_scalars`). Steps are the
trainer's: TRAIN step k is the k-th optimizer step (the trainer's `global_step`), every micro-batch of a
gradient-accumulation window belongs to it; each evaluation or prediction batch is a step of its mode.

Names follow the PyTorch hook's: `<ModelClass>_<parameter>` for weights and biases, `gradient/<that>` for
gradients; the loss the trainer computed is `loss` (collection `losses`) in every mode, logged metrics keep their
logged names (collection `metrics`).

Rules given to a callback run beside training, each in its own process (`tensortap.runner.rule_worker`, as
`tensortap run` runs them), reading the job as it grows; a rule that finds an issue asks for a stop, and the
callback ends training through the trainer's own flag at the next step. Errors inside the capture are logged
once and turn it off; training goes on.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Any

from tensortap import modes as _modes
from tensortap.collection import Collection
from tensortap.collection import CollectionKeys as K
from tensortap.config import ReductionConfig, SaveConfig
from tensortap.exceptions import InvalidConfiguration
from tensortap.hooks.base import Hook, check_out_dir

logger = logging.getLogger("tensortap")

#: seconds between looks for a stop request (a stat of one file)
STOP_CHECK_INTERVAL = 0.25
#: seconds a finished training waits for its rules to judge the last steps before they are stopped
RULES_GRACE = 60.0
#: the loss's tensor name, in every mode
LOSS = "loss"


class TrainerHook(Hook):
    """The hook under a trainer callback: the generic hook with the PyTorch hook's collections, its steps set by
    the trainer (the callback ends training on a stop request; the hook never raises one into the loop)."""

    builtin_collections = (*Hook.builtin_collections, K.WEIGHTS, K.BIASES, K.GRADIENTS, K.LOSSES, K.METRICS)
    default_include_collections = (K.LOSSES, K.METRICS, K.SCALARS)
    #: saved whatever include_collections names (smdebug's framework defaults: the loss and the metrics)
    always_include_collections = (K.LOSSES, K.METRICS)

    def __init__(self, out_dir: str, **kwargs: Any):
        super().__init__(out_dir, **kwargs)
        self._stop_watch = False  # (the callback watches for stop requests and uses the trainer's flag)

    def _init_builtin_collections(self) -> None:
        get = self.collection_manager.get
        get(K.WEIGHTS).include("^(?!gradient).*weight")
        get(K.BIASES).include("^(?!gradient).*bias")
        get(K.GRADIENTS).include("^gradient/")
        get(K.LOSSES).add_tensor_name(LOSS)

    def _programmatic_collections(self) -> set[str]:
        return set(self.builtin_collections)

    def begin(self, mode: _modes.ModeKeys, mode_step: int | None = None) -> None:
        """End the current step and begin one in `mode`: step `mode_step` of that mode (the trainer's count), or
        the mode's next step."""
        self.set_mode(mode)
        clock = self.clock
        if mode_step is not None:
            clock.sync()
            clock.mode_steps[mode] = int(mode_step) - 1
        self.next_step()


def _rule_specs(rules: Iterable[Any] | None) -> list[Any]:
    """Rules given to a callback: "name", "name:key=value,...", a RuleSpec, or (name, {params})."""
    from tensortap.runner.spec import RuleSpec, parse_rule

    out = []
    for r in rules or ():
        if isinstance(r, RuleSpec):
            out.append(r)
        elif isinstance(r, str):
            out.append(parse_rule(r))
        elif isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], str) and isinstance(r[1], dict):
            out.append(RuleSpec(r[0], {str(k): str(v) for k, v in r[1].items()}))
        else:
            raise InvalidConfiguration(f"rules entry {r!r}: give a rule name such as 'vanishing_gradient', "
                                       "'name:key=value,...', or (name, {params})")
    from tensortap.rules.builtin import get_rule

    for spec in out:
        get_rule(spec.name)  # an unknown name is an error now, naming the known ones
    return out


class TrainerCapture:
    """What a trainer callback does, framework by framework the same (see the module's docstring)."""

    def __init__(self, out_dir: str, save_config: SaveConfig | int | None = None,
                 include_collections: Sequence[str | Collection] | None = None,
                 reduction_config: ReductionConfig | None = None, rules: Iterable[Any] | None = None,
                 stop_on_issue: bool = True, include_workers: str = "all", **hook_kwargs: Any):
        self.out_dir = check_out_dir(out_dir)
        if isinstance(save_config, int) and not isinstance(save_config, bool):
            save_config = SaveConfig(save_interval=save_config)
        SaveConfig.coerce(save_config)  # (a bad value is an error now)
        if include_collections is not None and (isinstance(include_collections, str | bytes)
                                                or not isinstance(include_collections, Iterable)):
            raise InvalidConfiguration(f"include_collections={include_collections!r} must be a list of collection "
                                       "names")
        if not isinstance(stop_on_issue, bool):
            raise InvalidConfiguration(f"stop_on_issue={stop_on_issue!r} must be True or False")
        if include_workers not in ("one", "all"):
            raise InvalidConfiguration(f"include_workers={include_workers!r}: allowed are 'one' and 'all'")
        if reduction_config is not None and not isinstance(reduction_config, ReductionConfig):
            raise InvalidConfiguration(f"reduction_config={reduction_config!r} must be a tensortap.ReductionConfig "
                                       "or None")
        self.rule_specs = _rule_specs(rules)
        self.stop_on_issue = stop_on_issue
        self._hook_kwargs = dict(save_config=save_config, reduction_config=reduction_config,
                                 include_collections=list(include_collections) if include_collections is not None
                                 else None, include_workers=include_workers, **hook_kwargs)
        self.hook: TrainerHook | None = None
        self.stop_request: dict[str, Any] | None = None
        self._next_stop_check = 0.0
        self._params: list[tuple[str, Any]] = []
        self._rule_procs: list[tuple[str, subprocess.Popen]] = []
        self._rules_tmp: str | None = None
        self._failed = False
        #: the step engine's saving flag of the open step, read when it began (callbacks test this attribute)
        self.saving = False

    # --- life ---------------------------------------------------------------------------------

    def start(self, model: Any, rank: int = 0, world_size: int = 1) -> None:
        """Make the hook for this process's worker and start the rules (on rank 0)."""
        if self.hook is not None:
            return
        kw = dict(self._hook_kwargs)
        if self.rule_specs:
            kw["include_collections"] = self._with_rule_collections(kw["include_collections"])
        self.hook = TrainerHook(self.out_dir, rank=rank, world_size=max(world_size, 1), **kw)
        if self.rule_specs and self.hook.active:
            self.hook.apply_collection_configs(self._rule_collection_configs())
        self.set_model(model)
        if rank == 0 and self.rule_specs and self.hook.active:
            self._start_rules()

    def set_model(self, model: Any) -> None:
        name = type(model).__name__
        self._params = [(f"{name}_{n}", p) for n, p in model.named_parameters()]

    @property
    def active(self) -> bool:
        return self.hook is not None and self.hook.active and not self._failed

    def run(self, where: str, fn: Any, *args: Any) -> None:
        """`fn(*args)` for a trainer callback: nothing once the capture is off; an error turns it off (logged
        once), never reaching the trainer."""
        if self._failed or (self.hook is not None and self.hook.disabled):
            return
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - never break training
            self.fail(where, e)

    def fail(self, where: str, e: BaseException) -> None:
        """Never break training: log once, turn the capture off."""
        if self.hook is not None:
            self.hook._fail(f"trainer callback ({where})", e)
        else:
            logger.error("tensortap: trainer callback (%s) failed and is off: %s", where, e)
        self._failed = True

    def end_of_training(self, job_ends: bool) -> None:
        """Training returned: everything saved is made readable; with rules, when the job ends (`job_ends`), the
        hook closes so that they judge its last steps and finish."""
        if self.hook is None:
            return
        try:
            if self.rule_specs and job_ends:
                self.close()
            else:
                self.hook.end_step()
                self.hook.flush()
        except Exception as e:  # noqa: BLE001 - never break training
            self.fail("end of training", e)

    def close(self, wait_for_rules: bool = True) -> None:
        if self.hook is not None:
            self.hook.close()
        self._finish_rules(RULES_GRACE if wait_for_rules else 0.0)

    # --- steps --------------------------------------------------------------------------------

    def begin(self, mode: _modes.ModeKeys, mode_step: int | None = None) -> None:
        """Begin step `mode_step` (default: the next) of `mode`. A step known to save nothing after one that
        saved nothing in the same mode is only counted (readers learn it passed when a later step ends), as the
        framework hooks count their quiet steps."""
        if not self.active:
            self.saving = False
            return
        h = self.hook
        if h.engine.count_quiet(mode, None if mode_step is None else int(mode_step)):
            return  # (the step engine's quiet window)
        h.begin(mode, mode_step)
        self.saving = h.engine.saving

    def current(self) -> tuple[_modes.ModeKeys, int] | None:
        """(mode, mode step) of the open step, or None."""
        h = self.hook
        if h is None or not h.clock.in_step:
            return None
        clock = h.clock
        return clock.mode, clock.mode_steps[clock.mode]

    def saves(self, collection: str) -> bool:
        """Whether `collection` saves anything at the open step."""
        h = self.hook
        return self.active and h.clock.in_step and any(c.name == collection for c in h.collections_to_save())

    def save_weights(self) -> None:
        """The weights and biases as they are now (what the forward of this step used)."""
        if self.saving:
            self._save_tensors(self._params, "")

    def save_gradients(self) -> None:
        """The gradients as they are now (call where they are what the optimizer consumes)."""
        if self.saving:
            self._save_tensors([(n, p.grad) for n, p in self._params if p.grad is not None], "gradient/")

    def _save_tensors(self, named: list[tuple[str, Any]], prefix: str) -> None:
        if not self.saving:
            return
        h = self.hook
        if not self.active or not h.clock.in_step:
            return
        from tensortap.pytorch._tensors import host_numpy

        items = []
        for name, t in named:
            full = prefix + name
            colls = h.collections_for(full)
            if colls:
                items.append((full, host_numpy(_local(t).detach().cpu()), colls))
        if items:
            h.write_tensors(items, copy=True)

    def save_scalars(self, values: dict[str, Any], collection: str, always: bool = False) -> None:
        """Scalars the trainer computed, at the open step, in `collection` (created if new): when the collection
        saves at this step, or with `always` whenever it is included (values the trainer makes once per
        epoch or evaluation, such as aggregated logged metrics)."""
        h = self.hook
        if not self.active or not h.clock.in_step or not values or collection not in h.include_collections:
            return
        import numpy as np

        coll = h.collection_manager.get(collection)
        items = []
        for name, v in values.items():
            x = _as_float(v)
            if x is None:
                continue
            if not coll.matches(name):
                h._note_membership(name, [coll])  # (a new name: the collections file is written again)
                h._invalidate_caches()
            colls = [coll] if always else h.collections_for(name)
            if colls:
                items.append((name, np.asarray(x, dtype=np.float64), colls))
        if items:
            h.write_tensors(items, copy=True)

    # --- stop requests --------------------------------------------------------------------------

    def check_stop(self) -> dict[str, Any] | None:
        """A stop request a rule (or `tensortap run`) wrote for this job, looked for at most every
        STOP_CHECK_INTERVAL; the first one found is kept."""
        if self.stop_request is not None or self.hook is None or self.hook.disabled:
            return self.stop_request
        now = time.monotonic()
        if now < self._next_stop_check:
            return None
        self._next_stop_check = now + STOP_CHECK_INTERVAL
        from tensortap.format.control import stop_requested

        try:
            req = stop_requested(self.out_dir, min_interval=0)
        except Exception as e:  # noqa: BLE001 - an unreadable control file must not break training
            self.hook._warn_once("trainer-stop-check", f"tensortap: cannot check for stop requests: {e}")
            return None
        if req is not None:
            self.stop_request = req
            rule = req.get("rule") or "a stop request"
            logger.warning("tensortap: %s asked to stop training (step %s%s); the trainer stops after this step",
                           rule, req.get("step"), f": {req['reason']}" if req.get("reason") else "")
        return req

    # --- rules beside training --------------------------------------------------------------------

    def _job_spec(self) -> Any:
        from tensortap.runner.spec import JobSpec

        # A save config given to the callback decides the rules' collections' interval too (as `tensortap run
        # --save-interval` does); without one, each rule's own default applies.
        sc = self._hook_kwargs.get("save_config")
        interval = None
        if sc is not None:
            interval = getattr(SaveConfig.coerce(sc).get_save_config(_modes.TRAIN), "save_interval", None)
        return JobSpec(out_dir=self.out_dir, rules=self.rule_specs, stop_on_issue=self.stop_on_issue,
                       save_interval=interval)

    def _with_rule_collections(self, include: list[Any] | None) -> list[Any]:
        from tensortap.runner.hook_config import rule_collections

        base = list(include) if include is not None else list(TrainerHook.default_include_collections)
        return list(dict.fromkeys([*base, *rule_collections(self._job_spec())]))

    def _rule_collection_configs(self) -> dict[str, Collection]:
        """The collections the rules need, with the regexes and save intervals their configs give."""
        from tensortap.hook_config import parse_hook_config
        from tensortap.runner.hook_config import rule_collections

        colls = rule_collections(self._job_spec())
        cfg = parse_hook_config({"LocalPath": self.out_dir, "CollectionConfigurations": [
            {"CollectionName": name, "CollectionParameters": params} for name, params in colls.items()]})
        return cfg.collection_configs

    def _start_rules(self) -> None:
        from tensortap.runner.run import _labels

        self._rules_tmp = tempfile.mkdtemp(prefix="tensortap-rules-")
        env = {k: v for k, v in os.environ.items() if k not in ("TENSORTAP_AUTO", "TENSORTAP_CONFIG")}
        for label, spec in zip(_labels(self.rule_specs), self.rule_specs, strict=True):
            job = {"out_dir": self.out_dir, "label": label, "rule": spec.to_json(),
                   "stop_on_issue": self.stop_on_issue, "offline": False}
            path = os.path.join(self._rules_tmp, f"rule_{label}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(job, f)
            proc = subprocess.Popen([sys.executable, "-m", "tensortap.runner.rule_worker", path], env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            self._rule_procs.append((label, proc))

    def _finish_rules(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        for _label, proc in self._rule_procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._rule_procs = []
        if self._rules_tmp is not None:
            import shutil

            shutil.rmtree(self._rules_tmp, ignore_errors=True)
            self._rules_tmp = None

    def rule_statuses(self) -> dict[str, dict[str, Any]]:
        """{rule label: its status.json} of the rules this callback ran (read from the out_dir)."""
        from tensortap.runner import status as st
        from tensortap.runner.run import _labels
        from tensortap.storage import open_storage

        storage = open_storage(self.out_dir)
        out = {}
        for label in _labels(self.rule_specs):
            s = st.read_status(storage, label)
            if s is not None:
                out[label] = s
        return out


def _local(t: Any) -> Any:
    """This process's shard of a DTensor (FSDP2, tensor parallelism: no collective, so ranks that save nothing
    never wait for each other), else the tensor."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _as_float(v: Any) -> float | None:
    """A plain float of a number or a one-element tensor/array; None for anything else."""
    try:
        if hasattr(v, "detach"):
            v = v.detach()
            if v.numel() != 1:
                return None
            return float(v.item())
        if hasattr(v, "item") and getattr(v, "size", 1) == 1:
            return float(v.item())
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    except Exception:  # noqa: BLE001
        return None
    return None
