"""A small ViT on scikit-learn's 8x8 digits, its attention ``DiffAttention``: baseline, DIFF V1 and DIFF V2 over seeds.

    python examples/vit_digits.py                      # 3 variants x 3 seeds; about a minute on one CPU core

Each image is cut into 2x2 patches (16 tokens) plus a CLS token, with a learned position embedding, so the attention
runs with ``causal=False, rope=False``. Every variant trains on the same fixed split with the same seeds (the same
batches, in the same order); the table gives each variant's mean test accuracy with a 95% t-interval over the seeds,
and each DIFF variant minus the baseline, paired by seed. DIFF V1 has the baseline's parameters (plus its lambdas and
head norm); DIFF V2 has more: its query projection is twice as wide (2 x n_heads query heads), plus W_lambda.
"""

import argparse
import math
import statistics

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn import functional as F

from difftransformer import DiffAttention

VARIANTS, BATCH = ("baseline", "diff_v1", "diff_v2"), 32
p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--seeds", type=int, default=3, help="seeds per variant (0, 1, ...); the interval needs at least 2")
p.add_argument("--epochs", type=int, default=15, help="passes over the 1347 training images")
p.add_argument("--d-model", type=int, default=64, help="model width (4 baseline heads of d_model/4)")
p.add_argument("--depth", type=int, default=2, help="transformer blocks")
p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS, help="the attentions to compare")
p.error = lambda msg: p.exit(2, f"{p.prog}: error: {msg} (see --help)\n")  # one error line, no usage block
args = p.parse_args()
args.variants = list(dict.fromkeys(args.variants))  # each once, in the order given
if min(args.seeds, args.epochs, args.depth) < 1:
    p.error("--seeds, --epochs and --depth must be at least 1")
try:  # DiffAttention checks the shape (e.g. d_model divisible by the heads)
    DiffAttention(args.d_model, 4, "diff_v1", causal=False, rope=False)
except ValueError as e:
    p.error(f"--d-model {args.d_model}: {e}")

# The data: 1797 images of 8x8 pixels (0..16) -> 16 patches of 2x2 pixels; a fixed, stratified 75/25 split
digits = load_digits()
img = torch.tensor(digits.images, dtype=torch.float32) / 16.0  # (N, 8, 8)
patches = img.reshape(-1, 4, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(-1, 16, 4)  # (N, 16 patches, 4 pixels)
labels = torch.tensor(digits.target)
tr, te = train_test_split(range(len(labels)), test_size=0.25, random_state=0, stratify=digits.target)
x_train, y_train, x_test, y_test = patches[tr], labels[tr], patches[te], labels[te]


class Block(nn.Module):
    def __init__(self, d, variant, layer_idx):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = DiffAttention(d, 4, variant, causal=False, rope=False, layer_idx=layer_idx)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    def __init__(self, d, depth, variant):
        super().__init__()
        self.patch = nn.Linear(4, d)  # a 2x2 patch's pixels -> a token
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(0.02 * torch.randn(1, 17, d))  # learned positions: CLS + 16 patches
        self.blocks = nn.Sequential(*[Block(d, variant, i) for i in range(depth)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 10)

    def forward(self, x):  # (B, 16, 4) patches -> (B, 10) logits, read from the CLS token
        x = torch.cat([self.cls.expand(len(x), -1, -1), self.patch(x)], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def run(variant, seed):
    """Train one model; returns (parameters, test accuracy)."""
    torch.manual_seed(seed)
    model = ViT(args.d_model, args.depth, variant)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs * math.ceil(len(y_train) / BATCH))
    gen = torch.Generator().manual_seed(seed)  # its own generator: every variant sees the same batches
    for _ in range(args.epochs):
        for idx in torch.randperm(len(y_train), generator=gen).split(BATCH):
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    with torch.no_grad():
        acc = (model(x_test).argmax(-1) == y_test).float().mean().item()
    return sum(q.numel() for q in model.parameters()), acc


# t(0.975, df) for df = 1..30; past 30 the normal quantile with its first two corrections in 1/df
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df):
    z = 1.959964
    return T975[df - 1] if df <= 30 else z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci(xs):
    """Mean and the half-width of its 95% t-interval (None for a single value)."""
    m = statistics.mean(xs)
    return m, (t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None)


def fmt(m, h, sign=""):  # in percentage points
    return f"{100 * m:{sign}6.2f}" + (f" +- {100 * h:5.2f}" if h is not None else " (one seed: no interval)")


print("An example, not a claim: a tiny ViT on 8x8 digits says nothing about differential attention at scale.")
seeds = list(range(args.seeds))
acc, params = {}, {}
for v in args.variants:
    for s in seeds:
        params[v], a = run(v, s)
        acc.setdefault(v, []).append(a)
        print(f"  {v:8s} seed {s}: test accuracy {100 * a:.2f}%", flush=True)
print(f"\n{'variant':8s}  {'parameters':>10s}  test accuracy % (mean +- 95% t-interval, {len(seeds)} seeds)")
for v in args.variants:
    print(f"{v:8s}  {params[v]:10,d}  {fmt(*mean_ci(acc[v]))}")
if "baseline" in args.variants:
    for v in args.variants:
        if v != "baseline":
            d = [a - b for a, b in zip(acc[v], acc["baseline"])]
            print(f"{v} - baseline (paired by seed): {fmt(*mean_ci(d), sign='+')} points")
