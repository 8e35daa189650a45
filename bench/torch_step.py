#!/usr/bin/python3
"""PyTorch reference for bench_train_step (docs/benchmarks.md): one training step of the
configs/small.toml model (InternLM2: RMSNorm, GQA attention with RoPE, SwiGLU FFN, untied head) on
one packed row, eager mode, fp32 or torch.autocast("cpu", dtype=torch.bfloat16), AdamW with
gradient clipping. Attention is causal inside each document of the row (a loop over documents, as
a varlen-unaware PyTorch model has to do it). Prints tokens/s per dtype.

Needs Debian's python3-torch (1.13); a benchmark only, never a test dependency.
Usage: /usr/bin/python3 bench/torch_step.py [--threads N] [--steps S] [--P 2048] [--mean 300]
       [--dtypes float32,bfloat16] [--vocab V --hidden H --layers L --heads A --kv-heads K]
       [--profile]
--profile runs the last step under torch.profiler and prints the share of its CPU time spent in
GEMMs (aten::mm / addmm / bmm: oneDNN's kernels under autocast) — the part of PyTorch's step that
another engine calling the same GEMM library cannot make faster.
The model defaults to configs/small.toml's; the long-row benchmark (bench/long_row.toml) passes
--P 16384 --mean 2048 --hidden 512 --layers 4 --heads 4 --kv-heads 2.
"""
import argparse
import math
import time

import numpy as np
import torch
import torch.nn.functional as F

# configs/small.toml: vocab 8192, hidden 384, 6 layers, 6 heads (head_dim 64), 2 kv heads,
# FFN = 256 · ceil(int(384 · 8/3) / 256) = 1024 (set_shape changes them from the command line).
VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 8192, 384, 6, 6, 2, 1024
HEAD_DIM = HIDDEN // HEADS


def set_shape(vocab, hidden, layers, heads, kv_heads):
    """The model shape; FFN as longtron's mlp_ratio = "8/3" (a multiple of 256)."""
    global VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, HEAD_DIM
    VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS = vocab, hidden, layers, heads, kv_heads
    FFN = 256 * math.ceil(int(hidden * 8 / 3) / 256)
    HEAD_DIM = hidden // heads


def row_lengths(P, mean, seed):
    """Documents of exponential length (mean `mean`, at least 2 tokens) packed into a P-token row;
    the last one is cut at the row edge (as bench_train_step's random dataset is packed)."""
    rng = np.random.RandomState(seed)
    lengths, total = [], 0
    while total < P:
        n = min(max(2, int(round(rng.exponential(mean)))), P - total)
        lengths.append(n)
        total += n
    return lengths


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)) * self.weight


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = RMSNorm(HIDDEN)
        self.wqkv = torch.nn.Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.wo = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.ffn_norm = RMSNorm(HIDDEN)
        self.w1 = torch.nn.Linear(HIDDEN, FFN, bias=False)
        self.w3 = torch.nn.Linear(HIDDEN, FFN, bias=False)
        self.w2 = torch.nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x, cos, sin, bounds):
        qkv = self.wqkv(self.attention_norm(x))
        q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
        q = q.view(-1, HEADS, HEAD_DIM).transpose(0, 1)
        k = k.view(-1, KV_HEADS, HEAD_DIM).transpose(0, 1)
        v = v.view(-1, KV_HEADS, HEAD_DIM).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=0)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=0)
        outs = []
        for a, b in bounds:  # causal attention inside each document
            s = torch.matmul(q[:, a:b], k[:, a:b].transpose(1, 2)) / math.sqrt(HEAD_DIM)
            mask = torch.ones(b - a, b - a, dtype=torch.bool).triu(1)
            p = torch.softmax(s.float().masked_fill(mask, float("-inf")), dim=-1)
            outs.append(torch.matmul(p.to(v.dtype), v[:, a:b]))
        attn = torch.cat(outs, dim=1).transpose(0, 1).reshape(-1, HIDDEN)
        h = x + self.wo(attn)
        z = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(z)) * self.w3(z))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = torch.nn.Embedding(VOCAB, HIDDEN)
        self.layers = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(HIDDEN)
        self.output = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, ids, positions, bounds):
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        angles = positions[:, None].float() * inv_freq[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos()[None], emb.sin()[None]
        x = self.tok_embeddings(ids)
        for layer in self.layers:
            x = layer(x, cos, sin, bounds)
        return self.output(self.norm(x))


def make_row(P, mean, seed):
    """Random ids, labels (next token, -100 at each document's end), positions and document
    bounds of one packed P-token row."""
    bounds, positions, start = [], [], 0
    for n in row_lengths(P, mean, seed):
        bounds.append((start, start + n))
        positions.extend(range(n))
        start += n
    ids = torch.randint(3, VOCAB, (P,))
    labels = torch.roll(ids, -1)
    for a, b in bounds:
        labels[b - 1] = -100
    return ids, labels, torch.tensor(positions), bounds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--P", type=int, default=2048)
    ap.add_argument("--mean", type=float, default=300.0, help="mean document length")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--hidden", type=int, default=HIDDEN)
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--heads", type=int, default=HEADS)
    ap.add_argument("--kv-heads", type=int, default=KV_HEADS)
    ap.add_argument("--profile", action="store_true", help="GEMM share of the last step")
    args = ap.parse_args()
    set_shape(args.vocab, args.hidden, args.layers, args.heads, args.kv_heads)
    torch.set_num_threads(args.threads)  # PyTorch defaults to 1 thread here
    torch.manual_seed(0)
    # One row per step, drawn from the same law each time (as longtron's trainer sees a new row
    # each step), the same rows for every dtype.
    rows = [make_row(args.P, args.mean, 2024 + step) for step in range(args.steps)]
    sums = [sum((b - a) ** 2 for a, b in row[3]) for row in rows]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, P = {args.P}, "
          f"{sum(len(row[3]) for row in rows) / len(rows):.1f} documents per row (mean sum l^2 = "
          f"{sum(sums) / len(sums):.3g}), hidden {HIDDEN}, {LAYERS} layers, "
          f"{HEADS} heads of {HEAD_DIM}, {KV_HEADS} kv heads, FFN {FFN}")
    for dtype in args.dtypes.split(","):
        model = Model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01)
        times, cpu, losses = [], [], []
        def step(ids, labels, positions, bounds):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(dtype == "bfloat16")):
                logits = model(ids, positions, bounds)
                loss = F.cross_entropy(logits.float(), labels, ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return loss.item()

        for ids, labels, positions, bounds in rows:
            t0, c0 = time.perf_counter(), time.process_time()
            losses.append(step(ids, labels, positions, bounds))
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        steady = sorted(times[1:] if len(times) > 1 else times)
        median = steady[len(steady) // 2]
        steady_cpu = sorted(cpu[1:] if len(cpu) > 1 else cpu)
        median_cpu = steady_cpu[len(steady_cpu) // 2]
        print(f"torch {dtype}: median step {median:.3f} s, {args.P / median:.0f} tokens/s, "
              f"{median_cpu:.3f} CPU-s, {args.P / median_cpu:.0f} tokens per CPU-second "
              f"(first step {times[0]:.3f} s left out; loss {losses[0]:.4f} -> {losses[-1]:.4f})")
        if args.profile:
            print_gemm_share(dtype, lambda: step(*rows[-1]))


def print_gemm_share(dtype, run_step):
    """Runs one step under the profiler; prints the self CPU time of the GEMM ops over the total."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    gemm_ops = ("aten::mm", "aten::addmm", "aten::bmm")
    gemm = sum(e.self_cpu_time_total for e in events if e.key in gemm_ops)
    print(f"torch {dtype} profile: GEMMs (aten::mm/addmm/bmm self time) {gemm / 1e6:.3f} s of "
          f"{total / 1e6:.3f} s self CPU time in all ops ({gemm / total:.2f}); a step that only "
          f"ran these GEMMs would be {total / gemm:.2f}x faster")


if __name__ == "__main__":
    main()
