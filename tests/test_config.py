import copy
import dataclasses
import json
import pickle

import pytest

from tensortap.config import ReductionConfig, SaveConfig, SaveConfigMode, parse_bool, parse_int
from tensortap.exceptions import InvalidConfiguration
from tensortap.modes import ModeKeys

ALL_MODES = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT, ModeKeys.GLOBAL)


def saved(cfg, steps=range(0, 1001)):
    return [s for s in steps if cfg.should_save_step(s)]


# ------------------------------------------------------------------------------------------ SaveConfigMode


def test_save_config_mode_defaults():
    m = SaveConfigMode()
    assert (m.save_interval, m.start_step, m.end_step, m.save_steps) == (500, 0, None, ())
    assert saved(m) == [0, 500, 1000]


def test_modulo_is_on_absolute_step():
    m = SaveConfigMode(save_interval=100, start_step=150)
    assert saved(m, range(0, 401)) == [200, 300, 400]


def test_end_step_is_exclusive():
    m = SaveConfigMode(save_interval=10, start_step=0, end_step=30)
    assert saved(m, range(0, 100)) == [0, 10, 20]
    assert not m.should_save_step(30)


def test_save_steps_are_saved_outside_the_range():
    m = SaveConfigMode(save_interval=100, start_step=10, end_step=20, save_steps=[3, 7, 555])
    assert saved(m) == [3, 7, 555]


def test_end_step_equal_to_start_disables_interval_saves():
    m = SaveConfigMode(save_interval=1, end_step=0)
    assert saved(m, range(50)) == []


def test_string_values_are_accepted():
    m = SaveConfigMode(save_interval="10", start_step=" 5 ", end_step="40", save_steps="1, 2,3")
    assert m == SaveConfigMode(10, 5, 40, [1, 2, 3])
    assert m.save_steps == (1, 2, 3)
    assert SaveConfigMode(save_steps=["4", 2]).save_steps == (2, 4)


def test_save_config_mode_is_immutable_and_hashable():
    m = SaveConfigMode(10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.save_interval = 3
    assert hash(m) == hash(SaveConfigMode("10"))
    assert len({m, SaveConfigMode(10), SaveConfigMode(20)}) == 2
    assert "save_interval=10" in repr(m)
    assert pickle.loads(pickle.dumps(SaveConfigMode(save_steps=[5]))).should_save_step(5)


def test_save_config_mode_json_round_trip():
    m = SaveConfigMode(7, 3, 99, [1, 2])
    d = m.to_json_dict()
    assert d == {"save_interval": 7, "save_steps": [1, 2], "start_step": 3, "end_step": 99}
    assert SaveConfigMode.from_dict(json.loads(json.dumps(d))) == m
    assert SaveConfigMode.from_dict({"start_step": 4}, {"save_interval": 10}) == SaveConfigMode(10, 4)


@pytest.mark.parametrize(
    "kwargs, bad",
    [
        ({"save_interval": 0}, "0"),
        ({"save_interval": -5}, "-5"),
        ({"save_interval": "ten"}, "ten"),
        ({"save_interval": True}, "True"),
        ({"save_interval": 2.5}, "2.5"),
        ({"start_step": -1}, "-1"),
        ({"start_step": "x1"}, "x1"),
        ({"start_step": 10, "end_step": 5}, "5"),
        ({"end_step": False}, "False"),
        ({"save_steps": "1,two"}, "two"),
        ({"save_steps": [1, -3]}, "-3"),
        ({"save_steps": [True]}, "True"),
        ({"save_steps": 3.5}, "3.5"),
    ],
)
def test_bad_save_config_mode_values(kwargs, bad):
    with pytest.raises(InvalidConfiguration) as e:
        SaveConfigMode(**kwargs)
    assert bad in str(e.value)


def test_save_config_mode_from_dict_unknown_key():
    with pytest.raises(InvalidConfiguration, match="save_intervall"):
        SaveConfigMode.from_dict({"save_intervall": 3})


# ------------------------------------------------------------------------------------------ SaveConfig


def test_save_config_same_for_all_modes():
    sc = SaveConfig(save_interval=10, start_step=5)
    for mode in ALL_MODES:
        assert sc.get_save_config(mode) == SaveConfigMode(10, 5)
    assert sc.should_save_step(ModeKeys.EVAL, 10)
    assert not sc.should_save_step("train", 5)
    assert sc.is_complete()


def test_save_config_per_mode_and_missing_modes():
    sc = SaveConfig({ModeKeys.TRAIN: SaveConfigMode(2), "eval": {"save_interval": "3"}})
    assert sc.get_save_config(ModeKeys.TRAIN).save_interval == 2
    assert sc.get_save_config("EVAL").save_interval == 3
    assert sc.mode_save_configs[ModeKeys.PREDICT] is None
    assert not sc.is_complete()
    # a mode left None behaves as the default
    assert sc.get_save_config(ModeKeys.PREDICT) == SaveConfigMode()
    assert sc.should_save_step(ModeKeys.TRAIN, 4) and not sc.should_save_step(ModeKeys.TRAIN, 3)
    assert sc.should_save_step(ModeKeys.EVAL, 3) and not sc.should_save_step(ModeKeys.EVAL, 4)


def test_merge_default():
    sc = SaveConfig({ModeKeys.TRAIN: SaveConfigMode(2)})
    default = SaveConfig({ModeKeys.EVAL: SaveConfigMode(7), ModeKeys.TRAIN: SaveConfigMode(99)})
    merged = sc.merge_default(default)
    assert merged.is_complete()
    assert merged.get_save_config(ModeKeys.TRAIN).save_interval == 2  # own value wins
    assert merged.get_save_config(ModeKeys.EVAL).save_interval == 7
    assert merged.mode_save_configs[ModeKeys.PREDICT] == SaveConfigMode()
    assert sc.mode_save_configs[ModeKeys.EVAL] is None  # the original is unchanged
    assert sc.merge_default(None).get_save_config(ModeKeys.GLOBAL) == SaveConfigMode()


def test_save_config_json_round_trip():
    sc = SaveConfig({"train": SaveConfigMode(2, save_steps=[1]), ModeKeys.GLOBAL: SaveConfigMode(5, 0, 50)})
    d = sc.to_json_dict()
    assert d == {
        "TRAIN": {"save_interval": 2, "save_steps": [1], "start_step": 0, "end_step": None},
        "EVAL": None,
        "PREDICT": None,
        "GLOBAL": {"save_interval": 5, "save_steps": [], "start_step": 0, "end_step": 50},
    }
    back = SaveConfig.from_dict(json.loads(json.dumps(d)))
    assert back == sc and hash(back) == hash(sc)
    assert SaveConfig.from_json(sc.to_json()) == sc
    assert SaveConfig.from_dict({ModeKeys.EVAL: SaveConfigMode(4), "TRAIN": None}).get_save_config("eval") == (
        SaveConfigMode(4)
    )


def test_save_config_is_immutable_and_picklable():
    sc = SaveConfig(save_interval=3)
    with pytest.raises(AttributeError):
        sc.foo = 1
    sc.mode_save_configs[ModeKeys.TRAIN] = None  # a copy
    assert sc.get_save_config(ModeKeys.TRAIN).save_interval == 3
    assert pickle.loads(pickle.dumps(sc)) == sc
    assert copy.deepcopy(sc) == sc


def test_coerce():
    assert SaveConfig.coerce(None) == SaveConfig()
    sc = SaveConfig(save_interval=4)
    assert SaveConfig.coerce(sc) is sc
    assert SaveConfig.coerce(SaveConfigMode(4)) == sc
    assert SaveConfig.coerce({"save_interval": 4}) == sc
    per_mode = SaveConfig.coerce({ModeKeys.TRAIN: {"save_interval": 9}})
    assert per_mode.get_save_config(ModeKeys.TRAIN).save_interval == 9
    assert per_mode.mode_save_configs[ModeKeys.EVAL] is None
    with pytest.raises(InvalidConfiguration, match="42"):
        SaveConfig.coerce(42)


@pytest.mark.parametrize(
    "args, bad",
    [
        ({"mode_save_configs": {"TRAINING": {}}}, "TRAINING"),
        ({"mode_save_configs": {"train": 5}}, "5"),
        ({"mode_save_configs": {"train": {"save_interval": -1}}}, "-1"),
        ({"mode_save_configs": {"train": {}, ModeKeys.TRAIN: {}}}, "TRAIN"),
        ({"mode_save_configs": [1, 2]}, "list"),
        ({"mode_save_configs": {}, "save_interval": 3}, "save_interval"),
        ({"save_interval": "abc"}, "abc"),
    ],
)
def test_bad_save_config(args, bad):
    with pytest.raises(InvalidConfiguration) as e:
        SaveConfig(**args)
    assert bad in str(e.value)


# ------------------------------------------------------------------------------------------ ReductionConfig


def test_reduction_config_fields_and_requested():
    rc = ReductionConfig(
        reductions=["min", "max", "median", "min"], abs_reductions="mean", norms=["l1"], abs_norms="l2_norm"
    )
    assert rc.reductions == ("min", "max", "median")
    assert rc.abs_reductions == ("mean",)
    assert rc.norms == ("l1",)
    assert rc.abs_norms == ("l2",)
    assert rc.requested() == [
        ("min", False),
        ("max", False),
        ("median", False),
        ("l1", False),
        ("mean", True),
        ("l2", True),
    ]
    assert not rc.save_raw_tensor and not rc.save_shape


def test_reduction_config_from_string():
    rc = ReductionConfig.from_string("min,abs_mean,l2_norm,abs_l1_norm")
    assert rc == ReductionConfig(reductions=["min"], abs_reductions=["mean"], norms=["l2"], abs_norms=["l1"])
    # smdebug rejects these although its docs list them
    rc = ReductionConfig.from_string("median, l1, abs_l1, abs_l2, l2")
    assert rc.reductions == ("median",)
    assert rc.norms == ("l1", "l2")
    assert rc.abs_norms == ("l1", "l2")
    assert ReductionConfig.from_string("") == ReductionConfig()
    assert ReductionConfig.from_string("mean", save_raw_tensor=True).save_raw_tensor


def test_reduction_config_json_round_trip():
    rc = ReductionConfig(["mean"], ["max"], ["l1"], ["l2"], save_raw_tensor=True, save_shape=True)
    d = rc.to_json_dict()
    assert d == {"save_raw_tensor": True, "reductions": "mean,l1_norm,abs_max,abs_l2_norm", "save_shape": True}
    assert ReductionConfig.from_dict(json.loads(json.dumps(d))) == rc
    assert ReductionConfig.from_json(rc.to_json()) == rc
    assert ReductionConfig.from_dict({"reductions": "", "save_raw_tensor": "true"}) == ReductionConfig(
        save_raw_tensor=True
    )
    assert ReductionConfig.from_dict({"reductions": ["min", "abs_l1_norm"]}) == ReductionConfig(
        ["min"], abs_norms=["l1"]
    )


def test_reduction_config_immutable_hashable():
    rc = ReductionConfig(["min"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        rc.save_raw_tensor = True
    assert hash(rc) == hash(ReductionConfig("min"))
    assert rc != ReductionConfig(["min"], save_shape=True)


@pytest.mark.parametrize(
    "kwargs, bad",
    [
        ({"reductions": ["mode"]}, "mode"),
        ({"reductions": ["l1"]}, "l1"),
        ({"abs_reductions": "avg"}, "avg"),
        ({"norms": ["l3"]}, "l3"),
        ({"abs_norms": ["inf"]}, "inf"),
        ({"reductions": [3]}, "3"),
        ({"reductions": 5}, "5"),
        ({"save_raw_tensor": "yes"}, "yes"),
        ({"save_raw_tensor": 1}, "1"),
        ({"save_shape": None}, "None"),
    ],
)
def test_bad_reduction_config(kwargs, bad):
    with pytest.raises(InvalidConfiguration) as e:
        ReductionConfig(**kwargs)
    assert bad in str(e.value)


@pytest.mark.parametrize("s", ["min,foo", "abs_l3_norm", "abs_bar", "l5_norm"])
def test_bad_reduction_string(s):
    with pytest.raises(InvalidConfiguration) as e:
        ReductionConfig.from_string(s)
    assert s.split(",")[-1] in str(e.value)
    assert "median" in str(e.value)  # lists what is allowed


def test_reduction_from_dict_bad_values():
    with pytest.raises(InvalidConfiguration, match="maybe"):
        ReductionConfig.from_dict({"save_raw_tensor": "maybe"})
    with pytest.raises(InvalidConfiguration, match="reduction"):
        ReductionConfig.from_dict({"reduction": "min"})


def test_parse_helpers():
    assert parse_int(" 12 ", "x") == 12
    assert parse_bool("False", "x") is False and parse_bool("TRUE", "x") is True
    with pytest.raises(InvalidConfiguration, match="'nope'"):
        parse_bool("nope", "flag")
    with pytest.raises(InvalidConfiguration, match="flag"):
        parse_int(None, "flag")
