"""Non-finite values are never hidden from TensorBoard: a histogram counts the finite values in its buckets and the
NaN, +inf and -inf it left out are written beside it, each on its own, read back with TensorBoard's reader. The
job is a real PyTorch training whose first layer's weights get NaN and infinities planted at step 3."""

from __future__ import annotations

import numpy as np
import pytest

from tensortap.tensorboard.histogram import make_histogram


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_make_histogram_counts_each_kind_of_non_finite_value():
    v = np.array([1.0, np.nan, np.inf, -np.inf, -np.inf, 2.0, np.nan, np.nan], dtype=np.float32)
    h = make_histogram(v)
    assert (h.num, h.nonfinite, h.nonfinite_counts) == (2, 6, (3, 1, 2))
    assert int(np.sum(h.bucket)) == 2
    h64 = make_histogram(v.astype(np.float64))
    assert h64.nonfinite_counts == (3, 1, 2) and h64.num == 2
    only = make_histogram(np.array([np.nan, np.inf], dtype=np.float16))
    assert (only.num, only.nonfinite_counts) == (0, (1, 1, 0))
    assert make_histogram(np.arange(4.0)).nonfinite_counts == (0, 0, 0)


def test_a_pytorch_job_s_histograms_keep_nan_and_inf_counts(tmp_path, read_run, tb):
    torch = pytest.importorskip("torch")
    import tensortap.pytorch as tp

    out, tbdir = tmp_path / "job", tmp_path / "tb"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    loss_fn = torch.nn.CrossEntropyLoss()
    hook = tp.Hook(str(out), export_tensorboard=True, tensorboard_dir=str(tbdir),
                   save_config=tp.SaveConfig(save_interval=1), include_collections=["weights", "losses"],
                   writer="thread")
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.set_mode(tp.modes.TRAIN)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    seen = {}
    for step in range(6):
        if step == 3:
            with torch.no_grad():  # 3 NaN, 2 +inf, 1 -inf in the weights this step's forward uses
                w = model[0].weight
                w[0, :3] = float("nan")
                w[1, :2] = float("inf")
                w[2, 0] = float("-inf")
        seen[step] = model[0].weight.detach().clone().numpy()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    hook.close()
    train = read_run(tbdir / "worker_0" / "train")
    tag = "nonfinite/Sequential_0.weight"
    counts = {k: tb.scalars(train, f"{tag}/{k}") for k in ("nan", "posinf", "neginf")}
    expect = {s: (int(np.isnan(w).sum()), int(np.isposinf(w).sum()), int(np.isneginf(w).sum()))
              for s, w in seen.items() if s >= 3}
    assert expect[3] == (3, 2, 1)
    for s, (nan, pos, neg) in expect.items():
        assert (counts["nan"][s], counts["posinf"][s], counts["neginf"][s]) == (nan, pos, neg), s
        assert tb.scalars(train, tag)[s] == nan + pos + neg
    assert min(counts["nan"]) == 3  # from the first histogram that left something out
    hist = {e.step: e.histogram_value for e in train.Histograms("weights/Sequential_0.weight")}
    assert hist[3].num == seen[3].size - 6  # the finite values, in the buckets
    np.testing.assert_array_equal(np.asarray(hist[3].bucket), tb.numpy_counts(seen[3]))
    assert "1_losses/CrossEntropyLoss_output_0" in train.Tags()["scalars"]
