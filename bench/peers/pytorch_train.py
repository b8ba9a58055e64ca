"""PyTorch eager peer of `ember bench train` on a GPU: the same standard configs, AdamW (fused=True, lr 1e-3), one
fixed random batch, zero_grad(set_to_none=True), timed with the device synchronised after every step.

  python pytorch_train.py --model cnn|gpt|gpt2 [--amp none|autocast-fp16|autocast-bf16] [--batch-size B]
      [--steps 20] [--warmup 3] [--device cuda] [--compile]

Models: cnn is the MNIST Net without dropout (batch 64, 1x28x28); gpt is nanoGPT's char config (batch 12); gpt2 is
GPT-2 124M as nanoGPT/llm.c train it (12 layers, 12 heads, 768 wide, block 1024, vocab 50304, biases, tied lm_head;
batch 4 unless given). The GPT model is nanogpt_char.py's (nanoGPT's model.py, causal scaled_dot_product_attention).
autocast-fp16 uses torch.amp.GradScaler as PyTorch's recipe does; autocast-bf16 needs none. --compile wraps the model
in torch.compile (off by default: the issue compares against eager mode).
Prints one JSON line with ember's keys: model, device, batch, steps, ms_per_step_median/min/max, tokens_per_step,
tokens_per_s, peak_allocated_bytes (torch.cuda.max_memory_allocated over the timed steps), peak_reserved_bytes,
first_loss, last_loss, amp.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    from nanogpt_char import GPT, GPTConfig  # noqa: E402
except ModuleNotFoundError as e:
    # nanogpt_char imports numpy for its data loading only; torch's wheels do not depend on numpy, so where it is
    # missing the model is imported with a placeholder module, removed again so that torch still sees no numpy.
    if e.name != "numpy":
        raise
    import types
    sys.modules["numpy"] = types.ModuleType("numpy")
    try:
        from nanogpt_char import GPT, GPTConfig  # noqa: E402
    finally:
        del sys.modules["numpy"]


class MnistNet(nn.Module):
    """pytorch/examples' MNIST Net without its dropout layers (ember's MnistNet(dropout=false))."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def make_task(name, batch, device):
    if name == "cnn":
        b = batch or 64
        model = MnistNet()
        x = torch.randn(b, 1, 28, 28)
        y = torch.randint(0, 10, (b,))
        tokens = b
    elif name in ("gpt", "gpt2"):
        if name == "gpt":
            cfg, b = GPTConfig(), batch or 12
        else:
            cfg = GPTConfig(block_size=1024, vocab_size=50304, n_layer=12, n_head=12, n_embd=768, bias=True)
            b = batch or 4
        model = GPT(cfg)
        x = torch.randint(0, cfg.vocab_size, (b, cfg.block_size))
        y = torch.randint(0, cfg.vocab_size, (b, cfg.block_size))
        tokens = b * cfg.block_size
    else:
        raise SystemExit(f"pytorch_train: unknown model {name!r} (cnn, gpt, gpt2)")
    return model.to(device), x.to(device), y.to(device), b, tokens


def loss_of(model, x, y):
    out = model(x)
    logits = out[0] if isinstance(out, tuple) else out
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--amp", default="none", choices=["none", "autocast-fp16", "autocast-bf16"])
    ap.add_argument("--batch-size", type=int, default=0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0:
        raise SystemExit("pytorch_train: --steps must be >= 1 and --warmup >= 0")
    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    model, x, y, batch, tokens = make_task(a.model, a.batch_size, device)
    if a.compile:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device.type == "cuda")
    amp_dtype = {"autocast-fp16": torch.float16, "autocast-bf16": torch.bfloat16}.get(a.amp)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)

    def step():
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            loss = loss_of(model, x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    ms, first, last = [], None, None
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            sync()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        value = step().item()
        sync()
        t1 = time.perf_counter()
        first = value if first is None else first
        last = value
        if i >= a.warmup:
            ms.append((t1 - t0) * 1e3)
    ms.sort()
    med = ms[len(ms) // 2] if len(ms) % 2 else 0.5 * (ms[len(ms) // 2 - 1] + ms[len(ms) // 2])
    cuda = device.type == "cuda"
    print(json.dumps({
        "model": a.model, "device": str(device), "batch": batch, "steps": a.steps,
        "parameters": sum(p.numel() for p in model.parameters()),
        "ms_per_step_median": med, "ms_per_step_min": ms[0], "ms_per_step_max": ms[-1],
        "tokens_per_step": tokens, "tokens_per_s": tokens / (med * 1e-3),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(device) if cuda else 0,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device) if cuda else 0,
        "first_loss": first, "last_loss": last, "amp": a.amp, "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
