"""A small Lightning job the trainer tests run (in-process or as a script)."""

from __future__ import annotations

import torch
from torch import nn


def make_module(lightning_pkg, record=None, lr=0.1, automatic=True):
    L = lightning_pkg

    class Recording(torch.optim.SGD):
        """Records what the optimizer consumes: the gradients after the closure (forward, backward, unscaling,
        clipping) and the weights before the update, at each step."""

        def step(self, closure=None):
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            if record is not None:
                record.append({
                    "weights": {n: p.detach().clone() for n, p in module.named_parameters()},
                    "grads": {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None},
                })
            super().step()
            return loss

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
            self.automatic_optimization = automatic

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self(x)
            loss = nn.functional.cross_entropy(logits, y)
            self.log("train_acc", (logits.argmax(1) == y).float().mean(), on_step=True)
            if not automatic:
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.cross_entropy(self(x), y)
            self.log("val_loss", loss)
            return loss

        def configure_optimizers(self):
            return Recording(self.parameters(), lr=lr)

    module = Tiny()
    return module


def loaders(n=96, batch=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    ds = torch.utils.data.TensorDataset(x, y)
    return (torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=False),
            torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:32], y[:32]), batch_size=8))
