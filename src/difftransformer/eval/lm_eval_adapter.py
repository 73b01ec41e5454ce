"""Our models (baseline, DIFF V1, DIFF V2) as an lm-evaluation-harness model, named ``difftransformer``.

    from difftransformer.eval.lm_eval_adapter import DiffTransformerHarnessLM
    import lm_eval
    lm_eval.simple_evaluate(model=DiffTransformerHarnessLM("runs/v2"), tasks=["kjv_cloze"], task_manager=...)

or `difftransformer lm-eval --model DIR --tasks kjv_cloze` (the command puts the repository's local task files on
the harness's path). ``pretrained`` is a run (its newest checkpoint), one of our model directories, or a Hugging
Face Llama/DiffLlama directory (``difftransformer.loading``); the tokenizer is the model's ``tokenizer.json``.

The three request types follow the harness's own ``hf`` model step for step, so that on the same weights the
numbers agree (tested): ``loglikelihood`` moves a context's trailing spaces into the continuation, encodes context
+ continuation together and scores the continuation's tokens (an empty context is conditioned on the end-of-text
token), left-truncating to ``max_length``; ``loglikelihood_rolling`` scores a whole text in the harness's disjoint
rolling windows; ``generate_until`` decodes greedily on our KV cache and cuts at the first stop string.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from ..extras import MissingExtra

try:
    from lm_eval import utils as harness_utils
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as e:  # an optional dependency: say how to get it
    raise MissingExtra("the lm-evaluation-harness adapter", ["lm_eval"], ["lmeval"], name="lm_eval") from e

from ..data.tokenizer import EOS
from ..inference.generate import SamplingConfig, generate
from ..loading import load_model


@register_model("difftransformer")
class DiffTransformerHarnessLM(LM):
    def __init__(self, pretrained: str, device: str = "cpu", batch_size: int | str = 8,
                 max_length: Optional[int] = None, max_gen_toks: int = 256, dtype: str = "float32", **_ignored):
        super().__init__()
        if dtype not in ("float32", "bfloat16", "float64"):
            raise ValueError(f"dtype={dtype!r} must be float32, bfloat16 or float64")
        self._device = torch.device(device)
        loaded = load_model(pretrained, device=self._device, dtype=getattr(torch, dtype))  # run, ours or Hugging Face
        self.model, self.tok = loaded.model, loaded.tokenizer(where=Path(pretrained))
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8
        self.max_length = int(max_length or self.model.cfg.max_seq_len)
        self.max_gen_toks = int(max_gen_toks)
        eot = self.tok.token_to_id(EOS)
        if eot is None:
            raise ValueError(f"{pretrained}: its tokenizer has no {EOS} token (the harness conditions empty "
                             "contexts on it)")
        self.eot_token_id: int = eot

    # ---------------------------------------------------------------------------------------------- helpers
    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return "difftransformer"

    def tok_encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces > 0:  # "Q: x A:" + " y": the space belongs to the answer's first token
            continuation, context = context[-n_spaces:] + continuation, context[:-n_spaces]
        whole, ctx = self.tok_encode(context + continuation), self.tok_encode(context)
        return ctx, whole[len(ctx):]

    @torch.no_grad()
    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """Sum of log-probabilities of each continuation given its context, and whether greedy picks it."""
        out = []
        for i in range(0, len(pairs), self.batch_size):
            chunk = pairs[i:i + self.batch_size]
            inps = [(ctx + cont)[-(self.max_length + 1):][:-1] for ctx, cont in chunk]
            T = max(len(x) for x in inps)
            # built on the host, one copy to the model's device; the log-probabilities come back in one copy
            ids = torch.full((len(inps), T), self.eot_token_id, dtype=torch.long, device="cpu")
            for r, x in enumerate(inps):  # right-padded: causal attention never reads the padding
                ids[r, :len(x)] = torch.tensor(x, device="cpu")
            logp = F.log_softmax(self.model(ids.to(self.device)).logits.double(), dim=-1).cpu()
            for r, ((_, cont), x) in enumerate(zip(chunk, inps)):
                n = len(cont)
                lp = logp[r, len(x) - n:len(x)]  # the positions that predict the continuation's tokens
                target = torch.tensor(cont, device=lp.device)
                out.append((float(lp.gather(1, target[:, None]).sum()), bool((lp.argmax(-1) == target).all())))
        return out

    # ---------------------------------------------------------------------------------------------- the API
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = []
        for context, continuation in (r.args for r in requests):
            if context == "":
                pairs.append(([self.eot_token_id], self.tok_encode(continuation)))
            else:
                pairs.append(self._encode_pair(context, continuation))
        return self._score(pairs)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for (text,) in (r.args for r in requests):
            windows = [harness_utils.make_disjoint_window(w) for w in harness_utils.get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.eot_token_id, max_seq_len=self.max_length,
                context_len=1)]
            out.append(sum(lp for lp, _ in self._score(windows)))
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for context, gen_kwargs in (r.args for r in requests):
            kw = dict(gen_kwargs or {})
            until = kw.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            if kw.get("do_sample") or float(kw.get("temperature", 0.0) or 0.0) > 0:
                raise ValueError("generate_until: only greedy decoding is offered (do_sample=False, temperature=0)")
            max_new = int(kw.get("max_gen_toks", self.max_gen_toks))
            ids = self.tok_encode(context)[-(self.max_length - max_new):]
            res = generate(self.model, [ids], SamplingConfig(max_new_tokens=max_new, temperature=0.0,
                                                             stop_tokens=(self.eot_token_id,)))
            text = self.tok.decode(res.tokens[0])
            for stop in until:  # cut at the first stop string, as the harness does
                if stop:
                    text = text.split(stop)[0]
            out.append(text)
        return out
