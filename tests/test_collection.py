import json

import pytest

from tensortap.collection import (
    NON_HISTOGRAM_COLLECTIONS,
    NON_REDUCTION_COLLECTIONS,
    SCALAR_COLLECTIONS,
    TRAIN_ONLY_COLLECTIONS,
    Collection,
    CollectionKeys,
    CollectionManager,
    CollectionNotFound,
)
from tensortap.config import ReductionConfig, SaveConfig, SaveConfigMode
from tensortap.exceptions import InvalidConfiguration, TensorTapError
from tensortap.modes import ModeKeys

# The example of spec 4.1, with the "..." filled in.
SMDEBUG_COLLECTIONS_JSON = json.dumps(
    {
        "collections": {
            "losses": {
                "name": "losses",
                "include_regex": ["[Ll]oss_(?!input).*output"],
                "tensor_names": ["CrossEntropyLoss_output_0"],
                "reduction_config": {"save_raw_tensor": True, "reductions": "", "save_shape": False},
                "save_config": {
                    m: {"save_interval": 500, "save_steps": [], "start_step": 0, "end_step": None}
                    for m in ("TRAIN", "EVAL", "PREDICT", "GLOBAL")
                },
                "save_histogram": False,
            },
            "weights": {
                "name": "weights",
                "include_regex": ["^(?!gradient).*weight"],
                "tensor_names": [],
                "reduction_config": None,
                "save_config": None,
                "save_histogram": True,
            },
        },
        "_meta": {"num_workers": 2},
    }
)


def test_collection_keys_and_classes():
    assert CollectionKeys.ALL == "all" and CollectionKeys.SM_METRICS == "sm_metrics"
    assert CollectionKeys.FEATURE_IMPORTANCE == "feature_importance" and CollectionKeys.TREES == "trees"
    assert SCALAR_COLLECTIONS == {"losses", "metrics", "feature_importance", "average_shap", "sm_metrics", "scalars",
                                  "grad_scaler"}
    assert NON_REDUCTION_COLLECTIONS == NON_HISTOGRAM_COLLECTIONS == SCALAR_COLLECTIONS
    assert TRAIN_ONLY_COLLECTIONS == {"gradients", "optimizer_variables"}
    assert isinstance(SCALAR_COLLECTIONS, frozenset)


def test_collection_defaults():
    c = Collection("weights")
    assert c.name == "weights"
    assert c.include_regex == [] and c.tensor_names == set()
    assert c.reduction_config is None and c.save_config is None and c.save_histogram is True


def test_matches_by_name_and_regex():
    c = Collection("w", include_regex="weight", tensor_names=["fc1.bias"])
    assert c.matches("Net_fc1.weight")  # re.search: anywhere in the name
    assert c.matches("fc1.bias")
    assert not c.matches("fc1.bias2")
    assert not c.matches("gradient/x")
    c.include(["^gradient", "bias$"])
    assert c.matches("gradient/x") and c.matches("fc2.bias")  # cache invalidated by include
    assert c.include_regex == ["weight", "^gradient", "bias$"]
    c.add_tensor_name("exact")
    assert c.has_tensor_name("exact") and c.matches("exact")
    c.remove_tensor_name("exact")
    c.remove_tensor_name("never-there")
    assert not c.has_tensor_name("exact") and not c.matches("exact")


def test_include_regex_setter_and_copy():
    c = Collection("c", include_regex=["a"])
    c.include_regex.append("b")  # a copy
    assert c.include_regex == ["a"]
    c.include_regex = ["x"]
    assert not c.matches("a") and c.matches("x")


def test_bad_regex_is_rejected_naming_it():
    with pytest.raises(InvalidConfiguration) as e:
        Collection("c", include_regex=["ok", "(unclosed"])
    assert "(unclosed" in str(e.value)
    c = Collection("c", include_regex="ok")
    with pytest.raises(InvalidConfiguration, match=r"\[bad"):
        c.include(["fine", "[bad"])
    assert c.include_regex == ["ok"]  # nothing added when one fails


@pytest.mark.parametrize(
    "kwargs, bad",
    [
        ({"name": ""}, "''"),
        ({"name": 5}, "5"),
        ({"name": "c", "include_regex": [7]}, "7"),
        ({"name": "c", "tensor_names": "abc"}, "abc"),
        ({"name": "c", "reduction_config": "min"}, "min"),
        ({"name": "c", "save_config": 10}, "10"),
        ({"name": "c", "save_histogram": "yes"}, "yes"),
    ],
)
def test_bad_collection_values(kwargs, bad):
    with pytest.raises(InvalidConfiguration) as e:
        Collection(**kwargs)
    assert bad in str(e.value)


def test_save_config_is_coerced():
    c = Collection("c", save_config=SaveConfigMode(5))
    assert c.save_config == SaveConfig(save_interval=5)
    c.save_config = {ModeKeys.TRAIN: SaveConfigMode(3)}
    assert c.save_config.get_save_config(ModeKeys.TRAIN).save_interval == 3
    assert c.save_config.mode_save_configs[ModeKeys.EVAL] is None
    c.reduction_config = {"reductions": "min", "save_raw_tensor": True}
    assert c.reduction_config == ReductionConfig(["min"], save_raw_tensor=True)


def test_collection_json_round_trip():
    c = Collection(
        "c",
        include_regex=["a.*", "b"],
        tensor_names={"z", "a"},
        reduction_config=ReductionConfig(["mean"], abs_norms=["l2"], save_shape=True),
        save_config=SaveConfig({ModeKeys.TRAIN: SaveConfigMode(3)}),
        save_histogram=False,
    )
    d = c.to_json_dict()
    assert d["name"] == "c"
    assert d["include_regex"] == ["a.*", "b"]
    assert d["tensor_names"] == ["a", "z"]
    assert d["reduction_config"] == {"save_raw_tensor": False, "reductions": "mean,abs_l2_norm", "save_shape": True}
    assert d["save_config"]["TRAIN"]["save_interval"] == 3 and d["save_config"]["EVAL"] is None
    assert d["save_histogram"] is False
    assert Collection.from_dict(json.loads(json.dumps(d))) == c
    assert Collection.from_json(c.to_json()) == c
    assert Collection("c") != c


def test_from_dict_defaults():
    c = Collection.from_dict({"name": "x"})
    assert c.include_regex == [] and c.tensor_names == set() and c.save_histogram is True
    assert c.reduction_config is None and c.save_config is None
    with pytest.raises(InvalidConfiguration, match="name"):
        Collection.from_dict({"include_regex": []})


def test_hash_and_repr():
    a, b = Collection("w", include_regex="x"), Collection("w")
    assert hash(a) == hash(b) and a != b
    assert "w" in repr(a)


def test_manager_get_add():
    cm = CollectionManager()
    assert "default" not in cm and len(cm) == 0
    assert CollectionManager(create_default=True).get("default", create=False).name == "default"
    w = cm.get("weights")
    assert cm.get("weights") is w and "weights" in cm and w in cm
    with pytest.raises(KeyError) as e:
        cm.get("nope", create=False)
    assert "nope" in str(e.value) and isinstance(e.value, CollectionNotFound)
    assert isinstance(e.value, TensorTapError)
    assert cm.add("weights") is w  # a name does not replace
    new = Collection("weights", include_regex="w")
    cm.add(new)  # a Collection does
    assert cm.get("weights") is new
    assert [c.name for c in cm] == ["weights"]
    assert cm.get_collections() == {"weights": new}
    with pytest.raises(InvalidConfiguration, match="42"):
        cm.add(42)


def test_manager_num_workers():
    cm = CollectionManager()
    assert cm.get_num_workers() == 1
    cm.set_num_workers("4")
    assert cm.get_num_workers() == 4
    for bad in (0, -1, "x", True):
        with pytest.raises(InvalidConfiguration):
            cm.set_num_workers(bad)


def test_manager_loads_smdebug_json():
    cm = CollectionManager.load_from_string(SMDEBUG_COLLECTIONS_JSON)
    assert cm.get_num_workers() == 2
    losses = cm.get("losses", create=False)
    assert losses.tensor_names == {"CrossEntropyLoss_output_0"}
    assert losses.matches("CrossEntropyLoss_output_0") and losses.matches("MyLoss_output_1")
    assert not losses.matches("Loss_input_0_output")
    assert losses.reduction_config == ReductionConfig(save_raw_tensor=True)
    assert losses.save_config == SaveConfig()
    assert losses.save_histogram is False
    weights = cm.get("weights", create=False)
    assert weights.save_config is None and weights.reduction_config is None
    # round trip, key for key
    assert json.loads(cm.to_json()) == json.loads(SMDEBUG_COLLECTIONS_JSON)
    assert CollectionManager.from_json_dict(cm.to_json_dict()) == cm


def test_manager_rejects_bad_json():
    with pytest.raises(InvalidConfiguration, match="extra"):
        CollectionManager.from_json_dict({"collections": {}, "_meta": {"num_workers": 1}, "extra": 1})
    with pytest.raises(InvalidConfiguration, match="not valid JSON"):
        CollectionManager.load_from_string("{nope")
    with pytest.raises(InvalidConfiguration, match="other"):
        CollectionManager.from_json_dict({"collections": {"a": {"name": "other"}}})


class _Named:
    """A layer as add_keras_layer / add_block_tensors see one: an object with a name."""

    def __init__(self, name):
        self.name = name


def test_add_keras_layer_and_add_block_tensors_take_exactly_that_layers_tensors():
    keras_coll, mx_coll = Collection("k"), Collection("m")
    keras_coll.add_keras_layer(_Named("dense.1"), inputs=True, outputs=True)
    mx_coll.add_block_tensors(_Named("fc1"))  # (outputs only, the default)
    for name in ("dense.1/inputs", "dense.1/outputs", "dense.1/inputs_0", "dense.1/outputs_12"):
        assert keras_coll.matches(name), name
    for name in ("dense_1/inputs", "dense.10/inputs", "enc/dense.1/outputs", "dense.1/outputs/x", "dense.1/weights"):
        assert not keras_coll.matches(name), name
    assert mx_coll.matches("fc1_output_0") and mx_coll.matches("fc1_output_3")
    for name in ("fc1_input_0", "fc10_output_0", "model_fc1_output_0", "fc1_output_0x"):
        assert not mx_coll.matches(name), name
    assert Collection.from_json(mx_coll.to_json()).matches("fc1_output_0")  # (stored as regexes)
    nothing = Collection("n")
    nothing.add_block_tensors(_Named("fc1"), inputs=False, outputs=False)
    assert nothing.include_regex == []


@pytest.mark.parametrize(
    "call, bad",
    [
        (lambda c: c.add_keras_layer(_Named("d"), inputs="yes"), "inputs='yes'"),
        (lambda c: c.add_block_tensors(_Named("d"), outputs=1), "outputs=1"),
        (lambda c: c.add_keras_layer("d1"), "a Keras layer"),
        (lambda c: c.add_block_tensors(_Named("")), "mxnet.gluon.Block"),
        (lambda c: c.add_module_tensors(object()), "torch.nn.Module"),
    ],
)
def test_layer_calls_refuse_bad_input_naming_it(call, bad):
    with pytest.raises(InvalidConfiguration) as e:
        call(Collection("c"))
    assert bad in str(e.value)


def test_add_module_tensors_waits_for_a_hook_to_name_the_module():
    class Module:
        def named_modules(self):
            return iter(())

    coll, m = Collection("c"), Module()
    coll.add_module_tensors(m, inputs=True)
    assert coll.pending_modules() == [(m, True, True)] and not coll.matches("fc_output_0")
    coll.name_module(m, "enc.fc")
    assert coll.pending_modules() == []
    assert coll.matches("enc.fc_input_0") and coll.matches("enc.fc_output_1")
    assert not coll.matches("encxfc_output_0") and not coll.matches("enc.fc_output_")
