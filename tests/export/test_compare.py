"""`tensortap compare A B [C...]`: the first step at which runs diverge, per tensor and statistic."""

from __future__ import annotations

import json

import numpy as np

import tensortap as tt
from tensortap.cli.main import main as cli_main
from tensortap.compare import compare


def run(out_dir: str, diverge_from: int | None = None, steps: int = 12) -> None:
    """Identical runs until `diverge_from`; from there the loss is 1e-3 larger and the weight's one element too."""
    hook = tt.Hook(out_dir, save_config=tt.SaveConfig(save_interval=1), include_collections=["weights"])
    for s in range(steps):
        hook.next_step()
        late = diverge_from is not None and s >= diverge_from
        w = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4) * (s + 1)
        if late:
            w[0, 0] += 0.5
        hook.save_tensor("dense/weight", w, collections_to_write="weights")
        hook.save_scalar("loss", 1.0 / (s + 1) + (1e-3 if late else 0.0))
    hook.close()


def test_compare_names_the_first_divergent_step(tmp_path, capsys):
    a, b, c = (str(tmp_path / n) for n in "abc")
    run(a)
    run(b, diverge_from=7)
    run(c)
    results = compare([a, b, c])
    assert results[0].first.step == 7
    by = {(d.tensor, d.statistic): d for d in results[0].divergences}
    assert by[("scalar/loss", "value")].step == 7 and by[("scalar/loss", "value")].differing == 5
    assert by[("dense/weight", "l2")].step == 7 and by[("dense/weight", "mean")].step == 7
    assert ("dense/weight", "max") not in by  # the largest element did not change
    assert all(d.step == 7 for d in results[0].divergences)
    assert results[1].divergences == [] and results[1].compared == results[0].compared

    assert cli_main(["compare", a, b, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["comparisons"][0]["first_divergent_step"] == 7
    assert cli_main(["compare", a, b, "--tensor", "loss"]) == 1
    text = capsys.readouterr().out
    assert "first divergence at step 7" in text and "scalar/loss" in text and "dense/weight" not in text
    assert cli_main(["compare", a, c]) == 0
    assert "no divergence" in capsys.readouterr().out
    # a tolerance wider than the difference: the loss no longer diverges
    assert cli_main(["compare", a, b, "--tensor", "loss", "--atol", "0.01"]) == 0


def test_bad_input(tmp_path, capsys):
    run(str(tmp_path / "a"), steps=2)
    assert cli_main(["compare", str(tmp_path / "a")]) == 2
    assert "at least two runs" in capsys.readouterr().err
    assert cli_main(["compare", str(tmp_path / "a"), str(tmp_path / "a"), "--rtol", "-1"]) == 2
    assert "rtol" in capsys.readouterr().err
