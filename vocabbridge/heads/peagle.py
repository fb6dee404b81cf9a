"""The P-EAGLE head (parallel drafting): EAGLE-3's layer that proposes all k draft tokens in one forward.

A chained head (MTP, EAGLE-3) runs once per draft token. P-EAGLE (vLLM's ``parallel_drafting`` for
EAGLE-3 heads, trained by vLLM's ``speculators`` and SpecForge) appends k − 1 *mask* positions to
the real one and predicts every draft token in the same pass. At the last verified position p::

    position  p                        p+1           …  p+k−1
    hidden    fc(streams at p)         fc(mask_hidden)   fc(mask_hidden)
    token     x_{p+1}                  [mask]            [mask]
    predicts  x_{p+2}                  x_{p+3}           x_{p+k+1}

with ordinary causal attention over the head's cache of earlier real positions. ``mask_hidden``
(in the target's feature space, n·d wide: what ``fc`` reads, as vLLM stores it) and the mask
token's embedding ``mask_embed`` are learned; the rest is an :class:`~.eagle3.Eagle3Head`, so the
real position computes exactly what EAGLE-3's first step computes. Only real positions stay in the
head's cache (the mask entries are cropped at the next proposal), so catching up after a
verification is EAGLE-3's. ``parallel_tokens`` is how many draft tokens it was trained to propose
(mask positions + 1); the engine drafts no more than that.

Training (vocabbridge/training/chain.py ``parallel``) runs every position p of a sequence as a real
query plus k − 1 mask queries in one pass: mask j of p attends to the real keys ≤ p and to p's own
mask keys ≤ j (speculators' ``create_peagle_mask_mod``), and is trained on the target's
distribution at p + j + 1, the loss over all positions.

>>> head = new_peagle_head(parts, aux_layers=(14, 25, 28), draft_ids=ids, parallel_tokens=4)  # doctest: +SKIP
>>> s = head(torch.cat([head.combine(aux), head.mask_state().expand(1, 3, -1)], 1), tokens, positions)  # doctest: +SKIP
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError
from .draft_head import TargetParts
from .eagle3 import Eagle3Head, new_eagle3_head

MASK = -1  # the token id that stands for a mask position in a head's token input


class PEagleHead(Eagle3Head):
    """An EAGLE-3 head with a learned mask position: ``mask_hidden`` [n·d] and ``mask_embed`` [d]."""

    arch = "peagle"

    def __init__(self, parts: TargetParts, *, aux_layers: tuple[int, ...], draft_ids: torch.Tensor | None, parallel_tokens: int):
        super().__init__(parts, aux_layers=aux_layers, draft_ids=draft_ids)
        if parallel_tokens < 1:
            raise ConfigError(f"a P-EAGLE head proposes at least one token; parallel_tokens was {parallel_tokens}.")
        self.parallel_tokens = int(parallel_tokens)
        d = parts.hidden_size
        self.mask_hidden = nn.Parameter(torch.zeros(len(self.aux_layers) * d))  # what fc reads at a mask position
        self.mask_embed = nn.Parameter(torch.zeros(d))  # the mask token's embedding

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings, ``mask_embed`` where the token is :data:`MASK`."""
        e = self.parts.embed(tokens.clamp(min=0))
        return torch.where((tokens == MASK).unsqueeze(-1), self.mask_embed.to(e.dtype), e)

    def mask_state(self) -> torch.Tensor:
        """The hidden input of a mask position, [1, 1, d] (vLLM's ``combine_hidden_states(mask_hidden)``)."""
        return self.combine(self.mask_hidden.view(1, 1, -1))


@torch.no_grad()
def new_peagle_head(
    parts: TargetParts,
    *,
    aux_layers: tuple[int, ...],
    draft_ids: torch.Tensor | None,
    parallel_tokens: int,
    mask_hidden: torch.Tensor | None = None,
    mask_embed: torch.Tensor | None = None,
) -> PEagleHead:
    """A head to train: EAGLE-3's start (:func:`~.eagle3.new_eagle3_head`) for the layer, and the mask
    position started as an average position (``mask_hidden``: the mean of the target's features,
    ``mask_embed``: the mean embedding of the tokens the data hold; their norms would make zeros a
    singular start). Without them: the mean of the target's embedding rows, and a unit vector."""
    base = new_eagle3_head(parts, aux_layers=aux_layers, draft_ids=draft_ids)
    head = PEagleHead(parts, aux_layers=aux_layers, draft_ids=draft_ids, parallel_tokens=parallel_tokens)
    head.load_state_dict(base.state_dict(), strict=False)
    w = parts.embed.weight
    head.mask_embed.copy_(mask_embed if mask_embed is not None else w.float().mean(0))
    head.mask_hidden.copy_(mask_hidden if mask_hidden is not None else torch.ones(head.mask_hidden.shape[0]))
    return head.float()
