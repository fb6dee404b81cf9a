"""The one speculative configuration (vocabbridge.spec): every field reaches the command line, serve
argv and vLLM (or is engine-only) by construction; the drafter registry; the torch-free bench."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from vocabbridge.cli import main
from vocabbridge.errors import ConfigError
from vocabbridge.spec import (
    DRAFTERS,
    METHOD_NAMES,
    MODEL_MODES,
    EngineSpec,
    cli_args,
    options,
    resolve_method,
)
from vocabbridge.vllm.config import engine_only_notes
from vocabbridge.vllm.config import speculative_config as vllm_speculative_config

# A value other than the default for every field (a new field must be added here, or this fails).
CHANGED = {
    "target": "t",
    "drafter": "d",
    "mode": "text",
    "map_path": "m.json",
    "map_mode": "vllm",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 5,
    "ngram_map_n": 8,
    "ngram_map_value": 4,
    "ngram_map_min_hits": 2,
    "suffix_max_depth": 12,
    "suffix_max_spec_factor": 2.0,
    "suffix_min_prob": 0.25,
    "suffix_max_cached_requests": 0,
    "adaptive_k": True,
    "cost_aware": True,
    "min_confidence": 0.5,
    "ngram_first": True,
    "backoff": False,
    "prefill_chunk": 64,
    "dtype": "float32",
    "drafter_dtype": "int8",
    "device": "cpu",
    "kernels": "llama.cpp",
}


def _command(name):
    return main.get_command(None, name)


def _parse(command: str, argv: list[str]) -> EngineSpec:
    """What the CLI command makes of ``argv``: the EngineSpec its callback would get."""
    cmd = _command(command)
    ctx = cmd.make_context(command, list(argv))
    return cmd.callback.spec_from(ctx.params)


def test_every_field_has_a_flag_help_and_a_changed_value_here():
    names = [n for n, _, _ in options()]
    assert set(names) == set(CHANGED), "add the new field to CHANGED with a non-default value"
    flags = [o.flag for _, o, _ in options()]
    assert len(set(flags)) == len(flags)
    for name, o, default in options():
        assert o.flag.startswith("--") and len(o.help) > 20, name
        assert CHANGED[name] != default, name


@pytest.mark.parametrize("command", ["serve", "generate", "eval-drafter"])
def test_cli_args_round_trip_through_every_engine_command(command):
    spec = EngineSpec(**CHANGED)
    extra = ["-p", "x"] if command == "generate" else []
    assert _parse(command, cli_args(spec) + extra) == spec
    one_by_one = [EngineSpec(target="t", drafter="d", **{k: v}) for k, v in CHANGED.items() if k not in ("target", "drafter")]
    for s in one_by_one:
        assert _parse(command, cli_args(s) + extra) == s


def test_bench_takes_every_field_but_the_drafter_and_mode_from_the_same_options():
    spec = EngineSpec(**{k: v for k, v in CHANGED.items() if k not in ("drafter", "mode")})
    argv = cli_args(spec)[4:]  # without --target t --drafter none
    got = _parse("bench", ["--target", "t", *argv, "--url", "http://127.0.0.1:9"])
    assert got == spec


def test_every_field_reaches_vllm_or_is_named_engine_only():
    """Changing any field either changes the vLLM command (argv, speculative config or environment)
    or is named in its notes as engine-only: nothing is silently dropped on the way to vLLM."""
    from vocabbridge.vllm.backend import vllm_command

    def command(**kw):
        cmd = vllm_command(EngineSpec(**({"target": "qwen2.5-coder-1.5b", "drafter": "ngram"} | kw)), cpu=False)
        return cmd.argv, cmd.env, cmd.notes

    for base in ({"drafter": "smollm2-135m", "mode": "text"}, {"drafter": "smollm2-135m", "mode": "tli"}):
        argv0, env0, notes0 = command(**base)
        for name, value in CHANGED.items():
            if name in ("target", "drafter", "prompt_lookup_min", "prompt_lookup_max") or name.startswith("suffix_"):
                continue  # ngram's and suffix's: below
            if name == "dtype":
                value = "bfloat16"
            if name == "mode":
                value = "bridged"
            try:
                argv, env, notes = command(**(base | {name: value}))
            except ConfigError:
                continue  # e.g. --mode text with the same vocabulary is fine, draft with another is refused
            flag = dict((n, o.flag) for n, o, _ in options())[name]
            named = any(flag in n for n in notes if "embedded engine only" in n)
            assert (argv, env) != (argv0, env0) or named, (base, name)
    argv, env, _ = command(drafter="smollm2-135m", mode="text", min_confidence=0.5)
    assert "VOCABBRIDGE_VLLM_DRAFTER" in env  # our proposer reads --min-confidence from its configuration file
    base = vllm_speculative_config(EngineSpec(target="t", drafter="ngram"))
    for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
        changed = vllm_speculative_config(EngineSpec(target="t", drafter="ngram", **{name: CHANGED[name]}))
        assert changed != base and changed[name] == CHANGED[name]
    base = vllm_speculative_config(EngineSpec(target="t", drafter="suffix"))
    for name, key in [
        ("suffix_max_depth", "suffix_decoding_max_tree_depth"),
        ("suffix_max_spec_factor", "suffix_decoding_max_spec_factor"),
        ("suffix_min_prob", "suffix_decoding_min_token_prob"),
        ("suffix_max_cached_requests", "suffix_decoding_max_cached_requests"),
    ]:
        changed = vllm_speculative_config(EngineSpec(target="t", drafter="suffix", **{name: CHANGED[name]}))
        assert changed == base | {key: CHANGED[name]}


def test_the_registry_names_every_method_and_builds_engine_drafters():
    from vocabbridge.engine.drafters.base import Drafter

    assert METHOD_NAMES == ("none", "ngram", "ngram-map", "suffix", "mtp", "self")
    assert MODEL_MODES == ("draft", "bridged", "text", "tli")
    for name, m in DRAFTERS.items():
        assert m.name == name and m.summary
        if m.engine is None:
            with pytest.raises(ConfigError, match="--backend vllm"):
                m.engine_class()
        else:
            cls = m.engine_class()
            assert issubclass(cls, Drafter) and "from_spec" in vars(cls) | vars(Drafter)
    assert (
        _command("generate").params[1].help.startswith("What drafts: none, ngram, ngram-map, suffix, mtp, self, or")
    )  # the engine's mtp drafter
    assert "none, ngram, ngram-map, suffix, mtp" in _command("serve").params[1].help  # vLLM runs it


@pytest.mark.parametrize(
    "spec, same, want",
    [
        (EngineSpec(target="t", drafter="ngram"), None, "ngram"),
        (EngineSpec(target="t", drafter="m"), True, "draft"),
        (EngineSpec(target="t", drafter="m"), False, "text"),
        (EngineSpec(target="t", drafter="m"), None, "text"),  # unknown vocabulary: text works for any pair
        (EngineSpec(target="t", drafter="m", mode="bridged"), True, "bridged"),
    ],
)
def test_resolve_method(spec, same, want):
    assert resolve_method(spec, same_vocabulary=same).name == want


def test_bad_specs_say_how_to_fix_them():
    with pytest.raises(ConfigError, match="another vocabulary.*--mode bridged or --mode text"):
        resolve_method(EngineSpec(target="t", drafter="m", mode="draft"), same_vocabulary=False)
    with pytest.raises(ConfigError, match="is a mode, not a drafter; write --drafter MODEL --mode text"):
        EngineSpec(target="t", drafter="text")
    with pytest.raises(ConfigError, match="--num-speculative-tokens must be at most 64"):
        EngineSpec(num_speculative_tokens=65)
    with pytest.raises(ConfigError, match="--min-confidence must be below 1"):
        EngineSpec(min_confidence=1.0)
    with pytest.raises(ConfigError, match="--prompt-lookup-min \\(5\\) must not exceed --prompt-lookup-max \\(4\\)"):
        EngineSpec(prompt_lookup_min=5)
    with pytest.raises(ConfigError, match="--mode must be one of auto, draft, bridged, text, tli"):
        EngineSpec(mode="tlx")
    with pytest.raises(ConfigError, match="needs --target"):
        _ = EngineSpec(drafter="ngram").target_name


def test_one_vllm_config_for_serve_and_build_map():
    """build-map's hand-off and serve --backend vllm come from one function (they drifted once)."""
    from vocabbridge.vllm.backend import vllm_command

    spec = EngineSpec(drafter="exaone-1.2b", mode="tli", num_speculative_tokens=3)
    assert vllm_command(spec, cpu=False).speculative_config == vllm_speculative_config(spec, same_vocabulary=False)
    assert vllm_speculative_config(spec, same_vocabulary=False)["draft_sample_method"] == "greedy"


def test_the_bench_and_the_spec_import_without_torch():
    code = "import sys, vocabbridge.bench, vocabbridge.spec, vocabbridge.cli; assert 'torch' not in sys.modules, 'torch'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_spec_is_a_plain_frozen_value():
    spec = EngineSpec(target="t", drafter="ngram")
    assert spec.replace(num_speculative_tokens=2).num_speculative_tokens == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.drafter = "none"
