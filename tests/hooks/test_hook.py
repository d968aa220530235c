"""The generic numpy Hook: save configs, collections, modes, workers, errors, JSON config."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

import tensortap as tt
from tensortap import modes
from tensortap.exceptions import InvalidConfiguration, TensorUnavailableForStep


def _run(hook, n=10, mode_switch=None):
    for s in range(n):
        if mode_switch is not None:
            hook.set_mode(modes.TRAIN if s < mode_switch else modes.EVAL)
        hook.next_step()
        hook.save_tensor("a", np.full(3, s, dtype=np.int32))
        hook.save_tensor("b", np.full(2, s, dtype=np.float32), "other")
    hook.close()
    return tt.create_trial(hook.out_dir)


def test_save_interval_start_end_and_save_steps(tmp_path):
    cfg = tt.SaveConfig(save_interval=3, start_step=2, end_step=9, save_steps=[1])
    t = _run(tt.Hook(str(tmp_path), save_config=cfg))
    # modulo on the absolute step, start inclusive, end exclusive, plus explicit steps
    assert t.tensor("a").steps() == [1, 3, 6]


def test_per_mode_and_per_collection_save_configs(tmp_path):
    cfg = tt.SaveConfig(mode_save_configs={modes.TRAIN: tt.SaveConfigMode(save_interval=2),
                                           modes.EVAL: tt.SaveConfigMode(save_interval=1)})
    hook = tt.Hook(str(tmp_path), save_config=cfg)
    hook.get_collection("other").save_config = tt.SaveConfigMode(save_interval=5)
    t = _run(hook, n=10, mode_switch=6)
    assert t.tensor("a").steps(modes.TRAIN) == [0, 2, 4]
    assert t.tensor("a").steps(modes.EVAL) == [0, 1, 2, 3]
    assert t.tensor("b").steps(modes.TRAIN) == [0, 5]
    assert t.tensor("b").steps(modes.EVAL) == [0]


def test_collection_reduction_config_and_shapes(tmp_path):
    hook = tt.Hook(str(tmp_path), save_config=tt.SaveConfig(save_interval=1))
    hook.get_collection("other").reduction_config = tt.ReductionConfig(norms=["l1"], abs_reductions=["min"])
    t = _run(hook, n=2)
    b = t.tensor("b")
    with pytest.raises(TensorUnavailableForStep):
        b.value(1)
    assert b.reduction_value(1, "l1") == pytest.approx(2.0)
    assert b.reduction_value(1, "min", abs=True) == pytest.approx(1.0)
    assert b.shape(1) == (2,)
    assert np.array_equal(t.tensor("a").value(1), [1, 1, 1])


def test_include_workers_one_silences_other_ranks(tmp_path):
    h1 = tt.Hook(str(tmp_path), rank=1, world_size=2)
    assert not h1.writes and not h1.active
    h1.save_tensor("x", np.ones(2))
    h1.close()
    assert not os.path.exists(tmp_path / "tensortap")
    h0 = tt.Hook(str(tmp_path), rank=0, world_size=2)
    h0.save_tensor("x", np.ones(2))
    h0.close()
    t = tt.create_trial(str(tmp_path))
    assert t.workers() == ["worker_0"] and t.num_workers == 1 and t.loaded_all_steps


def test_disable_env_turns_hook_off(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORTAP_DISABLE", "1")
    hook = tt.Hook(str(tmp_path))
    hook.save_tensor("x", np.ones(2))
    hook.save_scalar("s", 1.0)
    hook.close()
    assert not os.path.exists(tmp_path / "tensortap")


def test_internal_error_disables_hook_and_training_goes_on(tmp_path, caplog):
    hook = tt.Hook(str(tmp_path), save_config=tt.SaveConfig(save_interval=1))
    hook.save_tensor("x", np.ones(2))

    def boom(record):
        raise RuntimeError("injected failure")

    hook._get_writer().submit = boom
    with caplog.at_level(logging.ERROR, logger="tensortap"):
        for _ in range(3):
            hook.next_step()
            hook.save_tensor("x", np.ones(2))  # must not raise
    assert hook.disabled and hook.error_count == 1
    assert sum("injected failure" in str(r.exc_info) for r in caplog.records) == 1  # logged once
    hook.close()


def test_dry_run_writes_nothing(tmp_path):
    hook = tt.Hook(str(tmp_path), dry_run=True)
    hook.save_tensor("x", np.ones(2))
    hook.close()
    assert not os.path.exists(tmp_path / "tensortap")


def test_save_all_and_include_regex(tmp_path):
    hook = tt.Hook(str(tmp_path), include_regex=["^keep"], include_collections=[])
    assert "default" in hook.include_collections
    hook.save_tensor("keep_me", np.ones(1))
    hook.close()
    hook2 = tt.Hook(str(tmp_path / "all"), save_all=True)
    assert "all" in hook2.include_collections
    hook2.close()


def test_bad_arguments_fail_at_construction(tmp_path):
    bad = [
        (dict(out_dir=""), "out_dir=''"),
        (dict(include_workers="some"), "'some'"),
        (dict(reduction_config={"reductions": ["mean"]}), "reduction_config="),
        (dict(save_all="yes"), "'yes'"),
        (dict(flush_interval=0), "flush_interval=0"),
        (dict(backpressure="panic"), "'panic'"),
        (dict(rank=3, world_size=2), "rank=3"),
        (dict(include_collections=[3]), "entry 3"),
        (dict(save_config=tt.SaveConfigMode(save_interval=0) if False else {"save_interval": -1}), "-1"),
    ]
    for kw, needle in bad:
        kw.setdefault("out_dir", str(tmp_path))
        with pytest.raises(InvalidConfiguration) as ei:
            tt.Hook(**kw)
        assert needle in str(ei.value), (kw, str(ei.value))
    hook = tt.Hook(str(tmp_path))
    with pytest.raises(InvalidConfiguration):
        hook.set_mode("training")
    hook.save_scalar("s", [1, 2])  # a value handed over while training runs: skipped and counted, never raised
    assert hook.dropped_records == 1 and not hook.disabled
    hook.close()


def test_out_dir_of_a_finished_job_is_refused(tmp_path):
    hook = tt.Hook(str(tmp_path))
    hook.save_tensor("x", np.ones(1))
    hook.close()
    with pytest.raises(InvalidConfiguration, match="already holds data"):
        tt.Hook(str(tmp_path))


def test_caller_may_mutate_its_array_after_save(tmp_path):
    hook = tt.Hook(str(tmp_path))
    a = np.zeros(4)
    hook.save_tensor("a", a)
    a[:] = 7
    hook.close()
    assert np.array_equal(tt.create_trial(str(tmp_path)).tensor("a").value(0), np.zeros(4))


def test_create_from_json_file_in_smdebug_format(tmp_path, monkeypatch):
    out = tmp_path / "out"
    cfg = {
        "LocalPath": str(out),
        "HookParameters": {"save_interval": "4", "eval.save_interval": "1", "reductions": "mean,abs_l2_norm",
                           "save_raw_tensor": True},
        "CollectionConfigurations": [
            {"CollectionName": "default"},
            {"CollectionName": "grads", "CollectionParameters": {"include_regex": "^g", "save_interval": "2"}},
        ],
    }
    path = tmp_path / "hook.json"
    path.write_text(json.dumps(cfg))
    monkeypatch.setenv("TENSORTAP_CONFIG", str(path))
    hook = tt.Hook.create_from_json_file()
    assert hook.out_dir == str(out)
    for s in range(8):
        hook.set_mode(modes.TRAIN if s < 5 else modes.EVAL)
        hook.next_step()
        hook.save_tensor("x", np.arange(3.0) + s)
        hook.save_tensor("g1", np.arange(2.0) - s, "grads")
    hook.close()
    t = tt.create_trial(str(out))
    assert t.tensor("x").steps(modes.TRAIN) == [0, 4]
    assert t.tensor("x").steps(modes.EVAL) == [0, 1, 2]
    assert t.tensor("g1").steps(modes.TRAIN) == [0, 2, 4]
    assert t.tensor("x").reduction_value(4, "l2", abs=True) == pytest.approx(np.linalg.norm([4, 5, 6]))
    assert ("mean", False) in t.tensor("x").reduction_values(4)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidConfiguration, match="bad.json"):
        tt.Hook.create_from_json_file(str(bad))


def test_backpressure_drop_policy_counts_and_training_continues(tmp_path):
    hook = tt.Hook(str(tmp_path), save_config=tt.SaveConfig(save_interval=1), max_pending_bytes=1,
                   backpressure="drop", writer="thread")  # the writer process's drops: tests/format
    for _ in range(5):
        hook.next_step()
        hook.save_tensor("big", np.ones(10_000))
    assert hook.dropped_records == 5
    hook.close()


def test_save_scalar_takes_smdebugs_signature(tmp_path):
    """save_scalar(name, value, sm_metric=False, timestamp=None): sm_metric=True also files it in sm_metrics; the
    generic hook, whose steps the script drives, saves a scalar outside a step in a step it starts."""
    hook = tt.Hook(str(tmp_path), save_config=tt.SaveConfig(save_interval=100))
    hook.save_scalar("before", 3, True, 1700000000.0)  # (positional, as smdebug's order)
    hook.next_step()
    hook.save_scalar("lr", np.float32(0.5), sm_metric=False, timestamp=None)
    hook.save_scalar("acc", 0.75, sm_metric=True)
    hook.close()
    t = tt.create_trial(str(tmp_path))
    assert t.steps() == [0, 1]
    assert t.tensor("scalar/before").value(0) == 3 and t.tensor("scalar/lr").value(1) == np.float32(0.5)
    assert t.tensor_names(collection="sm_metrics") == ["scalar/acc", "scalar/before"]
    assert t.tensor_names(collection="scalars") == ["scalar/acc", "scalar/before", "scalar/lr"]


def test_a_framework_hooks_default_collections_join_include_collections(tmp_path):
    class FrameworkHook(tt.Hook):
        builtin_collections = (*tt.Hook.builtin_collections, "losses")
        always_include_collections = ("losses",)

    hook = FrameworkHook(str(tmp_path), include_collections=["weights"])
    assert hook.include_collections == ["weights", "losses"]
    hook.close()
    plain = tt.Hook(str(tmp_path / "plain"), include_collections=["weights"])
    assert plain.include_collections == ["weights"]
    plain.close()
