"""PyTorch with a dead layer: the first Linear's bias starts at -100, so the ReLU after it outputs exactly 0
and that layer's weight and bias gradients are exactly 0 at every step (the layer that matters); the last
layer still learns. tensortap's PyTorch hook saves weights and gradients every step.
Usage: train_dead_layer.py OUT_DIR [STEPS] [BIAS] (BIAS 0: a healthy run of the same model to compare with)"""

import sys

import torch
from torch import nn

import tensortap.pytorch as tp

out = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
bias = float(sys.argv[3]) if len(sys.argv) > 3 else -100.0
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
with torch.no_grad():
    model[0].bias.fill_(bias)
hook = tp.Hook(out_dir=out, save_config=tp.SaveConfig(save_interval=1),
               include_collections=["weights", "biases", "gradients", "losses"])
hook.register_module(model)
loss_fn = nn.CrossEntropyLoss()
hook.register_loss(loss_fn)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(128, 8)
y = x[:, :3].argmax(dim=1)
for _ in range(steps):
    hook.set_mode(tp.modes.TRAIN)
    idx = torch.randint(0, len(x), (32,))
    opt.zero_grad()
    loss = loss_fn(model(x[idx]), y[idx])
    loss.backward()
    opt.step()
hook.close()
print("training finished", flush=True)
