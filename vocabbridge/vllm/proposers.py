"""vocabbridge's drafters inside vLLM, as ``custom_class`` proposers.

``vocabbridge serve --backend vllm --drafter MODEL --mode text`` (or ``bridged``, or ``--drafter
ngram-map``, or a drafter with the target's vocabulary and ``--ngram-first`` / ``--min-confidence``)
starts vLLM with ``--speculative-config '{"method": "custom_class", "model":
"vocabbridge.vllm.proposers.TextProposer", "num_speculative_tokens": k}'`` and
``VOCABBRIDGE_VLLM_DRAFTER`` naming a small JSON file that says which drafter model, map and options
to use (:func:`proposer_config`). vLLM imports the class in its
worker process and constructs it with its ``VllmConfig``; every step it calls
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` with every
running request's committed token ids, and verifies what we return with the target, losslessly.

Each request keeps its own drafter session (the drafter's KV cache, its view of the context), the
same sessions our engine uses: the text drafter reads the context as text in its own tokenization,
the bridged one through the token map and its input bridge. State is keyed by vLLM's request id
(read from the model runner's batch), checked against the committed context (a session whose
context is not a prefix of the row's is replaced), rolled back by the sessions' own KV sync after
a rejection, and evicted once a request has left the batch. The engine's policies apply per
request: prompt lookup first (``--ngram-first``), the confidence gate (``--min-confidence``), and
back-off after repeated misses.

The drafter model runs in vLLM's worker process, on its device (the CPU here; int8 weights by
default, as in our engine). Drafters without a model (the n-gram map) run there too, on the CPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path

from ..mapping.cache import cache_root
from ..spec import DRAFTERS, EngineSpec

CONFIG_ENV = "VOCABBRIDGE_VLLM_DRAFTER"
EVICT_AFTER = 256  # propose calls a request may be absent from the batch before its state is dropped


def proposer_config(spec: EngineSpec, drafter_source: str | None) -> tuple[Path, str]:
    """The proposer's configuration file (path, content), for vLLM's worker to read; its path goes
    in ``VOCABBRIDGE_VLLM_DRAFTER``. The name is a hash of the content: one configuration, one file."""
    doc = {"spec": dataclasses.asdict(spec), "drafter": drafter_source}
    if spec.map_path:
        doc["spec"]["map_path"] = os.path.abspath(spec.map_path)
    text = json.dumps(doc, sort_keys=True, indent=1) + "\n"
    return cache_root() / "vllm" / f"proposer-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json", text


def read_config() -> tuple[EngineSpec, str | None]:
    path = os.environ.get(CONFIG_ENV)
    if not path:
        raise RuntimeError(
            f"{CONFIG_ENV} is not set: start vLLM with `vocabbridge serve --backend vllm --drafter MODEL --mode text|bridged` "
            "(or --drafter ngram-map), which writes the proposer's configuration and sets it."
        )
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    return EngineSpec(**doc["spec"]), doc["drafter"]


@dataclass
class _TargetInfo:
    """What a drafter's ``from_spec`` needs of the target: its tokenizer view and logits width."""

    view: object
    vocab_size: int
    source: str


class _Request:
    def __init__(self, session, backoff):
        self.session = session
        self.backoff = backoff
        self.context: list[int] = []  # committed ids when we last proposed
        self.proposed = 0  # tokens proposed then
        self.forwards = 0  # the session's drafter forwards before that proposal
        self.seen = 0  # propose call that last saw this request


def _find_runner():
    """vLLM builds the proposer inside its model runner's ``__init__``: the runner is up the stack."""
    f = sys._getframe(2)
    while f is not None:
        obj = f.f_locals.get("self")
        if obj is not None and type(obj).__name__.endswith("ModelRunner"):
            return weakref.ref(obj)
        f = f.f_back
    return None


class VocabbridgeProposer:
    """The base of our proposers; subclasses name the registered drafting method (``method``): a
    model drafter's mode (text, bridged, draft) or a method without a model (ngram-map)."""

    method = ""

    def __init__(self, vllm_config):
        from ..engine.policies import BackOff  # torch: only inside vLLM's worker

        self._backoff_cls = BackOff
        spec, self.drafter_source = read_config()
        self.uses_model = DRAFTERS[self.method].uses_model
        self.spec = spec.replace(mode=self.method) if self.uses_model else spec
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.target_source = vllm_config.model_config.tokenizer
        self.target_vocab = vllm_config.model_config.get_vocab_size()
        self.runner = _find_runner()
        self.requests: dict[object, _Request] = {}
        self.calls = 0
        self.drafter = None

    def load_model(self, *args, **kwargs) -> None:
        """Called by vLLM once the target is loaded (required on the CPU runner): load our drafter."""
        from ..engine.drafters import NgramFirstDrafter
        from ..engine.factory import drafter_dtype, load_drafter_lm
        from ..tokenizer import load_tokenizer

        view = load_tokenizer(self.target_source) if self.uses_model else None  # the n-gram map reads ids only
        target = _TargetInfo(view, self.target_vocab, self.target_source)
        lm = load_drafter_lm(self.drafter_source, drafter_dtype(self.spec), device=self.spec.device) if self.uses_model else None
        drafter = DRAFTERS[self.method].engine_class().from_spec(self.spec, target, lm)
        if self.spec.ngram_first and self.uses_model:
            lookup_min = max(2, self.spec.prompt_lookup_min)
            drafter = NgramFirstDrafter(
                drafter, prompt_lookup_min=lookup_min, prompt_lookup_max=max(lookup_min, self.spec.prompt_lookup_max)
            )
        self.drafter = drafter

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **kwargs) -> list[list[int]]:
        from ..engine.sampling import SamplingParams

        if self.drafter is None:
            self.load_model()
        self.calls += 1
        runner = self.runner() if self.runner is not None else None
        req_ids = list(runner.input_batch.req_ids) if runner is not None else None
        greedy = SamplingParams(temperature=0.0, max_new_tokens=1 << 30)
        out: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            budget = min(self.k, self.max_model_len - n - 1)
            if not sampled or budget < 1:  # a partial prefill chunk, or the end of the context
                out.append([])
                continue
            context = token_ids_cpu[i, :n].tolist()
            key = req_ids[i] if req_ids is not None and i < len(req_ids) else i
            req = self.requests.get(key)
            if req is None or context[: len(req.context)] != req.context:
                req = _Request(self.drafter.session(context), self._backoff_cls(self.spec.backoff))
                self.requests[key] = req
            elif req.proposed:  # what the target kept of our last proposal: all but its own last token
                req.backoff.observe(len(sampled) - 1, costly=req.session.forwards - req.forwards > 1)
            req.seen, req.context, req.proposed = self.calls, context, 0
            if req.backoff.sit_out():
                out.append([])
                continue
            req.forwards = req.session.forwards
            tokens = req.session.propose(context, budget, greedy, None).tokens[:budget]
            cut = next((j for j, t in enumerate(tokens) if not 0 <= t < self.target_vocab), len(tokens))
            req.proposed = cut
            out.append([int(t) for t in tokens[:cut]])
        self._evict()
        return out

    def _evict(self) -> None:
        stale = [key for key, r in self.requests.items() if self.calls - r.seen > EVICT_AFTER]
        for key in stale:
            del self.requests[key]


class TextProposer(VocabbridgeProposer):
    """The text-level drafter (SLEM-style): the drafter continues the context text in its own tokenization."""

    method = "text"


class BridgedProposer(VocabbridgeProposer):
    """The bridged drafter: the context through the token map and its input bridge, proposals mapped back."""

    method = "bridged"


class DraftProposer(VocabbridgeProposer):
    """A drafter with the target's vocabulary (a transplanted folder, a smaller model of the target's
    family) with our policies, which vLLM's own ``draft_model`` lacks: prompt lookup first
    (``--ngram-first``), the confidence gate (``--min-confidence``: vLLM's drafts k tokens every step),
    back-off, and our CPU drafter (row-int8 on the lean forward). No map and no re-tokenization: the
    drafter reads and writes the target's ids. :func:`.config.speculative_config` picks it for such a
    drafter when one of those options is set, and vLLM's ``draft_model`` otherwise."""

    method = "draft"


class NgramMapProposer(VocabbridgeProposer):
    """llama.cpp's n-gram map (``--drafter ngram-map``): the most frequent continuation of the last n
    tokens, proposed once it has been seen ``--ngram-map-min-hits`` times; no model."""

    method = "ngram-map"
