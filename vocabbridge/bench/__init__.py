"""``vocabbridge bench``: the EXAONE study's speculative-decoding protocol against any
OpenAI-compatible server (ours or vLLM): a prompt suite, thinking on/off, repeats, a warm-up kept
out of the averages, acceptance from ``/metrics`` deltas, a concurrency sweep, prefilled-think
variants beside the plain requests with a flag for answers that start with planning notes;
tables, JSON, PNGs.

>>> from vocabbridge.bench import BenchSettings, Endpoint, bench_urls, load_prompts  # doctest: +SKIP
>>> res = bench_urls([Endpoint("ngram", "http://127.0.0.1:8000")], load_prompts(), BenchSettings(max_tokens=64))  # doctest: +SKIP
>>> res.config("ngram").overall.acceptance_rate  # doctest: +SKIP
"""

from ..errors import BenchError, LaunchError, MetricsError, PromptFileError, ServerError
from ..prompts import Prompt, load_prompts, parse_prompts, select_prompts
from .counters import Counters, SpecDelta, counter_delta, parse_counters
from .outputs import markdown_report, sections, write_outputs
from .planning import starts_with_planning
from .prefill import THINK_BLOCKS, prefill_text
from .protocol import BenchSettings, Progress, bench_endpoint, bench_urls
from .results import BenchResult, ConfigResult, Endpoint, Figures, PrefillFigures, RequestResult

__all__ = [
    "BenchError",
    "BenchResult",
    "BenchSettings",
    "ConfigResult",
    "Counters",
    "Endpoint",
    "Figures",
    "LaunchError",
    "MetricsError",
    "PrefillFigures",
    "Progress",
    "Prompt",
    "PromptFileError",
    "RequestResult",
    "ServerError",
    "SpecDelta",
    "THINK_BLOCKS",
    "bench_endpoint",
    "bench_urls",
    "counter_delta",
    "load_prompts",
    "markdown_report",
    "parse_counters",
    "parse_prompts",
    "prefill_text",
    "sections",
    "select_prompts",
    "starts_with_planning",
    "write_outputs",
]
