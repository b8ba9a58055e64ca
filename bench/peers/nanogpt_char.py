"""nanoGPT's character-level Shakespeare training in PyTorch, as a reference for examples/char_gpt.cpp.

The model is nanoGPT's model.py GPT (bias-free LayerNorm, tied wte/lm_head, its _init_weights and scaled c_proj
init, causal F.scaled_dot_product_attention); the loop is its train.py with configure_optimizers (AdamW, weight
decay on params with dim >= 2 only), get_lr (warmup + cosine), grad clipping at 1.0 and estimate_loss. Defaults are
nanoGPT's CPU config for shakespeare_char (4 layers, 4 heads, 128 wide, block 64, batch 12, 2000 iterations).

  python nanogpt_char.py --data input.txt [--iters 2000] [--seed 1337] [--eval-iters 200]
      [--init-state init.safetensors] [--batches batches.bin] [--save-state final.safetensors]
      [--print-step-losses] [--threads N]

--init-state loads initial weights (nanoGPT state_dict keys, e.g. as saved by ember); --batches reads pre-drawn
train-batch offsets, a raw little-endian int64 file of shape [iters, batch], used instead of torch.randint. Without
them, random draws happen in train.py's order (init, first batch, then per iteration: evaluation, forward, next
batch), so a seed gives nanoGPT's random draws. Prints one JSON line at the end: {"train_loss", "val_loss",
"ms_per_iter"} (the losses are the final estimate_loss with --eval-iters batches per split).
"""
import argparse
import json
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 65
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                           dropout_p=self.dropout if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight'):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        _, t = idx.size()
        assert t <= self.config.block_size
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {'params': [p for p in params if p.dim() >= 2], 'weight_decay': weight_decay},
            {'params': [p for p in params if p.dim() < 2], 'weight_decay': 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=False)


def get_lr(it, learning_rate, warmup_iters, lr_decay_iters, min_lr):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def load_data(path):
    """nanoGPT's data/shakespeare_char/prepare.py: sorted characters as the vocabulary, a 90/10 split."""
    with open(path, 'r', encoding='utf-8') as f:
        text = f.read()
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    data = np.array([stoi[c] for c in text], dtype=np.int64)
    n = len(data)
    return torch.from_numpy(data[:int(n * 0.9)]), torch.from_numpy(data[int(n * 0.9):]), len(chars)


def batch_at(data, ix, block_size, device):
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x.to(device), y.to(device)


def get_batch(data, batch_size, block_size, device):
    ix = torch.randint(len(data) - block_size, (batch_size,))
    return batch_at(data, ix, block_size, device)


def load_init_state(model, path):
    from safetensors.torch import load_file
    state = load_file(path)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    # Both tied names are in the file; they must hold the same values.
    assert torch.equal(state['lm_head.weight'], state['transformer.wte.weight'])


@torch.no_grad()
def estimate_loss(model, splits, eval_iters, batch_size, block_size, device):
    out = {}
    model.eval()
    for name, data in splits.items():
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            x, y = get_batch(data, batch_size, block_size, device)
            losses[k] = model(x, y)[1].item()
        out[name] = losses.mean().item()
    model.train()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--data', required=True)
    ap.add_argument('--iters', type=int, default=2000)
    ap.add_argument('--lr-decay-iters', type=int, default=2000)
    ap.add_argument('--warmup-iters', type=int, default=100)
    ap.add_argument('--seed', type=int, default=1337)
    ap.add_argument('--eval-iters', type=int, default=200)
    ap.add_argument('--eval-interval', type=int, default=250, help='0: evaluate only at the end')
    ap.add_argument('--batch-size', type=int, default=12)
    ap.add_argument('--device', default='cpu')
    ap.add_argument('--threads', type=int, default=0, help='torch.set_num_threads (0: leave as is)')
    ap.add_argument('--init-state', help='initial weights (.safetensors with nanoGPT state_dict keys)')
    ap.add_argument('--batches', help='raw little-endian int64 train-batch offsets [iters, batch_size]')
    ap.add_argument('--save-state', help='write the final weights here (.safetensors)')
    ap.add_argument('--log-every', type=int, default=0)
    ap.add_argument('--print-step-losses', action='store_true')
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(args.seed)
    train_data, val_data, vocab_size = load_data(args.data)
    config = GPTConfig(vocab_size=vocab_size)
    model = GPT(config)
    if args.init_state:
        load_init_state(model, args.init_state)
    model.to(args.device)
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99))
    offsets = None
    if args.batches:
        offsets = np.fromfile(args.batches, dtype='<i8').reshape(-1, args.batch_size)
        assert len(offsets) >= args.iters, f'{args.batches} holds {len(offsets)} batches, need {args.iters}'
    splits = {'train': train_data, 'val': val_data}

    def next_batch(i):  # nanoGPT draws a train batch up front and the next one right after each forward
        if offsets is None:
            return get_batch(train_data, args.batch_size, config.block_size, args.device)
        if i >= len(offsets):
            return None, None
        return batch_at(train_data, offsets[i].tolist(), config.block_size, args.device)

    t0 = time.time()
    x, y = next_batch(0)
    for it in range(args.iters + 1):
        lr = get_lr(it, 1e-3, args.warmup_iters, args.lr_decay_iters, 1e-4)
        for group in optimizer.param_groups:
            group['lr'] = lr
        if it == args.iters or (args.eval_interval and it % args.eval_interval == 0):
            if it == args.iters:
                ms = 1000 * (time.time() - t0) / max(args.iters, 1)
            losses = estimate_loss(model, splits, args.eval_iters, args.batch_size, config.block_size, args.device)
            print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}", flush=True)
            if it == args.iters:
                break
        _, loss = model(x, y)
        x, y = next_batch(it + 1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if args.print_step_losses:
            print(f'step {it} loss {loss.item():.7f}', flush=True)
        elif args.log_every and it % args.log_every == 0:
            print(f'iter {it}: loss {loss.item():.4f}, lr {lr:.2e}, {time.time() - t0:.0f} s', flush=True)
    if args.save_state:
        from safetensors.torch import save_file
        save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, args.save_state)
    print(json.dumps({'train_loss': round(losses['train'], 4), 'val_loss': round(losses['val'], 4),
                      'ms_per_iter': round(ms, 1)}))


if __name__ == '__main__':
    main()
