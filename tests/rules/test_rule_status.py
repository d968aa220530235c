"""Honest statuses on real data: a rule that evaluated nothing says NoData (never NoIssuesFound), names what it
looked for and what the job has; reports are JSON; activation rules find activations through the collections
framework hooks fill by layer type; smdebug's import paths; the hint for `trial.tensor("loss")`."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import tensortap as tt
from tensortap.exceptions import TensorUnavailable
from tensortap.rules import invoke_rule
from tensortap.rules.builtin import BUILTIN_RULES, DeadRelu, Overfit, SaturatedActivation, snake_name

torch = pytest.importorskip("torch")
tp = pytest.importorskip("tensortap.pytorch")
nn = torch.nn

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "smdebug")

#: parameters a rule cannot run without
REQUIRED = {"similar_across_runs": lambda path: {"other_trials": path},
            "all_zero": lambda path: {"collection_names": "weights"},
            "tensor_variance": lambda path: {"max_threshold": 1e6},
            "stalled_training_rule": lambda path: {"threshold": 600}}


def pytorch_job(out: str, model: nn.Module, collections: list[str], steps: int = 12) -> tt.trials.Trial:
    """A real PyTorch training of `model`, captured by tensortap.pytorch."""
    torch.manual_seed(0)
    hook = tp.Hook(out, save_config=tp.SaveConfig(save_interval=1), include_collections=collections)
    hook.register_module(model)
    loss_fn = nn.CrossEntropyLoss()
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    for _ in range(steps):
        hook.set_mode(tt.modes.TRAIN)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    hook.close()
    return tt.create_trial(out)


def run_all(path: str) -> dict[str, object]:
    reports = {}
    for cls in BUILTIN_RULES:
        name = snake_name(cls)
        params = REQUIRED[name](path) if name in REQUIRED else {}
        reports[name] = invoke_rule(cls(tt.create_trial(path), **params), stop_at_job_end=True)
    return reports


def check_honest(reports: dict[str, object]) -> None:
    for name, rep in reports.items():
        d = json.loads(json.dumps(rep.to_dict()))  # plain JSON
        assert d["status"] == rep.status in ("IssuesFound", "NoIssuesFound", "NoData"), name
        if rep.steps_evaluated == 0 or rep.datapoints == 0:
            assert rep.status == "NoData", (name, d)
        if rep.status == "NoData":
            assert d["message"].startswith("no data: ") and "the job has" in d["message"], (name, d["message"])
            assert d["no_data"]["job_tensors"], name


def test_a_pytorch_job_without_activations_or_xgboost_data(tmp_path):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    path = str(tmp_path / "job")
    pytorch_job(path, model, ["weights", "gradients", "losses"], steps=24)  # LossNotDecreasing's warm-up: 20
    reports = run_all(path)
    check_honest(reports)
    no_data = {n for n, r in reports.items() if r.status == "NoData"}
    # what this job cannot show: activations, labels/predictions, images, sequences, XGBoost trees, EVAL steps,
    # a second worker, a GradScaler
    assert no_data == {"confusion", "class_imbalance", "check_input_images", "dead_relu", "tree_depth", "overfit",
                       "saturated_activation", "nlp_sequence_ratio", "feature_importance_overweight",
                       "rank_divergence", "amp_scale_collapse"}
    dead = reports["dead_relu"].to_dict()
    assert dead["looked_for"] == {"collections": ["relu_output"], "regex": [".*relu_output"]}
    assert "'relu_output'" in dead["message"] and "Sequential_0.weight" in dead["message"]
    assert "no data: collections ['relu_output'] and regexes ['.*relu_output'] matched no tensor" in dead["message"]
    assert "the rule needs losses at EVAL steps after TRAIN steps, in at least min_evaluations evaluations" in \
        reports["overfit"].no_data_message()
    # the rules that did see data judged it
    for name in ("vanishing_gradient", "exploding_tensor", "loss_not_decreasing", "weight_update_ratio",
                 "loss_spike", "grad_norm_spike"):
        assert reports[name].status == "NoIssuesFound" and reports[name].steps_evaluated >= 10, name
    pwi = reports["poor_weight_initialization"]
    assert any("no activation inputs" in w for w in pwi.warnings), pwi.warnings


@pytest.mark.parametrize("fixture", ["pytorch_job", "two_workers"])
def test_smdebug_fixtures(fixture):
    path = os.path.join(FIXTURES, fixture)
    if not os.path.isdir(path):
        pytest.skip(f"no fixture {fixture}")
    reports = run_all(path)
    check_honest(reports)
    assert reports["tree_depth"].status == "NoData"


def test_an_empty_job_is_no_data_for_every_rule(tmp_path):
    hook = tt.Hook(str(tmp_path / "job"))
    hook.close()  # the job ended without saving a step
    reports = run_all(str(tmp_path / "job"))
    assert {r.status for r in reports.values()} == {"NoData"}
    assert "the job has 0 saved step(s)" in reports["vanishing_gradient"].no_data_message()


def test_activations_found_by_collection(tmp_path):
    # A framework hook puts activations into relu_output / tanh_input / sigmoid_input by layer type, whatever the
    # layer's name; the collection decides which threshold applies.
    pre = np.full((16, 8), 12.0, np.float32)  # outside tanh's active range, inside sigmoid's
    dead = np.zeros((16, 8), np.float32)
    hook = tt.Hook(str(tmp_path / "job"), save_config=tt.SaveConfig(save_interval=1),
                   include_collections=["relu_output", "tanh_input", "sigmoid_input"])
    for _ in range(3):
        hook.next_step()
        hook.save_tensor("3_output_0", dead, "relu_output")
        hook.save_tensor("5_input_0", pre, "tanh_input")
        hook.save_tensor("7_input_0", pre, "sigmoid_input")
    hook.close()
    trial = tt.create_trial(str(tmp_path / "job"))
    rep = invoke_rule(DeadRelu(trial), stop_at_job_end=True)
    assert rep.status == "IssuesFound" and rep.first_violations[0].tensor == "3_output_0"
    rep = invoke_rule(SaturatedActivation(tt.create_trial(trial.path)), stop_at_job_end=True)
    assert rep.status == "IssuesFound"
    assert {v.tensor for v in rep.first_violations} == {"5_input_0"}  # tanh saturates at 12, sigmoid does not
    assert "tanh" in rep.first_violations[0].condition


class SaturatedNet(nn.Module):
    """Sigmoids whose inputs are pushed far outside the active range; the layers are named by position only."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.Sigmoid(), nn.Linear(16, 3))
        with torch.no_grad():
            self.body[0].bias.fill_(40.0)

    def forward(self, x):
        return self.body(x)


def test_saturated_sigmoids_in_pytorch_by_default(tmp_path):
    trial = pytorch_job(str(tmp_path / "job"), SaturatedNet(), ["sigmoid_input", "gradients"], steps=4)
    # the hook fills the collection by layer type (the sigmoid is named "body.1"): the default rule sees it
    assert trial.tensor_names(collection="sigmoid_input") == ["body.1_input_0"]
    rep = invoke_rule(SaturatedActivation(trial), stop_at_job_end=True)
    assert rep.status == "IssuesFound" and rep.first_fired_step == 0


def test_saturated_sigmoids_not_saved_is_no_data(tmp_path):
    trial = pytorch_job(str(tmp_path / "job"), SaturatedNet(), ["gradients"], steps=4)
    rep = invoke_rule(SaturatedActivation(trial), stop_at_job_end=True)
    # the hook saved no activation: the rule says so, naming what it looked for (never NoIssuesFound)
    assert rep.status == "NoData" and "'sigmoid_input'" in rep.no_data_message()


def test_overfit_without_eval_steps_is_no_data(job, run_rule):
    trial = job(10, {"loss": ("losses", lambda s: np.float32(1.0))})
    rep = run_rule(Overfit(trial))
    assert rep.status == "NoData" and rep.judged == 0


def test_report_is_json_and_to_json(tmp_path):
    trial = pytorch_job(str(tmp_path / "job"), nn.Sequential(nn.Linear(8, 3)), ["gradients"], steps=3)
    from tensortap.rules.builtin import VanishingGradient

    rep = invoke_rule(VanishingGradient(trial), stop_at_job_end=True)
    assert json.loads(rep.to_json()) == json.loads(json.dumps(rep.to_dict()))
    assert json.loads(rep.to_json())["status"] == "NoIssuesFound"


def test_smdebug_import_paths_are_aliases():
    import tensortap.collection
    import tensortap.config
    import tensortap.modes
    import tensortap.rules.actions
    import tensortap.rules.invoke
    from tensortap.core import collection, modes, reduction_config, save_config
    from tensortap.rules import action, rule_invoker
    from tensortap.rules.rule_invoker import invoke_rule as ir

    assert modes is tensortap.modes and collection is tensortap.collection
    assert save_config is tensortap.config and reduction_config is tensortap.config
    assert rule_invoker is tensortap.rules.invoke and ir is invoke_rule
    assert action is tensortap.rules.actions
    assert modes.ModeKeys.TRAIN is tt.modes.TRAIN and save_config.SaveConfig is tt.SaveConfig
    assert reduction_config.ReductionConfig is tt.ReductionConfig and action.StopTraining


def test_missing_tensor_error_names_the_saved_one(tmp_path):
    hook = tt.Hook(str(tmp_path / "job"))
    hook.next_step()
    hook.save_scalar("loss", 1.5)
    hook.close()
    trial = tt.create_trial(str(tmp_path / "job"))
    with pytest.raises(TensorUnavailable, match="'scalar/loss'"):
        trial.tensor("loss")
    assert trial.tensor("scalar/loss").value(0) == 1.5
