"""Prometheus metrics under vLLM's names and labels (``model_name``, ``engine``), so one scraper
or benchmark client reads this server and ``vllm serve`` alike. Each app has its own registry.

Speculative decoding (present only when a drafter runs, as in vLLM); counters show as ``_total``:

- ``vllm:spec_decode_num_drafts`` — verification steps that carried a draft
- ``vllm:spec_decode_num_draft_tokens`` / ``vllm:spec_decode_num_accepted_tokens``
- ``vllm:spec_decode_num_accepted_tokens_per_pos{position="i"}`` — drafts whose i-th token was accepted

Ours beside them (vLLM has no admission limit): ``vocabbridge:queued_prompt_tokens`` (prompt tokens
waiting for a slot) and ``vocabbridge:requests_rejected_total{reason="queue_full"}`` (429s).

PromQL, as vLLM documents it::

    acceptance rate        = rate(vllm:spec_decode_num_accepted_tokens_total[5m])
                           / rate(vllm:spec_decode_num_draft_tokens_total[5m])
    mean acceptance length = 1 + rate(vllm:spec_decode_num_accepted_tokens_total[5m])
                               / rate(vllm:spec_decode_num_drafts_total[5m])   # +1: the target's bonus token

Counters move after every engine step (from the request's SpecStats deltas), under one lock that
``/metrics`` also takes, so a scrape mid-request is consistent: accepted ≤ draft tokens and the
per-position counts sum to accepted.

>>> m = ServerMetrics("tiny", speculative=True, num_spec_tokens=2)
>>> b"vllm:spec_decode_num_drafts_total" in m.render()
True
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

FINISH_REASONS = ("stop", "length", "abort", "error")
REJECT_REASONS = ("queue_full",)
TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
TOKEN_LATENCY_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
REQUEST_LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]


def buckets_1_2_5(limit: int) -> list[int]:
    """1, 2, 5, 10, 20, 50... up to ``limit`` (token-count histograms).

    >>> buckets_1_2_5(100)
    [1, 2, 5, 10, 20, 50, 100]
    """
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return out
            out.append(m * scale)
        scale *= 10


class ServerMetrics:
    def __init__(self, model_name: str, *, speculative: bool, num_spec_tokens: int = 0, max_model_len: int = 1 << 20):
        self.registry = CollectorRegistry()
        self.lock = threading.Lock()
        labels, values = ["model_name", "engine"], [model_name, "0"]
        self._values = values
        r = self.registry

        def metric(cls, name, doc, **kw):
            return cls(name, doc, labelnames=labels, registry=r, **kw).labels(*values)

        self.running = metric(Gauge, "vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = metric(Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        # Ours, not vLLM's (it has no admission limit): what the embedded server's bounded queue holds and refuses.
        self.queued_tokens = metric(
            Gauge, "vocabbridge:queued_prompt_tokens", "Prompt tokens of the requests waiting for a slot (not running)."
        )
        rejected = Counter(
            "vocabbridge:requests_rejected",
            "Requests refused on arrival (429), by reason (queue_full: --max-queued-tokens).",
            labelnames=labels + ["reason"],
            registry=r,
        )
        self.rejected = {reason: rejected.labels(*values, reason) for reason in REJECT_REASONS}
        self.prompt_tokens = metric(Counter, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = metric(Counter, "vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labelnames=labels + ["finished_reason"],
            registry=r,
        )
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        tok_buckets = buckets_1_2_5(max_model_len)
        self.req_prompt = metric(
            Histogram, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", buckets=tok_buckets
        )
        self.req_gen = metric(
            Histogram, "vllm:request_generation_tokens", "Number of generation tokens processed.", buckets=tok_buckets
        )
        self.req_max_tokens = metric(
            Histogram, "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", buckets=tok_buckets
        )
        self.ttft = metric(
            Histogram, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", buckets=TTFT_BUCKETS
        )
        self.itl = metric(
            Histogram,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            buckets=TOKEN_LATENCY_BUCKETS,
        )
        # vLLM's older name for the same observations; kept for clients that still read it.
        self.tpot_legacy = metric(
            Histogram,
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            buckets=TOKEN_LATENCY_BUCKETS,
        )
        self.req_tpot = metric(
            Histogram,
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            buckets=TOKEN_LATENCY_BUCKETS,
        )
        phases = {
            "e2e": ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
            "queue": ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
            "inference": ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."),
            "prefill": ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
            "decode": ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."),
        }
        self.phase = {k: metric(Histogram, n, d, buckets=REQUEST_LATENCY_BUCKETS) for k, (n, d) in phases.items()}

        self.speculative = speculative
        if speculative:
            self.drafts = metric(Counter, "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
            self.draft_tokens = metric(Counter, "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
            self.accepted = metric(Counter, "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
            self._per_pos = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                labelnames=labels + ["position"],
                registry=r,
            )
            self.accepted_per_pos = [self._per_pos.labels(*values, str(i)) for i in range(num_spec_tokens)]

    # ==== updates (engine worker thread) =================================================

    def spec_step(self, drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]) -> None:
        """One engine step's speculative deltas (call under ``self.lock``)."""
        if not self.speculative:
            return
        self.drafts.inc(drafts)
        self.draft_tokens.inc(draft_tokens)
        self.accepted.inc(accepted)
        while len(self.accepted_per_pos) < len(per_pos):  # adaptive k can draft past the configured k
            self.accepted_per_pos.append(self._per_pos.labels(*self._values, str(len(self.accepted_per_pos))))
        for i, n in enumerate(per_pos):
            if n:
                self.accepted_per_pos[i].inc(n)

    def render(self) -> bytes:
        """The exposition text, without prometheus_client's ``*_created`` series (vLLM shows none)."""
        with self.lock:
            text = generate_latest(self.registry).decode()
        keep = [ln for ln in text.splitlines() if not _is_created_line(ln)]
        return ("\n".join(keep) + "\n").encode()


def _is_created_line(line: str) -> bool:
    name = line.split(" ", 3)[2] if line.startswith("# ") and line.count(" ") >= 2 else line.split("{", 1)[0].split(" ", 1)[0]
    return name.endswith("_created")
