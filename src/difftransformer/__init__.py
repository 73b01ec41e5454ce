"""difftransformer: the Differential Transformer (DIFF V1, arXiv 2410.05258; DIFF V2, January 2026) beside a
parameter-matched baseline Transformer."""

from . import kernels as _kernels  # noqa: F401  (registers the fused kernels' rule in the model's table)
from .layer import DiffAttention
from .model import DiffTransformerLM, LMOutput, ModelConfig

__version__ = "0.1.0"
__all__ = ["DiffAttention", "ModelConfig", "DiffTransformerLM", "LMOutput", "__version__"]
