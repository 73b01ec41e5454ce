"""Model cards: the ``README.md`` written into every directory ``convert --to-hf`` exports (native and remote
code), into a LoRA run's ``RUN/adapter`` and into the base exported beside it (``RUN/adapter_base``).

A card is what a model hub shows for an uploaded directory. It opens with YAML front matter: ``library_name``
(transformers, or peft for an adapter), ``pipeline_tag: text-generation``, tags naming differential attention (for
a differential variant), the variant and ``custom_code`` for remote code, ``base_model`` when the weights came
from another model whose hub name is known, ``license`` when known. Then the model (variant, sizes, parameters,
the variant's lambda settings and, for DIFF V1, the learned lambda per layer), where it came from (the training
run: step, tokens and validation loss; the source it continued from; or the model directory it was exported from),
the lines that load it, and the papers' citation.

Hub metadata is only written when it is known: ``base_model`` from ``convert --to-hf --base-model NAME`` or
``train.lora_base``, else from the source's ``config.json`` (``_name_or_path`` when it is a hub name, not a local
path); ``license`` from ``--license`` or the source's own card. A local path is never written as ``base_model``:
the card names it in its text instead. Nothing here is read back: ``convert --from-hf`` and every loader ignore
the card, so a round trip stays bitwise.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .. import __version__
from ..fileio import PathLike, check_text
from ..model.config import ModelConfig
from ..model.transformer import DiffTransformerLM
from ..model.variants import variant
from ..rundir import (
    CONFIG_NAME,
    MODEL_CARD_NAME,
    STATE_JSON,
    read_metric_records,
    read_run_config,
    resolve_checkpoint,
    run_of_checkpoint,
)

__all__ = ["MODEL_CARD_NAME", "Provenance", "check_base_model", "check_license", "front_matter",
           "read_front_matter", "is_hub_name", "source_metadata", "source_of", "model_provenance", "run_lines",
           "export_card", "adapter_card", "n_words", "CITATION"]

# A model hub's repository name ("owner/name", or a bare "name"), and a licence identifier as hubs spell them
# (apache-2.0, mit, cc-by-4.0, llama3.2, other).
HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")
LICENSE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*")

CITATION = """\
@inproceedings{ye2025differential,
  title     = {Differential Transformer},
  author    = {Tianzhu Ye and Li Dong and Yuqing Xia and Yutao Sun and Yi Zhu and Gao Huang and Furu Wei},
  booktitle = {The Thirteenth International Conference on Learning Representations (ICLR)},
  year      = {2025},
  url       = {https://arxiv.org/abs/2410.05258}
}"""
V2_REFERENCE = "Tianzhu Ye, Li Dong, Yutao Sun, Furu Wei: Differential Transformer V2 (January 2026)."


@dataclass(frozen=True)
class Provenance:
    """Where a model's weights came from: sentences for the card, and the hub metadata when known."""

    lines: tuple[str, ...] = ()
    base_model: Optional[str] = None
    license: Optional[str] = None
    tags: tuple[str, ...] = field(default=())


def check_base_model(name: str, where: str) -> str:
    """``name`` when it is a hub model name (``owner/name``), else a ValueError naming ``where``."""
    check_text(name, where)
    if not HUB_NAME.fullmatch(name):
        raise ValueError(f"{where} {name!r} is not a model hub name such as HuggingFaceTB/SmolLM2-135M-Instruct")
    return name


def check_license(name: str, where: str) -> str:
    """``name`` when it is a licence identifier (apache-2.0, mit, other, ...), else a ValueError naming ``where``."""
    check_text(name, where)
    if not LICENSE_ID.fullmatch(name):
        raise ValueError(f"{where} {name!r} is not a licence identifier such as apache-2.0, mit or other")
    return name.lower()


# ---------------------------------------------------------------------------------------------- front matter
def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar


def front_matter(meta: dict[str, Any]) -> str:
    """``meta`` (strings and lists of strings; None values left out) as a YAML front matter block."""
    out = ["---"]
    for key, value in meta.items():
        if value is None or value == []:
            continue
        if isinstance(value, (list, tuple)):
            out.append(f"{key}:")
            out.extend(f"- {_yaml_scalar(v)}" for v in value)
        else:
            out.append(f"{key}: {_yaml_scalar(value)}")
    return "\n".join([*out, "---"]) + "\n"


def read_front_matter(text: str) -> dict[str, str]:
    """The top-level scalar ``key: value`` lines of a card's front matter ({} without one): enough to read a
    source's ``license`` and ``base_model`` without a YAML parser."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    out: dict[str, str] = {}
    for line in lines[1:]:
        if line.strip() == "---":
            return out
        m = re.fullmatch(r"([A-Za-z_][\w-]*):\s*(.*?)\s*", line)
        if m and m.group(2) and not m.group(2).startswith(("|", ">", "[", "{", "#")):
            value = m.group(2)
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            out[m.group(1)] = value
    return {}  # no closing line: not front matter


def is_hub_name(name: str) -> bool:
    """``name`` reads as a model hub name and is no local path (a directory of that name would be loaded)."""
    return bool(HUB_NAME.fullmatch(name)) and not Path(name).exists()


def source_metadata(directory: Optional[PathLike]) -> tuple[Optional[str], Optional[str]]:
    """(hub name, licence) of a source model directory, when it says them: its config.json's ``_name_or_path``
    when that is a hub name and no local path, and its own card's ``license``. (None, None) when unknown."""
    if directory is None:
        return None, None
    d = Path(directory)
    name = license_ = None
    try:
        cfg = json.loads((d / CONFIG_NAME).read_bytes().decode("utf-8"))
        value = cfg.get("_name_or_path") if isinstance(cfg, dict) else None
        if isinstance(value, str) and is_hub_name(value):
            name = value
    except (OSError, ValueError):
        pass
    try:
        lic = read_front_matter((d / MODEL_CARD_NAME).read_bytes().decode("utf-8")).get("license")
        if lic and LICENSE_ID.fullmatch(lic):
            license_ = lic.lower()
    except (OSError, ValueError):
        pass
    return name, license_


# ---------------------------------------------------------------------------------------------- provenance
def _step_of(model_dir: Path) -> tuple[Optional[int], Optional[int]]:
    """(step, tokens seen) of a checkpoint, from its training state; (None, None) when unreadable."""
    try:
        meta = json.loads((model_dir / STATE_JSON).read_bytes().decode("utf-8"))
        return int(meta["step"]), int(meta.get("tokens_seen", 0)) or None
    except (OSError, ValueError, KeyError, TypeError):
        return None, None


def _val_loss(run_dir: Path, step: Optional[int]) -> Optional[tuple[int, float]]:
    """The last validation loss the run logged at ``step`` or before: (its step, the loss)."""
    found = None
    for rec in read_metric_records(run_dir):
        s, v = rec.get("step"), rec.get("val_loss")
        if isinstance(s, int) and isinstance(v, (int, float)) and math.isfinite(v) and (step is None or s <= step):
            found = (s, float(v))
    return found


def run_lines(run_dir: Path, step: Optional[int], tokens: Optional[int] = None) -> tuple[list[str], dict]:
    """Sentences about a training run at ``step`` (the run's config, validation loss, source), and its
    ``[train]`` section as saved."""
    cfg = read_run_config(run_dir)
    train = cfg.get("train", {}) if isinstance(cfg.get("train"), dict) else {}
    data = cfg.get("data", {}) if isinstance(cfg.get("data"), dict) else {}
    total = train.get("steps")
    at = f"step {step:,}" if step is not None else "its newest checkpoint"
    if step is not None and isinstance(total, int):
        at += f" of {total:,}"
    if tokens:
        at += f" ({tokens:,} training tokens)"
    lines = [f"Trained with `difftransformer train` in the run `{run_dir.name}`: {at}."]
    val = _val_loss(run_dir, step)
    if val is not None:
        lines.append(f"Validation loss {val[1]:.4f} at step {val[0]:,} (held-out documents, nats per token).")
    sources = data.get("sources")
    if isinstance(sources, list) and sources:
        shown = ", ".join(f"`{Path(s).name or s}`" for s in sources[:5]) + (", ..." if len(sources) > 5 else "")
        lines.append(f"Training data: {shown}.")
    init_from = train.get("init_from")
    if init_from:
        name = Path(init_from).name
        if train.get("lora_rank"):
            lines.append(f"A LoRA fine-tune (rank {train['lora_rank']}, alpha {train.get('lora_alpha'):g}, targets "
                         f"{', '.join(train.get('lora_targets') or [])}) of `{name}` (`--init-from`), the source "
                         "frozen.")
        else:
            lines.append(f"Continued from `{name}` (`train --init-from`), every weight trained.")
    return lines, train


def model_provenance(model_dir: PathLike, given: Optional[PathLike] = None, base_model: Optional[str] = None,
                     license: Optional[str] = None) -> Provenance:
    """Where the weights of our model directory ``model_dir`` came from (``given``: the path the user named, a run
    or the directory itself). ``base_model``/``license`` override what the source says of itself."""
    d = Path(model_dir)
    run = run_of_checkpoint(d)
    src_name = src_license = None
    if run is not None:
        lines, train = run_lines(run, *_step_of(d))
        if train.get("lora_rank"):
            lines.append("These are the merged weights (W + BA alpha/r) of the run's checkpoint; the adapters alone "
                         "are the run's `adapter/` folder.")
        if train.get("init_from"):
            src_name, src_license = source_of(train["init_from"])
    else:
        lines = [f"Exported from the model directory `{Path(given or d).name}` (difftransformer's own format)."]
    return Provenance(tuple(lines), base_model or src_name, license or src_license)


def source_of(path: str) -> tuple[Optional[str], Optional[str]]:
    """The hub name and licence a training source says of itself (a Hugging Face directory, or a run or model
    directory of ours: the checkpoint's directory is asked)."""
    p = Path(path)
    if (p / CONFIG_NAME).is_file():
        return source_metadata(p)
    try:
        return source_metadata(resolve_checkpoint(p, check_hashes=False, warn=None))
    except (ValueError, OSError):
        return None, None


# ---------------------------------------------------------------------------------------------- the cards
def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _lambda_lines(model: DiffTransformerLM) -> list[str]:
    """The variant's own settings (its ``options``), in words where we know them, and DIFF V1's learned lambda."""
    cfg = model.cfg
    var = variant(cfg.attention)
    out = []
    for name in var.options:
        value = getattr(cfg, name)
        if name == "lambda_init" and value == "schedule":
            inits = ", ".join(f"{cfg.lambda_init_for(i):.3f}" for i in range(cfg.n_layers))
            out.append(f"`lambda_init` = \"schedule\": 0.8 - 0.6 exp(-0.3 l) at layer l (from 0): {inits}")
        elif name == "v2_lambda":
            words = {"sigmoid": "lambda = sigmoid(W_lambda x), per token and head pair",
                     "raw": "lambda = W_lambda x, per token and head pair (no sigmoid)",
                     "none": "no lambda: attn1 - attn2"}.get(value, "")
            out.append(f"`v2_lambda` = \"{value}\"" + (f": {words}" if words else ""))
        else:
            out.append(f"`{name}` = {json.dumps(value)}")
    learned = model.lambdas()
    if learned:
        out.append("learned lambda per layer: " + ", ".join(f"{x:.4f}" for x in learned))
    return out


def _model_section(model: DiffTransformerLM, architecture: str, dtype: str) -> list[str]:
    cfg: ModelConfig = model.cfg
    var = variant(cfg.attention)
    n = model.num_parameters()
    rows = [
        ("variant", f"{var.label} (`attention = \"{cfg.attention}\"`)"),
        ("architecture", architecture),
        ("parameters", f"{n:,} ({model.num_parameters(exclude_embeddings=True):,} without the embeddings)"),
        ("layers", str(cfg.n_layers)),
        ("d_model", str(cfg.d_model)),
        ("heads", f"{cfg.n_heads} query, {cfg.n_kv_heads} key/value, of {cfg.head_dim} (the baseline's counts; "
                  "the variant derives its own)"),
        ("SwiGLU hidden", str(cfg.ffn_hidden)),
        ("vocabulary", f"{cfg.vocab_size:,}"),
        ("context", f"{cfg.max_seq_len:,} tokens, RoPE theta {_num(cfg.rope_theta)}"
                    + (f", Llama 3 scaling x{_num(cfg.rope_factor)}" if cfg.rope_type == "llama3" else "")),
        ("tied embeddings", "yes" if cfg.tie_embeddings else "no"),
        ("dtype", dtype),
    ]
    out = ["## Model", "", "| | |", "| --- | --- |", *[f"| {k} | {v} |" for k, v in rows], ""]
    settings = _lambda_lines(model)
    if settings:
        out += [f"{var.label} settings:", "", *[f"- {s}" for s in settings], ""]
    return out


def _citation(cfg: ModelConfig) -> list[str]:
    out = ["## Citation", "", "```bibtex", CITATION, "```", ""]
    if cfg.attention == "diff_v2":
        out += [f"DIFF V2: {V2_REFERENCE}", ""]
    return out


def _tags(cfg: ModelConfig, extra: Iterable[str]) -> list[str]:
    var = variant(cfg.attention)
    tags = ["difftransformer", cfg.attention.replace("_", "-")]
    if var.differential:
        tags.insert(0, "differential-attention")
    return list(dict.fromkeys([*tags, *extra]))


def export_card(model: DiffTransformerLM, architecture: str, remote: bool, load_path: str,
                provenance: Optional[Provenance] = None, tokenizer: bool = True) -> str:
    """The README.md of a transformers export of ``model`` (``remote``: the remote-code directory)."""
    prov = provenance or Provenance()
    cfg = model.cfg
    var = variant(cfg.attention)
    dtype = str(model.output.weight.dtype).removeprefix("torch.")
    meta = {"library_name": "transformers", "pipeline_tag": "text-generation",
            "tags": _tags(cfg, [*(["custom_code"] if remote else []), *prov.tags]),
            "base_model": prov.base_model, "license": prov.license}
    trust = ", trust_remote_code=True" if remote else ""
    kind = (f"{architecture} as remote code (`trust_remote_code=True`: the modeling files are in this folder and "
            "import only torch and transformers)" if remote else f"transformers' native {architecture}")
    out = [front_matter(meta), f"# {Path(load_path).name or load_path}", "",
           f"A {var.label} language model ({n_words(model.num_parameters())} parameters), written by "
           f"difftransformer {__version__} (`difftransformer convert --to-hf`) as {kind}.", ""]
    out += _model_section(model, f"`{architecture}`" + (" (remote code)" if remote else ""), dtype)
    out += ["## Where it came from", "", *(prov.lines or ("Not recorded.",)), ""]
    out += ["## How to load", "", "```python"]
    out += ["from transformers import AutoModelForCausalLM, AutoTokenizer" if tokenizer else
            "from transformers import AutoModelForCausalLM"]
    if tokenizer:
        out.append(f"tok = AutoTokenizer.from_pretrained({json.dumps(load_path)}{trust})")
    out += [f"model = AutoModelForCausalLM.from_pretrained({json.dumps(load_path)}{trust})", "```", ""]
    if not tokenizer:
        out += ["No tokenizer was exported with it.", ""]
    out += ["`difftransformer convert --from-hf` reads this folder back into difftransformer's own format, bit for "
            "bit (this card is not read).", ""]
    return "\n".join(out + _citation(cfg)).rstrip("\n") + "\n"


def adapter_card(model: DiffTransformerLM, rank: int, alpha: float, dropout: float, modules: Iterable[str],
                 base: str, load_path: str, provenance: Optional[Provenance] = None, base_beside: bool = False) -> str:
    """The README.md of a LoRA run's ``RUN/adapter`` (PEFT's format) for adapters on ``model`` (the frozen base,
    before the adapters), whose ``adapter_config.json`` names ``base`` (``base_beside``: the run's own export of
    it, ``RUN/adapter_base``)."""
    prov = provenance or Provenance()
    cfg = model.cfg
    var = variant(cfg.attention)
    targets = sorted(set(modules))
    meta = {"library_name": "peft", "pipeline_tag": "text-generation",
            "tags": _tags(cfg, ["lora", "custom_code", *prov.tags]), "base_model": prov.base_model,
            "license": prov.license}
    where = (f"the remote-code export of the frozen base beside this folder (`{Path(base).name}`; "
             "`adapter_config.json` names it by its absolute path, so keep the two folders together or edit "
             "`base_model_name_or_path` after moving them)" if base_beside else f"`{base}` (`train.lora_base`)")
    out = [front_matter(meta), f"# LoRA adapter for a {var.label} model", "",
           f"LoRA adapters (rank {rank}, alpha {alpha:g}, dropout {dropout:g}) on {', '.join(targets)} of a "
           f"{var.label} language model, in PEFT's format, written by difftransformer {__version__}. Their base "
           f"is {where}.", ""]
    out += _model_section(model, "`DiffTransformerForCausalLM` (remote code): the frozen base the adapters are on",
                          str(model.output.weight.dtype).removeprefix("torch."))
    out += ["## Where it came from", "", *(prov.lines or ("Not recorded.",)), ""]
    out += ["## How to load", "", "```python", "from peft import AutoPeftModelForCausalLM",
            f"model = AutoPeftModelForCausalLM.from_pretrained({json.dumps(load_path)}, trust_remote_code=True)",
            "```", "",
            "The tokenizer is the base's: `AutoTokenizer.from_pretrained(model.peft_config[\"default\"]"
            ".base_model_name_or_path, trust_remote_code=True)`. `model.merge_and_unload()` gives the merged model, "
            "which is also the run's checkpoint (`difftransformer convert --to-hf RUN` exports it).", ""]
    return "\n".join(out + _citation(cfg)).rstrip("\n") + "\n"


def n_words(n: int) -> str:
    """1,234,567 -> "1.23M"; small numbers as they are."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)
