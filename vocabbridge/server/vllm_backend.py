"""The vLLM backend: the ``vllm serve`` command for an :class:`EngineSpec`, and running it.

``--speculative-config`` per drafter (field names as in vLLM's ``SpeculativeConfig``):

- a model:  ``{"method": "draft_model", "model": D, "num_speculative_tokens": k}``, plus
  ``"use_heterogeneous_vocab": true, "draft_sample_method": "greedy"`` when the vocabularies differ
  (vLLM's token-level intersection supports greedy draft sampling only);
- ``ngram``: ``{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": a, "prompt_lookup_max": b}``;
- ``mtp``:  ``{"method": "mtp", "num_speculative_tokens": k}`` (the target's own MTP layer);
- ``none``: no ``--speculative-config``.

Presets become their hub ids (vLLM downloads them); paths and hub ids pass through. The served
model name is the target as the user gave it, as with the embedded server, so a client works
against either. The API key reaches vLLM through ``VLLM_API_KEY``, never the command line.

>>> from vocabbridge.spec import EngineSpec
>>> cmd = vllm_command(EngineSpec(target="qwen2.5-coder-1.5b", drafter="ngram", num_speculative_tokens=3), port=8000)
>>> print(cmd.shell())
vllm serve Qwen/Qwen2.5-Coder-1.5B-Instruct --host 127.0.0.1 --port 8000 --served-model-name qwen2.5-coder-1.5b \
--speculative-config '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":1,"prompt_lookup_max":4}'
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx

from ..errors import VocabBridgeError
from ..presets import resolve_model
from ..spec import EngineSpec, engine_only_notes, served_name, vllm_model, vllm_speculative_config, vocabularies_match

INSTALL_HINT = (
    "vLLM is not installed: pip install 'vocabbridge[vllm]' (vLLM needs Linux with a CUDA GPU), or serve with --backend embedded."
)


@dataclass(frozen=True)
class VllmCommand:
    argv: list[str]
    model_name: str  # what clients send as "model"
    speculative_config: dict | None
    env: dict[str, str] = field(default_factory=dict)  # added to the environment (VLLM_API_KEY)
    notes: list[str] = field(default_factory=list)

    def shell(self) -> str:
        """The command line, shell-quoted (the API key, if any, shown as an environment variable)."""
        prefix = "VLLM_API_KEY=$VOCABBRIDGE_API_KEY " if "VLLM_API_KEY" in self.env else ""
        return prefix + " ".join(shlex.quote(a) for a in self.argv)


def speculative_config(spec: EngineSpec) -> tuple[dict | None, list[str]]:
    """vLLM's ``--speculative-config`` for ``spec`` (see :func:`vocabbridge.spec.vllm_speculative_config`),
    with the vocabularies compared by name, and notes on how it was decided."""
    notes: list[str] = []
    same = None
    if spec.uses_model:
        same, how = vocabularies_match(spec.drafter, spec.target_name, resolve=resolve_model)
        if same is None:
            notes.append(f"vocabularies not compared: {how}; assuming they differ (use_heterogeneous_vocab is safe either way)")
        else:
            notes.append(f"{'same' if same else 'different'} vocabulary ({how})")
    return vllm_speculative_config(spec, same_vocabulary=same, notes=notes), notes


def vllm_command(
    spec,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_num_seqs: int | None = None,
    tensor_parallel_size: int | None = None,
    extra_args: tuple[str, ...] | list[str] = (),
) -> VllmCommand:
    """The exact ``vllm serve`` argv for ``spec`` (nothing is run)."""
    model = vllm_model(spec.target_name)
    name = served_model_name or served_name(spec.target_name)
    cfg, notes = speculative_config(spec)
    argv = ["vllm", "serve", model, "--host", host, "--port", str(port)]
    if name != model:
        argv += ["--served-model-name", name]
    if tensor_parallel_size is not None:
        argv += ["--tensor-parallel-size", str(tensor_parallel_size)]
    if max_num_seqs is not None:
        argv += ["--max-num-seqs", str(max_num_seqs)]
    if cfg is not None:
        argv += ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]
    argv += list(extra_args)
    notes += engine_only_notes(spec)
    env = {"VLLM_API_KEY": api_key} if api_key else {}
    return VllmCommand(argv, name, cfg, env, notes)


# ==== choosing and running ===============================================================


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def choose_backend(requested: str) -> tuple[str, str]:
    """``auto`` → vllm when vLLM is importable and a CUDA GPU is present, else embedded; with the reason."""
    if requested != "auto":
        return requested, "asked for"
    has_vllm, has_gpu = vllm_installed(), cuda_available()
    if has_vllm and has_gpu:
        return "vllm", "vLLM is installed and a CUDA GPU is present"
    why = " and ".join(w for w, ok in (("vLLM is not installed", has_vllm), ("no CUDA GPU", has_gpu)) if not ok)
    return "embedded", why


def run_vllm(cmd: VllmCommand, *, host: str, port: int, on_ready, poll_s: float = 1.0) -> int:
    """Run ``cmd``; call ``on_ready()`` once its /health answers 200; forward SIGINT/SIGTERM to it;
    return its exit status (0 after a clean stop)."""

    if not vllm_installed():
        raise VocabBridgeError(INSTALL_HINT)
    argv = list(cmd.argv)
    if shutil.which(argv[0]) is None:  # no console script on PATH: the same CLI through this Python
        argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", *argv[1:]]
    # Its own process group: a terminal's Ctrl-C reaches us only, and we forward it once.
    proc = subprocess.Popen(argv, env=os.environ | cmd.env, start_new_session=True)
    forwarded: list[int] = []

    def forward(signum, frame):
        forwarded.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        probe = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
        health = f"http://[{probe}]:{port}/health" if ":" in probe else f"http://{probe}:{port}/health"
        while proc.poll() is None and not forwarded:
            try:
                if httpx.get(health, timeout=poll_s).status_code == 200:
                    on_ready()
                    break
            except httpx.HTTPError:
                pass
            time.sleep(poll_s)
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if proc.poll() is None:
            proc.kill()
    if forwarded and rc in (0, -signal.SIGINT, -signal.SIGTERM):
        return 0
    return rc if rc >= 0 else 128 - rc
