#!/usr/bin/python3
"""Writes gpt_reference.safetensors: a small GPT's weights, a batch of tokens,
and PyTorch's loss, logits and gradient of every parameter on them, for
tests/nn/test_gpt.cpp. Run once with Debian's python3-torch (1.13, CPU):

    /usr/bin/python3 tests/nn/reference/make_gpt_reference.py

The model is nanoGPT's (same module tree and parameter names), with the
attention written out (PyTorch 1.13 has no scaled_dot_product_attention).
"""
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG = dict(vocab_size=96, block_size=24, n_layer=2, n_head=3, n_embd=48)
BATCH, STEPS = 3, 17  # an odd sequence length, shorter than block_size


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"])
        self.n_head = c["n_head"]

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"])
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"])

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["n_embd"])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c["n_embd"])
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab_size"], c["n_embd"]),
            wpe=nn.Embedding(c["block_size"], c["n_embd"]),
            h=nn.ModuleList([Block(c) for _ in range(c["n_layer"])]),
            ln_f=nn.LayerNorm(c["n_embd"]),
        ))
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        t = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def write_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    dtypes = {torch.float32: "F32", torch.int64: "I64"}
    for name, t in tensors.items():
        data = t.detach().contiguous().numpy().tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    torch.manual_seed(0)
    model = GPT(CONFIG)
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        for name, p in model.named_parameters():
            if "ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    idx = torch.randint(0, CONFIG["vocab_size"], (BATCH, STEPS))
    targets = torch.randint(0, CONFIG["vocab_size"], (BATCH, STEPS))
    logits, loss = model(idx, targets)
    loss.backward()

    tensors = dict(model.state_dict())  # both tied names, as PyTorch lists them
    tensors["input.idx"] = idx
    tensors["input.targets"] = targets
    tensors["output.logits"] = logits
    tensors["output.loss"] = loss.reshape(1)
    for name, p in model.named_parameters():
        tensors["grad." + name] = p.grad
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt_reference.safetensors")
    write_safetensors(path, tensors, {"config": json.dumps(CONFIG), "torch": torch.__version__})
    print(f"wrote {path}: loss {loss.item():.6f}, {len(tensors)} tensors")


if __name__ == "__main__":
    main()
