"""PyTorch Lightning: `TensortapCallback`, a `lightning.pytorch.Callback` (docs/trainers.md).

    from tensortap.lightning import TensortapCallback
    trainer = L.Trainer(callbacks=[TensortapCallback(out_dir="runs/l1", save_config=10,
                                                     include_collections=["weights", "gradients", "losses"],
                                                     rules=["vanishing_gradient"])])

* TRAIN step k is the trainer's optimizer step k (`trainer.global_step`); with gradient accumulation every
  micro-batch of the window belongs to it.
* Weights are read in `on_before_optimizer_step` (what the step's forward used), gradients right after the
  optimizer's step (a torch optimizer step post-hook): what the optimizer consumed, accumulated, unscaled and
  clipped (Lightning clips after `on_before_optimizer_step`).
* fit's training / validation, test, predict → TRAIN / EVAL / EVAL / PREDICT; the sanity check saves nothing.
* The loss `training_step` / `validation_step` / `test_step` returned is `loss` (collection `losses`): for a TRAIN
  step the mean over its micro-batches; every metric logged with `self.log` is saved under its name
  (collection `metrics`) at the step where Lightning made it available.
* DDP: each process saves as `worker_<global_rank>`.
* Rules run beside training; a rule that finds an issue sets `trainer.should_stop` (checkpoints and logs are
  written as on any early stop).

`lightning.pytorch` and the older `pytorch_lightning` package both work (`tensortap.lightning.callback_class`).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from tensortap import modes as _modes
from tensortap.trainers.capture import LOSS, TrainerCapture, _as_float

logger = logging.getLogger("tensortap")

#: with several processes a stop is decided together, at TRAIN steps that are multiples of this
DISTRIBUTED_STOP_EVERY = 10

# Lightning calls each hook of every callback at every training batch, for its own price (~2 µs each, a profiler
# context per call) unless the callback's attribute is not callable (`_call_callback_hooks`, Lightning >= 2.2).
# So the hooks a step does not need are hidden from it: those this callback never uses for the whole fit, those
# only a saving step uses in the other steps, and the batch start in the steps the step engine only counts, which
# the optimizer's step hook counts instead (docs/internals.md).
_UNUSED_BATCH_HOOKS = ("on_before_backward", "on_after_backward", "on_before_zero_grad")
_SAVING_STEP_HOOKS = ("on_before_optimizer_step", "on_train_batch_end")
_BATCH_START = "on_train_batch_start"
#: the first Lightning release whose trainer skips a callback attribute that is not callable, as far as tested
_HIDING_SINCE = (2, 2)


class _TensortapCallbackMixin:
    """The callback's behaviour, on whichever Lightning package's Callback class (see `callback_class`)."""

    _hides_hooks = False  # (set per Lightning package by `callback_class`, with `_callback_base`)
    _callback_base: Any = None
    _hidden: tuple[str, ...] = ()  # the saving step's hooks hidden in the other steps (those not overridden)

    def __init__(self, out_dir: str, save_config: Any = None, include_collections: Any = None,
                 reduction_config: Any = None, rules: Any = None, stop_on_issue: bool = True,
                 include_workers: str = "all", **hook_kwargs: Any):
        super().__init__()
        self.capture = TrainerCapture(out_dir, save_config=save_config, include_collections=include_collections,
                                      reduction_config=reduction_config, rules=rules,
                                      stop_on_issue=stop_on_issue, include_workers=include_workers, **hook_kwargs)
        self._handles: list[Any] = []
        self._losses: list[float] = []
        self._stepped = False
        self._grads_taken: set[int] = set()  # (several optimizers) parameters whose gradients the open step saved
        self._weights_taken = False  # the open step saved its weights (before the first of its optimizers stepped)
        self._eval_metrics: set[str] = set()  # names logged during evaluation (saved at its end)
        self._names_before: set[str] = set()
        self._distributed = False  # (several processes: a stop is decided together)
        self._trainer: Any = None
        #: the batch starts of steps the engine only counts may be hidden (`_hide_batch_starts`): the optimizer's step
        #: hook sees every step of the fit (one optimizer, automatic optimization, no gradient scaler, one process)
        self._counts_steps = False
        self._counting = False  # the batch start is hidden: the optimizer's step hook counts the steps

    # --- set-up and end -------------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.capture.run("setup", self._setup, trainer, pl_module)

    def _setup(self, trainer: Any, pl_module: Any) -> None:
        from tensortap.pytorch import auto

        auto.detach()  # (under `tensortap run`: this callback captures the trainer's job, not the torch discovery)
        if self.capture.hook is None:
            self.capture.start(pl_module, rank=trainer.global_rank, world_size=trainer.world_size)
        else:
            self.capture.set_model(pl_module)
        self._distributed = trainer.world_size > 1
        self.capture.start_writer()
        if self._hides_hooks:
            cls = type(self)
            # (a hook a subclass overrides is its own: never hidden)
            for name in _UNUSED_BATCH_HOOKS:
                if getattr(cls, name) is getattr(self._callback_base, name):
                    setattr(self, name, None)
            self._hidden = tuple(n for n in _SAVING_STEP_HOOKS
                                 if getattr(cls, n) is getattr(_TensortapCallbackMixin, n))
            self._show_saving_hooks(self.capture.saving)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.capture.run("on_train_start", self._hook_optimizers, trainer)
        self.capture.run("on_train_start", self.capture.training_starts, trainer.global_step)

    def _hook_optimizers(self, trainer: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = [opt.register_step_post_hook(self._after_optimizer_step) for opt in trainer.optimizers]
        self._trainer = trainer
        plugin = getattr(trainer, "precision_plugin", None)
        # (a step the gradient scaler skips, or a second optimizer, does not reach the hook as one step)
        self._counts_steps = (self._hides_hooks and len(self._handles) == 1 and not self._distributed
                              and getattr(trainer.lightning_module, "automatic_optimization", False) is True
                              and plugin is not None and getattr(plugin, "scaler", None) is None
                              and type(self).on_train_batch_start is _TensortapCallbackMixin.on_train_batch_start)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        for name in (*_UNUSED_BATCH_HOOKS, *_SAVING_STEP_HOOKS, _BATCH_START):
            self.__dict__.pop(name, None)  # (the class's hooks again)
        self._counting = False
        self._trainer = None
        self.capture.end_of_training(job_ends=stage == "fit")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        try:
            self.capture.close(wait_for_rules=False)
        except Exception as e:  # noqa: BLE001
            logger.error("tensortap: closing after the trainer's exception failed: %s", e)

    # --- training -------------------------------------------------------------------------------

    # (Lightning calls each hook of every callback at every batch: the hooks of a step that saves nothing test
    # one or two numbers and return; the saving step reads the weights, the gradients, the loss and the logged
    # metrics, handed to the writer as two messages, the tensors in one copy straight from the parameters.)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        cap = self.capture
        if cap.begin_train(trainer.global_step):
            self._losses = []
            self._stepped = False
            self._grads_taken.clear()
            self._weights_taken = False
            if self._hides_hooks:
                self._show_saving_hooks(cap.saving)
            if not cap.saving:
                self._hide_batch_starts()
        self._check_stop(trainer)

    def _hide_batch_starts(self) -> None:
        """The open TRAIN step saves nothing and the engine may only count the steps after it: their batch starts
        are hidden from Lightning, and the optimizer's step hook counts them (`_count_step`) until the step that
        cannot be only counted, whose batch start is shown again."""
        if self._counts_steps and self.capture.quiet_steps_left() > 0:
            setattr(self, _BATCH_START, None)
            self._counting = True

    def _count_step(self) -> None:
        """The optimizer stepped in a step whose batch start was hidden: that step (the trainer's global step, not
        yet advanced) is counted (or begun: after an evaluation), and the stop requests looked for."""
        cap = self.capture
        trainer = self._trainer
        if cap.begin_train(trainer.global_step) and cap.saving:
            # (the schedule changed since the batch starts were hidden: this step saves, its weights already
            # stepped; its gradients are read here, its loss where the batch ends)
            self._losses = []
            self._show_saving_hooks(True)
            self._after_step()
        if cap.quiet_steps_left() <= 0:
            self.__dict__.pop(_BATCH_START, None)
            self._counting = False
        self._check_stop(trainer)

    def _show_saving_hooks(self, saving: bool) -> None:
        """The hooks only a saving step needs, shown to Lightning in such a step and hidden in the others (an
        instance attribute None, which Lightning does not call; deleted, the class's method again)."""
        if saving:
            for name in self._hidden:
                self.__dict__.pop(name, None)
        else:
            for name in self._hidden:
                setattr(self, name, None)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.capture.saving:
            self.capture.run("on_before_optimizer_step", self._before_optimizer_step)

    def _before_optimizer_step(self) -> None:
        cap = self.capture
        if cap.in_train_step() and not self._weights_taken:
            self._weights_taken = True
            cap.save_weights()

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._stepped = True
        if self._counting:  # (an evaluation in between may have left `saving` set: its step's)
            self.capture.run("optimizer step", self._count_step)
        elif self.capture.saving:
            self.capture.run("optimizer step", self._after_step, optimizer)

    def _after_step(self, optimizer: Any = None) -> None:
        cap = self.capture
        if cap.in_train_step():
            cap.save_gradients(self._consumed_by(optimizer))

    def _consumed_by(self, optimizer: Any) -> set[int] | None:
        """With several optimizers (a GAN's, in manual optimization, each stepping after its own backward), the
        parameters whose gradients `optimizer` has just consumed, not yet saved in this step (the first also takes
        those of no optimizer); None with one: every gradient is what it consumed."""
        trainer = self._trainer
        optimizers = trainer.optimizers if trainer is not None else ()
        if optimizer is None or len(optimizers) < 2:
            return None
        taken = self._grads_taken
        if taken:
            mine = {id(p) for group in optimizer.param_groups for p in group["params"]}
        else:
            others = {id(p) for opt in optimizers if opt is not optimizer for group in opt.param_groups
                      for p in group["params"]}
            mine = {id(p) for _n, p in self.capture.parameters() if id(p) not in others}
        mine -= taken
        taken |= mine
        return mine

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.capture.saving:
            self.capture.run("on_train_batch_end", self._saving_batch_end, trainer, pl_module, outputs)
        else:
            self._stepped = False

    def _saving_batch_end(self, trainer: Any, pl_module: Any, outputs: Any) -> None:
        cap = self.capture
        loss = _loss_of(outputs)  # (a host sync on a GPU: only where it is saved)
        if loss is not None:
            self._losses.append(loss)
        open_step = cap.open_train_step()
        if open_step < 0:
            return
        if self._stepped or trainer.global_step != open_step:  # (the step's last micro-batch)
            groups = []
            if self._losses:
                automatic = getattr(pl_module, "automatic_optimization", True)
                # (automatic optimization hands back each micro-batch's loss divided by the window's length)
                value = sum(self._losses) if automatic else sum(self._losses) / len(self._losses)
                groups.append(({LOSS: value}, "losses", False))
            metrics = self._train_metrics(trainer)
            if metrics:
                groups.append((metrics, "metrics", False))
            cap.save_scalar_groups(groups)
            cap.end_saving_step()  # (the step after it is then as cheap as any quiet one)
            self._losses = []
            self._stepped = False
            if self._hides_hooks:
                self._show_saving_hooks(False)
            self._hide_batch_starts()

    def _check_stop(self, trainer: Any) -> None:
        cap = self.capture
        if self._distributed:
            if trainer.global_step % DISTRIBUTED_STOP_EVERY:
                return
            local = cap.check_stop() is not None
            if trainer.strategy.reduce_boolean_decision(local, all=False):
                trainer.should_stop = True
        elif cap.check_stop() is not None:
            trainer.should_stop = True

    # --- evaluation and prediction ------------------------------------------------------------

    def _train_metrics(self, trainer: Any) -> dict[str, Any]:
        """The logged metrics a TRAIN step saves: those not logged during an evaluation."""
        evals = self._eval_metrics
        return {k: v for k, v in trainer.callback_metrics.items() if k not in evals}

    def _eval_batch_start(self, trainer: Any, mode: _modes.ModeKeys) -> None:
        if not trainer.sanity_checking:
            self.capture.begin(mode)

    def _eval_batch_end(self, trainer: Any, outputs: Any) -> None:
        if trainer.sanity_checking or not self.capture.saving:
            return
        loss = _loss_of(outputs)
        if loss is not None:
            self.capture.save_scalars({LOSS: loss}, "losses")

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._names_before = set(trainer.callback_metrics)

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._names_before = set(trainer.callback_metrics)

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        self.capture.run("on_validation_batch_start", self._eval_batch_start, trainer, _modes.EVAL)

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self.capture.run("on_validation_batch_end", self._eval_batch_end, trainer, outputs)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self.capture.run("on_validation_end", self._save_metrics, trainer, True)

    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        self.capture.run("on_test_batch_start", self._eval_batch_start, trainer, _modes.EVAL)

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        self.capture.run("on_test_batch_end", self._eval_batch_end, trainer, outputs)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self.capture.run("on_test_end", self._save_metrics, trainer, True)

    def on_predict_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        self.capture.run("on_predict_batch_start", self._eval_batch_start, trainer, _modes.PREDICT)

    # --- logged metrics -----------------------------------------------------------------------------

    def _save_metrics(self, trainer: Any, eval_names: bool) -> None:
        """What `self.log` made available (`trainer.callback_metrics`): at the end of an evaluation the names
        logged during it, whatever the interval (one aggregate per evaluation); at a TRAIN step the others,
        when the step saves."""
        metrics = trainer.callback_metrics
        if eval_names:
            self._eval_metrics |= set(metrics) - self._names_before
            chosen = {k: v for k, v in metrics.items() if k in self._eval_metrics}
        else:
            chosen = self._train_metrics(trainer)
        if chosen:
            self.capture.save_scalars(chosen, "metrics", always=eval_names)

    def rule_statuses(self) -> dict[str, dict[str, Any]]:
        """{rule label: status} of the rules this callback ran."""
        return self.capture.rule_statuses()


def _loss_of(outputs: Any) -> float | None:
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    return None if outputs is None else _as_float(outputs)


_classes: dict[Any, type] = {}


def callback_class(callback_base: Any) -> type:
    """The TensortapCallback class for a Lightning package's `Callback` base (lightning.pytorch's or
    pytorch_lightning's)."""
    cls = _classes.get(callback_base)
    if cls is None:
        cls = _classes[callback_base] = type("TensortapCallback", (_TensortapCallbackMixin, callback_base),
                                             {"__module__": __name__, "__doc__": _TensortapCallbackMixin.__doc__,
                                              "_hides_hooks": _skips_uncallable_hooks(callback_base),
                                              "_callback_base": callback_base})
    return cls


def _skips_uncallable_hooks(callback_base: Any) -> bool:
    """Whether the Lightning package of `callback_base` skips a callback hook that is not callable (its version)."""
    package = sys.modules.get(callback_base.__module__.split(".")[0])
    try:
        release = tuple(int(part) for part in str(package.__version__).split(".")[:2])
    except (AttributeError, ValueError):
        return False
    return release >= _HIDING_SINCE


def _lightning_callback_base() -> Any:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback
    return Callback


TensortapCallback = callback_class(_lightning_callback_base())


_attached: set[type] = set()


def attach(module: Any) -> None:
    """`tensortap run`: every Trainer the script makes gets a TensortapCallback with the runner's settings
    (unless the script gave it one)."""
    from tensortap.hooks.base import disabled_by_env

    if disabled_by_env():
        return
    trainer_cls = getattr(module, "Trainer", None)
    callback_base = getattr(module, "Callback", None)
    if trainer_cls is None or callback_base is None or trainer_cls in _attached:
        return
    _attached.add(trainer_cls)
    cls = callback_class(callback_base)
    original = trainer_cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        callbacks = kwargs.get("callbacks")
        callbacks = [] if callbacks is None else list(callbacks) if isinstance(callbacks, list | tuple) \
            else [callbacks]
        if not any(isinstance(c, _TensortapCallbackMixin) for c in callbacks):
            try:
                from tensortap.hook_config import load_hook_config

                cfg = load_hook_config()
                callbacks.append(cls(cfg.out_dir))
            except Exception as e:  # noqa: BLE001 - never break the training script
                logger.error("tensortap: could not add the Lightning callback: %s", e)
        kwargs["callbacks"] = callbacks
        original(self, *args, **kwargs)

    trainer_cls.__init__ = __init__
