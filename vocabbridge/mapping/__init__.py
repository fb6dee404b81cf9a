"""Drafter↔target token maps: build (``bytes`` or ``vllm`` rule), input bridge, map file, coverage.

>>> from vocabbridge.mapping import build_token_map, save_map, load_map  # doctest: +SKIP
>>> tm = build_token_map(drafter_view, target_view, mode="bytes")  # doctest: +SKIP
>>> save_map(tm, "maps/a_to_b.json"); load_map("maps/a_to_b.json", drafter=drafter_view, target=target_view)  # doctest: +SKIP
"""

from .build import build_token_map
from .cache import token_map_for
from .coverage import Coverage, compute_coverage, default_texts
from .mapfile import load_map, read_map, save_map
from .tokenmap import BuildStats, MapSide, TokenMap

__all__ = [
    "BuildStats",
    "Coverage",
    "MapSide",
    "TokenMap",
    "build_token_map",
    "compute_coverage",
    "default_texts",
    "load_map",
    "read_map",
    "save_map",
    "token_map_for",
]
