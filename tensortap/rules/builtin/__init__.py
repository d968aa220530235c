"""Built-in rules, open and runnable on any trial: SageMaker Debugger's twenty (same class names, parameter
names and defaults) and tensortap's own (LossSpike, GradNormSpike, RankDivergence, AmpScaleCollapse).
`RULES` maps each class name and its snake_case name to the class; `get_rule(name)` looks one up by either
(case-insensitive); `describe_rules()` lists names, descriptions and parameters."""

from __future__ import annotations

import inspect
import re
from typing import Any

from tensortap.exceptions import InvalidConfiguration
from tensortap.rules.builtin.all_zero import AllZero
from tensortap.rules.builtin.amp_scale_collapse import AmpScaleCollapse
from tensortap.rules.builtin.check_input_images import CheckInputImages
from tensortap.rules.builtin.class_imbalance import ClassImbalance
from tensortap.rules.builtin.confusion import Confusion
from tensortap.rules.builtin.dead_relu import DeadRelu
from tensortap.rules.builtin.exploding_tensor import ExplodingTensor
from tensortap.rules.builtin.feature_importance_overweight import FeatureImportanceOverweight
from tensortap.rules.builtin.grad_norm_spike import GradNormSpike
from tensortap.rules.builtin.loss_not_decreasing import LossNotDecreasing
from tensortap.rules.builtin.loss_spike import LossSpike
from tensortap.rules.builtin.nlp_sequence_ratio import NLPSequenceRatio
from tensortap.rules.builtin.overfit import Overfit
from tensortap.rules.builtin.overtraining import Overtraining
from tensortap.rules.builtin.poor_weight_initialization import PoorWeightInitialization
from tensortap.rules.builtin.rank_divergence import RankDivergence
from tensortap.rules.builtin.saturated_activation import SaturatedActivation
from tensortap.rules.builtin.similar_across_runs import SimilarAcrossRuns
from tensortap.rules.builtin.stalled_training import StalledTrainingRule
from tensortap.rules.builtin.tensor_variance import TensorVariance
from tensortap.rules.builtin.tree_depth import TreeDepth
from tensortap.rules.builtin.unchanged_tensor import UnchangedTensor
from tensortap.rules.builtin.vanishing_gradient import VanishingGradient
from tensortap.rules.builtin.weight_update_ratio import WeightUpdateRatio
from tensortap.rules.rule import Rule

__all__ = [
    "VanishingGradient",
    "ExplodingTensor",
    "SimilarAcrossRuns",
    "WeightUpdateRatio",
    "AllZero",
    "UnchangedTensor",
    "LossNotDecreasing",
    "Confusion",
    "ClassImbalance",
    "CheckInputImages",
    "DeadRelu",
    "TreeDepth",
    "Overfit",
    "Overtraining",
    "TensorVariance",
    "PoorWeightInitialization",
    "SaturatedActivation",
    "NLPSequenceRatio",
    "StalledTrainingRule",
    "FeatureImportanceOverweight",
    "LossSpike",
    "GradNormSpike",
    "RankDivergence",
    "AmpScaleCollapse",
    "BUILTIN_RULES",
    "RULES",
    "snake_name",
    "get_rule",
    "describe_rules",
]

#: every built-in rule class, in the catalog's order
BUILTIN_RULES: tuple[type[Rule], ...] = (
    VanishingGradient, ExplodingTensor, SimilarAcrossRuns, WeightUpdateRatio, AllZero, UnchangedTensor,
    LossNotDecreasing, Confusion, ClassImbalance, CheckInputImages, DeadRelu, TreeDepth, Overfit, Overtraining,
    TensorVariance, PoorWeightInitialization, SaturatedActivation, NLPSequenceRatio, StalledTrainingRule,
    FeatureImportanceOverweight, LossSpike, GradNormSpike, RankDivergence, AmpScaleCollapse,
)

#: rules that inspect deep-learning tensors (the others need XGBoost data, a second trial, or wall time)
DEEP_LEARNING_RULES: tuple[type[Rule], ...] = tuple(
    r for r in BUILTIN_RULES if r not in (TreeDepth, FeatureImportanceOverweight, StalledTrainingRule)
)


def snake_name(cls_or_name: type | str) -> str:
    """VanishingGradient → vanishing_gradient, NLPSequenceRatio → nlp_sequence_ratio,
    StalledTrainingRule → stalled_training_rule."""
    name = cls_or_name if isinstance(cls_or_name, str) else cls_or_name.__name__
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return s.lower()


RULES: dict[str, type[Rule]] = {}
for _cls in BUILTIN_RULES:
    RULES[_cls.__name__] = _cls
    RULES[snake_name(_cls)] = _cls
RULES["stalled_training"] = StalledTrainingRule

_LOOKUP = {k.lower().replace("_", "").replace("-", ""): v for k, v in RULES.items()}


def get_rule(name: str) -> type[Rule]:
    """The built-in rule class named `name`: class name or snake_case, any case ('VanishingGradient',
    'vanishing_gradient', 'vanishinggradient')."""
    cls = _LOOKUP.get(str(name).strip().lower().replace("_", "").replace("-", ""))
    if cls is None:
        raise InvalidConfiguration(
            f"no built-in rule {name!r}; known: {', '.join(snake_name(c) for c in BUILTIN_RULES)}"
        )
    return cls


def describe_rules() -> list[dict[str, Any]]:
    """[{name, snake_name, description, compares, parameters: [{name, default, required}], collections}] of
    every built-in rule (`compares`: what the rule compares, in a phrase); `collections` are those its default
    configuration reads (tensortap.rules.configs; empty where the user must name them, e.g. AllZero)."""
    from tensortap.rules.configs import config_for

    out = []
    for cls in BUILTIN_RULES:
        try:
            colls = config_for(cls).collection_names
        except InvalidConfiguration:
            colls = []
        params = []
        for pname, default in cls.parameters():
            required = default is inspect.Parameter.empty
            params.append({"name": pname, "default": None if required else default, "required": required})
        out.append({"name": cls.__name__, "snake_name": snake_name(cls), "description": cls.description,
                    "compares": cls.compares, "parameters": params, "collections": colls})
    return out
