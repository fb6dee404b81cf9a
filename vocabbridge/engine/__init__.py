"""The embedded speculative-decoding engine: models, drafters, verification, stats."""

from .drafters import BridgedDrafter, Drafter, DraftModelDrafter, NgramDrafter, NoDrafter, TextDrafter
from .engine import GenerationResult, SpecEngine
from .model import CausalLM, load_causal_lm
from .sampling import SamplingParams
from .stats import SpecStats

__all__ = [
    "BridgedDrafter",
    "CausalLM",
    "DraftModelDrafter",
    "Drafter",
    "GenerationResult",
    "NgramDrafter",
    "NoDrafter",
    "SamplingParams",
    "SpecEngine",
    "SpecStats",
    "TextDrafter",
    "load_causal_lm",
]
