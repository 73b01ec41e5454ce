"""A nanoGPT-shaped character-level GPT whose attention is ``DiffAttention``, trained on the embedded King James Bible.

    python examples/gpt.py --variant diff_v2    # or baseline, diff_v1: the same model but for its attention

All but the attention is here: token embedding, pre-norm blocks (attention + MLP), LM head. Positions: RoPE inside
DiffAttention (on by default for self-attention). An example, not a claim: a few hundred CPU steps prove nothing.
"""

import argparse

import torch
from torch import nn
from torch.nn import functional as F

from difftransformer import DiffAttention
from difftransformer.data.corpus import embedded_corpus, split_documents

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--variant", default="diff_v2", choices=["baseline", "diff_v1", "diff_v2"], help="the attention")
p.add_argument("--steps", type=int, default=300, help="training steps (batches of 16 x 128 characters)")
p.add_argument("--d-model", type=int, default=128, help="model width (4 baseline heads of d_model/4)")
p.add_argument("--layers", type=int, default=4, help="transformer blocks")
p.add_argument("--seed", type=int, default=0, help="seed of the initialisation and of the batches")
p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, mps, ...")
p.error = lambda msg: p.exit(2, f"{p.prog}: error: {msg} (see --help)\n")  # one error line, no usage block
args = p.parse_args()
if args.steps < 1 or args.layers < 1:
    p.error("--steps and --layers must be at least 1")
N_HEADS, SEQ, BATCH = 4, 128, 16
try:  # DiffAttention checks the shape (e.g. head_dim = d_model / N_HEADS must be even for RoPE)
    DiffAttention(args.d_model, N_HEADS, args.variant)
except ValueError as e:
    p.error(f"--d-model {args.d_model}: {e}")

# Data: the corpus the demo trains on (documents split as the demo does), one character = one token
train_docs, val_docs = split_documents(embedded_corpus("kjv"), val_fraction=0.02)
train_text, val_text = "\n".join(train_docs), "\n".join(val_docs)
chars = sorted(set(train_text + val_text))
stoi = {c: i for i, c in enumerate(chars)}
train_ids, val_ids = (torch.tensor([stoi[c] for c in text]) for text in (train_text, val_text))


def batch(ids, gen):
    """BATCH random windows of SEQ + 1 characters: inputs and next-character targets."""
    starts = torch.randint(len(ids) - SEQ - 1, (BATCH,), generator=gen)
    w = torch.stack([ids[s:s + SEQ + 1] for s in starts.tolist()]).to(args.device)
    return w[:, :-1], w[:, 1:]


class Block(nn.Module):
    def __init__(self, d, layer_idx):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        # layer_idx: DIFF V1's lambda_init depends on the depth
        self.attn = DiffAttention(d, N_HEADS, args.variant, causal=True, layer_idx=layer_idx)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d, n_layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(*[Block(d, i) for i in range(n_layers)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):  # (B, T) token ids -> (B, T, vocab) logits
        return self.head(self.norm(self.blocks(self.embed(idx))))


torch.manual_seed(args.seed)
model = GPT(len(chars), args.d_model, args.layers).to(args.device)
opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.1)
gen = torch.Generator().manual_seed(args.seed)  # its own generator: every variant sees the same batches
print(f"{args.variant}: {sum(q.numel() for q in model.parameters()):,} parameters, vocabulary {len(chars)} characters")
for step in range(1, args.steps + 1):
    x, y = batch(train_ids, gen)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if step % max(1, args.steps // 10) == 0 or step == args.steps:
        print(f"step {step:4d}  train loss {loss.item():.4f}")

model.eval()
with torch.no_grad():
    val_gen = torch.Generator().manual_seed(1234)  # the same validation windows for every run
    val = torch.stack([F.cross_entropy(model(x).flatten(0, 1), y.flatten())
                       for x, y in (batch(val_ids, val_gen) for _ in range(20))]).mean()
    print(f"final val loss {val.item():.4f}")
    ids = torch.tensor([[stoi[c] for c in "And God said"]], device=args.device)
    for _ in range(200):  # greedy decoding, the last SEQ characters as context
        ids = torch.cat([ids, model(ids[:, -SEQ:])[:, -1].argmax(-1, keepdim=True)], dim=1)
print("sample:", repr("".join(chars[i] for i in ids[0].tolist())))
