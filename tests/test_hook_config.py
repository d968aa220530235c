import json

import pytest

from tensortap.config import ReductionConfig, SaveConfig, SaveConfigMode
from tensortap.exceptions import InvalidConfiguration
from tensortap.hook_config import (
    HOOK_PARAMETER_KEYS,
    HookConfig,
    config_path_from_env,
    load_hook_config,
    parse_hook_config,
)
from tensortap.modes import ModeKeys

TRAIN, EVAL, PREDICT, GLOBAL = ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT, ModeKeys.GLOBAL

# The example of spec 4.2 ("one|all" made concrete).
SPEC_EXAMPLE = {
    "LocalPath": "/opt/ml/output/tensors",
    "HookParameters": {
        "save_all": "false",
        "include_regex": "a,b",
        "include_workers": "all",
        "save_interval": "100",
        "save_steps": "1,2,3",
        "start_step": "1",
        "end_step": "1000",
        "train.save_interval": "10",
        "eval.save_steps": "0,5",
        "reductions": "min,max,abs_mean,l2_norm,abs_l1_norm",
        "save_raw_tensor": True,
        "save_shape": False,
        "export_tensorboard": "true",
        "tensorboard_dir": "/tmp/tb",
    },
    "CollectionConfigurations": [
        {
            "CollectionName": "weights",
            "CollectionParameters": {
                "include_regex": "x.*",
                "save_histogram": "false",
                "save_interval": "5",
                "eval.save_interval": "1",
                "reductions": "mean",
            },
        }
    ],
}


def test_spec_example_hook_level():
    cfg = parse_hook_config(SPEC_EXAMPLE)
    assert cfg.out_dir == "/opt/ml/output/tensors"
    sc = cfg.save_config
    assert sc.get_save_config(TRAIN) == SaveConfigMode(10, 1, 1000, [1, 2, 3])
    assert sc.get_save_config(EVAL) == SaveConfigMode(100, 1, 1000, [0, 5])
    assert sc.get_save_config(PREDICT) == SaveConfigMode(100, 1, 1000, [1, 2, 3])
    assert sc.get_save_config(GLOBAL) == SaveConfigMode(100, 1, 1000, [1, 2, 3])
    assert sc.should_save_step(TRAIN, 20) and not sc.should_save_step(TRAIN, 1000)
    assert sc.should_save_step(EVAL, 0) and not sc.should_save_step(EVAL, 1)
    assert cfg.reduction_config == ReductionConfig(
        reductions=["min", "max"], abs_reductions=["mean"], norms=["l2"], abs_norms=["l1"], save_raw_tensor=True
    )
    assert cfg.include_regex == ["a", "b"]
    assert cfg.include_collections == ["weights"]
    assert cfg.save_all is False
    assert cfg.include_workers == "all"
    assert cfg.export_tensorboard is True
    assert cfg.tensorboard_dir == "/tmp/tb"
    assert cfg.dry_run is False


def test_spec_example_collection_level():
    coll = parse_hook_config(SPEC_EXAMPLE).collection_configs["weights"]
    assert coll.name == "weights"
    assert coll.include_regex == ["x.*"]
    assert coll.save_histogram is False
    assert coll.reduction_config == ReductionConfig(["mean"])  # reductions without save_raw_tensor: no raw
    sc = coll.save_config
    # collection keys win over hook-level per-mode values; other hook-level keys are kept
    assert sc.get_save_config(TRAIN) == SaveConfigMode(5, 1, 1000, [1, 2, 3])
    assert sc.get_save_config(EVAL) == SaveConfigMode(1, 1, 1000, [0, 5])
    assert sc.get_save_config(PREDICT) == SaveConfigMode(5, 1, 1000, [1, 2, 3])
    assert sc.get_save_config(GLOBAL) == SaveConfigMode(5, 1, 1000, [1, 2, 3])


def test_hook_kwargs():
    cfg = parse_hook_config(SPEC_EXAMPLE)
    kw = cfg.hook_kwargs()
    assert set(kw) == {
        "out_dir",
        "save_config",
        "reduction_config",
        "include_regex",
        "include_collections",
        "save_all",
        "include_workers",
        "export_tensorboard",
        "tensorboard_dir",
        "dry_run",
    }
    assert kw["save_config"] is cfg.save_config and kw["include_collections"] == ["weights"]
    assert parse_hook_config({"LocalPath": "/x"}).hook_kwargs()["include_collections"] is None


def test_minimal_config_defaults():
    cfg = parse_hook_config({"LocalPath": "/out", "HookParameters": None, "CollectionConfigurations": None})
    assert cfg == HookConfig(out_dir="/out")
    assert cfg.save_config == SaveConfig()
    assert cfg.reduction_config is None and cfg.include_regex is None
    assert cfg.include_collections == [] and cfg.collection_configs == {}
    assert (cfg.save_all, cfg.include_workers, cfg.export_tensorboard, cfg.dry_run) == (False, "one", False, False)


def test_default_save_config_fills_missing_keys():
    d = {
        "LocalPath": "/o",
        "HookParameters": {"start_step": 2},
        "CollectionConfigurations": [{"CollectionName": "metrics"}],
    }
    cfg = parse_hook_config(d, default_save_config={"save_interval": 10, "start_step": 0, "end_step": None})
    assert cfg.save_config == SaveConfig(save_interval=10, start_step=2)
    assert cfg.collection_configs["metrics"].save_config == SaveConfig(save_interval=10, start_step=2)
    assert cfg.collection_configs["metrics"].reduction_config is None


def test_smdebug_bugs_are_fixed():
    d = {
        "LocalPath": "/o",
        "HookParameters": {
            "save_steps": [4, "8"],  # a JSON list
            "predict.save_steps": "1, 2",
            "save_raw_tensor": "false",
            "save_shape": "True",  # read without reductions, as strings
            "dry_run": "true",
        },
        "CollectionConfigurations": [
            {"CollectionName": "grads", "CollectionParameters": {"reductions": "median,l1,abs_l1"}},
            {"CollectionName": "shapes", "CollectionParameters": {"save_shape": True}},
        ],
    }
    cfg = parse_hook_config(d)
    assert cfg.save_config.get_save_config(TRAIN).save_steps == (4, 8)
    assert cfg.save_config.get_save_config(PREDICT).save_steps == (1, 2)
    assert cfg.reduction_config == ReductionConfig(save_raw_tensor=False, save_shape=True)
    assert cfg.dry_run is True
    grads = cfg.collection_configs["grads"]
    assert grads.reduction_config == ReductionConfig(["median"], norms=["l1"], abs_norms=["l1"])
    # without reductions the raw tensor is still saved
    assert cfg.collection_configs["shapes"].reduction_config == ReductionConfig(save_raw_tensor=True, save_shape=True)


def test_top_level_tensorboard_keys_are_read():
    cfg = parse_hook_config({"LocalPath": "/o", "export_tensorboard": True, "tensorboard_dir": "/tb"})
    assert cfg.export_tensorboard is True and cfg.tensorboard_dir == "/tb"


def test_unknown_keys_warn_once_naming_the_key_and_are_ignored(caplog):
    """smdebug ignores keys it does not know (SageMaker's configs carry their own): tensortap warns once per key,
    naming it and the keys it knows, and reads the rest."""
    d = {
        "LocalPath": "/o",
        "S3OutputPath": "s3://bucket/prefix",  # SageMaker's: known, nothing to say
        "ProfilerConfig": {},
        "HookParameters": {"save_intervall": 5, "save_interval": "7", "sagemaker_only": "x"},
        "CollectionConfigurations": [
            {"CollectionName": "weights", "CollectionParameters": {"save_interval": "3", "x": 1},
             "Extra": True},
        ],
    }
    with caplog.at_level("WARNING", logger="tensortap"):
        cfg = parse_hook_config(d)
        parse_hook_config(d)  # (a second read says nothing more)
    assert cfg.save_config.get_save_config(TRAIN).save_interval == 7
    assert cfg.collection_configs["weights"].save_config.get_save_config(TRAIN).save_interval == 3
    warned = [r.getMessage() for r in caplog.records]
    for key in ("'save_intervall'", "'sagemaker_only'", "'ProfilerConfig'", "'x'", "'Extra'"):
        assert sum(key in m for m in warned) == 1, (key, warned)
    assert not any("S3OutputPath" in m.split(" is ignored")[0] for m in warned)
    hp = next(m for m in warned if "save_intervall" in m)
    for key in ("save_interval", "train.save_steps", "reductions", "save_raw_tensor", "include_workers", "dry_run"):
        assert key in hp and key in HOOK_PARAMETER_KEYS


@pytest.mark.parametrize(
    "d, bad",
    [
        ({"HookParameters": {}}, "LocalPath"),
        ({"LocalPath": "/o", "HookParameters": {"include_workers": "some"}}, "some"),
        ({"LocalPath": "/o", "HookParameters": {"save_interval": "0"}}, "0"),
        ({"LocalPath": "/o", "HookParameters": {"train.save_interval": "often"}}, "often"),
        ({"LocalPath": "/o", "HookParameters": {"start_step": 10, "end_step": 5}}, "end_step=5"),
        ({"LocalPath": "/o", "HookParameters": {"save_steps": "1,x"}}, "x"),
        ({"LocalPath": "/o", "HookParameters": {"reductions": "min,avg"}}, "avg"),
        ({"LocalPath": "/o", "HookParameters": {"save_raw_tensor": "perhaps"}}, "perhaps"),
        ({"LocalPath": "/o", "HookParameters": {"save_all": "sometimes"}}, "sometimes"),
        ({"LocalPath": "/o", "CollectionConfigurations": [{"CollectionParameters": {}}]}, "CollectionName"),
        (
            {
                "LocalPath": "/o",
                "CollectionConfigurations": [{"CollectionName": "c", "CollectionParameters": {"include_regex": "("}}],
            },
            "'('",
        ),
        (
            {
                "LocalPath": "/o",
                "CollectionConfigurations": [
                    {"CollectionName": "c", "CollectionParameters": {"save_histogram": "nah"}}
                ],
            },
            "nah",
        ),
    ],
)
def test_bad_hook_configs(d, bad):
    with pytest.raises(InvalidConfiguration) as e:
        parse_hook_config(d)
    assert bad in str(e.value)


# ------------------------------------------------------------------------------------------ files and env


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("TENSORTAP_CONFIG", raising=False)
    monkeypatch.delenv("SMDEBUG_CONFIG_FILE_PATH", raising=False)
    return monkeypatch


def write(path, d):
    path.write_text(json.dumps(d))
    return str(path)


def test_env_lookup_order(no_env, tmp_path):
    assert config_path_from_env() is None
    sm = write(tmp_path / "sm.json", {"LocalPath": "/from-smdebug"})
    tt = write(tmp_path / "tt.json", {"LocalPath": "/from-tensortap"})
    explicit = write(tmp_path / "explicit.json", {"LocalPath": "/explicit"})
    no_env.setenv("SMDEBUG_CONFIG_FILE_PATH", sm)
    assert config_path_from_env() == sm
    assert load_hook_config().out_dir == "/from-smdebug"
    no_env.setenv("TENSORTAP_CONFIG", tt)
    assert config_path_from_env() == tt
    assert load_hook_config().out_dir == "/from-tensortap"
    assert load_hook_config(explicit).out_dir == "/explicit"
    assert load_hook_config(tmp_path / "explicit.json").out_dir == "/explicit"
    no_env.setenv("TENSORTAP_CONFIG", "")  # empty counts as unset
    assert config_path_from_env() == sm


def test_load_spec_example_from_file(no_env, tmp_path):
    path = write(tmp_path / "debughookconfig.json", SPEC_EXAMPLE)
    assert load_hook_config(path) == parse_hook_config(SPEC_EXAMPLE)
    cfg = load_hook_config(path, default_save_config={"save_interval": 10})
    assert cfg.save_config.get_save_config(EVAL).save_interval == 100


def test_missing_file_names_path(no_env, tmp_path):
    missing = str(tmp_path / "nope.json")
    with pytest.raises(FileNotFoundError) as e:
        load_hook_config(missing)
    assert missing in str(e.value) and e.value.filename == missing
    no_env.setenv("TENSORTAP_CONFIG", missing)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_hook_config()


def test_malformed_json_names_file(no_env, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"LocalPath": "/o",')
    with pytest.raises(InvalidConfiguration) as e:
        load_hook_config(str(path))
    assert str(path) in str(e.value) and "JSON" in str(e.value)
    bad_value = write(tmp_path / "bad_value.json", {"LocalPath": "/o", "HookParameters": {"save_interval": -3}})
    with pytest.raises(InvalidConfiguration) as e:
        load_hook_config(bad_value)
    assert bad_value in str(e.value) and "-3" in str(e.value)
    not_object = write(tmp_path / "list.json", [1, 2])
    with pytest.raises(InvalidConfiguration, match="list.json"):
        load_hook_config(not_object)
