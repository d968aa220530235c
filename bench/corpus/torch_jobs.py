"""PyTorch trainings of the rules corpus: small MLPs, CNNs and transformers on synthetic data that can be learnt,
run with or without a defect. `train(out_dir, **spec)` writes the job through an explicit tensortap hook when
`out_dir` is given, and is plain PyTorch when it is None (`tensortap run` attaches to it then).

Every job evaluates the whole validation set once per epoch (model.eval(), one loss per batch)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: collections every corpus job saves (what the built-in deep-learning rules read)
COLLECTIONS = ["weights", "biases", "gradients", "losses", "relu_output", "relu_input", "tanh_input",
               "sigmoid_input", "input_image", "input_sequence", "labels", "predictions"]


def _teacher_data(seed: int, n: int, d: int = 20, classes: int = 4, label_noise: float = 0.05,
                  imbalance: float | None = None, shuffle_labels: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Inputs N(0, 1) labelled by a fixed random two-layer teacher (a function a student can learn)."""
    teacher = np.random.default_rng(1234)
    w1 = teacher.normal(size=(d, 32)) / math.sqrt(d)
    w2 = teacher.normal(size=(32, classes)) / math.sqrt(32)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n * 4 if imbalance else n, d)).astype(np.float32)
    y = np.argmax(np.maximum(x @ w1, 0) @ w2, axis=1)
    if imbalance:  # keep almost only class 0
        keep = (y == 0) | (rng.random(len(y)) < imbalance)
        x, y = x[keep][:n], y[keep][:n]
    flip = rng.random(len(y)) < label_noise
    y = np.where(flip, rng.integers(0, classes, len(y)), y)
    if shuffle_labels:
        y = rng.permutation(y)
    return x, y.astype(np.int64)


def _image_data(seed: int, n: int, size: int = 12, classes: int = 4, scale: float = 1.0
                ) -> tuple[np.ndarray, np.ndarray]:
    """1-channel images: a bar (horizontal, vertical or one of two diagonals) at a random place, plus noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.normal(0, 0.3, size=(n, 1, size, size)).astype(np.float32)
    for i, c in enumerate(y):
        r, s = rng.integers(2, size - 2, 2)
        for k in range(-2, 3):
            rr, cc = [(r, s + k), (r + k, s), (r + k, s + k), (r + k, s - k)][c]
            x[i, 0, rr, cc] += 1.5
    return x * scale, y.astype(np.int64)


def _sequence_data(seed: int, n: int, length: int = 16, vocab: int = 12, pad_fraction: float = 0.25
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Token sequences padded with 0 at the end; the label is which of tokens 1..4 occurs most often."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, vocab, size=(n, length))
    lo = max(1, int(length * (1 - 2 * pad_fraction)))
    lengths = rng.integers(lo, length + 1, n) if pad_fraction < 0.5 else rng.integers(1, 4, n)
    for i, k in enumerate(lengths):
        x[i, k:] = 0
    counts = np.stack([(x == t).sum(axis=1) for t in range(1, 5)], axis=1) + rng.random((n, 4)) * 0.1
    return x.astype(np.int64), np.argmax(counts, axis=1).astype(np.int64)


def _model(torch: Any, nn: Any, arch: str, act: str, depth: int, width: int, d: int, classes: int) -> Any:
    acts = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}
    if arch == "mlp":
        layers: list[Any] = []
        for i in range(depth):
            layers += [nn.Linear(d if i == 0 else width, width), acts[act]()]
        layers.append(nn.Linear(width, classes))
        return nn.Sequential(*layers)
    if arch == "cnn":
        return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), acts[act](), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3, padding=1), acts[act](), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(16 * 3 * 3, 32), acts[act](), nn.Linear(32, classes))
    if arch == "transformer":

        class Tiny(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embedding = nn.Embedding(12, 32, padding_idx=0)
                self.encoder = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
                self.head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, classes))

            def forward(self, x: Any) -> Any:
                mask = x == 0
                h = self.encoder(self.embedding(x), src_key_padding_mask=mask)
                keep = (~mask).unsqueeze(-1).float()
                return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1))

        return Tiny()
    raise ValueError(f"arch={arch!r}")


def train(out_dir: str | None, *, arch: str = "mlp", seed: int = 0, optimizer: str = "adam", lr: float = 1e-3,
          batch: int = 32, epochs: int = 6, n_train: int = 2048, n_val: int = 512, act: str = "relu",
          depth: int = 2, width: int = 64, save_interval: int = 10, weight_decay: float = 0.0,
          defect: str | None = None) -> None:
    """One training job. `defect` plants a bug: see DEFECTS."""
    import torch
    from torch import nn

    if defect is not None and defect not in DEFECTS:
        raise ValueError(f"defect={defect!r}: known {sorted(DEFECTS)}")
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    classes = 4
    if arch == "cnn":
        x, y = _image_data(seed, n_train + n_val, scale=255.0 if defect == "unnormalised_images" else 1.0)
        d = 0
    elif arch == "transformer":
        x, y = _sequence_data(seed, n_train + n_val, pad_fraction=0.8 if defect == "mostly_padding" else 0.25)
        d = 0
    else:
        x, y = _teacher_data(seed, n_train + n_val, imbalance=0.02 if defect == "class_imbalance" else None,
                             shuffle_labels=defect == "shuffled_labels")
        d = x.shape[1]
    if defect == "shifted_val_labels":  # the bug: the validation set's label mapping is off by one
        y[n_train:] = (y[n_train:] + 1) % classes
    if defect == "nan_input":
        x[n_train // 2 + 7, 3] = np.nan
    xt, yt = torch.from_numpy(x[:n_train]), torch.from_numpy(y[:n_train])
    xv, yv = torch.from_numpy(x[n_train:]), torch.from_numpy(y[n_train:])
    model = _model(torch, nn, arch, act, depth, width, d, classes)
    with torch.no_grad():
        linears = [m for m in model.modules() if isinstance(m, nn.Linear | nn.Conv2d)]
        if defect == "dead_relu":
            for m in linears[:-1]:
                m.bias.fill_(-20.0)
        elif defect == "saturated":
            for m in linears[:-1]:
                nn.init.normal_(m.weight, std=0.5)
                m.bias.fill_(30.0)
        elif defect == "zero_init":
            for m in linears:
                m.weight.zero_()
                m.bias.zero_()
        elif defect == "huge_init":
            for m in linears:
                nn.init.normal_(m.weight, std=3.0)
    params = list(model.parameters())
    if defect == "frozen":
        for p in params:
            p.requires_grad_(True)
        opt_params = list(nn.Linear(1, 1).parameters())  # the bug: the optimizer was given another model
    else:
        opt_params = params
    if optimizer == "adam":
        opt = torch.optim.Adam(opt_params, lr=lr, weight_decay=weight_decay)
    elif optimizer == "adamw":
        opt = torch.optim.AdamW(opt_params, lr=lr, weight_decay=weight_decay or 0.01)
    elif optimizer == "sgd":
        opt = torch.optim.SGD(opt_params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    elif optimizer == "rmsprop":
        opt = torch.optim.RMSprop(opt_params, lr=lr)
    else:
        raise ValueError(f"optimizer={optimizer!r}")
    loss_fn = nn.CrossEntropyLoss()
    hook = None
    if out_dir is not None:
        import tensortap.pytorch as tp

        hook = tp.Hook(out_dir=out_dir, save_config=tp.SaveConfig(save_interval=save_interval),
                       include_collections=list(COLLECTIONS))
        intervals = {"TRAIN": save_interval, "EVAL": 1, "PREDICT": 1, "GLOBAL": save_interval}
        every_eval = tp.SaveConfig(mode_save_configs={m: {"save_interval": i} for m, i in intervals.items()})
        for c in ("labels", "predictions"):  # a whole evaluation's labels, as for the losses
            hook.get_collection(c).save_config = every_eval
        hook.register_module(model)
        hook.register_loss(loss_fn)
    g = torch.Generator().manual_seed(seed)
    for _epoch in range(epochs):
        model.train()
        if hook is not None:
            hook.set_mode(tp.modes.TRAIN)
        order = torch.randperm(n_train, generator=g)
        for i in range(0, n_train - batch + 1, batch):
            idx = order[i:i + batch]
            opt.zero_grad()
            out = model(xt[idx])
            loss = loss_fn(out, yt[idx])
            loss.backward()
            if hook is not None:
                _save_extra(hook, arch, xt[idx], yt[idx], out)
            if defect == "exploding":
                for p in params:  # the bug: a gradient scaler that multiplies instead of dividing
                    if p.grad is not None:
                        p.grad.mul_(1e4)
            opt.step()
        model.eval()
        if hook is not None:
            hook.set_mode(tp.modes.EVAL)
        with torch.no_grad():
            for i in range(0, n_val, 128):
                out = model(xv[i:i + 128])
                loss_fn(out, yv[i:i + 128])
                if hook is not None:
                    _save_extra(hook, arch, xv[i:i + 128], yv[i:i + 128], out)
    if hook is not None:
        hook.close()


def _save_extra(hook: Any, arch: str, x: Any, y: Any, out: Any) -> None:
    """What the PyTorch hook does not capture by itself: labels and predictions (ClassImbalance, Confusion) and
    the model's input images or token sequences (CheckInputImages, NLPSequenceRatio), under the names those
    rules look for. Saved at the hook's saving steps only."""
    hook.save_tensor("labels", y, "labels")
    hook.save_tensor("predictions", out.detach().argmax(1), "predictions")
    if arch == "cnn":
        hook.save_tensor("Sequential_input_0", x, "input_image")
    elif arch == "transformer":
        hook.save_tensor("embedding_input_0", x, "input_sequence")


#: defects a job can plant, and what they do
DEFECTS = {
    "dead_relu": "hidden biases start at -20: every ReLU outputs 0, nothing learns",
    "saturated": "hidden biases start at +30: tanh/sigmoid inputs far outside the active range",
    "zero_init": "every weight and bias starts at 0: symmetric units, gradients collapse",
    "huge_init": "weights std 3: activations blow up layer after layer",
    "frozen": "the optimizer was given another model's parameters: the weights never change",
    "exploding": "gradients multiplied by 1e4 before the step: the weights overflow to inf/NaN",
    "nan_input": "one training sample holds a NaN",
    "shuffled_labels": "labels permuted: there is nothing to learn, the loss never falls",
    "class_imbalance": "98% of the samples are of class 0",
    "unnormalised_images": "images in 0..255 instead of normalised",
    "mostly_padding": "sequences are mostly padding tokens",
    "shifted_val_labels": "the validation labels are mapped off by one class",
}
