#!/usr/bin/env python3
"""PyTorch peer for step_bench: times forward + backward + SGD step of the
Fashion-MNIST MLP or CNN, ResNet-18 for 32x32 inputs, or a GPT (nanoGPT's
model, its shape given by --vocab-size ... --n-embd), on the CPU or one GPU,
and prints one JSON object.

GPT: the module tree and parameter names of nanoGPT (transformer.wte, wpe,
h.N.ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, ln_f, lm_head
tied to wte), exact GELU, no dropout; attention through
scaled_dot_product_attention(is_causal=True) where torch has it (2.x), else
written out (softmax of masked q k^T / sqrt(d), times v) for torch 1.13. Its
weights are drawn here, as nanoGPT draws them, not copied from lockstep: the
two sides share the architecture and the parameter count, which is reported.

CPU: refuses to report (exit 3) when PyTorch is not running on OpenBLAS, since
a comparison against the reference BLAS would be meaningless; reports which of
OpenBLAS's kernel sets it ran (step_bench passes OPENBLAS_CORETYPE where
lockstep corrected OpenBLAS's choice, runtime/cpu/openblas_core.h, so both
sides run the same kernels).

CUDA (--device cuda): every timed step ends with torch.cuda.synchronize(), as
step_bench's do; cudnn.benchmark is on unless --cudnn-benchmark off (its
algorithm search runs in the warm-up steps), and TF32 is off for both cuBLAS
and cuDNN unless --tf32: PyTorch's cudnn.allow_tf32 defaults to True,
lockstep's TF32 to off.
--kernel-trace N then runs N more steps under torch.profiler (CUPTI's
activity records, as lockstep's trace) and adds every kernel, copy and fill
they ran, as [name, start us, end us], for step_bench to summarize.

torch.set_num_threads() does not reach OpenBLAS (it keeps one thread per
core), so the thread count is also set through the environment before torch
loads, and the count OpenBLAS really uses is read back and reported."""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time


def threads_from_argv():
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "1"


# Must happen before torch (and with it OpenBLAS) is loaded.
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = threads_from_argv()

try:
    import torch  # noqa: E402
    import torch.nn as nn  # noqa: E402
except ImportError as e:
    sys.exit(f"{os.path.basename(sys.argv[0])}: no PyTorch for {sys.executable} ({e}; "
             "apt-get install python3-torch)")


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


class BasicBlock(nn.Module):
    """torchvision's BasicBlock (the same attribute names, so the same
    parameter names as lockstep's models::BasicBlock)."""

    def __init__(self, in_channels, channels, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """ResNet for 32x32 inputs: 3x3 stem, no max-pool (lockstep's models::ResNet)."""

    def __init__(self, blocks_per_stage=(2, 2, 2, 2), num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        in_channels = 64
        for stage, blocks in enumerate(blocks_per_stage):
            channels = 64 << stage
            layer = []
            for b in range(blocks):
                layer.append(BasicBlock(in_channels, channels, 2 if stage > 0 and b == 0 else 1))
                in_channels = channels
            setattr(self, "layer%d" % (stage + 1), nn.Sequential(*layer))
        self.fc = nn.Linear(in_channels, num_classes)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        for stage in range(1, 5):
            out = getattr(self, "layer%d" % stage)(out)
        out = torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)
        return self.fc(out)


def resnet18():
    return ResNet((2, 2, 2, 2), 10)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.sdpa = hasattr(nn.functional, "scaled_dot_product_attention")
        if not self.sdpa:
            mask = torch.tril(torch.ones(block_size, block_size, dtype=torch.bool))
            self.register_buffer("bias", mask.view(1, 1, block_size, block_size),
                                 persistent=False)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.sdpa:
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(~self.bias[:, :, :T, :T], float("-inf"))
            y = nn.functional.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()  # exact (erf), as lockstep's
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT (lockstep's models::Gpt), without dropout."""

    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets):
        T = idx.size(1)
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


MODELS = {"mlp": mlp, "cnn": cnn, "resnet18": resnet18}
INPUT_SHAPES = {"mlp": (1, 28, 28), "cnn": (1, 28, 28), "resnet18": (3, 32, 32)}


def loaded_blas():
    """The BLAS library this process has mapped (after a matmul has run)."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            name = os.path.basename(path)
            if "blas" in name or "lapack" in name:
                libs.add(os.path.realpath(path))
    return sorted(libs)


def openblas_threads(blas):
    """Threads the loaded OpenBLAS uses, or None when it cannot be asked."""
    for path in blas:
        try:
            return ctypes.CDLL(path).openblas_get_num_threads()
        except (OSError, AttributeError):
            continue
    return None


def openblas_core(blas):
    """The kernel set the loaded OpenBLAS runs ("Cooperlake", "Prescott"), or None."""
    for path in blas:
        try:
            get = ctypes.CDLL(path).openblas_get_corename
        except (OSError, AttributeError):
            continue
        get.restype = ctypes.c_char_p
        return get().decode()
    return None


def device_activities(step, steps):
    """[name, start us, end us] of every kernel, copy and fill the GPU ran in
    `steps` calls of step(), from the profiler's raw (Kineto) events."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    cuda_type = torch.autograd.DeviceType.CUDA
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    out = []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() != cuda_type:
            continue
        if hasattr(e, "start_ns"):
            start, length = e.start_ns() / 1e3, e.duration_ns() / 1e3
        else:  # before 2.1
            start, length = float(e.start_us()), float(e.duration_us())
        out.append([e.name(), start, start + length])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted([*MODELS, "gpt"]), required=True)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--amp", choices=["none", "bf16", "f16"], default="none",
                    help="autocast dtype for forward and loss (f16 with a GradScaler)")
    ap.add_argument("--cudnn-benchmark", choices=["on", "off"], default="on",
                    help="CUDA: torch.backends.cudnn.benchmark")
    ap.add_argument("--kernel-trace", type=int, default=0, metavar="N",
                    help="CUDA: trace N more steps' kernels with torch.profiler")
    ap.add_argument("--tf32", action="store_true",
                    help="TF32 for cuBLAS and cuDNN (CUDA only; off by default)")
    gpt = ap.add_argument_group("gpt", "the GPT's shape (step_bench passes lockstep's)")
    gpt.add_argument("--seq-len", type=int, default=128)
    gpt.add_argument("--vocab-size", type=int, default=256)
    gpt.add_argument("--block-size", type=int, default=128)
    gpt.add_argument("--n-layer", type=int, default=4)
    gpt.add_argument("--n-head", type=int, default=4)
    gpt.add_argument("--n-embd", type=int, default=128)
    a = ap.parse_args()

    cuda = a.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            print("step_bench_torch: --device cuda, but torch.cuda.is_available() is False "
                  "(PyTorch %s)" % torch.__version__, file=sys.stderr)
            return 5
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
        torch.backends.cudnn.benchmark = a.cudnn_benchmark == "on"
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    device = torch.device("cuda:0" if cuda else "cpu")
    gpt_fields = {}
    if a.model == "gpt":
        model = GPT(a.vocab_size, a.block_size, a.n_layer, a.n_head, a.n_embd).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        # Each row's targets are its ids shifted by one.
        tokens = torch.randint(0, a.vocab_size, (a.batch_size, a.seq_len + 1)).to(device)
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        gpt_fields = {"seq_len": a.seq_len,
                      "parameters": sum(p.numel() for p in model.parameters()),
                      "attention": ("scaled_dot_product_attention"
                                    if model.transformer.h[0].attn.sdpa else "explicit")}

        def loss_of():
            return model(x, y)
    else:
        model = MODELS[a.model]().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x = torch.randn(a.batch_size, *INPUT_SHAPES[a.model]).to(device)
        y = torch.randint(0, 10, (a.batch_size,)).to(device)
        loss_fn = nn.CrossEntropyLoss()

        def loss_of():
            return loss_fn(model(x), y)

    amp_dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(a.amp)
    if a.amp == "f16" and not cuda:
        print("step_bench_torch: PyTorch's CPU autocast has no f16", file=sys.stderr)
        return 6
    # torch.amp.GradScaler("cuda") since 2.3; torch.cuda.amp's before (1.13).
    if hasattr(torch.amp, "GradScaler"):
        scaler = torch.amp.GradScaler("cuda", enabled=a.amp == "f16")
    else:
        scaler = torch.cuda.amp.GradScaler(enabled=a.amp == "f16")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp_dtype or torch.bfloat16,
                            enabled=amp_dtype is not None):
            loss = loss_of()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if cuda:
            torch.cuda.synchronize()

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)

    if cuda:
        trace = {}
        if a.kernel_trace > 0:
            try:  # a trace that fails costs the trace, not the timing
                trace = {"kernel_trace": {"steps": a.kernel_trace,
                                          "activities": device_activities(step, a.kernel_trace)}}
            except Exception as e:  # noqa: BLE001 (any profiler failure is reported)
                trace = {"kernel_trace": {"error": "%s: %s" % (type(e).__name__, e)}}
        print(json.dumps({"peer": "pytorch", "version": torch.__version__, "model": a.model,
                          "device": "cuda", "gpu": torch.cuda.get_device_name(device),
                          "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                          "tf32": a.tf32, "amp": a.amp, "batch_size": a.batch_size,
                          "median_ms": statistics.median(times) * 1e3, **gpt_fields,
                          **trace}))
        return 0  # OpenBLAS plays no part on the GPU

    blas = loaded_blas()
    on_openblas = any("openblas" in b for b in blas)
    blas_threads = openblas_threads(blas)
    result = {"blas_threads": blas_threads, "openblas_core": openblas_core(blas),
              "peer": "pytorch", "version": torch.__version__,
              "model": a.model, "device": "cpu", "amp": a.amp, "batch_size": a.batch_size,
              "threads": a.threads,
              "median_ms": statistics.median(times) * 1e3, "blas": blas,
              "on_openblas": on_openblas, **gpt_fields}
    print(json.dumps(result))
    if not on_openblas:
        print("step_bench_torch: PyTorch is not using OpenBLAS (loaded: %s). Install "
              "libopenblas0 so Debian's alternatives point libblas.so.3 at it; the reference "
              "BLAS is ~15x slower and the comparison would be meaningless." % (blas or "none"),
              file=sys.stderr)
        return 3
    if blas_threads is not None and blas_threads != a.threads:
        print("step_bench_torch: OpenBLAS uses %d threads, asked for %d" % (blas_threads, a.threads),
              file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
