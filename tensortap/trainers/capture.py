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
from collections.abc import Container, Iterable, Sequence
from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.capture.batch import BatchSpec, pad
from tensortap.capture.engine import Tally
from tensortap.collection import Collection
from tensortap.collection import CollectionKeys as K
from tensortap.config import ReductionConfig, SaveConfig
from tensortap.exceptions import InvalidConfiguration
from tensortap.hooks.base import Hook, check_out_dir
from tensortap.transport import ONE_BLAS_THREAD

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
    #: the writer process starts a flush interval after the trainer's set-up: not beside a fit's first steps, and
    #: not at all for a fit that ends sooner (its data is written when training ends)
    _late_writer_process = True

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
        clock = self.clock
        if mode is not clock.mode:
            self.set_mode(mode)
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
        self._plan_key: tuple[str, int] = ("trainer", 0)  # (the step plans' key: set_model's count)
        self._rule_procs: list[tuple[str, subprocess.Popen]] = []
        self._rules_tmp: str | None = None
        self._failed = False
        #: the step engine's saving flag of the open step, read when it began (callbacks test this attribute)
        self.saving = False
        self._quiet = Tally()  # TRAIN steps of the engine's quiet window, counted by `begin_train`
        self._train_open = -1  # the TRAIN step open (begun or counted), -1 when the open step is not TRAIN
        self._last_train = -1  # the last TRAIN step open, whatever is open now
        self._train_offset = 0  # added to the trainer's steps: see `training_starts`
        self._unmarked = False  # steps passed since the last step mark, none of them open (end_saving_step)
        self._message: tuple[Any, _StepPlan] | None = None  # the step's message, its weights in, its gradients due

    # --- life ---------------------------------------------------------------------------------

    def start(self, model: Any, rank: int = 0, world_size: int = 1) -> None:
        """Make the hook for this process's worker and start the rules (on rank 0)."""
        if self.hook is not None:
            return
        kw = dict(self._hook_kwargs)
        if self.rule_specs:
            kw["include_collections"] = self._with_rule_collections(kw["include_collections"])
        self.hook = TrainerHook(self.out_dir, rank=rank, world_size=max(world_size, 1), **kw)
        self.hook.clock.tally = self._quiet
        if self.rule_specs and self.hook.active:
            self.hook.apply_collection_configs(self._rule_collection_configs())
        self.set_model(model)
        if rank == 0 and self.rule_specs and self.hook.active:
            self._start_rules()

    def start_writer(self) -> None:
        """Make the writer now, before the trainer's first step (the trainer's set-up, not its training thread's
        first saving step, pays for its ring; its process starts a flush interval later: `_late_writer_process`)."""
        h = self.hook
        if h is not None and h.active and not h.dry_run:
            h._get_writer()

    def parameters(self) -> list[tuple[str, Any]]:
        """The model's parameters as (saved name, parameter)."""
        return self._params

    def set_model(self, model: Any) -> None:
        name = type(model).__name__
        self._plan_key = ("trainer", self._plan_key[1] + 1)
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
        self.saving = False

    def end_of_training(self, job_ends: bool) -> None:
        """Training returned: everything saved is made readable; with rules, when the job ends (`job_ends`), the
        hook closes so that they judge its last steps and finish."""
        if self.hook is None:
            return
        try:
            self._settle_message()
            if self.rule_specs and job_ends:
                self.close()
            else:
                self.hook.end_step()
                self._mark_counted()
                self.hook.flush()
        except Exception as e:  # noqa: BLE001 - never break training
            self.fail("end of training", e)

    def close(self, wait_for_rules: bool = True) -> None:
        self.saving = False
        if self.hook is not None:
            message, self._message = self._message, None
            if message is not None and message[0]:
                message[0].cancel()  # (the trainer failed inside the step)
            if not self.hook.clock.in_step:
                self.hook.end_step()  # (the counted steps are added to the clock before their mark)
                self._mark_counted()
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
        train = mode is _modes.TRAIN
        if self._train_open >= 0:
            self._last_train = self._train_open
        self._train_open = int(mode_step) if train and mode_step is not None else -1
        if h.engine.count_quiet(mode, None if mode_step is None else int(mode_step)):
            return  # (the step engine's quiet window)
        if self._message is not None:
            self._settle_message()
        h.begin(mode, mode_step)
        self._unmarked = False  # (the mark that ends this step covers every step before it)
        self.saving = saving = h.engine.saving
        if train and not saving:
            h.engine.arm(self._quiet)  # (the TRAIN steps before the next saving one are only counted: begin_train)

    def end_saving_step(self) -> None:
        """The open step saved and its last hand-off is made (a TRAIN step's loss and metrics): end it now, so
        that readers learn at once that it passed, and only count the steps up to the next saving one, none of
        them begun (`begin_train`): the step after a saving step costs what any quiet step does. Their mark is
        the one that ends the next step to begin (or `_mark_counted` at the end of training)."""
        h = self.hook
        if not self.active or not h.clock.in_step:
            return
        if self._message is not None:
            self._settle_message()
        h.end_step()
        self.saving = False
        self._unmarked = True
        h.engine.arm_after(self._quiet)

    def _mark_counted(self) -> None:
        """Steps counted after the last mark with no step open (see `end_saving_step`): readers learn they passed."""
        if self._unmarked and not self.hook.clock.in_step:
            self._unmarked = False
            self.hook._send_step_mark()

    def training_starts(self, first_step: int) -> None:
        """A training run begins at the trainer's step `first_step`. When this capture has already had TRAIN steps
        at or past it (`train()` called again, a new trainer given the same callback), the run's steps are saved
        after them, the trainer's step plus an offset (said once): over them, the earlier values would hide the
        new ones."""
        if not self.active:
            return
        last = max(self._train_open, self._last_train)
        if last >= 0 and first_step + self._train_offset <= last:
            self._train_offset = last + 1 - first_step
            logger.warning("tensortap: training began again at step %d after TRAIN steps up to %d; this run's TRAIN "
                           "steps are saved from %d on (the trainer's step + %d)", first_step, last, last + 1,
                           self._train_offset)

    def begin_train(self, step: int) -> bool:
        """TRAIN step `step` (the trainer's global step) is under way: begin it unless it is the open one (another
        micro-batch) or a step of the quiet window (then only counted: the open step saved nothing, and neither
        does this one). True when it began here. (This runs at every batch: on a quiet step it tests two
        numbers.)"""
        step += self._train_offset
        if step == self._train_open:
            return False
        if step == self._train_open + 1 and self._quiet.take():
            self._train_open = step
            return False
        self.run("begin", self.begin, _modes.TRAIN, step)
        return True

    def in_train_step(self) -> bool:
        """Whether the open step is a TRAIN step (False when none is open)."""
        h = self.hook
        return h is not None and h.clock.in_step and h.clock.mode is _modes.TRAIN

    def open_train_step(self) -> int:
        """The open TRAIN step (the trainer's global step), -1 when no TRAIN step is open."""
        h = self.hook
        if h is None or not h.clock.in_step or h.clock.mode is not _modes.TRAIN:
            return -1
        clock = h.clock
        clock.sync()
        return clock.mode_steps[_modes.TRAIN] - self._train_offset

    def quiet_steps_left(self) -> int:
        """How many TRAIN steps after the open (or last counted) one `begin_train` may still only count."""
        return self._quiet.left

    def saves(self, collection: str) -> bool:
        """Whether `collection` saves anything at the open step."""
        h = self.hook
        return self.active and h.clock.in_step and any(c.name == collection for c in h.collections_to_save())

    def save_weights(self) -> None:
        """The weights and biases as they are now (what the forward of this step used). With `save_gradients`
        called later in the same step, both go to the writer as one message (see `_StepPlan`)."""
        if not self.saving:
            return
        if self._message is not None:
            self._settle_message()  # (a second call in one step: the first message goes as it is)
        plan = self._step_plan()
        if plan is None:
            return
        if plan.fast and plan.weights:
            found = _ring_sources(plan.weights, plan.wspec.shapes)
            if found is not None and found[1] is plan.wspec.shapes:
                res = (self._reserve(plan.joint, plan.head + plan.gbytes) if plan.grads
                       else self._reserve(plan.wspec, plan.head))
                if res is not None:
                    if res:  # (False: dropped under backpressure, counted by the writer)
                        _fill(res, found[0])
                        plan.note(self.hook, plan.witems)
                        if not plan.grads:
                            res.commit()
                            return
                    self._message = (res, plan)
                    return
        self._save_tensors([(n, p, c) for n, p, c in plan.witems], "")

    def save_gradients(self, only: Container[int] | None = None) -> None:
        """The gradients as they are now (call where they are what the optimizer consumes); with `only`, those of
        the parameters whose ids it holds (one optimizer's of several: the others' are read where theirs step)."""
        if not self.saving:
            return
        plan = self._step_plan()
        if plan is None:
            return
        message, self._message = self._message, None
        if only is not None:
            if message is not None:
                self._send_weights_alone(message)
            self._save_tensors([(n, p.grad, c) for n, p, c in plan.gitems if id(p) in only and p.grad is not None],
                               "")
            return
        try:
            self._save_gradients(plan, message)
        except BaseException:
            if message is not None and message[0]:
                message[0].cancel()  # (nothing waits behind an open message; cancelling a sent one does nothing)
            raise

    def _save_gradients(self, plan: _StepPlan, message: tuple[Any, _StepPlan] | None) -> None:
        if message is not None and message[1] is not plan:
            self._send_weights_alone(message)
            message = None
        grads = [p.grad for p in plan.grads]
        if plan.fast and grads and all(g is not None for g in grads):
            found = _ring_sources(grads, plan.gspec.shapes)
            if found is not None and found[1] is plan.gspec.shapes:
                if message is not None:
                    res = message[0]
                    if res:
                        res.copy_in(found[0], plan.head)
                        res.commit()
                        plan.note(self.hook, plan.gitems)
                    return
                res = self._reserve(plan.gspec, plan.gbytes)
                if res is not None:
                    if res:
                        _fill(res, found[0])
                        res.commit()
                        plan.note(self.hook, plan.gitems)
                    return
        if message is not None:
            if not message[0]:
                return  # (the step's message was dropped, its gradients counted with it)
            self._send_weights_alone(message)
        self._save_tensors([(n, g, c) for (n, _p, c), g in zip(plan.gitems, grads, strict=True) if g is not None],
                           "")

    def _step_plan(self) -> _StepPlan | None:
        """The open saving step's plan (None when no step is open); callers test `saving` first."""
        h = self.hook
        if not h.clock.in_step or h.disabled:
            return None
        engine = h.engine
        return engine.plans.get(engine.now, self._plan_key, self._make_plan)

    def _make_plan(self, now: Any, key: Any) -> _StepPlan:
        h = self.hook
        witems, gitems = [], []
        for name, p in self._params:
            colls = h.collections_for(name)
            if colls:
                witems.append((name, p, colls))
            if getattr(p, "requires_grad", True):
                gname = "gradient/" + name
                colls = h.collections_for(gname)
                if colls:
                    gitems.append((gname, p, colls))
        return _StepPlan(h, witems, gitems)

    def _reserve(self, spec: BatchSpec, nbytes: int) -> Any:
        """Room in the writer for `spec` at the open step: a reservation, False when dropped under backpressure
        (counted by the writer), None when it cannot go that way (then the tensors go by `_save_tensors`)."""
        h = self.hook
        writer = h._writer
        if writer is None or h.dry_run:
            if h.dry_run:
                return None
            writer = h._get_writer()
        if nbytes < writer.reserve_min_bytes:
            return None  # (a writer thread takes small values cheaper as host arrays)
        clock = h.clock
        clock.sync()
        return spec.reserve(writer, clock)

    def _send_weights_alone(self, message: tuple[Any, _StepPlan]) -> None:
        res, plan = message
        if res:
            ws = plan.wspec
            res.shrink(ws.names, ws.np_dtype, ws.shapes, ws.reductions)
            res.commit()

    def _settle_message(self) -> None:
        """A step's message still open (its gradients never came): it goes with the weights alone."""
        message, self._message = self._message, None
        if message is not None:
            self._send_weights_alone(message)

    def _save_tensors(self, items: list[tuple[str, Any, list[Collection]]], prefix: str) -> None:
        """Tensors of any kind (another device, a DTensor shard, mixed dtypes), read to the host one by one."""
        h = self.hook
        if not items or not self.active or not h.clock.in_step:
            return
        from tensortap.pytorch._tensors import host_numpy

        h.write_tensors([(prefix + name, host_numpy(_local(t).detach().cpu()), colls) for name, t, colls in items],
                        copy=True)

    def save_scalars(self, values: dict[str, Any], collection: str, always: bool = False) -> None:
        """Scalars the trainer computed, at the open step, in `collection` (created if new): when the collection
        saves at this step, or with `always` whenever it is included (values the trainer makes once per
        epoch or evaluation, such as aggregated logged metrics)."""
        self.save_scalar_groups(((values, collection, always),))

    def save_scalar_groups(self, groups: Iterable[tuple[dict[str, Any], str, bool]]) -> None:
        """`save_scalars(values, collection, always)` for each group, in one hand-off (a step's loss and its logged
        metrics)."""
        h = self.hook
        if not self.active or not h.clock.in_step:
            return
        key = []
        values = []
        for vals, collection, always in groups:
            if not vals:
                continue
            names = []
            for name, v in vals.items():
                x = _as_float(v)
                if x is not None:
                    names.append(name)
                    values.append(x)
            key.append((collection, always, tuple(names)))
        if not values:
            return
        engine = h.engine
        plan = engine.plans.get(engine.now, ("scalars", tuple(key)), self._make_scalar_plan)
        if not plan.items:
            return
        if plan.fast:
            buf = plan.buf
            j = 0
            for i, _name, _colls in plan.items:
                buf[j] = values[i]
                j += 1
            res = self._reserve(plan.spec, buf.nbytes)
            if res is not None:
                if res:  # (False: dropped under backpressure, counted by the writer)
                    _fill(res, plan.sources)
                    res.commit()
                    plan.note(h)
                return
        h.write_tensors([(name, np.asarray(values[i], dtype=np.float64), colls) for i, name, colls in plan.items],
                        copy=False)  # (each array is made here and handed over)

    def _make_scalar_plan(self, now: Any, key: Any) -> _ScalarPlan:
        h = self.hook
        items = []
        i = 0
        for collection, always, names in key[1]:
            if collection not in h.include_collections:
                i += len(names)
                continue
            coll = h.collection_manager.get(collection)
            for name in names:
                if not coll.matches(name):
                    h._note_membership(name, [coll])  # (a new name: the collections file is written again)
                    h._invalidate_caches()
                colls = [coll] if always else h.collections_for(name)
                if colls:
                    items.append((i, name, colls))
                i += 1
        return _ScalarPlan(h, items)

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
        env.update(ONE_BLAS_THREAD)
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


class _StepPlan:
    """What a TRAIN saving step saves of the model, for one answer of the schedule: the weights (`witems`) and
    the gradients (`gitems`) as (name, parameter, collections). When they are dense contiguous CPU tensors of one
    dtype saved raw (`fast`), a step's weights and gradients go to the writer as one message: room reserved for
    both where the weights are read, the weights copied straight from the parameters into it, the gradients
    after them where they are read (`joint`; `wspec` / `gspec` for a step that saves only one of the two)."""

    __slots__ = ("witems", "gitems", "weights", "grads", "fast", "wspec", "gspec", "joint", "head", "gbytes",
                 "_noted")

    def __init__(self, hook: Hook, witems: list[tuple[str, Any, list[Collection]]],
                 gitems: list[tuple[str, Any, list[Collection]]]):
        self.witems, self.gitems = witems, gitems
        self.weights = [p for _n, p, _c in witems]
        self.grads = [p for _n, p, _c in gitems]
        self.head = self.gbytes = 0
        self._noted: set[int] = set()
        self.wspec = self.gspec = self.joint = None
        self.fast = False
        tensors = self.weights + self.grads
        if not tensors:
            return
        import torch

        if not _NUMPY_DTYPES:
            _NUMPY_DTYPES.update({torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64),
                                  torch.float16: np.dtype(np.float16)})
        dtype = tensors[0].dtype
        np_dtype = _NUMPY_DTYPES.get(dtype)
        if np_dtype is None:
            return  # (bfloat16, integers...: the tensors go one by one)
        for t in tensors:
            if (t.layout is not torch.strided or not t.is_cpu or t.dtype is not dtype or not t.is_contiguous()
                    or isinstance(t, torch.nn.parameter.UninitializedParameter)
                    or (t.numel() and not t.data_ptr())):  # (no storage of its own: a DTensor)
                return
        specs = []
        for items in (witems, gitems):
            reds = []
            for name, _p, colls in items:
                save_raw, r, save_shape = hook._plan(name, colls)
                if not save_raw or save_shape:
                    return
                reds.append(r)
            specs.append(BatchSpec(tuple(n for n, _p, _c in items), True, tuple(reds) if any(reds) else None,
                                   tuple(tuple(p.shape) for _n, p, _c in items), np_dtype=np_dtype))
        self.wspec, self.gspec = specs
        self.head = sum(p.numel() for p in self.weights) * np_dtype.itemsize
        self.gbytes = sum(p.numel() for p in self.grads) * np_dtype.itemsize
        reds = None
        if self.wspec.reductions is not None or self.gspec.reductions is not None:
            reds = pad(self.wspec.reductions, len(witems)) + pad(self.gspec.reductions, len(gitems))
        self.joint = BatchSpec(self.wspec.names + self.gspec.names, True, reds,
                               self.wspec.shapes + self.gspec.shapes, np_dtype=np_dtype)
        self.fast = True

    def note(self, hook: Hook, items: list[tuple[str, Any, list[Collection]]]) -> None:
        """The tensors of `items` were handed over: readers learn they are members of their collections (once)."""
        if id(items) not in self._noted:
            self._noted.add(id(items))
            for name, _p, colls in items:
                hook._note_membership(name, colls)


#: the torch dtypes whose tensors a step's message takes, and their numpy dtypes (filled at the first plan)
_NUMPY_DTYPES: dict[Any, Any] = {}


class _ScalarPlan:
    """Scalars a step saves (the loss, logged metrics), for one answer of the schedule and one list of names:
    `items` (index among the step's values, name, collections). Saved raw, they go as one message of float64
    copied from `buf` (`fast`), else as records."""

    __slots__ = ("items", "fast", "spec", "buf", "sources", "_noted")

    def __init__(self, hook: Hook, items: list[tuple[int, str, list[Collection]]]):
        self.items = items
        self._noted = False
        self.fast = False
        self.spec = None
        self.buf = np.zeros(len(items), dtype=np.float64)
        self.sources = [(self.buf.__array_interface__["data"][0], self.buf.nbytes)]
        reds = []
        for _i, name, colls in items:
            save_raw, r, save_shape = hook._plan(name, colls)
            if not save_raw or save_shape:
                return
            reds.append(r)
        self.spec = BatchSpec(tuple(name for _i, name, _c in items), True, tuple(reds) if any(reds) else None,
                              ((),) * len(items), np_dtype=self.buf.dtype)
        self.fast = bool(items)

    def note(self, hook: Hook) -> None:
        if not self._noted:
            self._noted = True
            for _i, name, colls in self.items:
                hook._note_membership(name, colls)


def _fill(res: Any, sources: list[tuple[int, int]]) -> None:
    """Copy `sources` into a new reservation; on an error it is cancelled (an open one holds back every later
    message)."""
    try:
        res.copy_in(sources)
    except BaseException:
        res.cancel()
        raise


def _ring_sources(tensors: list[Any], shapes: Any) -> Any:
    from tensortap.pytorch._tensors import ring_sources

    return ring_sources(tensors, shapes)


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
