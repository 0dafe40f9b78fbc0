#!/usr/bin/python3
"""Prints the PyTorch numbers of tests/models/test_resnet_reference.cpp: a
CIFAR ResNet-18 with torchvision's module tree (BasicBlock, downsample, the
same attribute names), a 3x3 stem and no max-pool as models/resnet.h, given
weights and an input from sine formulas both sides compute, run once in train
mode (batch statistics, running statistics updated with momentum 0.1), one
backward of the cross-entropy, then in eval mode. Run with Debian's
python3-torch (1.13, CPU):

    /usr/bin/python3 tests/nn/reference/make_resnet_reference.py
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

class BasicBlock(nn.Module):
    def __init__(self, inp, ch, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, ch, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(ch, ch, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(ch)
        self.downsample = None
        if stride != 1 or inp != ch:
            self.downsample = nn.Sequential(nn.Conv2d(inp, ch, 1, stride, bias=False),
                                            nn.BatchNorm2d(ch))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(out + shortcut)


class ResNet(nn.Module):
    def __init__(self, blocks=(2, 2, 2, 2), num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        inp = 64
        for i, n in enumerate(blocks):
            ch, layer = 64 << i, []
            for b in range(n):
                layer.append(BasicBlock(inp, ch, 2 if (i > 0 and b == 0) else 1))
                inp = ch
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        for i in range(4):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


# Entry j of the p-th state_dict tensor is a function of sin(0.7 j + 1.3 p + 0.5):
# running variances in [1, 1.5], weights of convs and linears scaled by 1 / sqrt(fan_in).
def fill(model):
    with torch.no_grad():
        for p, (name, t) in enumerate(model.state_dict().items()):
            if name.endswith("num_batches_tracked"):
                continue
            j = torch.arange(t.numel(), dtype=torch.float64)
            base = torch.sin(0.7 * j + 1.3 * p + 0.5)
            if name.endswith("running_var"):
                v = 1.0 + 0.5 * base * base
            elif name.endswith("running_mean"):
                v = 0.1 * base
            elif t.dim() >= 2:
                v = base / math.sqrt(t[0].numel())
            else:
                v = (1.0 if name.endswith("weight") else 0.0) + 0.2 * base
            t.copy_(v.reshape(t.shape).float())


def inputs(n):
    j = torch.arange(n * 3 * 32 * 32, dtype=torch.float64)
    return torch.sin(0.37 * j + 0.1).reshape(n, 3, 32, 32).float()


def numbers(name, values):
    print(f"{name} = {{" + ", ".join(f"{v:.9g}" for v in values) + "}")


def main():
    model = ResNet()
    fill(model)
    x = inputs(2)
    model.train()
    logits = model(x)
    loss = F.cross_entropy(logits, torch.tensor([3, 8]))
    loss.backward()
    numbers("train logits", logits.detach().flatten().tolist())
    numbers("loss", [loss.item()])
    params = dict(model.named_parameters())
    for name in GRADS:
        g = params[name].grad.double()
        w = torch.sin(0.3 * torch.arange(g.numel(), dtype=torch.float64)).reshape(g.shape)
        numbers(f"grad {name} (sum |g|, sum g sin(0.3 j))",
                [g.abs().sum().item(), (g * w).sum().item()])
    sd = model.state_dict()
    for name in BUFFERS:
        t = sd[name].double().flatten()
        numbers(f"{name} (first two, sum)", [t[0].item(), t[1].item(), t.sum().item()])
    print("num_batches_tracked", sorted({sd[k].item() for k in sd if k.endswith("tracked")}))
    model.eval()
    with torch.no_grad():
        numbers("eval logits", model(x).flatten().tolist())


GRADS = ["conv1.weight", "bn1.weight", "layer2.0.downsample.0.weight", "layer4.1.bn2.bias",
         "fc.weight", "fc.bias"]
BUFFERS = ["bn1.running_mean", "bn1.running_var", "layer2.0.downsample.1.running_mean",
           "layer4.1.bn2.running_var"]

if __name__ == "__main__":
    main()
