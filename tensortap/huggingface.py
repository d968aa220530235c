"""Hugging Face Trainer: `TensortapCallback`, a `transformers.TrainerCallback` (docs/trainers.md).

    from tensortap.huggingface import TensortapCallback
    trainer = Trainer(model, args, train_dataset=..., callbacks=[TensortapCallback(out_dir="runs/h1",
                                                                                   save_config=10)])

* TRAIN step k is the Trainer's optimizer step k (`state.global_step`); every micro-batch of a
  gradient-accumulation window belongs to it.
* Weights and gradients are read in `on_pre_optimizer_step`: after the Trainer clipped (and unscaled) the
  gradients, before the optimizer steps: what the optimizer consumes.
* The loss is the one the model's forward returned (`outputs.loss`), read by a forward hook on the model: a TRAIN
  step's loss is the mean over its micro-batches (their sum when the Trainer hands the model
  `num_items_in_batch`, the window's token count: then each micro-batch's loss is its share of the window's).
  Evaluation and prediction batches are EVAL steps with their loss (the Trainer tells callbacks no difference
  between the two before the end); the Trainer's logs (`loss` when the model gave none, `grad_norm`,
  `learning_rate`, `eval_*`, …) are saved as scalars (collection `metrics`) where they are made.
* Rules run beside training; a rule that finds an issue sets `control.should_training_stop` (and
  `should_save`: the Trainer writes its checkpoint as on any stop).

Not registered under a `report_to` name: transformers keeps that table to itself, and tensortap does not patch it.
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerCallback

from tensortap import modes as _modes
from tensortap.trainers.capture import LOSS, TrainerCapture, _as_float

logger = logging.getLogger("tensortap")

#: with several processes a stop is decided together, at TRAIN steps that are multiples of this
DISTRIBUTED_STOP_EVERY = 10
#: losses of forwards no step has taken yet, kept at most (a step's micro-batches are far fewer)
_MAX_PENDING = 256


def _eager(fn: Any) -> Any:
    """`fn`, which torch.compile never traces (~0.3 us a call)."""
    import torch

    return torch.compiler.disable(fn)


class TensortapCallback(TrainerCallback):
    """Saves a Trainer's weights, gradients, loss and logs into `out_dir`, and runs rules beside it."""

    def __init__(self, out_dir: str, save_config: Any = None, include_collections: Any = None,
                 reduction_config: Any = None, rules: Any = None, stop_on_issue: bool = True,
                 include_workers: str = "all", **hook_kwargs: Any):
        self.capture = TrainerCapture(out_dir, save_config=save_config, include_collections=include_collections,
                                      reduction_config=reduction_config, rules=rules,
                                      stop_on_issue=stop_on_issue, include_workers=include_workers, **hook_kwargs)
        self._handle: Any = None
        self._watched: Any = None  # the model whose forwards are read (`_watch`)
        self._training = False  # inside train()
        self._pending: list[float] = []  # losses of the forwards since the last look
        self._shared_loss = False  # the model's losses are shares of the window's (num_items_in_batch)
        self._saved_here: set[str] = set()
        self._model_gives_loss = False  # (then the logs' `loss`, a mean over the logging window, is not saved)

    # --- life ---------------------------------------------------------------------------------

    def on_init_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        self.capture.run("on_init_end", self._watch, model)

    def _watch(self, model: Any) -> None:
        """Read the loss of `model`'s forwards (a forward hook, kept for the Trainer's life: an `evaluate()` or a
        `predict()` before or after `train()` has its losses too). The Trainer's model, once per model."""
        from tensortap.hooks.base import disabled_by_env
        from tensortap.pytorch import auto

        auto.detach()  # (under `tensortap run`: this callback captures the Trainer's job, before its first forward)
        if model is None or model is self._watched or disabled_by_env():
            return
        if self._handle is not None:
            self._handle.remove()  # (`model_init`: train() made a new model)
        # (never traced: a model the Trainer compiles runs its hooks beside the compiled frames, and dynamo would
        # otherwise compile this one as a frame of its own, again for each value of `saving`, and break at .item())
        self._handle = model.register_forward_hook(_eager(self._after_forward), with_kwargs=True)
        self._watched = model

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        self._training = True
        self.capture.run("on_train_begin", self._begin, args, state, model)

    def _begin(self, args: Any, state: Any, model: Any) -> None:
        if self.capture.hook is None:
            self._start(args, model)
        else:
            self.capture.set_model(model)
        self._watch(model)
        self.capture.training_starts(int(state.global_step))

    def _start(self, args: Any, model: Any) -> None:
        self.capture.start(model, rank=int(args.process_index), world_size=int(args.world_size))

    def _after_forward(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        cap = self.capture
        if module.training and not cap.saving:
            return  # (a loss is read, a host sync on a GPU, only where it is saved; eval steps begin after it)
        if cap.hook is not None and not cap.active:
            return  # (closed or off: the model's later forwards cost nothing)
        try:
            loss = getattr(output, "loss", None)
            if loss is None and isinstance(output, dict):
                loss = output.get("loss")
            x = _as_float(loss) if loss is not None else None
            if x is not None:
                self._model_gives_loss = True
                if len(self._pending) >= _MAX_PENDING:
                    self._pending.clear()  # (forwards outside the Trainer's steps: nothing takes them)
                self._pending.append(x)
                self._shared_loss = kwargs.get("num_items_in_batch") is not None
        except Exception as e:  # noqa: BLE001
            cap.fail("forward hook", e)

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._training = False
        self._pending.clear()
        self.capture.end_of_training(job_ends=True)

    # --- training -------------------------------------------------------------------------------

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.capture.begin_train(state.global_step)  # (on a step of the quiet window: two numbers tested)
        if self._pending:
            self._pending.clear()
        if self._saved_here:
            self._saved_here.clear()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.capture.saving:
            self.capture.run("on_pre_optimizer_step", self._pre_optimizer_step)

    def _pre_optimizer_step(self) -> None:
        cap = self.capture
        if cap.in_train_step():
            cap.save_weights()
            cap.save_gradients()  # (with the weights: one message)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.capture.run("on_step_end", self._step_end, args, state, control)

    def _step_end(self, args: Any, state: Any, control: Any) -> None:
        cap = self.capture
        if self._pending and cap.in_train_step():
            n = len(self._pending)
            value = sum(self._pending) if self._shared_loss else sum(self._pending) / n
            cap.save_scalars({LOSS: value}, "losses")
            self._saved_here.add(LOSS)
        if self._pending:
            self._pending.clear()
        if self._stop_decided(args, state):
            control.should_training_stop = True
            control.should_save = True

    def _stop_decided(self, args: Any, state: Any) -> bool:
        cap = self.capture
        if int(args.world_size) > 1:
            if state.global_step % DISTRIBUTED_STOP_EVERY:
                return False
            import torch
            import torch.distributed as dist

            local = cap.check_stop() is not None
            if not (dist.is_available() and dist.is_initialized()):
                return local
            flag = torch.tensor([1.0 if local else 0.0])
            dist.all_reduce(flag)
            return bool(flag.item() > 0)
        return cap.check_stop() is not None

    # --- evaluation and logs ----------------------------------------------------------------------

    def on_prediction_step(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        self.capture.run("on_prediction_step", self._prediction_step, args, model)

    def _prediction_step(self, args: Any, model: Any) -> None:
        if self.capture.hook is None and model is not None:  # (an evaluation before any training)
            self._start(args, model)
            self._watch(model)
        self.capture.begin(_modes.EVAL)
        self._saved_here = set()
        if self._pending:
            self.capture.save_scalars({LOSS: sum(self._pending) / len(self._pending)}, "losses")
            self._saved_here.add(LOSS)
        self._pending = []

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kw: Any) -> None:
        self.capture.run("on_evaluate", self._evaluation_end, metrics)

    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None, **kw: Any) -> None:
        self.capture.run("on_predict", self._evaluation_end, metrics)  # (`test_loss` and the other `test_*`)

    def _evaluation_end(self, metrics: Any) -> None:
        self._save_logs(metrics)
        self._pending.clear()
        if not self._training:  # (`evaluate()`/`predict()` returns now: what it saved is readable)
            self.capture.end_of_training(job_ends=False)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        self.capture.run("on_log", self._save_logs, logs)

    def _save_logs(self, logs: Any) -> None:
        if not logs:
            return
        new = {k: v for k, v in logs.items()
               if k not in self._saved_here and not (k == LOSS and self._model_gives_loss)}
        if new:
            self.capture.save_scalars(new, "metrics", always=True)
            self._saved_here.update(new)

    def rule_statuses(self) -> dict[str, dict[str, Any]]:
        """{rule label: status} of the rules this callback ran."""
        return self.capture.rule_statuses()


_attached: set[type] = set()


def attach(module: Any) -> None:
    """`tensortap run`: every Trainer the script makes gets a TensortapCallback with the runner's settings
    (unless the script gave it one)."""
    from tensortap.hooks.base import disabled_by_env

    if disabled_by_env():
        return
    import transformers

    trainer_cls = transformers.Trainer
    if trainer_cls in _attached:
        return
    _attached.add(trainer_cls)
    original = trainer_cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            if not any(isinstance(c, TensortapCallback) for c in self.callback_handler.callbacks):
                from tensortap.hook_config import load_hook_config

                callback = TensortapCallback(load_hook_config().out_dir)
                self.add_callback(callback)
                callback._watch(self.model)  # (its on_init_end has passed)
        except Exception as e:  # noqa: BLE001 - never break the training script
            logger.error("tensortap: could not add the Trainer callback: %s", e)

    trainer_cls.__init__ = __init__
