"""A small PyTorch training with a real bug: a deep sigmoid network whose biases start far too large.

Every sigmoid saturates (its output is ~1, its slope ~1e-5), so the gradients reaching the first layers
vanish and those layers never learn.
Plain PyTorch, synthetic data, no tensortap code: `tensortap run` attaches to it.
Usage: python train_saturating.py [--steps N] [--healthy]
"""

import argparse

import torch
from torch import nn


def build(healthy: bool) -> nn.Module:
    layers = []
    width = 32
    for i in range(8):
        lin = nn.Linear(16 if i == 0 else width, width)
        if healthy:
            nn.init.kaiming_uniform_(lin.weight, nonlinearity="relu")
        else:
            nn.init.normal_(lin.weight, std=0.1)
            nn.init.constant_(lin.bias, 12.0)  # the bug: every sigmoid starts saturated
        layers += [lin, nn.ReLU() if healthy else nn.Sigmoid()]
    layers.append(nn.Linear(width, 4))
    return nn.Sequential(*layers)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--healthy", action="store_true", help="ReLU with a sensible initialisation instead")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x = torch.randn(512, 16)
    y = (x[:, :4].argmax(dim=1)).long()
    model = build(args.healthy)
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05 if args.healthy else 0.5)
    for step in range(args.steps):
        model.train()
        idx = torch.randint(0, len(x), (64,))
        opt.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        if step % 50 == 49:
            model.eval()
            with torch.no_grad():
                val = loss_fn(model(x[:128]), y[:128])
            print(f"step {step + 1}: train loss {loss.item():.4f}, eval loss {val.item():.4f}", flush=True)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
