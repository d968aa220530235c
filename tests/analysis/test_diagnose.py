"""`diagnose` on real PyTorch trainings with a planted fault: each fault is found where it was planted, and a
healthy run of the same training is found healthy."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _faulty_jobs as jobs  # noqa: E402

from tensortap.analysis.diagnose import diagnose  # noqa: E402
from tensortap.trials import create_trial  # noqa: E402

CORRUPT = 60


@pytest.fixture(scope="module")
def spiky(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("spiky") / "job")
    rec = jobs.spike_job(out, corrupt_step=CORRUPT, factor=100.0)
    return out, rec


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("healthy") / "job")
    jobs.spike_job(out, corrupt_step=None)
    return out


def test_a_gradient_spike_then_a_loss_spike_attributed_to_the_layer_that_moved_first(spiky):
    out, rec = spiky
    d = diagnose(create_trial(out))
    by_kind = {s["kind"]: s for s in d.spikes}
    assert set(by_kind) == {"loss", "gradient norm"}, d.spikes
    g, loss = by_kind["gradient norm"], by_kind["loss"]
    assert g["step"] == CORRUPT  # the corrupted gradient is what the optimizer consumed at that step
    assert loss["step"] == CORRUPT + 1  # the weights it moved make the next step's loss spike
    assert loss["value"] == pytest.approx(rec["losses"][CORRUPT + 1], rel=1e-6)  # what the script itself saw
    assert loss["ratio"] > 2 and loss["z"] > 6
    first = loss["movers"][0]
    assert (first["tensor"], first["step"]) == ("gradient/Sequential_2.weight", CORRUPT)
    assert g["movers"][0]["tensor"] == "gradient/Sequential_2.weight"
    assert d.nonfinite is None and not d.ranks and d.findings == 2
    text = d.to_text()
    assert f"at step {CORRUPT + 1}" in text and "gradient/Sequential_2.weight" in text
    assert any("lowering the learning rate" in s for s in d.suggestions)
    assert any("clipping gradients" in s for s in d.suggestions)
    assert any(f"{CORRUPT}, {CORRUPT + 1}" in s for s in d.suggestions)  # the steps whose data to check


def test_the_same_training_without_the_fault_is_healthy(healthy):
    d = diagnose(create_trial(healthy))
    assert d.findings == 0, d.to_text()
    assert d.spikes == [] and d.nonfinite is None and d.suggestions == []
    assert d.to_text().splitlines()[2].startswith("nothing wrong found (")
    # no green without data: the built-in rules ran on the job's data and judged it
    judged = {r["name"] for r in d.rules if r["status"] == "NoIssuesFound" and r["run"] == "diagnose"}
    assert {"vanishing_gradient", "exploding_tensor", "loss_not_decreasing", "weight_update_ratio"} <= judged
    json.loads(d.to_json())


def test_a_gradient_scaler_that_collapses(tmp_path):
    out = str(tmp_path / "amp")
    scales = jobs.amp_job(out, overflow_from=20)
    d = diagnose(create_trial(out))
    assert d.amp is not None and d.amp["collapsed"], d.amp
    assert d.amp["skipped"] == 20 and d.amp["run_steps"] == [20, 39] and d.amp["longest_run"] == 20
    assert d.amp["last_scale"] == pytest.approx(scales[-2])  # the scale it skipped its last step with
    assert d.findings == 1 and "GradScaler" in d.headline()
    ok = str(tmp_path / "amp_ok")
    jobs.amp_job(ok, overflow_from=None)
    d2 = diagnose(create_trial(ok))
    assert d2.amp is not None and not d2.amp["collapsed"] and d2.amp["skipped"] == 0 and d2.findings == 0


def test_non_finite_values_from_saved_data(tmp_path):
    """Without the flight recorder's incident, the earliest saved step holding NaN/inf is reported."""
    out = str(tmp_path / "nan")
    jobs.spike_job(out, steps=40, corrupt_step=25, factor=float("inf"))
    d = diagnose(create_trial(out))
    nf = d.nonfinite
    assert nf is not None and nf["source"] == "saved data" and nf["step"] == 25
    assert "gradient/Sequential_2.weight" in nf["tensors"]
    assert "Sequential_0.weight" not in nf["tensors"]  # the weights used at step 25 were still finite
    assert d.to_dict()["first_nonfinite"]["step"] == 25
    json.loads(d.to_json())  # inf/NaN values are written as strings / null: valid JSON


def test_diverging_rank_of_a_two_process_gloo_job(tmp_path):
    out = str(tmp_path / "ddp")
    jobs.ddp_job(out, str(tmp_path), corrupt_rank=1, corrupt_from=20)
    d = diagnose(create_trial(out))
    assert d.ranks, d.to_text()
    assert all(r["workers"] == ["worker_1"] for r in d.ranks)
    norm = next(r for r in d.ranks if r["curve"] == "the total gradient norm")
    assert 20 <= norm["step"] <= 24
    assert any("worker_1" in s for s in d.suggestions)
    assert np.isfinite(norm["ratio"]) and norm["ratio"] > 2


def test_the_flight_recorder_s_incident_names_the_producer(tmp_path):
    """A non-finite incident, as docs/format.md §11 has the flight recorder write it, is what diagnose reports
    (module, phase, step, inputs), ahead of the saved-data scan (which only knows the first saved step)."""
    from tensortap.format.incidents import IncidentLog, make_incident
    from tensortap.storage import open_storage

    out = str(tmp_path / "nan")
    jobs.spike_job(out, steps=40, corrupt_step=25, factor=float("inf"))
    log = IncidentLog(open_storage(out), "worker_0")
    log.append(make_incident("non_finite", 25, "TRAIN", 25, "worker_0", 1.0, (0, 25), {
        "phase": "backward", "module": None, "parameter": "Sequential_2.weight",
        "tensor": "gradient/Sequential_2.weight", "nan": 0, "posinf": 512, "neginf": 512, "inputs": []}))
    log.append(make_incident("loss_spike", 26, "TRAIN", 26, "worker_0", 2.0, None, {"value": float("nan")}))
    d = diagnose(create_trial(out))
    nf = d.nonfinite
    assert nf["source"] == "flight recorder" and nf["step"] == 25 and nf["phase"] == "backward"
    assert nf["parameter"] == "Sequential_2.weight" and (nf["posinf"], nf["neginf"]) == (512, 512)
    assert d.incidents == {"non_finite": 1, "loss_spike": 1}
    text = d.to_text()
    assert "the gradient of parameter Sequential_2.weight went non-finite first in the backward pass" in text
    assert "steps 0..25 before it" in text
    assert any("overflowed first at step 25" in s for s in d.suggestions)
    assert json.loads(d.to_json())["first_nonfinite"]["parameter"] == "Sequential_2.weight"


def _flight_recorder_landed() -> bool:
    import inspect

    import tensortap.pytorch as tp

    return "flight_recorder" in inspect.signature(tp.Hook.__init__).parameters


@pytest.mark.skipif(not _flight_recorder_landed(), reason="the PyTorch flight recorder (#40, capture side) is not "
                                                          "in this tree yet")
def test_a_third_layer_that_outputs_inf_at_step_k_is_named_at_step_k(tmp_path):
    """The issue's end-to-end case: with the flight recorder on and save_interval=500 (nothing saved near step k),
    diagnose names the third layer, at step k, in the forward pass."""
    from torch import nn

    import tensortap.pytorch as tp

    k = 37

    class InfAt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(32, 32)
            self.calls = 0

        def forward(self, x):
            y = self.lin(x)
            if self.calls == k:
                y = y.clone()
                y[0, 0] = float("inf")
            self.calls += 1
            return y

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), InfAt(), nn.ReLU(), nn.Linear(32, 4))
    out = str(tmp_path / "job")
    hook = tp.Hook(out_dir=out, save_config=tp.SaveConfig(save_interval=500), flight_recorder=True,
                   include_collections=["losses"], writer="thread")
    hook.register_module(model)
    loss_fn = nn.CrossEntropyLoss()
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = jobs._data()
    for step in range(k + 5):
        opt.zero_grad()
        loss_fn(model(x[step * 32:step * 32 + 32]), y[step * 32:step * 32 + 32]).backward()
        opt.step()
    hook.close()
    d = diagnose(create_trial(out))
    nf = d.nonfinite
    assert nf is not None and nf["source"] == "flight recorder", d.to_text()
    assert (nf["step"], nf["phase"], nf["module"]) == (k, "forward", "2")
    assert nf["posinf"] == 1
    assert f"step {k}" in d.to_text() and "module 2 went non-finite first in the forward pass" in d.to_text()
    r = json.loads(d.to_json())
    assert r["first_nonfinite"]["module"] == "2" and r["first_nonfinite"]["step"] == k


def test_spikes_found_in_the_flight_recorder_s_ring(tmp_path):
    """save_interval=500: only step 0 is saved by the schedule; the flight recorder writes its ring when it sees
    the spike, and diagnose (and the spike rules, offline) find it there, attributed to the same layer."""
    from tensortap.rules import invoke_rule
    from tensortap.rules.builtin import GradNormSpike, LossSpike

    out = str(tmp_path / "flight")
    rec = jobs.spike_job(out, corrupt_step=CORRUPT, save_interval=500, flight=True)
    trial = create_trial(out)
    assert {i["kind"] for i in trial.incidents()} >= {"grad_norm_spike"}
    d = diagnose(trial)
    by_kind = {s["kind"]: s for s in d.spikes}
    assert by_kind["gradient norm"]["step"] == CORRUPT and by_kind["loss"]["step"] == CORRUPT + 1, d.to_text()
    assert by_kind["loss"]["value"] == pytest.approx(rec["losses"][CORRUPT + 1], rel=1e-5)  # its ring's |loss|
    assert by_kind["loss"]["movers"][0]["tensor"] == "gradient/Sequential_2.weight"
    rep = invoke_rule(LossSpike(create_trial(out)), stop_at_job_end=True)
    assert rep.status == "IssuesFound" and rep.fired_steps[0] == CORRUPT + 1
    rep = invoke_rule(GradNormSpike(create_trial(out)), stop_at_job_end=True)
    assert rep.status == "IssuesFound" and rep.fired_steps[0] == CORRUPT


def test_outliers_growing_in_a_layer_s_outputs_are_named_before_the_gradients(tmp_path):
    """Outliers planted in the outputs of module `2` from step 60 (the flight recorder on with its full
    statistics, nothing else saved): the spikes that follow are attributed first to that module's activation
    kurtosis at step 60, before any gradient norm moved; a gradient-norm-only attribution would name a gradient
    at step 61. The LossSpike rule's message says the same."""
    from tensortap.analysis.spikes import attribute
    from tensortap.rules.builtin import LossSpike
    from tensortap.rules.invoke import invoke_rule

    out = str(tmp_path / "job")
    rec = jobs.outlier_job(out, start=60)
    d = diagnose(create_trial(out), rules=False)
    loss = [s for s in d.spikes if s["kind"] == "loss"]
    assert loss and 60 < loss[0]["step"] <= 63
    for sp in d.spikes:
        first = sp["movers"][0]
        assert (first["tensor"], first["statistic"], first["step"]) == ("2_output_0", "activation kurtosis", 60)
        assert first["ratio"] > 3
        assert all(m["step"] > 60 for m in sp["movers"] if m["statistic"] == "gradient norm")
    text = d.to_text()
    assert "moved first: the activation kurtosis of 2_output_0 at step 60" in text
    assert any("outputs of 2 grew outliers" in s for s in d.suggestions)
    # the kurtosis the diagnosis used is the job's own: n·Σx⁴/(Σx²)² of the outputs it saved statistics of
    t = create_trial(out)
    o = t.tensor("2_output_0")
    n = int(np.prod(o.shape(60)))
    k60 = n * (float(o.reduction_value(60, "l4")) / float(o.reduction_value(60, "l2"))) ** 4
    assert first["value"] == pytest.approx(k60, rel=1e-9)
    # gradient norms alone: a later step
    grads = {g: (np.asarray(sorted(t.tensor(g).steps())), np.asarray([float(t.tensor(g).reduction_value(s, "l2"))
                                                                      for s in sorted(t.tensor(g).steps())]))
             for g in t.tensor_names(regex="^gradient/")}
    assert min(m.step for m in attribute(loss[0]["step"], grads, since=loss[0]["previous_step"])) > 60
    rep = invoke_rule(LossSpike(create_trial(out)), stop_at_job_end=True)
    assert rep.status == "IssuesFound"
    assert "; moved first: the activation kurtosis of 2_output_0 (x" in rep.first_violations[0].condition
    assert np.isfinite(rec["losses"][59])
