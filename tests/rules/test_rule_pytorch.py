"""Built-in rules on data captured by tensortap.pytorch from real (tiny) PyTorch trainings: each problem is
really produced by the training (huge learning rate, saturating sigmoids, zero-initialised ReLU layers, a
frozen layer, one-class labels, ...) and a healthy training keeps the rule quiet. Hooks are configured with
the rules' own configs (tensortap.rules.configs)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
tp = pytest.importorskip("tensortap.pytorch")

import tensortap as tt  # noqa: E402
from tensortap.rules import configs, invoke_rule  # noqa: E402
from tensortap.rules.builtin import (  # noqa: E402
    AllZero,
    CheckInputImages,
    ClassImbalance,
    Confusion,
    DeadRelu,
    ExplodingTensor,
    LossNotDecreasing,
    NLPSequenceRatio,
    Overfit,
    Overtraining,
    PoorWeightInitialization,
    SaturatedActivation,
    SimilarAcrossRuns,
    TensorVariance,
    UnchangedTensor,
    VanishingGradient,
    WeightUpdateRatio,
)

D, K = 16, 3
W_TRUE = np.random.default_rng(0).standard_normal((D, K)).astype(np.float32)


def separable(step: int, n: int = 64, seed: int = 0, one_class: bool = False):
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    x = torch.randn(n, D, generator=g)
    y = torch.zeros(n, dtype=torch.long) if one_class else (x @ torch.from_numpy(W_TRUE)).argmax(1)
    return x, y


class MLP(nn.Module):
    def __init__(self, width: int = 32, act: str = "relu", depth: int = 2):
        super().__init__()
        self.fc1 = nn.Linear(D, width)
        self.relu1 = nn.ReLU() if act == "relu" else nn.Sigmoid()
        self.hidden = nn.ModuleList(nn.Linear(width, width) for _ in range(depth - 1))
        self.acts = nn.ModuleList((nn.ReLU() if act == "relu" else nn.Sigmoid()) for _ in range(depth - 1))
        self.fc_out = nn.Linear(width, K)

    def forward(self, x):
        x = self.relu1(self.fc1(x))
        for lin, a in zip(self.hidden, self.acts, strict=True):
            x = a(lin(x))
        return self.fc_out(x)


class SigmoidNet(nn.Module):
    """Four sigmoid layers, named so that their inputs match SaturatedActivation's default regex; a large
    `bias` pushes every sigmoid into saturation."""

    def __init__(self, bias: float):
        super().__init__()
        self.fc1, self.fc2, self.fc3, self.fc4 = (nn.Linear(D, 32), nn.Linear(32, 32), nn.Linear(32, 32),
                                                  nn.Linear(32, 32))
        self.fc_out = nn.Linear(32, K)
        self.l1_sigmoid, self.l2_sigmoid, self.l3_sigmoid, self.l4_sigmoid = (nn.Sigmoid() for _ in range(4))
        with torch.no_grad():
            for m in (self.fc1, self.fc2, self.fc3, self.fc4):
                m.bias.fill_(bias)

    def forward(self, x):
        x = self.l2_sigmoid(self.fc2(self.l1_sigmoid(self.fc1(x))))
        return self.fc_out(self.l4_sigmoid(self.fc4(self.l3_sigmoid(self.fc3(x)))))


def train(out, model, *, steps=30, lr=0.05, data=separable, rule_configs=(), collections=("weights", "gradients",
          "losses"), eval_every=None, eval_data=None, eval_steps=3, optimizer="sgd"):
    torch.manual_seed(0)
    hook = tp.Hook(out, save_config=tp.SaveConfig(save_interval=1), include_collections=list(collections))
    for cfg in rule_configs:
        cfg.apply(hook)
    hook.register_module(model)
    loss_fn = nn.CrossEntropyLoss()
    hook.register_loss(loss_fn)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=lr) if optimizer == "sgd" else torch.optim.Adam(params, lr=lr)
    for step in range(steps):
        hook.set_mode(tt.modes.TRAIN)
        model.train()
        x, y = data(step)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if eval_every and (step + 1) % eval_every == 0:
            hook.set_mode(tt.modes.EVAL)
            model.eval()
            with torch.no_grad():
                for k in range(eval_steps):
                    xe, ye = (eval_data or data)(10_000 + step * 10 + k)
                    loss_fn(model(xe), ye)
    hook.close()
    return tt.create_trial(out)


def run(rule):
    return invoke_rule(rule, stop_at_job_end=True)


@pytest.fixture
def out(tmp_path):
    n = iter(range(100))
    return lambda: str(tmp_path / f"job{next(n)}")


# --- ExplodingTensor, TensorVariance, WeightUpdateRatio: a huge learning rate ----------------------------------


def test_huge_learning_rate(out):
    trial = train(out(), MLP(), lr=1e7, steps=20, rule_configs=[configs.exploding_tensor(save_interval=1)])
    rep = run(ExplodingTensor(trial))
    assert rep.triggered and rep.first_fired_step < 20
    assert run(WeightUpdateRatio(trial)).first_fired_step == 1
    assert run(TensorVariance(trial, collection_names="weights", max_threshold="1e6")).triggered

    healthy = train(out(), MLP(), lr=0.05, steps=20, rule_configs=[configs.exploding_tensor(save_interval=1)])
    assert not run(ExplodingTensor(healthy)).triggered
    assert not run(WeightUpdateRatio(healthy)).triggered
    assert not run(TensorVariance(healthy, collection_names="weights", max_threshold="1e6")).triggered


# --- VanishingGradient, SaturatedActivation: saturating sigmoids ----------------------------------------------


def test_saturating_sigmoids(out):
    cfgs = [configs.vanishing_gradient(save_interval=1), configs.saturated_activation(save_interval=1)]
    trial = train(out(), SigmoidNet(bias=20.0), steps=10, rule_configs=cfgs, collections=())
    rep = run(VanishingGradient(trial))
    assert rep.first_fired_step == 0
    assert "gradient/SigmoidNet_fc1.weight" in {v.tensor for v in rep.first_violations}
    rep = run(SaturatedActivation(trial))
    assert rep.first_fired_step == 0
    assert {v.tensor for v in rep.first_violations} >= {"l1_sigmoid_input_0"}

    healthy = train(out(), SigmoidNet(bias=0.0), steps=10, rule_configs=cfgs, collections=())
    assert not run(VanishingGradient(healthy)).triggered
    assert not run(SaturatedActivation(healthy)).triggered


# --- DeadRelu, AllZero: zero-initialised ReLU layers ----------------------------------------------------------


def test_zero_initialised_relu_layers(out):
    cfg = configs.dead_relu(tensor_regex=".*relu.*_output_0", save_interval=1)
    model = MLP()
    with torch.no_grad():
        model.fc1.weight.zero_()
        model.fc1.bias.zero_()
    trial = train(out(), model, steps=8, rule_configs=[cfg])
    rep = run(DeadRelu(trial, tensor_regex=".*relu.*_output_0"))
    assert rep.first_fired_step == 0 and rep.violations == 8 and rep.first_violations[0].tensor == "relu1_output_0"
    assert run(AllZero(trial, collection_names="relu_output")).first_fired_step == 0

    healthy = train(out(), MLP(), steps=8, rule_configs=[cfg])
    assert not run(DeadRelu(healthy, tensor_regex=".*relu.*_output_0")).triggered
    assert not run(AllZero(healthy, collection_names="relu_output")).triggered


# --- UnchangedTensor, WeightUpdateRatio: a frozen layer -------------------------------------------------------


def test_frozen_layer(out):
    model = MLP()
    model.fc1.weight.requires_grad_(False)
    trial = train(out(), model, steps=10, rule_configs=[configs.unchanged_tensor(save_interval=1)])
    rep = run(UnchangedTensor(trial, collection_names="weights"))
    assert rep.first_fired_step == 2 and {v.tensor for v in rep.first_violations} == {"MLP_fc1.weight"}
    rep = run(WeightUpdateRatio(trial))
    assert rep.first_fired_step == 1 and rep.first_violations[0].tensor == "MLP_fc1.weight"

    healthy = train(out(), MLP(), steps=10, rule_configs=[configs.unchanged_tensor(save_interval=1)])
    assert not run(UnchangedTensor(healthy, collection_names="weights")).triggered
    assert not run(WeightUpdateRatio(healthy)).triggered


# --- ClassImbalance, Confusion: labels of one class ------------------------------------------------------------


def test_labels_of_one_class(out):
    cfg = configs.class_imbalance(labels_regex="CrossEntropyLoss_input_1", predictions_regex="CrossEntropyLoss_input_0",
                                  save_interval=1)
    params = dict(labels_regex="CrossEntropyLoss_input_1", predictions_regex="CrossEntropyLoss_input_0",
                  argmax=True)
    trial = train(out(), MLP(), steps=12, data=lambda s: separable(s, one_class=True), rule_configs=[cfg])
    rep = run(ClassImbalance(trial, **params))
    assert rep.first_fired_step == 7  # 8 steps x 64 labels >= 500 samples

    healthy = train(out(), MLP(), steps=40, lr=0.5, rule_configs=[cfg])
    assert not run(ClassImbalance(healthy, samples=1000, **params)).triggered
    # the trained model's confusion matrix is good at the end, poor at the start
    conf = dict(labels="CrossEntropyLoss_input_1", predictions="CrossEntropyLoss_input_0", min_diag="0.7",
                max_off_diag="0.3")
    rep = invoke_rule(Confusion(healthy, samples="100", **conf), start_step=30, stop_at_job_end=True)
    assert not rep.triggered and rep.steps_evaluated == 10
    # judged from 2 * samples labels on (the first samples are a warm-up): 4 steps of 64
    assert run(Confusion(trial, samples="100", **conf)).first_fired_step == 3


# --- LossNotDecreasing, Overtraining: a loss that does not move -----------------------------------------------


def test_loss_not_decreasing(out):
    fixed = lambda s: separable(0)  # noqa: E731 - one batch, so the loss only moves with learning
    cfg = [configs.loss_not_decreasing(save_interval=1)]
    trial = train(out(), MLP(), steps=25, lr=0.0, data=fixed, rule_configs=cfg)
    assert run(LossNotDecreasing(trial)).first_fired_step == 19  # after its warm-up: 4 windows of 5 values
    assert run(Overtraining(trial, patience_train="5")).first_fired_step == 9  # median of 5, then 5 steps

    healthy = train(out(), MLP(), steps=25, lr=0.1, data=fixed, rule_configs=cfg)
    assert not run(LossNotDecreasing(healthy)).triggered


# --- Overfit: memorising a small training set ------------------------------------------------------------------


def test_overfit(out):
    rng = np.random.default_rng(7)
    xs = torch.from_numpy(rng.standard_normal((32, D)).astype(np.float32))
    ys = torch.from_numpy(rng.integers(0, K, 32))  # random labels: only memorisable
    memorise = lambda s: (xs, ys)  # noqa: E731
    fresh = lambda s: (torch.from_numpy(rng.standard_normal((32, D)).astype(np.float32)),  # noqa: E731
                       torch.from_numpy(rng.integers(0, K, 32)))
    trial = train(out(), MLP(width=128), steps=60, lr=0.01, optimizer="adam", data=memorise, eval_data=fresh,
                  eval_every=10, rule_configs=[configs.overfit(save_interval=1)])
    rep = run(Overfit(trial))
    assert rep.triggered and trial.mode(rep.first_fired_step) == tt.modes.EVAL

    healthy = train(out(), MLP(), steps=60, lr=0.05, eval_every=10, rule_configs=[configs.overfit(save_interval=1)])
    assert not run(Overfit(healthy)).triggered


# --- PoorWeightInitialization ---------------------------------------------------------------------------------


def test_poor_weight_initialisation(out):
    cfg = configs.poor_weight_initialization(activation_inputs_regex=".*relu1_input_0|.*acts\\.0_input_0",
                                             save_interval=1)

    def model(scale):
        m = MLP()
        with torch.no_grad():
            for lin in (m.fc1, m.hidden[0]):
                nn.init.kaiming_normal_(lin.weight)
                lin.bias.zero_()
            m.hidden[0].weight.mul_(scale)
        return m

    names = ".*relu1_input_0|.*acts\\.0_input_0"
    trial = train(out(), model(100.0), steps=12, rule_configs=[cfg])
    assert trial.tensor_names(regex=names) == ["acts.0_input_0", "relu1_input_0"]
    rep = run(PoorWeightInitialization(trial, activation_inputs_regex=names))
    assert rep.first_fired_step == 0 and "fold across layers" in rep.first_violations[0].condition

    healthy = train(out(), model(1.0), steps=12, rule_configs=[cfg])
    assert not run(PoorWeightInitialization(healthy, activation_inputs_regex=names)).triggered


# --- CheckInputImages: unnormalised images ---------------------------------------------------------------------


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4 * 6 * 6, K)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))


def images(normalised):
    def data(step):
        g = torch.Generator().manual_seed(step)
        x = torch.rand(32, 3, 8, 8, generator=g)  # pixels in [0, 1]: mean 0.5
        if normalised:
            x = (x - 0.5) / 0.29
        return x, torch.randint(0, K, (32,), generator=g)

    return data


def test_unnormalised_input_images(out):
    cfg = configs.check_input_images(regex="ConvNet_input_0", save_interval=1)
    trial = train(out(), ConvNet(), steps=20, data=images(False), rule_configs=[cfg], collections=("losses",))
    rep = run(CheckInputImages(trial, regex="ConvNet_input_0"))
    assert rep.first_fired_step == 15 and len(rep.first_violations) == 3  # 16 x 32 images >= 500

    healthy = train(out(), ConvNet(), steps=20, data=images(True), rule_configs=[cfg], collections=("losses",))
    assert not run(CheckInputImages(healthy, regex="ConvNet_input_0")).triggered


# --- NLPSequenceRatio: padded sequences ------------------------------------------------------------------------


class TextNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding0 = nn.Embedding(50, 8, padding_idx=0)
        self.head = nn.Linear(8, K)

    def forward(self, x):
        return self.head(self.embedding0(x).mean(1))


def sequences(pad_fraction):
    def data(step):
        g = torch.Generator().manual_seed(step)
        x = torch.randint(1, 50, (16, 20), generator=g)
        x[:, int(20 * (1 - pad_fraction)):] = 0
        return x, torch.randint(0, K, (16,), generator=g)

    return data


def test_padded_sequences(out):
    cfg = configs.nlp_sequence_ratio(save_interval=1)
    trial = train(out(), TextNet(), steps=5, data=sequences(0.75), rule_configs=[cfg], collections=())
    rep = run(NLPSequenceRatio(trial))
    assert rep.first_fired_step == 0 and rep.first_violations[0].tensor == "embedding0_input_0"

    healthy = train(out(), TextNet(), steps=5, data=sequences(0.2), rule_configs=[cfg], collections=())
    assert not run(NLPSequenceRatio(healthy)).triggered


# --- SimilarAcrossRuns: the same training twice, and with another seed ----------------------------------------


def test_similar_across_runs(out):
    def model(seed):
        torch.manual_seed(seed)
        return MLP()

    a = train(out(), model(1), steps=6)
    b = train(out(), model(1), steps=6)
    c = train(out(), model(2), steps=6)
    assert not run(SimilarAcrossRuns(a, b, collection_names="weights")).triggered
    rep = run(SimilarAcrossRuns(a, c, collection_names="weights"))
    assert rep.first_fired_step == 0
