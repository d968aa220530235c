"""The TensorBoard settings from the hook JSON config, SageMaker's TensorBoard config, and `tensortap run`."""

from __future__ import annotations

import json
import os

import pytest

from tensortap.cli.main import _spec_from_args, build_parser
from tensortap.exceptions import InvalidConfiguration
from tensortap.hook_config import parse_hook_config
from tensortap.runner.hook_config import build_hook_config
from tensortap.runner.spec import JobSpec, merge_job_file


def test_hook_parameters_give_the_hook_kwargs(monkeypatch):
    monkeypatch.delenv("TRAINING_JOB_NAME", raising=False)
    kw = parse_hook_config({"LocalPath": "/o", "HookParameters": {"export_tensorboard": "True",
                                                                  "tensorboard_dir": "/tb"}}).hook_kwargs()
    assert (kw["export_tensorboard"], kw["tensorboard_dir"]) == (True, "/tb")
    kw = parse_hook_config({"LocalPath": "/o"}).hook_kwargs()
    assert (kw["export_tensorboard"], kw["tensorboard_dir"]) == (False, None)
    with pytest.raises(InvalidConfiguration, match="export_tensorboard"):
        parse_hook_config({"LocalPath": "/o", "HookParameters": {"export_tensorboard": "maybe"}})


def test_sagemaker_tensorboard_config_wins_inside_a_training_job(tmp_path, monkeypatch):
    hook_json = {"LocalPath": "/o", "HookParameters": {"export_tensorboard": "true", "tensorboard_dir": "/mine"}}
    tb_cfg = tmp_path / "tensorboardoutputconfig.json"
    monkeypatch.setenv("TRAINING_JOB_NAME", "job-1")
    monkeypatch.setenv("TENSORBOARD_CONFIG_FILE_PATH", str(tb_cfg))
    cfg = parse_hook_config(hook_json)  # no TensorBoard config file: no export, whatever the hook config says
    assert (cfg.export_tensorboard, cfg.tensorboard_dir) == (False, None)
    tb_cfg.write_text(json.dumps({"LocalPath": "/opt/ml/output/tensorboard"}))
    cfg = parse_hook_config(hook_json)
    assert (cfg.export_tensorboard, cfg.tensorboard_dir) == (True, "/opt/ml/output/tensorboard")
    tb_cfg.write_text(json.dumps({"S3OutputPath": "s3://b/p"}))
    with pytest.raises(InvalidConfiguration, match="LocalPath"):
        parse_hook_config(hook_json)


def test_run_tensorboard_dir_reaches_the_hook_config(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINING_JOB_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["run", "--out-dir", "job", "--tensorboard-dir", "tb"])
    spec = _spec_from_args(args, ["python", "train.py"])
    assert spec.tensorboard_dir == os.path.join(str(tmp_path), "tb")
    kw = parse_hook_config(build_hook_config(spec)).hook_kwargs()
    assert (kw["export_tensorboard"], kw["tensorboard_dir"]) == (True, os.path.join(str(tmp_path), "tb"))
    # without the option, no TensorBoard keys at all
    plain = build_hook_config(JobSpec(out_dir="job"))
    assert "export_tensorboard" not in plain["HookParameters"]
    # a job file may name it too; the command line wins
    spec = JobSpec(out_dir="job")
    merge_job_file(spec, {"tensorboard_dir": "from_file"})
    assert spec.tensorboard_dir == os.path.join(str(tmp_path), "from_file")
