#!/usr/bin/env python3
"""Writes optim_reference.json: PyTorch's optimizers, LR schedulers and
gradient clipping run on fixed inputs, for tests/optim to compare against.

Run once with a CPU PyTorch (Debian's python3-torch 1.13 made the stored file):
    /usr/bin/python3 tests/optim/reference/make_reference.py
Floats are f32 values written as Python floats (exact), so the tests can
compare bit for bit where the arithmetic allows.
"""
import json
import os

import torch

torch.manual_seed(1234)
SHAPES = [(3, 4), (5,)]
STEPS = 6


def floats(t):
    return [float(x) for x in t.detach().reshape(-1).tolist()]


def optimizer_case(name, kind, torch_kwargs, ours, groups=None):
    params = [torch.randn(s, dtype=torch.float32) for s in SHAPES]
    initial = [floats(p) for p in params]
    grads = [[torch.randn(s, dtype=torch.float32) for s in SHAPES] for _ in range(STEPS)]
    live = [p.clone().requires_grad_(True) for p in params]
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
    if groups:
        arg = [dict(params=[live[i]], **g) for i, g in enumerate(groups)]
    else:
        arg = live
    extra = {} if kind == "sgd" else {"foreach": False}
    opt = cls(arg, **torch_kwargs, **extra)
    after = []
    for step in range(STEPS):
        for p, g in zip(live, grads[step]):
            p.grad = g.clone()
        opt.step()
        after.append([floats(p) for p in live])
    return {"name": name, "optimizer": kind, "options": ours, "groups": groups or [],
            "shapes": [list(s) for s in SHAPES], "initial": initial,
            "grads": [[floats(g) for g in gs] for gs in grads], "after": after}


def schedule_case(name, make, opt_kind="sgd", steps=12, momentum_key=None):
    p = torch.zeros(1, requires_grad=True)
    if opt_kind == "sgd":
        opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    else:
        opt = torch.optim.Adam([p], lr=0.1)
    sched = make(opt)
    lrs, momenta = [], []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        if momentum_key == "momentum":
            momenta.append(opt.param_groups[0]["momentum"])
        elif momentum_key == "beta1":
            momenta.append(opt.param_groups[0]["betas"][0])
        p.grad = torch.zeros(1)
        opt.step()
        sched.step()
    return {"name": name, "optimizer": opt_kind, "lr": lrs, "momentum": momenta}


def clip_case(name, max_norm, norm_type):
    grads = [torch.randn(s, dtype=torch.float32) * 3 for s in [(4, 3), (7,), (2, 2)]]
    params = [torch.zeros(g.shape, requires_grad=True) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
    return {"name": name, "max_norm": max_norm,
            "norm_type": "inf" if norm_type == float("inf") else norm_type,
            "shapes": [list(g.shape) for g in grads], "grads": [floats(g) for g in grads],
            "total_norm": float(total), "clipped": [floats(p.grad) for p in params]}


S = torch.optim.lr_scheduler
optimizers = [
    optimizer_case("sgd plain", "sgd", {"lr": 0.1}, {"lr": 0.1}),
    optimizer_case("sgd nesterov wd", "sgd",
                   {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
                   {"lr": 0.05, "momentum": 0.9, "nesterov": 1, "weight_decay": 0.01}),
    optimizer_case("sgd dampening maximize", "sgd",
                   {"lr": 0.05, "momentum": 0.8, "dampening": 0.3, "maximize": True},
                   {"lr": 0.05, "momentum": 0.8, "dampening": 0.3, "maximize": 1}),
    optimizer_case("adam default", "adam", {"lr": 1e-3}, {"lr": 1e-3}),
    optimizer_case("adam wd amsgrad", "adam",
                   {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1,
                    "amsgrad": True},
                   {"lr": 1e-2, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.1,
                    "amsgrad": 1}),
    optimizer_case("adam maximize", "adam", {"lr": 1e-2, "maximize": True},
                   {"lr": 1e-2, "maximize": 1}),
    optimizer_case("adamw default", "adamw", {"lr": 1e-3}, {"lr": 1e-3}),
    optimizer_case("adamw amsgrad", "adamw", {"lr": 3e-2, "weight_decay": 0.05, "amsgrad": True},
                   {"lr": 3e-2, "weight_decay": 0.05, "amsgrad": 1}),
    optimizer_case("adam groups", "adam", {"lr": 1e-3}, {"lr": 1e-3},
                   groups=[{"lr": 0.05}, {"weight_decay": 0.2}]),
]
schedules = [
    schedule_case("step", lambda o: S.StepLR(o, step_size=3, gamma=0.5)),
    schedule_case("multistep", lambda o: S.MultiStepLR(o, milestones=[2, 5, 9], gamma=0.1)),
    schedule_case("cosine", lambda o: S.CosineAnnealingLR(o, T_max=10, eta_min=0.001)),
    schedule_case("linear", lambda o: S.LinearLR(o, start_factor=0.25, end_factor=1.0,
                                                 total_iters=4)),
    schedule_case("warmup cosine", lambda o: S.SequentialLR(
        o, [S.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=3),
            S.CosineAnnealingLR(o, T_max=9, eta_min=0.0)], milestones=[3])),
    schedule_case("onecycle sgd", lambda o: S.OneCycleLR(o, max_lr=0.5, total_steps=12,
                                                         pct_start=0.3),
                  momentum_key="momentum"),
    schedule_case("onecycle adam linear", lambda o: S.OneCycleLR(
        o, max_lr=0.5, total_steps=12, pct_start=0.4, anneal_strategy="linear"),
        opt_kind="adam", momentum_key="beta1"),
]
clips = [clip_case("l2", 1.0, 2.0), clip_case("l1", 2.0, 1.0), clip_case("inf", 0.5, float("inf")),
         clip_case("l3", 1.5, 3.0), clip_case("no clip", 1000.0, 2.0)]

out = {"torch_version": torch.__version__, "optimizers": optimizers, "schedules": schedules,
       "clip": clips}
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim_reference.json")
with open(path, "w") as f:
    json.dump(out, f, indent=0)
print(f"wrote {path}")
