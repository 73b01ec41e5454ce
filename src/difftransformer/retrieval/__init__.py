"""Token-level key-value retrieval benchmark: does differential attention find the answer among distractors with
less attention noise (paper Fig. 1, Table 2, Fig. 5, Table 3, Fig. 8)? Entry point: ``run_benchmark``."""

from .benchmark import run_benchmark
from .config import Condition, RetrievalConfig, quick_config

__all__ = ["run_benchmark", "RetrievalConfig", "Condition", "quick_config"]
