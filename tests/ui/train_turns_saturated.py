"""A short PyTorch training that is healthy until step SATURATE_AT, then its sigmoids saturate (biases
set to 12), so the gradients of the first layers vanish. Plain PyTorch: `tensortap run` attaches to it."""

import sys

import torch
from torch import nn

SATURATE_AT = int(sys.argv[1]) if len(sys.argv) > 1 else 30
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 50

torch.manual_seed(0)
torch.set_num_threads(1)
layers = []
for i in range(4):
    layers += [nn.Linear(8 if i == 0 else 16, 16), nn.Sigmoid()]
model = nn.Sequential(*layers, nn.Linear(16, 3))
x = torch.randn(256, 8)
y = x[:, :3].argmax(dim=1)
loss_fn = nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(STEPS):
    if step == SATURATE_AT:
        with torch.no_grad():
            for m in model:
                if isinstance(m, nn.Linear) and m.out_features == 16:
                    m.bias.fill_(12.0)
    model.train()
    idx = torch.randint(0, len(x), (32,))
    opt.zero_grad()
    loss = loss_fn(model(x[idx]), y[idx])
    loss.backward()
    opt.step()
    if step % 10 == 9:
        model.eval()
        with torch.no_grad():
            loss_fn(model(x[:64]), y[:64])
print("training finished", flush=True)
