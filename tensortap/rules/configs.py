"""What each built-in rule needs the hook to save (the analog of smdebug_rulesconfig's `rule_configs`).

`configs.vanishing_gradient()` etc. return a RuleConfig: the collections (with their regexes, and a save
interval when one is asked for) the rule reads. `RuleConfig.apply(hook)` configures a hook before training
starts; `RuleConfig.collection_configs()` gives SageMaker's CollectionConfigurations form. Each function takes
the rule's own parameters where they decide what to save (`tensor_regex`, `collection_names`, ...), and
`save_interval`: by default None, the hook's own save config decides when the collections save (every 500
steps for the deep-learning hooks, SageMaker's ruleConfigs figure; every 10 rounds for XGBoost, whose jobs
are counted in boosting rounds: an interval of 500 would save round 0 only).

Where SageMaker had no default collection ("–" in the catalog) tensortap picks the obvious one and says so
in the function's docstring.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tensortap.config import DEFAULT_SAVE_INTERVAL as _HOOK_DEFAULT_SAVE_INTERVAL
from tensortap.config import SaveConfig
from tensortap.exceptions import InvalidConfiguration
from tensortap.rules.params import as_int, as_regex_list, as_str_list

__all__ = [
    "CollectionSpec",
    "RuleConfig",
    "config_for",
    "DEFAULT_SAVE_INTERVAL",
    "vanishing_gradient",
    "exploding_tensor",
    "similar_across_runs",
    "weight_update_ratio",
    "all_zero",
    "unchanged_tensor",
    "loss_not_decreasing",
    "confusion",
    "class_imbalance",
    "check_input_images",
    "dead_relu",
    "tree_depth",
    "overfit",
    "overtraining",
    "tensor_variance",
    "poor_weight_initialization",
    "saturated_activation",
    "nlp_sequence_ratio",
    "stalled_training_rule",
    "feature_importance_overweight",
    "loss_spike",
    "grad_norm_spike",
    "rank_divergence",
    "amp_scale_collapse",
]

#: the deep-learning hooks' default save interval (SageMaker's ruleConfigs figure)
DEFAULT_SAVE_INTERVAL = _HOOK_DEFAULT_SAVE_INTERVAL


@dataclass(frozen=True)
class CollectionSpec:
    """One collection a rule reads: its name, regexes to add, and how often to save it (None: as the hook's own
    save config says)."""

    name: str
    include_regex: tuple[str, ...] = ()
    save_interval: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """SageMaker's CollectionConfiguration: {"CollectionName", "CollectionParameters"} (string values)."""
        params: dict[str, str] = {}
        if self.include_regex:
            params["include_regex"] = ",".join(self.include_regex)
        if self.save_interval is not None:
            params["save_interval"] = str(self.save_interval)
        return {"CollectionName": self.name, "CollectionParameters": params}


@dataclass(frozen=True)
class RuleConfig:
    """The collections `rule` needs saved, plus the parameters the config was built for."""

    rule: str
    collections: tuple[CollectionSpec, ...]
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def collection_names(self) -> list[str]:
        return [c.name for c in self.collections]

    def collection_configs(self) -> list[dict[str, Any]]:
        return [c.to_dict() for c in self.collections]

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "parameters": dict(self.parameters),
                "collections_to_save": self.collection_configs()}

    def apply(self, hook: Any) -> None:
        """Make `hook` save what the rule needs: include each collection, add its regexes, and, when the config
        has a `save_interval`, save it at least that often (a more frequent interval already set is kept).
        Call before training starts."""
        for spec in self.collections:
            if spec.name not in hook.include_collections:
                hook.include_collections.append(spec.name)
            coll = hook.get_collection(spec.name)  # also resets the hook's per-step caches
            if spec.include_regex:
                coll.include(list(spec.include_regex))
            if spec.save_interval is not None:
                cur = coll.save_config
                cur_iv = None
                if cur is not None:
                    cur_iv = min(cur.get_save_config(m).save_interval for m in ("TRAIN", "EVAL", "PREDICT",
                                                                                   "GLOBAL"))
                if cur_iv is None or cur_iv > spec.save_interval:
                    coll.save_config = SaveConfig(save_interval=spec.save_interval)


def _iv(save_interval: Any) -> int | None:
    """A save interval asked for, or None: the hook's own save config decides."""
    if save_interval is None:
        return None
    return as_int(save_interval, "save_interval", "rule config", minimum=1)


def _user_collections(rule: str, collection_names: Any, tensor_regex: Any, save_interval: Any,
                      default: Iterable[str]) -> tuple[CollectionSpec, ...]:
    iv = _iv(save_interval)
    names = as_str_list(collection_names, "collection_names", rule)
    regex = as_regex_list(tensor_regex, "tensor_regex", rule)
    specs = [CollectionSpec(n, (), iv) for n in names]
    if regex:
        specs.append(CollectionSpec(rule, tuple(regex), iv))
    if not specs:
        specs = [CollectionSpec(n, (), iv) for n in default]
    return tuple(specs)


def vanishing_gradient(save_interval: int | None = None, **params: Any) -> RuleConfig:
    """`gradients`."""
    return RuleConfig("VanishingGradient", (CollectionSpec("gradients", (), _iv(save_interval)),), params)


def exploding_tensor(collection_names: Any = None, tensor_regex: Any = None,
                     save_interval: int | None = None, **params: Any) -> RuleConfig:
    """The given collections / a collection `exploding_tensor` of `tensor_regex`; by default (tensortap's
    choice) `weights`, `gradients` and `losses`."""
    return RuleConfig("ExplodingTensor", _user_collections("exploding_tensor", collection_names, tensor_regex,
                                                           save_interval, ("weights", "gradients", "losses")),
                      dict(params, collection_names=collection_names, tensor_regex=tensor_regex))


def similar_across_runs(collection_names: Any = None, tensor_regex: Any = None,
                        save_interval: int | None = None, **params: Any) -> RuleConfig:
    """Same in both runs: the given collections / regex; by default (tensortap's choice) `weights`."""
    return RuleConfig("SimilarAcrossRuns", _user_collections("similar_across_runs", collection_names, tensor_regex,
                                                             save_interval, ("weights",)),
                      dict(params, collection_names=collection_names, tensor_regex=tensor_regex))


def weight_update_ratio(save_interval: int | None = None, **params: Any) -> RuleConfig:
    """`weights`."""
    return RuleConfig("WeightUpdateRatio", (CollectionSpec("weights", (), _iv(save_interval)),), params)


def all_zero(collection_names: Any = None, tensor_regex: Any = None, save_interval: int | None = None,
             **params: Any) -> RuleConfig:
    """The given collections / a collection `all_zero` of `tensor_regex` (one is required)."""
    if not as_str_list(collection_names, "collection_names", "AllZero") and \
            not as_regex_list(tensor_regex, "tensor_regex", "AllZero"):
        raise InvalidConfiguration("AllZero: give collection_names or tensor_regex")
    return RuleConfig("AllZero", _user_collections("all_zero", collection_names, tensor_regex, save_interval, ()),
                      dict(params, collection_names=collection_names, tensor_regex=tensor_regex))


def unchanged_tensor(collection_names: Any = None, tensor_regex: Any = None,
                     save_interval: int | None = None, **params: Any) -> RuleConfig:
    """The given collections / regex; by default (tensortap's choice) `weights`."""
    return RuleConfig("UnchangedTensor", _user_collections("unchanged_tensor", collection_names, tensor_regex,
                                                           save_interval, ("weights",)),
                      dict(params, collection_names=collection_names, tensor_regex=tensor_regex))


def loss_not_decreasing(collection_names: Any = None, tensor_regex: Any = None,
                        save_interval: int | None = None, **params: Any) -> RuleConfig:
    """`losses`, plus any given collections / regex."""
    extra = _user_collections("loss_not_decreasing", collection_names, tensor_regex, save_interval, ())
    return RuleConfig("LossNotDecreasing", (CollectionSpec("losses", (), _iv(save_interval)), *extra),
                      dict(params, collection_names=collection_names, tensor_regex=tensor_regex))


def confusion(labels_collection: str = "labels", predictions_collection: str = "predictions",
              save_interval: int | None = None, **params: Any) -> RuleConfig:
    """`labels` and `predictions` (or the named collections)."""
    iv = _iv(save_interval)
    return RuleConfig("Confusion", (CollectionSpec(labels_collection, (), iv),
                                    CollectionSpec(predictions_collection, (), iv)), params)


def class_imbalance(labels_regex: str = ".*labels", predictions_regex: str = ".*predictions",
                    save_interval: int | None = None, **params: Any) -> RuleConfig:
    """`labels` and `predictions`, with the rule's regexes added."""
    iv = _iv(save_interval)
    return RuleConfig("ClassImbalance", (
        CollectionSpec("labels", tuple(as_regex_list(labels_regex, "labels_regex", "ClassImbalance")), iv),
        CollectionSpec("predictions", tuple(as_regex_list(predictions_regex, "predictions_regex",
                                                          "ClassImbalance")), iv)),
        dict(params, labels_regex=labels_regex, predictions_regex=predictions_regex))


def check_input_images(regex: Any = ".*hybridsequential0_input_0", save_interval: int | None = None,
                       **params: Any) -> RuleConfig:
    """`input_image` of `regex` (the default: the model's input in MXNet, PyTorch and Keras naming)."""
    from tensortap.rules.builtin.check_input_images import input_regex

    regex_list = input_regex(regex)
    return RuleConfig("CheckInputImages", (CollectionSpec("input_image", tuple(regex_list), _iv(save_interval)),),
                      dict(params, regex=regex))


def dead_relu(tensor_regex: Any = None, save_interval: int | None = None, **params: Any) -> RuleConfig:
    """`relu_output` (framework hooks fill it with the outputs of their ReLU layers, by layer type), with
    `tensor_regex` (default `.*relu_output`, smdebug's) added."""
    regex = as_regex_list(tensor_regex, "tensor_regex", "DeadRelu") or [".*relu_output"]
    return RuleConfig("DeadRelu", (CollectionSpec("relu_output", tuple(regex), _iv(save_interval)),),
                      dict(params, tensor_regex=tensor_regex))


def tree_depth(save_interval: int | None = None, **params: Any) -> RuleConfig:
    """`trees` (XGBoost)."""
    return RuleConfig("TreeDepth", (CollectionSpec("trees", (), _iv(save_interval)),), params)


def overfit(tensor_regex: Any = None, save_interval: int | None = None, **params: Any) -> RuleConfig:
    """`losses` (or a collection `overfit` of `tensor_regex`), in TRAIN and EVAL."""
    regex = as_regex_list(tensor_regex, "tensor_regex", "Overfit")
    spec = CollectionSpec("overfit", tuple(regex), _iv(save_interval)) if regex else \
        CollectionSpec("losses", (), _iv(save_interval))
    return RuleConfig("Overfit", (spec,), dict(params, tensor_regex=tensor_regex))


def overtraining(save_interval: int | None = None, **params: Any) -> RuleConfig:
    """`losses`, in TRAIN and EVAL."""
    return RuleConfig("Overtraining", (CollectionSpec("losses", (), _iv(save_interval)),), params)


def tensor_variance(collection_names: Any = None, tensor_regex: Any = None,
                    save_interval: int | None = None, **params: Any) -> RuleConfig:
    """The given collections / regex; by default (tensortap's choice) `weights` and `gradients`."""
    return RuleConfig("TensorVariance", _user_collections("tensor_variance", collection_names, tensor_regex,
                                                          save_interval, ("weights", "gradients")),
                      dict(params, collection_names=collection_names, tensor_regex=tensor_regex))


def poor_weight_initialization(activation_inputs_regex: Any = ".*relu_input",
                               save_interval: int | None = None, **params: Any) -> RuleConfig:
    """`relu_input` of `activation_inputs_regex`, plus `gradients` and `losses` (the rule judges all three)."""
    iv = _iv(save_interval)
    regex = as_regex_list(activation_inputs_regex, "activation_inputs_regex", "PoorWeightInitialization")
    return RuleConfig("PoorWeightInitialization", (CollectionSpec("relu_input", tuple(regex), iv),
                                                   CollectionSpec("gradients", (), iv),
                                                   CollectionSpec("losses", (), iv)),
                      dict(params, activation_inputs_regex=activation_inputs_regex))


def saturated_activation(collection_names: Any = None, tensor_regex: Any = ".*tanh_input|.*sigmoid_input",
                         save_interval: int | None = None, **params: Any) -> RuleConfig:
    """The given collections, plus `tanh_input` / `sigmoid_input` (filled by layer type; a collection
    `saturated_activation` for a custom regex)."""
    iv = _iv(save_interval)
    names = as_str_list(collection_names, "collection_names", "SaturatedActivation")
    regex = as_regex_list(tensor_regex, "tensor_regex", "SaturatedActivation")
    specs = [CollectionSpec(n, (), iv) for n in names]
    specs += [CollectionSpec("tanh_input", (".*tanh_input",), iv),
              CollectionSpec("sigmoid_input", (".*sigmoid_input",), iv)]
    if regex and regex != [".*tanh_input|.*sigmoid_input"]:
        specs.append(CollectionSpec("saturated_activation", tuple(regex), iv))
    return RuleConfig("SaturatedActivation", tuple(specs),
                      dict(params, collection_names=collection_names, tensor_regex=tensor_regex))


def nlp_sequence_ratio(tensor_regex: Any = ".*embedding0_input_0", save_interval: int | None = None,
                       **params: Any) -> RuleConfig:
    """`input_sequence` of `tensor_regex` (the default: the embedding's input in MXNet, PyTorch and Keras
    naming)."""
    from tensortap.rules.builtin.nlp_sequence_ratio import sequence_regex

    regex = sequence_regex(tensor_regex)
    return RuleConfig("NLPSequenceRatio", (CollectionSpec("input_sequence", tuple(regex), _iv(save_interval)),),
                      dict(params, tensor_regex=tensor_regex))


def stalled_training_rule(**params: Any) -> RuleConfig:
    """Nothing in particular: any saved data (or finished step) counts as progress."""
    return RuleConfig("StalledTrainingRule", (), params)


def feature_importance_overweight(save_interval: int | None = None, **params: Any) -> RuleConfig:
    """`feature_importance` (XGBoost)."""
    return RuleConfig("FeatureImportanceOverweight",
                      (CollectionSpec("feature_importance", (), _iv(save_interval)),), params)


def loss_spike(tensor_regex: Any = None, save_interval: int | None = None, **params: Any) -> RuleConfig:
    """`losses` (or a collection `loss_spike` of `tensor_regex`), and `gradients`: a spike's message names the
    layers whose gradient norm moved first."""
    iv = _iv(save_interval)
    regex = as_regex_list(tensor_regex, "tensor_regex", "LossSpike")
    spec = CollectionSpec("loss_spike", tuple(regex), iv) if regex else CollectionSpec("losses", (), iv)
    return RuleConfig("LossSpike", (spec, CollectionSpec("gradients", (), iv)), dict(params, tensor_regex=tensor_regex))


def grad_norm_spike(collection_name: str = "gradients", save_interval: int | None = None, **params: Any
                    ) -> RuleConfig:
    """`gradients` (or the named collection)."""
    return RuleConfig("GradNormSpike", (CollectionSpec(collection_name, (), _iv(save_interval)),),
                      dict(params, collection_name=collection_name))


def rank_divergence(tensor_regex: Any = None, save_interval: int | None = None, **params: Any) -> RuleConfig:
    """`losses` (or a collection `rank_divergence` of `tensor_regex`) and `gradients`, on every worker."""
    iv = _iv(save_interval)
    regex = as_regex_list(tensor_regex, "tensor_regex", "RankDivergence")
    spec = CollectionSpec("rank_divergence", tuple(regex), iv) if regex else CollectionSpec("losses", (), iv)
    return RuleConfig("RankDivergence", (spec, CollectionSpec("gradients", (), iv)),
                      dict(params, tensor_regex=tensor_regex))


def amp_scale_collapse(save_interval: int | None = None, **params: Any) -> RuleConfig:
    """`grad_scaler` (PyTorch, with `hook.register_scaler(scaler)`): skipped steps are saved whatever the
    interval, the scale at saving steps."""
    return RuleConfig("AmpScaleCollapse", (CollectionSpec("grad_scaler", (), _iv(save_interval)),), params)


def config_for(rule: str | type, **params: Any) -> RuleConfig:
    """The RuleConfig of a built-in rule given by class, class name or snake_case name, for its parameters
    (those that do not decide what to save are kept in `parameters` only)."""
    from tensortap.rules.builtin import get_rule, snake_name

    cls = rule if isinstance(rule, type) else get_rule(rule)
    fn = globals()[snake_name(cls)]
    return fn(**params)
