"""Rule parameters arrive as strings (JSON, CLI): parsed, with clear errors."""

import pytest

from tensortap import modes
from tensortap.exceptions import InvalidConfiguration
from tensortap.rules import params as P
from tensortap.rules.builtin import LossNotDecreasing, SaturatedActivation, WeightUpdateRatio


def test_parsers():
    assert P.as_float("1e-7", "x") == 1e-7 and P.as_float(3, "x") == 3.0
    assert P.as_float("None", "x", optional=True) is None
    assert P.as_int("10", "n") == 10 and P.as_int("10.0", "n") == 10 and P.as_int(4.0, "n") == 4
    assert P.as_bool("TRUE", "b") is True and P.as_bool("false", "b") is False and P.as_bool(0, "b") is False
    assert P.as_str_list("a, b,,c", "l") == ["a", "b", "c"] and P.as_str_list(None, "l") == []
    assert P.as_regex_list("a{1,3}, b", "r") == ["a{1,3}", "b"]
    assert P.as_float_pair("(-9.5, 9.5)", "p") == (-9.5, 9.5) and P.as_float_pair([-1, 2], "p") == (-1.0, 2.0)
    assert P.as_int_list("0,1", "t") == [0, 1] and P.as_float_list("50", "t") == [50.0]
    assert P.as_mode("eval", "m") == modes.EVAL and P.as_mode(None, "m") is None


@pytest.mark.parametrize("call, match", [
    (lambda: P.as_float("abc", "threshold", "R"), r"R: threshold='abc' must be a number"),
    (lambda: P.as_float(True, "x"), "not a bool"),
    (lambda: P.as_float("nan", "x"), "not NaN"),
    (lambda: P.as_float("-1", "x", minimum=0), ">= 0"),
    (lambda: P.as_int("2.5", "n"), "integer"),
    (lambda: P.as_int("0", "n", minimum=1), ">= 1"),
    (lambda: P.as_bool("maybe", "b"), "true"),
    (lambda: P.as_regex_list("(", "r"), "not a valid regular expression"),
    (lambda: P.as_float_pair("1,2,3", "p"), "pair"),
    (lambda: P.as_float_pair("2,1", "p"), "low < high"),
    (lambda: P.as_mode("train2", "mode"), "TRAIN, EVAL"),
    (lambda: P.as_str_list(5, "l"), "comma-separated"),
])
def test_parse_errors(call, match):
    with pytest.raises(InvalidConfiguration, match=match):
        call()


def test_rules_take_string_parameters(job):
    trial = job(1, {"w": ("weights", lambda s: [1.0])})
    r = WeightUpdateRatio(trial, num_steps="5", large_threshold="20", small_threshold="1e-9", epsilon="0")
    assert (r.num_steps, r.large_threshold, r.small_threshold, r.epsilon) == (5, 20.0, 1e-9, 0.0)
    r = LossNotDecreasing(trial, use_losses_collection="false", num_steps="3", mode="TRAIN",
                          tensor_regex="loss.*,val")
    assert r.mode == modes.TRAIN and r.tensor_regex == ["loss.*", "val"] and not r.use_losses_collection
    r = SaturatedActivation(trial, threshold_tanh="-5,5", threshold_sigmoid="(-10, 10)")
    assert r.threshold_tanh == (-5.0, 5.0) and r.report.parameters["threshold_sigmoid"] == [-10.0, 10.0]
    with pytest.raises(InvalidConfiguration, match="WeightUpdateRatio: num_steps='x'"):
        WeightUpdateRatio(trial, num_steps="x")
