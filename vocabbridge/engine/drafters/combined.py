"""Prompt lookup first, then a model: the n-gram drafter proposes when the context repeats
itself (free: no forward), the model drafter (a draft model or an MTP head) proposes otherwise.

Copy-heavy requests (code review, summaries, edits) get n-gram drafting at no drafter cost; the
rest gets the model. The model's KV cache is simply behind after n-gram steps and catches up in
one forward on its next turn (sessions sync to the committed context). An MTP head's session keeps
receiving the target's hidden states through n-gram steps, so it catches up the same way.
"""

from __future__ import annotations

from .base import Drafter, DraftSession, Proposal
from .ngram import NgramIndex


class _CombinedSession(DraftSession):
    def __init__(self, d: NgramFirstDrafter, prompt):
        self.index = NgramIndex(d.min_n, d.max_n)
        self.model = d.model.session(prompt)
        self.ngram_drafts = 0

    @property
    def forwards(self) -> int:
        return self.model.forwards

    @property
    def reads_hidden(self) -> bool | tuple[int, ...]:
        return self.model.reads_hidden

    def observe_hidden(self, start, hidden):
        self.model.observe_hidden(start, hidden)

    def attach_target(self, target):
        self.model.attach_target(target)

    def warm(self, context, chunk):
        return self.model.warm(context, chunk)

    def free_proposal(self, context, k, params, generator):
        tokens = self.index.propose(context, k)
        if tokens:
            self.ngram_drafts += 1
            return Proposal(tokens)
        return None

    def propose(self, context, k, params, generator):
        p = self.free_proposal(context, k, params, generator)
        return p if p is not None else self.model.propose(context, k, params, generator)

    def finish(self, context):
        self.model.finish(context)


class NgramFirstDrafter(Drafter):
    uses_model = True

    def __init__(self, model: Drafter, *, prompt_lookup_min: int = 2, prompt_lookup_max: int = 4):
        self.model = model
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max
        self.name = f"ngram+{model.name}"

    def load_model(self) -> None:
        self.model.load_model()

    def session(self, prompt):
        return _CombinedSession(self, prompt)

    def describe(self):
        return {
            "name": self.name,
            "prompt_lookup_min": self.min_n,
            "prompt_lookup_max": self.max_n,
            "model": self.model.describe(),
        }
