"""Drafters behind one interface (``Drafter.session(prompt).propose(context, k, params, gen)``)."""

from .base import Drafter, DraftSession, NoDrafter, Proposal
from .combined import NgramFirstDrafter
from .model_based import BridgedDrafter, DraftModelDrafter, TLIDrafter
from .ngram import NgramDrafter, NgramMapDrafter, find_ngram_proposal
from .self_spec import SelfSpecDrafter, early_exit_view
from .suffix import SuffixDrafter
from .text import TextDrafter

__all__ = [
    "BridgedDrafter",
    "DraftModelDrafter",
    "DraftSession",
    "Drafter",
    "NgramDrafter",
    "NgramMapDrafter",
    "NgramFirstDrafter",
    "NoDrafter",
    "Proposal",
    "SelfSpecDrafter",
    "SuffixDrafter",
    "TLIDrafter",
    "TextDrafter",
    "early_exit_view",
    "find_ngram_proposal",
]
