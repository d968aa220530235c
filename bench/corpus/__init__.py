"""The rules corpus: real (small, CPU, seconds each) trainings, healthy ones and broken ones, each broken one
labelled with the built-in rules that must fire on it.

    from bench.corpus import JOBS, build
    out_dir = build("mlp_adam_s0")          # runs the job once; cached under bench/_out/corpus/<name>

`python -m bench.corpus NAME` runs job NAME as plain training with no tensortap code (what `tensortap run`
attaches to). `bench/rules_corpus.py` evaluates every built-in rule at its defaults over the whole corpus.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Job", "JOBS", "HEALTHY", "BROKEN", "build", "run_plain", "OUT_ROOT"]

#: where generated jobs are cached (gitignored)
OUT_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_out", "corpus")


@dataclass(frozen=True)
class Job:
    """One corpus training. `expect`: rules that must fire (empty for a healthy job); `allow`: rules that may
    also fire on this broken job because its defect shows there too (never counted as false alarms)."""

    name: str
    framework: str  # torch | keras | xgboost
    spec: dict[str, Any] = field(default_factory=dict)
    expect: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    note: str = ""

    @property
    def healthy(self) -> bool:
        return not self.expect


def _t(name: str, expect: tuple[str, ...] = (), allow: tuple[str, ...] = (), note: str = "", **spec: Any) -> Job:
    return Job(name, "torch", spec, expect, allow, note)


def _x(name: str, expect: tuple[str, ...] = (), allow: tuple[str, ...] = (), note: str = "", **spec: Any) -> Job:
    return Job(name, "xgboost", spec, expect, allow, note)


def _k(name: str, expect: tuple[str, ...] = (), allow: tuple[str, ...] = (), note: str = "", **spec: Any) -> Job:
    return Job(name, "keras", spec, expect, allow, note)


# a model that learns nothing (its predictions are one class: ClassImbalance and Confusion rightly see it)
_STUCK = ("loss_not_decreasing", "overtraining", "poor_weight_initialization", "class_imbalance", "confusion")
_STILL = ("unchanged_tensor", "weight_update_ratio", "vanishing_gradient")  # weights that do not move
_BLOWN = _STUCK + _STILL + ("class_imbalance", "dead_relu")  # NaN everywhere: every rule may see it

HEALTHY = [
    _t("mlp_adam_s0", note="MLP, Adam 1e-3, batch 32"),
    _t("mlp_adam_s1_b64", seed=1, batch=64, epochs=8),
    _t("mlp_adam_s2_b16", seed=2, batch=16, epochs=4),
    _t("mlp_sgd", optimizer="sgd", lr=0.05),
    _t("mlp_sgd_b128", seed=3, optimizer="sgd", lr=0.1, batch=128, epochs=8),
    _t("mlp_rmsprop", seed=4, optimizer="rmsprop", lr=1e-3),
    _t("mlp_adamw_deep", seed=5, optimizer="adamw", depth=4),
    _t("mlp_tanh", seed=6, act="tanh"),
    _t("mlp_sigmoid", seed=7, act="sigmoid", lr=3e-3),
    _t("mlp_converged", seed=8, lr=3e-3, epochs=12, weight_decay=1e-4,
       note="converges in a few epochs, then trains on at a plateau"),
    _t("mlp_save5", seed=9, save_interval=5),
    _t("mlp_save20", seed=10, save_interval=20, epochs=8),
    _t("cnn_adam", arch="cnn", epochs=5),
    _t("cnn_sgd", arch="cnn", seed=1, optimizer="sgd", lr=0.05, epochs=5),
    _t("transformer_adam", arch="transformer", epochs=5),
    _t("transformer_adamw", arch="transformer", seed=1, optimizer="adamw", lr=5e-4, epochs=6),
    _k("keras_adam", note="Keras MLP, Adam"),
    _k("keras_sgd", seed=1, optimizer="sgd", lr=0.05, batch=64, epochs=8),
    _x("xgb_binary_d3", max_depth=3),
    _x("xgb_binary_d6", seed=1, max_depth=6, note="XGBoost's own default depth"),
    _x("xgb_regression", seed=2, task="regression", eta=0.15),
    _x("xgb_binary_subsample", seed=3, subsample=0.7, rounds=80, save_interval=5),
    _x("xgb_regression_fast", seed=4, task="regression", eta=0.3, rounds=40),
]

BROKEN = [
    _t("dead_relu_mlp", ("dead_relu",), _STUCK + _STILL + ("class_imbalance",), defect="dead_relu"),
    _t("dead_relu_cnn", ("dead_relu",), _STUCK + _STILL, arch="cnn", defect="dead_relu", epochs=3),
    _t("saturated_tanh", ("saturated_activation",), _STUCK + _STILL + ("class_imbalance",), act="tanh",
       defect="saturated"),
    _t("saturated_sigmoid", ("saturated_activation",), _STUCK + _STILL + ("class_imbalance",),
       act="sigmoid", depth=6, optimizer="sgd", lr=0.05, defect="saturated"),
    _t("vanishing_deep_sigmoid", ("vanishing_gradient",), _STUCK + _STILL + ("class_imbalance",), act="sigmoid",
       depth=10, width=32, optimizer="sgd", lr=0.01),
    _t("exploding_grads", ("exploding_tensor",), _BLOWN,
       optimizer="sgd", lr=0.1, defect="exploding"),
    _t("exploding_lr", ("exploding_tensor",), _BLOWN,
       optimizer="sgd", lr=200.0, depth=3),
    _t("nan_input", ("exploding_tensor",), _BLOWN, defect="nan_input"),
    _t("frozen_mlp", ("unchanged_tensor", "weight_update_ratio", "loss_not_decreasing"), _STUCK + _STILL,
       defect="frozen"),
    _t("frozen_cnn", ("unchanged_tensor", "weight_update_ratio"), _STUCK + _STILL, arch="cnn", defect="frozen",
       epochs=3),
    _t("zero_lr", ("unchanged_tensor", "weight_update_ratio", "loss_not_decreasing"), _STUCK + _STILL,
       optimizer="sgd", lr=0.0),
    _t("shuffled_labels", ("loss_not_decreasing",), _STUCK + ("overfit", "class_imbalance"),
       defect="shuffled_labels", epochs=8),
    _t("tiny_lr", ("loss_not_decreasing",), _STUCK + ("class_imbalance",), optimizer="sgd", lr=1e-6, epochs=8),
    _t("zero_init", ("poor_weight_initialization",), _STUCK + _STILL + ("class_imbalance", "dead_relu"),
       defect="zero_init"),
    _t("huge_init", ("poor_weight_initialization",), _STUCK + ("overfit", "class_imbalance", "dead_relu"),
       defect="huge_init", depth=4),
    _t("overfit_small_data", ("overfit",), ("overtraining", "class_imbalance", "confusion"), n_train=96, width=256,
       depth=3, epochs=80, note="96 training samples, 140k parameters"),
    _t("overfit_cnn", ("overfit",), ("overtraining", "class_imbalance", "confusion"), arch="cnn", n_train=64,
       epochs=150, lr=3e-3),
    _t("overtraining_mlp", ("overtraining",), ("overfit", "class_imbalance", "confusion"), seed=2, n_train=256,
       width=128, epochs=50, note="trains 50 epochs on 256 samples: the validation loss bottoms out early"),
    _t("class_imbalance_mlp", ("class_imbalance",), ("overfit", "overtraining"), defect="class_imbalance"),
    _t("unnormalised_images", ("check_input_images",), _STUCK + _STILL + ("dead_relu", "overfit"), arch="cnn",
       defect="unnormalised_images", epochs=3),
    _t("shifted_val_labels", ("confusion",), ("overfit", "overtraining", "class_imbalance", "loss_not_decreasing"),
       defect="shifted_val_labels"),
    _t("mostly_padding", ("nlp_sequence_ratio",), ("overfit", "overtraining"), arch="transformer",
       defect="mostly_padding", epochs=3),
    _k("keras_exploding_lr", ("exploding_tensor",), _STUCK + _STILL, optimizer="sgd", lr=50.0),
    _x("xgb_deep_trees", ("tree_depth",), ("overtraining", "overfit"), max_depth=12, min_child_weight=0, rounds=30,
       save_interval=5),
    _x("xgb_lossguide_deep", ("tree_depth",), ("overtraining", "overfit"), seed=1, max_depth=0,
       grow_policy="lossguide", max_leaves=256, min_child_weight=0, rounds=30, save_interval=5),
    _x("xgb_label_leak", ("feature_importance_overweight",), ("overtraining",), leak=True),
    _x("xgb_label_leak_regression", ("feature_importance_overweight",), ("overtraining",), seed=1,
       task="regression", leak=True),
    _x("xgb_class_imbalance", ("class_imbalance",), ("overtraining",), seed=2, imbalance=True),
    _x("xgb_overtraining", ("overtraining",), ("tree_depth",), seed=3, eta=0.5, max_depth=8, rounds=200,
       n=1500),
]

JOBS: dict[str, Job] = {j.name: j for j in HEALTHY + BROKEN}


def _source_hash(framework: str) -> str:
    """The hash of the code a job of `framework` runs (Keras jobs use the PyTorch jobs' data)."""
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    files = {"torch": ["torch_jobs.py"], "keras": ["keras_jobs.py", "torch_jobs.py"], "xgboost": ["xgb_jobs.py"]}
    for f in files[framework]:
        with open(os.path.join(here, f), "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()[:16]


def _trainer(framework: str) -> Any:
    if framework == "torch":
        from bench.corpus.torch_jobs import train
    elif framework == "keras":
        from bench.corpus.keras_jobs import train
    else:
        from bench.corpus.xgb_jobs import train
    return train


def build(name: str, root: str = OUT_ROOT, force: bool = False) -> str:
    """The out_dir of job `name` under `root`, running the job first unless a finished run of the same job
    (same spec, same corpus code) is there."""
    job = JOBS[name]
    out_dir = os.path.join(root, name)
    stamp = os.path.join(root, f"{name}.done.json")
    key = {"spec": job.spec, "framework": job.framework, "code": _source_hash(job.framework)}
    if not force and os.path.exists(stamp):
        with open(stamp, encoding="utf-8") as f:
            if json.load(f) == key:
                return out_dir
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(root, exist_ok=True)
    _trainer(job.framework)(out_dir, **job.spec)
    with open(stamp, "w", encoding="utf-8") as f:
        json.dump(key, f)
    return out_dir


def run_plain(name: str) -> None:
    """Run job `name` with no tensortap code (for `tensortap run`)."""
    job = JOBS[name]
    _trainer(job.framework)(None, **job.spec)
