"""tensortap.lightning.TensortapCallback on real PyTorch Lightning jobs (CPU; tiny models built here)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

L = pytest.importorskip("lightning")
torch = pytest.importorskip("torch")

from tensortap import modes  # noqa: E402
from tensortap.exceptions import InvalidConfiguration  # noqa: E402
from tensortap.lightning import TensortapCallback  # noqa: E402
from tensortap.trials import create_trial  # noqa: E402

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from _lightning_job import loaders, make_module  # noqa: E402

ROOT = HERE.parents[1]


def _trainer(callbacks, **kw):
    opts = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                accelerator="cpu", devices=1)
    opts.update(kw)
    return L.Trainer(callbacks=callbacks, **opts)


def test_values_steps_modes_with_accumulation_and_clipping(tmp_path):
    torch.manual_seed(0)
    record, losses, val_losses = [], [], []
    module = make_module(L, record)
    original_step, original_val = module.training_step, module.validation_step

    def training_step(batch, batch_idx):
        loss = original_step(batch, batch_idx)
        losses.append(loss.item())
        return loss

    def validation_step(batch, batch_idx):
        loss = original_val(batch, batch_idx)
        if not module.trainer.sanity_checking:
            val_losses.append(loss.item())
        return loss

    module.training_step, module.validation_step = training_step, validation_step
    out = str(tmp_path / "job")
    cb = TensortapCallback(out_dir=out, save_config=2,
                           include_collections=["weights", "biases", "gradients", "losses", "metrics"])
    trainer = _trainer([cb], max_steps=12, accumulate_grad_batches=2, gradient_clip_val=0.05,
                       limit_val_batches=2, val_check_interval=6)
    trainer.fit(module, *loaders())
    assert trainer.global_step == 12 and len(record) == 12

    trial = create_trial(out)  # right after fit, no close(): everything saved is readable
    grad_name = "gradient/Tiny_net.0.weight"
    assert trial.tensor(grad_name).steps(mode=modes.TRAIN) == [0, 2, 4, 6, 8, 10]
    for k in [0, 2, 4, 6, 8, 10]:
        for pname in ("net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"):
            # what the optimizer consumed: accumulated over two micro-batches, clipped
            got = trial.tensor(f"gradient/Tiny_{pname}").value(k, mode=modes.TRAIN)
            assert np.array_equal(got, record[k]["grads"][pname].numpy()), (k, pname)
            w = trial.tensor(f"Tiny_{pname}").value(k, mode=modes.TRAIN)
            assert np.array_equal(w, record[k]["weights"][pname].numpy()), (k, pname)
        # the step's loss: the mean of its two micro-batches' losses as training_step returned them
        assert trial.tensor("loss").value(k, mode=modes.TRAIN) == pytest.approx(
            (losses[2 * k] + losses[2 * k + 1]) / 2, rel=1e-6)
        assert 0.0 <= trial.tensor("train_acc").value(k, mode=modes.TRAIN) <= 1.0
    # clipping happened (the test would not show "after clipping" otherwise)
    total = np.sqrt(sum(float((g.double() ** 2).sum()) for g in record[0]["grads"].values()))
    assert total == pytest.approx(0.05, rel=1e-3)

    # a validation of two batches every 6 training batches (the sanity check saves nothing): EVAL steps 0..7,
    # the loss saved at every one (losses are saved at every EVAL step)
    assert len(val_losses) == 8
    assert trial.tensor("loss").steps(mode=modes.EVAL) == list(range(8))
    assert [trial.tensor("loss").value(s, mode=modes.EVAL) for s in range(8)] == pytest.approx(val_losses, rel=1e-6)
    # the logged val_loss (an epoch aggregate) at the end of each validation, whatever the interval
    assert trial.tensor("val_loss").steps(mode=modes.EVAL) == [1, 3, 5, 7]
    assert "val_loss" in trial.tensor_names(collection="metrics")
    assert "loss" in trial.tensor_names(collection="losses")


def test_manual_optimization_steps_and_gradients(tmp_path):
    torch.manual_seed(1)
    record = []
    module = make_module(L, record, automatic=False)
    out = str(tmp_path / "job")
    trainer = _trainer([TensortapCallback(out_dir=out, save_config=3, include_collections=["gradients"])],
                       max_steps=9, limit_val_batches=0)
    trainer.fit(module, loaders()[0])
    trial = create_trial(out)
    # the loss and the metrics are saved whatever include_collections names (smdebug's default collections)
    assert trial.tensor("loss").steps(mode=modes.TRAIN) == [0, 3, 6]
    assert "train_acc" in trial.tensor_names(collection="metrics")
    assert trial.tensor("gradient/Tiny_net.2.weight").steps(mode=modes.TRAIN) == [0, 3, 6]
    for k in (0, 3, 6):
        assert np.array_equal(trial.tensor("gradient/Tiny_net.2.weight").value(k, mode=modes.TRAIN),
                              record[k]["grads"]["net.2.weight"].numpy())


def test_two_optimizers_each_gradient_as_its_optimizer_consumed_it(tmp_path):
    """A GAN's step (manual optimization): the discriminator's optimizer steps, then the generator's, each after
    its own backward; the generator's gradients of the step are those its optimizer consumed, not the previous
    step's still on the parameters when the discriminator stepped. Weights are those before either stepped."""

    class GAN(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.g, self.d = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)
            self.consumed = []  # per batch: {parameter name: gradient} at each optimizer's step, weights before

        def training_step(self, batch, batch_idx):
            opt_g, opt_d = self.optimizers()
            seen = {"weights": {n: p.detach().clone() for n, p in self.named_parameters()}, "grads": {}}
            self.consumed.append(seen)
            z = torch.randn(16, 4)
            loss_d = (torch.nn.functional.softplus(-self.d(batch[0])).mean()
                      + torch.nn.functional.softplus(self.d(self.g(z).detach())).mean())
            opt_d.zero_grad()
            self.manual_backward(loss_d)
            seen["grads"].update({"d." + n: p.grad.clone() for n, p in self.d.named_parameters()})
            opt_d.step()
            loss_g = torch.nn.functional.softplus(-self.d(self.g(z))).mean()
            opt_g.zero_grad()
            self.manual_backward(loss_g)
            seen["grads"].update({"g." + n: p.grad.clone() for n, p in self.g.named_parameters()})
            opt_g.step()
            self.log_dict({"loss_d": loss_d, "loss_g": loss_g})

        def configure_optimizers(self):
            return torch.optim.Adam(self.g.parameters(), 1e-2), torch.optim.Adam(self.d.parameters(), 1e-2)

    torch.manual_seed(0)
    module = GAN()
    out = str(tmp_path / "job")
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(128, 8)), batch_size=16)
    trainer = _trainer([TensortapCallback(out_dir=out, save_config=4, include_collections=["weights", "biases",
                                                                                          "gradients"])],
                       max_steps=16)  # (two optimizer steps a batch: 8 batches, global steps 0, 2, .., 14)
    trainer.fit(module, data)
    trial = create_trial(out)
    for part in ("g", "d"):
        for pname in (f"{part}.weight", f"{part}.bias"):
            g = trial.tensor(f"gradient/GAN_{pname}")
            assert g.steps(mode=modes.TRAIN) == [0, 4, 8, 12]
            for k in (0, 4, 8, 12):
                batch = module.consumed[k // 2]
                assert np.array_equal(g.value(k, mode=modes.TRAIN), batch["grads"][pname].numpy()), (k, pname)
                assert np.array_equal(trial.tensor(f"GAN_{pname}").value(k, mode=modes.TRAIN),
                                      batch["weights"][pname].numpy()), (k, pname)
    assert trial.tensor("loss_g").steps(mode=modes.TRAIN) == [0, 4, 8, 12]


def test_a_second_fit_with_the_same_callback_continues_the_steps(tmp_path, caplog):
    """A new Trainer given the same callback counts from step 0 again: its TRAIN steps are saved after the first
    fit's (said once), each gradient the one its optimizer consumed."""
    record = []
    out = str(tmp_path / "job")
    cb = TensortapCallback(out_dir=out, save_config=3, include_collections=["gradients"])
    _trainer([cb], max_steps=7, limit_val_batches=0).fit(make_module(L, record), loaders()[0])
    with caplog.at_level(logging.WARNING, logger="tensortap"):
        _trainer([cb], max_steps=7, limit_val_batches=0).fit(make_module(L, record), loaders()[0])
    said = [r.getMessage() for r in caplog.records if r.name == "tensortap"]
    assert len(said) == 1 and "from 7" in said[0], said
    g = create_trial(out).tensor("gradient/Tiny_net.2.weight")
    assert g.steps(mode=modes.TRAIN) == [0, 3, 6, 9, 12]
    for k in (0, 3, 6, 9, 12):
        assert np.array_equal(g.value(k, mode=modes.TRAIN), record[k]["grads"]["net.2.weight"].numpy()), k


class _Sequence(L.Callback):
    """The steps Lightning runs, in order: ("TRAIN", global_step) once per optimizer step, ("EVAL", i) per
    validation batch (the sanity check left out)."""

    def __init__(self):
        self.seq, self.evals = [], 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not self.seq or self.seq[-1] != ("TRAIN", trainer.global_step):
            self.seq.append(("TRAIN", trainer.global_step))

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self.seq.append(("EVAL", self.evals))
            self.evals += 1


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_global_steps_and_a_parameter_without_gradient(tmp_path, writer):
    """Steps that save nothing between saving ones are counted all the same: every saved value's global step is its
    place among all the TRAIN and EVAL steps the trainer ran. A parameter the forward does not use has no
    gradient: the weights and the other gradients are saved all the same, bit for bit (with either writer)."""
    torch.manual_seed(4)
    record = []
    module = make_module(L, record)
    module.unused = torch.nn.Linear(3, 2)  # (no gradient ever)
    seq = _Sequence()
    out = str(tmp_path / "job")
    cb = TensortapCallback(out_dir=out, save_config=4, writer=writer,
                           include_collections=["weights", "biases", "gradients", "losses"])
    trainer = _trainer([seq, cb], max_steps=18, limit_val_batches=2, val_check_interval=5)
    trainer.fit(module, *loaders(n=240))
    trial = create_trial(out)
    global_of = {step: i for i, step in enumerate(seq.seq)}
    saved = [0, 4, 8, 12, 16]
    for name in ("Tiny_net.0.weight", "gradient/Tiny_net.2.bias", "Tiny_unused.weight"):
        assert trial.tensor(name).steps(mode=modes.TRAIN) == saved, name
        assert trial.tensor(name).steps() == [global_of["TRAIN", k] for k in saved], name
    assert trial.tensor("loss").steps(mode=modes.TRAIN) == saved
    assert seq.evals == 6 and trial.tensor("loss").steps(mode=modes.EVAL) == list(range(seq.evals))
    assert trial.tensor("loss").steps() == sorted(
        [global_of["TRAIN", k] for k in saved] + [global_of["EVAL", i] for i in range(seq.evals)])
    assert "gradient/Tiny_unused.weight" not in trial.tensor_names()
    for k in saved:
        for pname in ("net.0.weight", "net.2.bias", "unused.weight", "unused.bias"):
            assert np.array_equal(trial.tensor(f"Tiny_{pname}").value(k, mode=modes.TRAIN),
                                  record[k]["weights"][pname].numpy()), (k, pname)
        for pname in ("net.0.weight", "net.2.bias"):
            assert np.array_equal(trial.tensor(f"gradient/Tiny_{pname}").value(k, mode=modes.TRAIN),
                                  record[k]["grads"][pname].numpy()), (k, pname)


@pytest.mark.parametrize("close", [False, True])
def test_steps_between_saving_ones_have_passed_when_fit_returns(tmp_path, close):
    """A job that ends between two saving steps (and one whose validation runs there): readers learn that every
    step the trainer ran has passed, with nothing saved at the steps that save nothing (and, before close, not a
    step more), right after fit (no close) and after close."""
    from tensortap.trials.trial import StepState

    for name, kw, last_train, evals in (("window", dict(limit_val_batches=0), 24, 0),
                                        ("val", dict(limit_val_batches=2, val_check_interval=13), 24, 2)):
        torch.manual_seed(5)
        seq = _Sequence()
        out = str(tmp_path / name)
        cb = TensortapCallback(out_dir=out, save_config=10, include_collections=["weights", "gradients", "losses"])
        trainer = _trainer([seq, cb], max_steps=last_train + 1, **kw)
        trainer.fit(make_module(L), *loaders(n=240))
        if close:
            cb.capture.close()
        trial = create_trial(out)
        last = len(seq.seq) - 1
        assert seq.seq[-1] == ("TRAIN", last_train) and seq.evals == evals
        assert trial.tensor("loss").steps(mode=modes.TRAIN) == [0, 10, 20], name
        assert trial.has_passed_step(last) == StepState.UNAVAILABLE, name
        assert trial.has_passed_step(last_train, mode=modes.TRAIN) == StepState.UNAVAILABLE, name
        assert trial.has_passed_step(15, mode=modes.TRAIN) == StepState.UNAVAILABLE, name
        assert trial.has_passed_step(20, mode=modes.TRAIN) == StepState.AVAILABLE, name
        if not close:  # (a closed job has passed every step: it ended)
            assert trial.has_passed_step(last + 1) == StepState.NOT_YET_AVAILABLE, name
            assert trial.has_passed_step(last_train + 1, mode=modes.TRAIN) == StepState.NOT_YET_AVAILABLE, name


class _WriterProcesses(L.Callback):
    """The writer processes of this process at the last training step (waiting up to 30 s for one to show when
    `expected`)."""

    def __init__(self, find, last: int, expected: bool) -> None:
        self.find, self.last, self.expected, self.seen = find, last, expected, None

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step != self.last:
            return
        deadline = time.monotonic() + (30 if self.expected else 0)
        self.seen = self.find()
        while not self.seen and time.monotonic() < deadline:
            time.sleep(0.01)
            self.seen = self.find()


@pytest.mark.parametrize("fit", ["shorter", "longer"])
def test_the_writer_process_starts_a_flush_interval_into_the_fit(tmp_path, fit, writer_processes):
    """The writer process starts a flush interval after the trainer's set-up: a fit that ends sooner starts none
    (its data is written from the training process when training ends), a longer one starts it. Either way every
    saved step is readable right after fit, bit for bit."""
    torch.manual_seed(0)
    record = []
    out = str(tmp_path / "job")
    kw = {} if fit == "shorter" else {"flush_interval": 0.05}
    cb = TensortapCallback(out_dir=out, save_config=2, include_collections=["weights", "gradients", "losses"], **kw)
    steps = 8 if fit == "shorter" else 200
    probe = _WriterProcesses(writer_processes, steps - 1, expected=fit == "longer")
    before = writer_processes()
    _trainer([probe, cb], max_steps=steps, limit_val_batches=0).fit(make_module(L, record), loaders(n=64)[0])
    # (only processes started here count: another test's writer process may still be exiting)
    if fit == "shorter":
        assert not set(probe.seen) - set(before) and not set(writer_processes()) - set(before)
    else:
        assert set(probe.seen) - set(before), "no writer process started"
    trial = create_trial(out)  # right after fit, no close()
    saved = list(range(0, steps, 2))
    assert trial.tensor("gradient/Tiny_net.0.weight").steps(mode=modes.TRAIN) == saved
    for k in saved:
        assert np.array_equal(trial.tensor("gradient/Tiny_net.0.weight").value(k, mode=modes.TRAIN),
                              record[k]["grads"]["net.0.weight"].numpy()), k
    cb.capture.close()
    assert cb.capture.hook.dropped_records == 0


def test_hooks_hidden_in_quiet_steps_and_shown_in_saving_steps(tmp_path, monkeypatch):
    """Lightning calls only the hooks a step needs: in a saving step (each of its micro-batches) the batch-start,
    optimizer-step and batch-end hooks, in a step that saves nothing none of them (the optimizer's step hook counts
    it, also across an evaluation), the per-batch hooks the callback never uses not at all; the saved values are
    still what the optimizer consumed at the trainer's global steps, and after `fit` the callback's hooks are its
    methods again (a later `validate` with it saves its losses). A hook that a subclass overrides is called at
    every batch."""
    from tensortap.lightning import _TensortapCallbackMixin

    calls = []

    def counting(owner, name):
        original = getattr(owner, name)

        def hook(self, trainer, *args, **kwargs):
            calls.append((name, trainer.global_step))
            return original(self, trainer, *args, **kwargs)

        monkeypatch.setattr(owner, name, hook)

    counting(_TensortapCallbackMixin, "on_train_batch_start")
    counting(_TensortapCallbackMixin, "on_before_optimizer_step")
    counting(_TensortapCallbackMixin, "on_train_batch_end")
    counting(L.Callback, "on_before_backward")
    counting(L.Callback, "on_before_zero_grad")

    class Own(TensortapCallback):
        def on_after_backward(self, trainer, pl_module):
            calls.append(("own after_backward", trainer.global_step))

    torch.manual_seed(6)
    record = []
    module = make_module(L, record)
    out = str(tmp_path / "job")
    cb = Own(out_dir=out, save_config=4, include_collections=["gradients", "losses"])
    trainer = _trainer([cb], max_steps=12, accumulate_grad_batches=2, limit_val_batches=2, val_check_interval=10)
    trainer.fit(module, *loaders(n=240))
    assert trainer.global_step == 12
    own = [c for c in calls if c[0] == "own after_backward"]
    assert [s for _n, s in own] == [k // 2 for k in range(24)]  # (the subclass's hook: every micro-batch)
    # (the first micro-batch ends before the optimizer steps; the second after it, at the next global step)
    # (validation runs after step 4, batch 10: the steps after it are counted all the same)
    assert [c for c in calls if c[0] != "own after_backward"] == [
        ("on_train_batch_start", 0), ("on_train_batch_end", 0), ("on_train_batch_start", 0),
        ("on_before_optimizer_step", 0), ("on_train_batch_end", 1),
        ("on_train_batch_start", 4), ("on_train_batch_end", 4), ("on_train_batch_start", 4),
        ("on_before_optimizer_step", 4), ("on_train_batch_end", 5),
        ("on_train_batch_start", 8), ("on_train_batch_end", 8), ("on_train_batch_start", 8),
        ("on_before_optimizer_step", 8), ("on_train_batch_end", 9)]
    trial = create_trial(out)
    assert trial.tensor("gradient/Tiny_net.2.weight").steps(mode=modes.TRAIN) == [0, 4, 8]
    for k in (0, 4, 8):
        assert np.array_equal(trial.tensor("gradient/Tiny_net.2.weight").value(k, mode=modes.TRAIN),
                              record[k]["grads"]["net.2.weight"].numpy())
    for name in ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end", "on_before_backward",
                 "on_after_backward", "on_before_zero_grad"):
        assert getattr(cb, name).__func__ is getattr(Own, name), name
    evals = len(trial.tensor("loss").steps(mode=modes.EVAL))
    trainer.validate(module, loaders(n=240)[1])
    assert len(create_trial(out).tensor("loss").steps(mode=modes.EVAL)) == evals + 2  # (limit_val_batches=2)


def test_a_gradient_scaler_that_skips_steps(tmp_path):
    """fp16 mixed precision with a gradient scaler whose first scales overflow: the optimizer skips those steps
    (the trainer's global step advances all the same). Steps are still the trainer's global steps: the loss is
    saved at every saving step, gradients where the optimizer stepped, equal to what it consumed."""
    from lightning.pytorch.plugins import MixedPrecision

    torch.manual_seed(0)
    record, stepped = [], []
    module = make_module(L, record)

    class Stepped(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if len(record) > len(stepped):
                stepped.append(trainer.global_step - 1)

    out = str(tmp_path / "job")
    cb = TensortapCallback(out_dir=out, save_config=3, include_collections=["gradients", "losses"])
    scaler = torch.amp.GradScaler("cpu", init_scale=1e7)
    trainer = _trainer([Stepped(), cb], max_steps=12, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    trainer.fit(module, *loaders())
    assert trainer.global_step == 12 and 0 < len(stepped) < 12 and stepped[0] > 3, stepped  # (first steps skipped)
    trial = create_trial(out)
    assert trial.tensor("loss").steps(mode=modes.TRAIN) == [0, 3, 6, 9]
    saved = [k for k in stepped if k % 3 == 0]
    assert trial.tensor("gradient/Tiny_net.0.weight").steps(mode=modes.TRAIN) == saved
    for k in saved:
        assert np.array_equal(trial.tensor("gradient/Tiny_net.0.weight").value(k, mode=modes.TRAIN),
                              record[stepped.index(k)]["grads"]["net.0.weight"].numpy()), k


def test_a_stop_request_between_saving_steps_ends_the_fit(tmp_path):
    """A stop request written while the callback only counts steps (their batch starts hidden from Lightning) is
    seen when the optimizer steps: fit returns normally, long before the next saving step."""
    from tensortap.format.control import request_stop

    torch.manual_seed(0)
    module = make_module(L)
    out = str(tmp_path / "job")
    at = {}

    class Ask(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 5 and not at:
                at["step"] = trainer.global_step
                request_stop(out, reason="asked by the test")

    cb = TensortapCallback(out_dir=out, save_config=100_000, include_collections=["losses"])
    trainer = _trainer([Ask(), cb], max_steps=100_000, max_epochs=-1, limit_val_batches=0)
    trainer.fit(module, loaders(n=64)[0])
    assert at and 5 < trainer.global_step < 20_000, trainer.global_step
    assert create_trial(out).tensor("loss").steps(mode=modes.TRAIN) == [0]


@pytest.mark.parametrize("case", ["bf16-mixed", "compiled"])
def test_mixed_precision_and_a_compiled_module(tmp_path, case):
    """precision="bf16-mixed" (autocast on the CPU) and a LightningModule whose network is compiled
    (`self.net.compile()`): every saved gradient is what the optimizer consumed, steps are global steps, the loss
    is saved at each saving step."""
    torch.manual_seed(0)
    record: list[dict] = []
    module = make_module(L, record)
    if case == "compiled":
        module.net.compile(backend="aot_eager")
    out = str(tmp_path / "job")
    cb = TensortapCallback(out_dir=out, save_config=3,
                           include_collections=["weights", "biases", "gradients", "losses"])
    kw = {"precision": "bf16-mixed"} if case == "bf16-mixed" else {}
    trainer = _trainer([cb], max_steps=9, limit_val_batches=0, **kw)
    trainer.fit(module, loaders()[0])
    assert trainer.global_step == len(record) == 9
    assert cb.capture.hook.error_count == 0
    trial = create_trial(out)
    assert trial.tensor("gradient/Tiny_net.0.weight").steps(mode=modes.TRAIN) == [0, 3, 6]
    assert trial.tensor("loss").steps(mode=modes.TRAIN) == [0, 3, 6]
    for k in (0, 3, 6):
        for pname in ("net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"):
            got = trial.tensor(f"gradient/Tiny_{pname}").value(k, mode=modes.TRAIN)
            assert np.array_equal(got, record[k]["grads"][pname].numpy()), (k, pname)
            w = trial.tensor(f"Tiny_{pname}").value(k, mode=modes.TRAIN)
            assert np.array_equal(w, record[k]["weights"][pname].numpy()), (k, pname)


def test_bad_arguments_are_one_line_errors(tmp_path):
    with pytest.raises(InvalidConfiguration, match="out_dir"):
        TensortapCallback(out_dir=3)
    with pytest.raises(InvalidConfiguration, match="no_such_rule"):
        TensortapCallback(out_dir=str(tmp_path / "a"), rules=["no_such_rule"])
    with pytest.raises(InvalidConfiguration, match="include_collections"):
        TensortapCallback(out_dir=str(tmp_path / "b"), include_collections="weights")
    with pytest.raises(InvalidConfiguration, match="include_workers='every'"):
        TensortapCallback(out_dir=str(tmp_path / "c"), include_workers="every")
    with pytest.raises(InvalidConfiguration, match="save_interval"):
        TensortapCallback(out_dir=str(tmp_path / "d"), save_config=0)


def test_a_failing_capture_never_breaks_training(tmp_path, caplog, monkeypatch):
    torch.manual_seed(2)
    module = make_module(L)
    cb = TensortapCallback(out_dir=str(tmp_path / "job"), save_config=1, include_collections=["weights", "losses"])

    def boom():
        raise RuntimeError("injected")

    monkeypatch.setattr(cb.capture, "save_weights", boom)
    with caplog.at_level(logging.ERROR, logger="tensortap"):
        trainer = _trainer([cb], max_steps=5, limit_val_batches=0)
        trainer.fit(module, loaders()[0])
    assert trainer.global_step == 5
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name == "tensortap"]
    assert len(errors) == 1, [r.getMessage() for r in errors]  # logged once; the capture is off afterwards
    assert "injected" in str(errors[0].exc_info[1])


class _Poison(L.Callback):
    """Writes NaN into a weight at a chosen step: the loss is NaN from then on."""

    def __init__(self, at):
        self.at = at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.at:
            with torch.no_grad():
                pl_module.net[2].weight.fill_(float("nan"))


def test_a_rule_stops_training_through_the_trainer(tmp_path):
    """A job whose loss turns NaN at step 3 is stopped by exploding_tensor running beside it: fit returns
    normally long before max_steps, its checkpoint is written, the rule's status says why."""
    torch.manual_seed(3)
    module = make_module(L)
    out = str(tmp_path / "job")
    ckpt_dir = tmp_path / "ckpt"
    cb = TensortapCallback(out_dir=out, save_config=1, rules=["exploding_tensor"])
    max_steps = 200_000
    trainer = L.Trainer(callbacks=[_Poison(3), cb, L.pytorch.callbacks.ModelCheckpoint(dirpath=str(ckpt_dir))],
                        max_steps=max_steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", devices=1, limit_val_batches=0, max_epochs=-1)
    trainer.fit(module, loaders(n=64)[0])
    assert 3 < trainer.global_step < max_steps
    assert list(ckpt_dir.glob("*.ckpt")), "the trainer's checkpoint was not written"
    status = cb.rule_statuses()["exploding_tensor"]
    assert status["status"] == "IssuesFound" and status["first_step"] >= 3, status


class _RuleThreads(L.Callback):
    """At step `at`, once each rule worker beside training has imported numpy (its BLAS, if it starts a pool,
    starts it then), the threads of each rule worker process."""

    def __init__(self, cb: object, at: int) -> None:
        self.cb, self.at, self.threads = cb, at, {}

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step != self.at:
            return
        for label, proc in self.cb.capture._rule_procs:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                with open(f"/proc/{proc.pid}/maps") as f:
                    if "_multiarray_umath" in f.read():
                        break
                time.sleep(0.05)
            else:
                continue
            time.sleep(0.3)
            self.threads[label] = sorted(os.listdir(f"/proc/{proc.pid}/task")), str(proc.pid)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the rule worker's threads from /proc")
def test_rule_workers_beside_training_run_one_thread_whatever_blas_threads_the_job_asks_for(tmp_path, monkeypatch):
    """A rule worker imports numpy, whose BLAS would start a pool of its own (one thread per core, spinning at its
    start beside the training thread); the job's setting is for the job."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "8")
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    torch.manual_seed(0)
    cb = TensortapCallback(out_dir=str(tmp_path / "job"), save_config=1, rules=["exploding_tensor"])
    look = _RuleThreads(cb, at=5)
    trainer = L.Trainer(callbacks=[cb, look], max_steps=8, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, accelerator="cpu", devices=1,
                        limit_val_batches=0, max_epochs=-1)
    trainer.fit(make_module(L), loaders(n=64)[0])
    assert list(look.threads) == ["exploding_tensor"], "the rule worker was not seen with numpy imported"
    for label, (tids, pid) in look.threads.items():
        assert tids == [pid], (label, tids)


_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import lightning as L
    sys.path.insert(0, {here!r})
    from _lightning_job import loaders, make_module
    {extra}
    torch.manual_seed(0)
    module = make_module(L)
    trainer = L.Trainer(max_steps=8, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", limit_val_batches=0, {trainer_kw}
                        callbacks=[{callbacks}])
    trainer.fit(module, loaders()[0])
""")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def test_ddp_two_processes_write_both_workers(tmp_path):
    out = str(tmp_path / "job")
    script = tmp_path / "ddp.py"
    script.write_text(_SCRIPT.format(
        here=str(HERE), extra="from tensortap.lightning import TensortapCallback",
        trainer_kw='strategy="ddp", devices=2,',
        callbacks=f'TensortapCallback(out_dir={out!r}, save_config=2, include_collections=["gradients", '
                  '"losses"])'))
    proc = subprocess.run([sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trial = create_trial(out)
    assert sorted(trial.workers()) == ["worker_0", "worker_1"]
    name = "gradient/Tiny_net.0.weight"
    assert trial.tensor(name).steps(mode=modes.TRAIN) == [0, 2, 4, 6]
    for k in (0, 2, 4, 6):  # DDP averaged the gradients: both workers saved the same ones
        a = trial.tensor(name).value(k, mode=modes.TRAIN, worker="worker_0")
        b = trial.tensor(name).value(k, mode=modes.TRAIN, worker="worker_1")
        assert np.array_equal(a, b)


def test_tensortap_run_saves_an_unmodified_lightning_scripts_loss(tmp_path):
    out = str(tmp_path / "job")
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.format(here=str(HERE), extra="", trainer_kw="", callbacks=""))
    proc = subprocess.run([sys.executable, "-m", "tensortap.cli.main", "run", "--out-dir", out, "--save-interval",
                           "2", "--", sys.executable, str(script)],
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    trial = create_trial(out)
    assert trial.tensor("loss").steps(mode=modes.TRAIN) == [0, 2, 4, 6]
    assert all(np.isfinite(trial.tensor("loss").value(k, mode=modes.TRAIN)) for k in (0, 2, 4, 6))


def test_tensortap_run_stops_an_unmodified_lightning_script_through_the_trainer(tmp_path):
    """`tensortap run --stop-on-issue` on a script with no tensortap code whose loss turns NaN at step 3: the
    runner's rule asks for a stop, the callback the runner added ends fit through trainer.should_stop (the
    script's own code after fit runs), and the run exits 1 (a rule found an issue)."""
    out = str(tmp_path / "job")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import torch
        import lightning as L
        sys.path.insert(0, {str(HERE)!r})
        from _lightning_job import loaders, make_module

        class Poison(L.Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                if trainer.global_step == 3:
                    with torch.no_grad():
                        pl_module.net[2].weight.fill_(float("nan"))

        torch.manual_seed(0)
        trainer = L.Trainer(max_steps=200_000, max_epochs=-1, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                            limit_val_batches=0, callbacks=[Poison()])
        trainer.fit(make_module(L), loaders(n=64)[0])
        print("FIT RETURNED AT", trainer.global_step, flush=True)
    """))
    proc = subprocess.run([sys.executable, "-m", "tensortap.cli.main", "run", "--out-dir", out, "--save-interval",
                           "1", "--rule", "exploding_tensor", "--stop-on-issue", "--", sys.executable, str(script)],
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = next((x for x in proc.stdout.splitlines() if x.startswith("FIT RETURNED AT")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]  # (the script's own end, or why not)
    assert 3 < int(line.split()[-1]) < 200_000
