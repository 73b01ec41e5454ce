"""Every backend's outputs and gradients at two commits, compared bit for bit (a refactoring's evidence).

    .venv/bin/python tests/model/compare_commits.py OLD NEW     # e.g. HEAD~1 HEAD; "." is this work tree

Each commit is checked out with ``git worktree`` into a temporary directory, and this script runs there in a fresh
process (``--dump``, the commit's ``src`` first on ``sys.path``, ``TRITON_INTERPRET=1`` so the Triton kernels run on
the CPU): a small float64 LM of each variant form on every backend (eager, sdpa, auto, blocked, triton) computes
the logits and every parameter's gradient (causal, and with left padding) and a KV-cache prefill from 0 followed
by decode steps (without and with padding). The two dumps are then compared tensor by tensor through their bits
(NaN included).
Exit 0 when every tensor is the same, 1 otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ("eager", "sdpa", "auto", "blocked", "triton")
FORMS = {  # name -> ModelConfig changes
    "baseline": dict(attention="baseline"),
    "diff_v1": dict(attention="diff_v1"),
    "diff_v1_per_head": dict(attention="diff_v1", v1_layout="per_head"),
    "diff_v2": dict(attention="diff_v2"),
    "diff_v2_halves": dict(attention="diff_v2", v2_pairing="halves"),
    "diff_v2_none": dict(attention="diff_v2", v2_lambda="none"),
    "diff_v2_separate_keys": dict(attention="diff_v2", v2_keys="separate"),
    "diff_v2_scalar": dict(attention="diff_v2", v2_lambda="scalar", v2_headwise_norm=True),
}
B, T, STEPS = 2, 12, 3


def dump(out: str) -> None:
    import torch

    import difftransformer
    from difftransformer.model.config import ModelConfig
    from difftransformer.model.transformer import DiffTransformerLM

    print(f"difftransformer from {Path(difftransformer.__file__).parent}", file=sys.stderr)
    warnings.simplefilter("ignore")
    results: dict[str, torch.Tensor] = {}
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[1, :3] = False  # row 1 left-padded by 3
    for form, changes in FORMS.items():
        for backend in BACKENDS:
            torch.manual_seed(0)
            cfg = ModelConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                              max_seq_len=32, backend=backend, **changes)
            model = DiffTransformerLM(cfg).double()
            if form == "diff_v1_per_head":
                model.set_negative_weight(0.7)
            idx = torch.randint(0, 64, (B, T + STEPS))
            for case, mask in (("causal", None), ("padded", pad)):
                model.zero_grad()
                logits = model(idx[:, :T], attention_mask=mask).logits
                weight = torch.randn(logits.shape, dtype=logits.dtype)
                (logits * weight).sum().backward()
                key = f"{form}/{backend}/{case}"
                results[f"{key}/logits"] = logits.detach()
                for name, p in model.named_parameters():
                    if p.grad is not None:
                        results[f"{key}/grad/{name}"] = p.grad.detach().clone()
            full = torch.ones(B, T + STEPS, dtype=torch.bool)
            full[1, :3] = False
            for case, mask in (("cached", None), ("cached-padded", full)):
                with torch.no_grad():  # a prefill from position 0, then decode steps
                    model.setup_caches(B, T + STEPS)
                    logits = model(idx[:, :T], attention_mask=mask, input_pos=torch.arange(T)).logits
                    results[f"{form}/{backend}/{case}/prefill/logits"] = logits
                    for s in range(STEPS):
                        pos = torch.tensor([T + s])
                        logits = model(idx[:, T + s:T + s + 1], attention_mask=mask, input_pos=pos).logits
                        results[f"{form}/{backend}/{case}/decode{s}/logits"] = logits
                    model.clear_caches()
    torch.save(results, out)
    print(f"{len(results)} tensors", file=sys.stderr)


def run_at(commit: str, tmp: Path) -> Path:
    name = "worktree" if commit == "." else commit.replace("/", "_")
    tree, out = (ROOT if commit == "." else tmp / f"tree-{name}"), tmp / f"{name}.pt"
    if commit != ".":
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit], check=True,
                       capture_output=True)
    try:
        env = {**os.environ, "PYTHONPATH": str(tree / "src"), "TRITON_INTERPRET": "1"}
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--dump", str(out)], cwd=tree, env=env,
                       check=True)
    finally:
        if commit != ".":
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
    return out


def compare(old: Path, new: Path) -> int:
    import torch

    a, b = torch.load(old), torch.load(new)
    if a.keys() != b.keys():
        print(f"different tensors: only old {sorted(a.keys() - b.keys())}, only new {sorted(b.keys() - a.keys())}")
        return 1
    bad = [k for k in a if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype
           or not torch.equal(a[k].view(torch.int64), b[k].view(torch.int64))]
    worst = 0.0, ""
    for k in bad:
        x, y = a[k].double(), b[k].double()
        rel = ((x - y).abs().max() / x.abs().max().clamp_min(1e-300)).item() if x.shape == y.shape else float("inf")
        worst = max(worst, (rel, k))
        print(f"DIFFERENT {k}: largest |new - old| {rel:.1e} of max |old|")
    if bad:
        print(f"largest difference: {worst[0]:.1e} of the tensor's max |old| ({worst[1]})")
    print(f"{len(a) - len(bad)} of {len(a)} tensors bit for bit the same "
          f"({len(FORMS)} forms x {len(BACKENDS)} backends: causal and padded logits and gradients, "
          f"a prefill and {STEPS} decode steps, without and with padding)")
    return 1 if bad else 0


def main() -> int:
    if sys.argv[1:2] == ["--dump"]:
        dump(sys.argv[2])
        return 0
    old, new = sys.argv[1:3]
    with tempfile.TemporaryDirectory() as tmp:
        return compare(run_at(old, Path(tmp)), run_at(new, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
