"""`tensortap run` / `tensortap rules run`: NoData in the summary and the exit status, the collections rules
need turned on in the hook config, out_dir and collection validation before training starts, offline
statuses beside the live ones. Real PyTorch trainings with no tensortap code in them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import tensortap as tt  # noqa: E402

TRAIN = textwrap.dedent(
    """
    import sys, torch
    from torch import nn
    dead = sys.argv[1] == "dead"
    steps = int(sys.argv[2])
    marker = sys.argv[3] if len(sys.argv) > 3 else None
    if marker:
        open(marker, "w").write("training started")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.relu, self.fc2 = nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)
            if dead:  # every ReLU unit is dead: its input is always negative
                with torch.no_grad():
                    self.fc1.weight.zero_()
                    self.fc1.bias.fill_(-1.0)

        def forward(self, x):
            return self.fc2(self.relu(self.fc1(x)))

    torch.manual_seed(0)
    model = Net()
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    for step in range(steps):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    print("training finished", flush=True)
    """
)


def tensortap(*args, timeout=300):
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def train_py(tmp_path):
    p = tmp_path / "train.py"
    p.write_text(TRAIN)
    return str(p)


def _doc(r):
    assert r.stdout.strip(), r.stderr
    return json.loads(r.stdout)


def test_a_rule_without_data_is_no_data_and_exit_3(tmp_path, train_py):
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--save-interval", "1", "--rule", "vanishing_gradient",
                  "--rule", "tree_depth", "--json", "--", sys.executable, train_py, "ok", "12")
    doc = _doc(r)
    rules = {x["name"]: x for x in doc["rules"]}
    assert rules["vanishing_gradient"]["status"] == "NoIssuesFound"
    assert rules["tree_depth"]["status"] == "NoData"
    assert "regexes ['(^|/)trees/Node$'] matched no tensor" in rules["tree_depth"]["message"]
    assert "gradient/Net_fc1.weight" in rules["tree_depth"]["message"]
    assert r.returncode == 3 and doc["training"]["exit_code"] == 0
    status = json.load(open(os.path.join(out, "rules", "tree_depth", "status.json")))
    assert status["status"] == "NoData" and status["report"]["steps_evaluated"] == 0
    # the text summary says it too
    r = tensortap("rules", "run", out, "--rule", "tree_depth")
    assert r.returncode == 3 and "tree_depth: NoData: no data: regexes" in r.stdout


def test_a_missing_training_script_is_not_a_clean_bill(tmp_path):
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--rule", "vanishing_gradient", "--json",
                  "--", sys.executable, str(tmp_path / "no_such_script.py"))
    doc = _doc(r)
    assert r.returncode == 2 and doc["training"]["exit_code"] == 2
    assert doc["rules"][0]["status"] == "NoData"
    assert "collections ['gradients'] matched no tensor" in doc["rules"][0]["message"]


def test_the_runner_turns_on_what_the_rule_needs(tmp_path, train_py):
    # no --collection: `--rule dead_relu` alone makes the hook save the ReLU outputs
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--save-interval", "1", "--rule", "dead_relu", "--json",
                  "--", sys.executable, train_py, "dead", "6")
    doc = _doc(r)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert doc["rules"][0]["status"] == "IssuesFound" and doc["rules"][0]["first_step"] == 0
    trial = tt.create_trial(out)
    assert trial.tensor_names(collection="relu_output") == ["relu_output_0"]
    assert float(trial.tensor("relu_output_0").value(0).max()) == 0.0
    out2 = str(tmp_path / "job2")
    r = tensortap("run", "--out-dir", out2, "--save-interval", "1", "--rule", "dead_relu", "--json",
                  "--", sys.executable, train_py, "ok", "6")
    assert r.returncode == 0 and _doc(r)["rules"][0]["status"] == "NoIssuesFound"


IMAGES = textwrap.dedent(
    """
    import torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.rand(64, 3, 8, 8) * 255, torch.randint(0, 2, (64,))  # pixels 0..255: not normalised
    for step in range(4):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    """
)


def test_check_input_images_finds_the_pytorch_models_input(tmp_path):
    script = tmp_path / "images.py"
    script.write_text(IMAGES)
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--save-interval", "1", "--rule", "check_input_images:threshold_samples=64",
                  "--json", "--", sys.executable, str(script))
    assert r.returncode == 1, (r.stdout, r.stderr)
    rep = json.load(open(os.path.join(out, "rules", "check_input_images", "report.json")))
    assert {v["tensor"] for v in rep["first_violations"]} == {"Sequential_input_0"}  # not the loss's input
    assert 120 < rep["first_violations"][0]["value"] < 135  # mean pixel ~127.5


def _job(path):
    hook = tt.Hook(str(path))
    hook.next_step()
    hook.save_scalar("loss", 1.0)
    hook.close()


@pytest.mark.parametrize("case", ["proc", "under_a_file", "a_file", "inside_a_job", "unknown_collection"])
def test_bad_out_dir_or_collection_fails_before_training(tmp_path, train_py, case):
    (tmp_path / "some_file").write_text("x")
    _job(tmp_path / "other_job")
    out = {"proc": "/proc/tensortap-x", "under_a_file": str(tmp_path / "some_file" / "sub"),
           "a_file": str(tmp_path / "some_file"), "inside_a_job": str(tmp_path / "other_job" / "sub"),
           "unknown_collection": str(tmp_path / "job")}[case]
    extra = ["--collection", "nonsense"] if case == "unknown_collection" else []
    needle = {"proc": "is not writable", "under_a_file": "is a file, not a directory",
              "a_file": "is a file, not a directory", "inside_a_job": "lies inside the data of another job",
              "unknown_collection": "--collection 'nonsense': no such collection"}[case]
    marker = tmp_path / "started"
    for json_flag in ([["--json"]] if case in ("proc", "unknown_collection") else [[]]):
        r = tensortap("run", "--out-dir", out, "--rule", "vanishing_gradient", *extra, *json_flag,
                      "--", sys.executable, train_py, "ok", "3", str(marker))
        assert r.returncode == 2, (case, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tensortap: error: ") and needle in lines[0], (case, lines)
        if json_flag:
            assert needle in json.loads(r.stdout)["error"]
        else:
            assert r.stdout == ""
    assert not marker.exists()  # training never started
    if case == "inside_a_job":  # a folder merely named tensortap (e.g. this package's source) is not a job
        (tmp_path / "project" / "tensortap" / "rules").mkdir(parents=True)
        (tmp_path / "project" / "tensortap" / "rules" / "rule.py").write_text("# source\n")
        r = tensortap("run", "--out-dir", str(tmp_path / "project" / "runs" / "job"), "--json",
                      "--", sys.executable, train_py, "ok", "2")
        assert r.returncode == 0, r.stderr
    # a collection defined by a regex is fine
    if case == "unknown_collection":
        r = tensortap("run", "--out-dir", out, "--collection", "mine:include_regex=fc1", "--json",
                      "--", sys.executable, train_py, "ok", "3")
        assert r.returncode == 0, r.stderr
        assert tt.create_trial(out).tensor_names(collection="mine")


def test_offline_rules_run_writes_beside_the_live_statuses(tmp_path, train_py):
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--save-interval", "1", "--rule", "vanishing_gradient",
                  "--rule", "loss_not_decreasing:num_steps=2,window=1", "--json", "--", sys.executable, train_py, "ok",
                  "8")
    assert r.returncode in (0, 1), r.stderr
    live = {n: open(os.path.join(out, "rules", n, "status.json"), "rb").read()
            for n in ("vanishing_gradient", "loss_not_decreasing")}
    r = tensortap("rules", "run", out, "--rule", "vanishing_gradient:threshold=1e9", "--json")
    assert r.returncode == 1 and _doc(r)["rules"][0]["status"] == "IssuesFound"
    for n, body in live.items():
        assert open(os.path.join(out, "rules", n, "status.json"), "rb").read() == body
    offline = json.load(open(os.path.join(out, "rules", "vanishing_gradient", "offline", "status.json")))
    assert offline["status"] == "IssuesFound"
    assert os.path.exists(os.path.join(out, "rules", "vanishing_gradient", "offline", "report.json"))
    # an offline StopTraining on the finished job writes nothing into it
    assert not os.path.exists(os.path.join(out, "tensortap", "control", "stop.json"))
