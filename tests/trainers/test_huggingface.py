"""tensortap.huggingface.TensortapCallback on real Hugging Face Trainer jobs (CPU; a tiny BERT built here)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from tensortap import modes  # noqa: E402
from tensortap.exceptions import InvalidConfiguration  # noqa: E402
from tensortap.huggingface import TensortapCallback  # noqa: E402
from tensortap.trials import create_trial  # noqa: E402

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from _hf_job import RecordingCallback, dataset, model  # noqa: E402

ROOT = HERE.parents[1]
PREFIX = "BertForSequenceClassification_"


def _args(tmp_path, **kw):
    opts = dict(output_dir=str(tmp_path / "hf"), per_device_train_batch_size=8, per_device_eval_batch_size=8,
                report_to=[], use_cpu=True, save_strategy="no", learning_rate=1e-2, disable_tqdm=True,
                logging_steps=2)
    opts.update(kw)
    return TrainingArguments(**opts)


class _Install(TrainerCallback):
    def __init__(self, recorder):
        self.recorder = recorder

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kw):
        self.recorder.install(model, optimizer)


class _Losses:
    """The loss of every forward, read independently of tensortap."""

    def __init__(self, m):
        self.train, self.eval = [], []
        m.register_forward_hook(lambda mod, a, out: (self.train if mod.training else self.eval).append(
            float(out.loss.detach())))


def test_values_steps_modes_logs_with_accumulation_and_clipping(tmp_path):
    rec = RecordingCallback()
    m = model()
    losses = _Losses(m)
    out = str(tmp_path / "job")
    cb = TensortapCallback(out_dir=out, save_config=2,
                           include_collections=["weights", "biases", "gradients", "losses", "metrics"])
    args = _args(tmp_path, gradient_accumulation_steps=2, max_grad_norm=0.01, max_steps=8, eval_strategy="steps",
                 eval_steps=4)
    trainer = Trainer(model=m, args=args, train_dataset=dataset(), eval_dataset=dataset(16, seed=1),
                      callbacks=[_Install(rec), cb])
    trainer.train()
    assert trainer.state.global_step == 8 and len(rec.records) == 8

    trial = create_trial(out)  # right after train(), no close()
    names = [n[len("gradient/" + PREFIX):] for n in trial.tensor_names(collection="gradients")]
    assert "classifier.weight" in names and "bert.encoder.layer.0.attention.self.query.weight" in names
    for pname in ("classifier.weight", "bert.encoder.layer.0.attention.self.query.weight"):
        g = trial.tensor(f"gradient/{PREFIX}{pname}")
        assert g.steps(mode=modes.TRAIN) == [0, 2, 4, 6]
        for k in (0, 2, 4, 6):  # what the optimizer consumed: accumulated, clipped to 0.01 overall
            assert np.array_equal(g.value(k, mode=modes.TRAIN), rec.records[k]["grads"][pname].numpy())
            assert np.array_equal(trial.tensor(PREFIX + pname).value(k, mode=modes.TRAIN),
                                  rec.records[k]["weights"][pname].numpy())
    total = np.sqrt(sum(float((t.double() ** 2).sum()) for t in rec.records[0]["grads"].values()))
    assert total == pytest.approx(0.01, rel=1e-3)
    # the step's loss: the Trainer hands the model the window's item count (num_items_in_batch), so each
    # micro-batch's loss is its share of the window's: the step's loss is their sum
    assert len(losses.train) == 16
    for k in (0, 2, 4, 6):
        assert trial.tensor("loss").value(k, mode=modes.TRAIN) == pytest.approx(
            losses.train[2 * k] + losses.train[2 * k + 1], rel=1e-6)
    # the Trainer's logs (every 2 steps, made after step k = 1, 3, 5, 7 in tensortap's count)
    assert trial.tensor("grad_norm").steps(mode=modes.TRAIN) == [1, 3, 5, 7]
    assert [trial.tensor("learning_rate").value(k, mode=modes.TRAIN) for k in (1, 3, 5, 7)] == pytest.approx(
        [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h])
    # evaluation: two runs of two batches, EVAL steps 0..3, the loss saved at every one (losses are saved at
    # every EVAL step); eval_loss at the end of each run
    assert len(losses.eval) == 4
    assert trial.tensor("loss").steps(mode=modes.EVAL) == [0, 1, 2, 3]
    assert [trial.tensor("loss").value(s, mode=modes.EVAL) for s in range(4)] == pytest.approx(losses.eval, rel=1e-6)
    evals = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    assert [trial.tensor("eval_loss").value(s, mode=modes.EVAL) for s in (1, 3)] == pytest.approx(evals)


def test_evaluation_and_prediction_after_training_and_without_it(tmp_path):
    """`evaluate()` and `predict()` after `train()`, and `evaluate()` with no training at all, as scripts call them:
    each batch is an EVAL step with the model's loss, and the Trainer's metrics (`eval_*`, `test_*`) are saved."""
    m = model()
    losses = _Losses(m)
    out = str(tmp_path / "job")
    trainer = Trainer(model=m, args=_args(tmp_path, max_steps=2, eval_strategy="steps", eval_steps=2),
                      train_dataset=dataset(), eval_dataset=dataset(16, seed=1), callbacks=[TensortapCallback(out)])
    trainer.train()  # (one evaluation of two batches inside: EVAL steps 0 and 1)
    after = trainer.evaluate()
    predicted = trainer.predict(dataset(24, seed=2))
    assert len(losses.eval) == 2 + 2 + 3
    trial = create_trial(out)
    loss = trial.tensor("loss")
    assert loss.steps(mode=modes.EVAL) == list(range(7))
    assert [loss.value(s, mode=modes.EVAL) for s in range(7)] == pytest.approx(losses.eval, rel=1e-6)
    assert trial.tensor("eval_loss").steps(mode=modes.EVAL) == [1, 3]
    assert trial.tensor("eval_loss").value(3, mode=modes.EVAL) == pytest.approx(after["eval_loss"])
    assert trial.tensor("test_loss").steps(mode=modes.EVAL) == [6]
    assert trial.tensor("test_loss").value(6, mode=modes.EVAL) == pytest.approx(predicted.metrics["test_loss"])

    m2 = model(seed=1)
    losses2 = _Losses(m2)
    out2 = str(tmp_path / "eval_only")
    only = Trainer(model=m2, args=_args(tmp_path), eval_dataset=dataset(16, seed=1),
                   callbacks=[TensortapCallback(out2)])
    metrics = only.evaluate()
    trial = create_trial(out2)
    assert trial.tensor("loss").steps(mode=modes.EVAL) == [0, 1]
    assert [trial.tensor("loss").value(s, mode=modes.EVAL) for s in (0, 1)] == pytest.approx(losses2.eval, rel=1e-6)
    assert trial.tensor("eval_loss").value(1, mode=modes.EVAL) == pytest.approx(metrics["eval_loss"])


def test_a_compiled_model_has_its_loss_saved_without_a_graph_break(tmp_path):
    """`torch_compile=True`: the Trainer compiles the model, whose forward hook (the callback's loss) runs beside
    the compiled frames: dynamo compiles no frame more with the callback than without it (none of the callback's,
    none again as `saving` changes), breaks no graph, and every saving step's loss is the one the Trainer logged."""
    from torch._dynamo.utils import counters

    def train(callbacks):
        torch._dynamo.reset()
        counters.clear()
        trainer = Trainer(model=model(), args=_args(tmp_path, max_steps=6, logging_steps=1, torch_compile=True),
                          train_dataset=dataset(), callbacks=callbacks)
        trainer.train()
        assert dict(counters["graph_break"]) == {}
        return trainer, dict(counters["frames"])

    _plain, frames = train([])
    out = str(tmp_path / "job")
    trainer, frames_with = train([TensortapCallback(out, save_config=2)])
    assert frames_with == frames
    trial = create_trial(out)
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert trial.tensor("loss").steps(mode=modes.TRAIN) == [0, 2, 4]
    assert [trial.tensor("loss").value(k, mode=modes.TRAIN) for k in (0, 2, 4)] == pytest.approx(
        [logged[0], logged[2], logged[4]], rel=1e-5)


def test_train_called_again_continues_the_steps(tmp_path, caplog):
    """A second `train()` on the same Trainer counts its steps from 0 again: its TRAIN steps are saved after the
    first run's (said once), not over them, where the first run's values would hide them."""
    m = model()
    losses = _Losses(m)
    out = str(tmp_path / "job")
    trainer = Trainer(model=m, args=_args(tmp_path, max_steps=4), train_dataset=dataset(),
                      callbacks=[TensortapCallback(out, save_config=2, include_collections=["gradients"])])
    trainer.train()
    with caplog.at_level(logging.WARNING, logger="tensortap"):
        trainer.train()
    assert trainer.state.global_step == 4 and len(losses.train) == 8
    said = [r.getMessage() for r in caplog.records if r.name == "tensortap"]
    assert len(said) == 1 and "from 4" in said[0], said
    trial = create_trial(out)
    loss = trial.tensor("loss")
    assert loss.steps(mode=modes.TRAIN) == [0, 2, 4, 6]
    assert [loss.value(k, mode=modes.TRAIN) for k in (0, 2, 4, 6)] == pytest.approx(
        [losses.train[k] for k in (0, 2, 4, 6)], rel=1e-6)
    assert trial.tensor(f"gradient/{PREFIX}classifier.weight").steps(mode=modes.TRAIN) == [0, 2, 4, 6]


def test_the_disabling_variable_leaves_the_job_untouched(tmp_path, monkeypatch):
    """With TENSORTAP_DISABLE=1 the callback writes nothing and puts no hook on the model; training and evaluation
    run as without it."""
    monkeypatch.setenv("TENSORTAP_DISABLE", "1")
    m = model()
    out = tmp_path / "job"
    trainer = Trainer(model=m, args=_args(tmp_path, max_steps=2), train_dataset=dataset(),
                      eval_dataset=dataset(16, seed=1), callbacks=[TensortapCallback(str(out), save_config=1)])
    trainer.train()
    trainer.evaluate()
    assert trainer.state.global_step == 2
    assert not m._forward_hooks and not out.exists()


def test_bad_arguments_are_one_line_errors(tmp_path):
    with pytest.raises(InvalidConfiguration, match="out_dir"):
        TensortapCallback(out_dir=None)
    with pytest.raises(InvalidConfiguration, match="rules entry"):
        TensortapCallback(out_dir=str(tmp_path / "a"), rules=[3])


def test_a_failing_capture_never_breaks_training(tmp_path, caplog, monkeypatch):
    cb = TensortapCallback(out_dir=str(tmp_path / "job"), save_config=1, include_collections=["gradients"])

    def boom():
        raise RuntimeError("injected")

    monkeypatch.setattr(cb.capture, "save_gradients", boom)
    trainer = Trainer(model=model(), args=_args(tmp_path, max_steps=4), train_dataset=dataset(), callbacks=[cb])
    with caplog.at_level(logging.ERROR, logger="tensortap"):
        trainer.train()
    assert trainer.state.global_step == 4
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name == "tensortap"]
    assert len(errors) == 1 and "injected" in str(errors[0].exc_info[1])


class _Poison(TrainerCallback):
    """Writes NaN into the classifier's weight at a chosen step: the loss is NaN from then on."""

    def __init__(self, at):
        self.at = at

    def on_step_begin(self, args, state, control, model=None, **kw):
        if state.global_step == self.at:
            with torch.no_grad():
                model.classifier.weight.fill_(float("nan"))


def test_a_rule_stops_training_through_the_trainer(tmp_path):
    """A job whose loss turns NaN at step 3 is stopped by exploding_tensor running beside it: train() returns
    normally long before max_steps, the Trainer writes its checkpoint, the rule's status says why."""
    out = str(tmp_path / "job")
    cb = TensortapCallback(out_dir=out, save_config=1, rules=["exploding_tensor"])
    max_steps = 100_000
    args = _args(tmp_path, max_steps=max_steps, logging_steps=1000, logging_nan_inf_filter=False,
                 save_strategy="steps", save_steps=10**9)
    trainer = Trainer(model=model(), args=args, train_dataset=dataset(256), callbacks=[_Poison(3), cb])
    trainer.train()
    assert 3 < trainer.state.global_step < max_steps
    assert list((tmp_path / "hf").glob("checkpoint-*")), "the Trainer's checkpoint was not written"
    status = cb.rule_statuses()["exploding_tensor"]
    assert status["status"] == "IssuesFound" and status["first_step"] >= 3, status


def test_tensortap_run_saves_an_unmodified_hf_scripts_loss(tmp_path):
    out = str(tmp_path / "job")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from _hf_job import dataset, model
        from transformers import Trainer, TrainingArguments
        args = TrainingArguments(output_dir={str(tmp_path / "hf")!r}, per_device_train_batch_size=8, max_steps=6,
                                 report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
        Trainer(model=model(), args=args, train_dataset=dataset()).train()
    """))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-m", "tensortap.cli.main", "run", "--out-dir", out, "--save-interval",
                           "2", "--", sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    trial = create_trial(out)
    assert trial.tensor("loss").steps(mode=modes.TRAIN) == [0, 2, 4]
    assert all(np.isfinite(trial.tensor("loss").value(k, mode=modes.TRAIN)) for k in (0, 2, 4))


def test_tensortap_run_saves_an_unmodified_evaluation_scripts_losses(tmp_path):
    """A script that only evaluates (no train()): under `tensortap run` its batches are EVAL steps with their
    losses, written by the Trainer's callback alone (one worker), eval_loss their mean."""
    out = str(tmp_path / "job")
    script = tmp_path / "evaluate.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from _hf_job import dataset, model
        from transformers import Trainer, TrainingArguments
        args = TrainingArguments(output_dir={str(tmp_path / "hf")!r}, per_device_eval_batch_size=8, report_to=[],
                                 use_cpu=True, save_strategy="no", disable_tqdm=True)
        Trainer(model=model(), args=args, eval_dataset=dataset(16, seed=1)).evaluate()
    """))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-m", "tensortap.cli.main", "run", "--out-dir", out, "--", sys.executable,
                           str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    trial = create_trial(out)
    assert trial.workers() == ["worker_0"]
    losses = [trial.tensor("loss").value(s, mode=modes.EVAL) for s in trial.tensor("loss").steps(mode=modes.EVAL)]
    assert len(losses) == 2
    assert trial.tensor("eval_loss").value(1, mode=modes.EVAL) == pytest.approx(np.mean(losses), rel=1e-5)


def test_tensortap_run_stops_an_unmodified_hf_script_through_the_trainer(tmp_path):
    """`tensortap run --stop-on-issue` on a script with no tensortap code whose loss turns NaN at step 3: the
    runner's rule asks for a stop, the callback the runner added ends train() through
    control.should_training_stop (the script's own code after train runs), and the run exits 1."""
    out = str(tmp_path / "job")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import torch
        sys.path.insert(0, {str(HERE)!r})
        from _hf_job import dataset, model
        from transformers import Trainer, TrainerCallback, TrainingArguments

        class Poison(TrainerCallback):
            def on_step_begin(self, args, state, control, model=None, **kw):
                if state.global_step == 3:
                    with torch.no_grad():
                        model.classifier.weight.fill_(float("nan"))

        args = TrainingArguments(output_dir={str(tmp_path / "hf")!r}, per_device_train_batch_size=8,
                                 max_steps=100_000, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
                                 logging_steps=1000, logging_nan_inf_filter=False)
        trainer = Trainer(model=model(), args=args, train_dataset=dataset(256), callbacks=[Poison()])
        trainer.train()
        print("TRAIN RETURNED AT", trainer.state.global_step, flush=True)
    """))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-m", "tensortap.cli.main", "run", "--out-dir", out, "--save-interval",
                           "1", "--rule", "exploding_tensor", "--stop-on-issue", "--", sys.executable, str(script)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = next((x for x in proc.stdout.splitlines() if x.startswith("TRAIN RETURNED AT")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]  # (the script's own end, or why not)
    assert 3 < int(line.split()[-1]) < 100_000
