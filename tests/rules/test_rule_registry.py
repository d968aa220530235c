"""The built-in rule registry, introspection for `tensortap rules list`, and the rule configs."""

import inspect

import numpy as np
import pytest

import tensortap as tt
from tensortap.exceptions import InvalidConfiguration
from tensortap.rules import Rule, configs, invoke_rule
from tensortap.rules.builtin import BUILTIN_RULES, RULES, VanishingGradient, describe_rules, get_rule, snake_name

# smdebug's parameter names, with tensortap's defaults (calibrated on bench/corpus, docs/rules.md says where and
# why they differ from smdebug's) and the parameters tensortap adds
CATALOG = {
    "VanishingGradient": {"threshold": 1e-7},
    "ExplodingTensor": {"collection_names": None, "tensor_regex": None, "only_nan": False},
    "SimilarAcrossRuns": {"other_trials": inspect.Parameter.empty, "collection_names": None, "tensor_regex": None},
    "WeightUpdateRatio": {"num_steps": None, "large_threshold": 10.0, "small_threshold": 1e-8, "epsilon": 1e-9},
    "AllZero": {"collection_names": None, "tensor_regex": None, "threshold": 100},
    "UnchangedTensor": {"collection_names": None, "tensor_regex": None, "num_steps": 3, "rtol": 1e-5,
                        "atol": 1e-8, "equal_nan": False},
    "LossNotDecreasing": {"collection_names": None, "tensor_regex": None, "use_losses_collection": True,
                          "num_steps": 10, "diff_percent": 0.0, "mode": None, "window": 5,
                          "min_drop_percent": 10.0},
    "Confusion": {"category_no": None, "labels": "labels", "predictions": "predictions",
                  "labels_collection": "labels", "predictions_collection": "predictions", "min_diag": 0.5,
                  "max_off_diag": 0.5, "samples": 500},
    "ClassImbalance": {"threshold_imbalance": 10, "threshold_misprediction": 0.7, "samples": 500, "argmax": False,
                       "labels_regex": ".*labels", "predictions_regex": ".*predictions"},
    "CheckInputImages": {"threshold_mean": 0.2, "threshold_samples": 500, "regex": ".*hybridsequential0_input_0",
                         "channel": 1},
    "DeadRelu": {"tensor_regex": None, "threshold_inactivity": 1.0, "threshold_layer": 50.0},
    "TreeDepth": {"depth": 6},
    "Overfit": {"tensor_regex": None, "start_step": 0, "patience": 2, "ratio_threshold": 0.1, "train_window": 10,
                "min_evaluations": 3},
    "Overtraining": {"patience_train": 40, "patience_validation": 10, "delta": 0.0, "window": 5},
    "TensorVariance": {"collection_names": None, "tensor_regex": None, "max_threshold": None, "min_threshold": None},
    "PoorWeightInitialization": {"activation_inputs_regex": ".*relu_input", "threshold": 1000.0,
                                 "distribution_range": 0.001, "patience": 5, "steps": 10},
    "SaturatedActivation": {"collection_names": None, "tensor_regex": ".*tanh_input|.*sigmoid_input",
                            "threshold_tanh": (-9.4999, 9.4999), "threshold_sigmoid": (-23, 16.99999),
                            "threshold_inactivity": 1.0, "threshold_layer": 50.0},
    "NLPSequenceRatio": {"tensor_regex": ".*embedding0_input_0", "token_values": "0",
                         "token_thresholds_percent": "50"},
    "StalledTrainingRule": {"threshold": 1800, "stop_training_on_fire": False, "training_job_name_prefix": None},
    "FeatureImportanceOverweight": {"threshold": 0.8, "nfeatures": 3,
                                    "tensor_regex": ".*feature_importance/weight", "min_round": 20},
    # tensortap's own (docs/rules.md)
    "LossSpike": {"tensor_regex": None, "mode": None, "window": 50, "z_threshold": 6.0, "min_ratio": 2.0,
                  "max_factor": 10.0, "min_history": 10},
    "GradNormSpike": {"collection_name": "gradients", "window": 50, "z_threshold": 6.0, "min_ratio": 2.0,
                      "max_factor": 10.0, "min_history": 10},
    "RankDivergence": {"tensor_regex": None, "ratio_threshold": 2.0, "window": 5},
    "AmpScaleCollapse": {"consecutive_skips": 10, "min_scale": 1.0},
}


def test_catalog_names_parameters_and_defaults():
    assert [c.__name__ for c in BUILTIN_RULES] == list(CATALOG)
    for cls in BUILTIN_RULES:
        assert issubclass(cls, Rule)
        assert dict(cls.parameters()) == CATALOG[cls.__name__], cls.__name__
        assert cls.description and "\n" not in cls.description
        assert cls.compares and "\n" not in cls.compares, cls.__name__  # what `rules list` says it compares


def test_lookup_by_any_name():
    assert get_rule("vanishing_gradient") is get_rule("VanishingGradient") is get_rule("VANISHINGGRADIENT")
    assert snake_name("NLPSequenceRatio") == "nlp_sequence_ratio"
    assert RULES["stalled_training_rule"] is RULES["stalled_training"] is get_rule("StalledTrainingRule")
    with pytest.raises(InvalidConfiguration, match="vanishing_gradient"):
        get_rule("nope")
    listing = describe_rules()
    assert len(listing) == 24 and listing[0]["parameters"] == [
        {"name": "threshold", "default": 1e-7, "required": False}]
    lnd = next(r for r in listing if r["name"] == "LossNotDecreasing")
    assert "median of the last `window` saved losses" in lnd["compares"]


def test_every_rule_has_a_config():
    for cls in BUILTIN_RULES:
        if cls.__name__ == "AllZero":
            with pytest.raises(InvalidConfiguration):
                configs.config_for(cls)
            cfg = configs.config_for(cls, tensor_regex="relu")
        else:
            cfg = configs.config_for(cls)
        assert cfg.rule == cls.__name__
        d = cfg.to_dict()
        assert all(set(c) == {"CollectionName", "CollectionParameters"} for c in d["collections_to_save"])
    # no save interval unless asked for: the hook's own save config decides (e.g. XGBoost's every 10 rounds)
    assert configs.vanishing_gradient().collection_configs() == [
        {"CollectionName": "gradients", "CollectionParameters": {}}]
    assert configs.vanishing_gradient(save_interval=500).collection_configs() == [
        {"CollectionName": "gradients", "CollectionParameters": {"save_interval": "500"}}]
    assert configs.dead_relu().collections[0].include_regex == (".*relu_output",)


def test_config_configures_a_hook(tmp_path):
    out = str(tmp_path / "job")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1000))
    configs.vanishing_gradient().apply(hook)
    configs.vanishing_gradient(save_interval=250).apply(hook)
    configs.vanishing_gradient(save_interval=700).apply(hook)  # the more frequent interval is kept
    assert "gradients" in hook.include_collections
    for s in range(1001):
        hook.next_step()
        hook.save_tensor("gradient/w", np.full(3, 1e-9 if s >= 600 else 1.0), "gradients")
    hook.close()
    trial = tt.create_trial(out)
    assert trial.tensor("gradient/w").steps() == [0, 250, 500, 750, 1000]
    rep = invoke_rule(VanishingGradient(trial), stop_at_job_end=True)
    assert rep.fired_steps == [750, 1000] and rep.steps_evaluated == 5


def test_rules_list_says_what_each_rule_compares_and_its_defaults(capsys):
    from tensortap.cli.main import main

    assert main(["rules", "list"]) == 0
    out = capsys.readouterr().out
    assert "compares: the median of the last `window` saved losses" in out
    assert "min_drop_percent=10.0" in out and "depth=6" in out
