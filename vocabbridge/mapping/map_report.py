"""A token map and its coverage as one report: built by :func:`analyze_pair` / :func:`analyze_map`,
rendered as sections (rich table / Markdown) or as a JSON-ready dict.

Several coverages side by side (``bytes`` and ``vllm``) render as one column each.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from ..report import Section, fmt_int, fmt_pct, to_jsonable
from ..tokenizer import TokenizerView
from ..tokenizer.scripts import SCRIPT_LABELS
from .build import build_token_map
from .coverage import Coverage, RoleCoverage, compute_coverage
from .tokenmap import TokenMap

LABELS = {"bytes": "bytes map", "vllm": "vllm map (what vLLM builds)"}


@dataclass
class MapReport:
    """What ``build-map`` and ``coverage`` show: the map, its coverage (and vLLM's map's, side by
    side), and the vLLM hand-off for the pair."""

    map: TokenMap
    coverages: list[Coverage]  # the map's own first; then the other mode's when compared
    path: str | None = None  # where the map was written / read
    vllm_config: dict | None = None  # --speculative-config for this drafter in vLLM (build-map only)
    serve_line: str | None = None  # the `vocabbridge serve --backend vllm …` command that runs it (build-map only)

    @property
    def coverage(self) -> Coverage:
        return self.coverages[0]

    def to_dict(self) -> dict:
        tm = self.map
        out = {"map": self.path, "mode": tm.mode, "drafter": to_jsonable(tm.drafter), "target": to_jsonable(tm.target)}
        if self.vllm_config is not None:
            out["stats"] = to_jsonable(tm.stats)
        out["coverage"] = {c.mode: coverage_dict(c) for c in sorted(self.coverages, key=lambda c: c.mode)}
        if self.vllm_config is not None:
            out["vllm"] = {
                "speculative_config": self.vllm_config,
                "vocabbridge_serve": self.serve_line,
                "serve_command": serve_command(tm.target.source, self.vllm_config, map_path=self.path),
                "coverage_mode": "vllm",
            }
        return out

    def _vllm_section(self, vllm_cov: Coverage) -> Section:
        """How to run the pair in vLLM: our map through the plugin (the default), vLLM's own string map without it."""
        config, own = self.vllm_config or {}, self.coverage
        notes = ["--speculative-config '" + json.dumps(config) + "'"]
        if self.serve_line:
            notes.append(self.serve_line)
        hetero = config.get("use_heterogeneous_vocab")
        if hetero and own.mode != "vllm":
            notes.append(
                f"With vocabbridge installed beside vLLM, its plugin builds vLLM's VocabMapping from this {own.mode} map "
                f"({own.pairs:,} pairs, {fmt_pct(own.pct_target)} of the target vocabulary; unpaired target tokens reach the "
                "drafter as the first token of their spelling, not unk):"
            )
        notes.append(serve_command(self.map.target.source, config, map_path=self.path if hetero else None))
        if hetero:
            total = vllm_cov.total_text()
            claim = (
                f"Without the plugin, vLLM builds its own string map at start-up: the vllm column above, {vllm_cov.pairs:,} "
                f"pairs ({fmt_pct(vllm_cov.pct_target)} of the target vocabulary)"
            )
            if total is not None:
                claim += f", and on these texts {fmt_pct(total.vllm_unk_share)} of target tokens reach the drafter as unk"
            notes.append(claim + ". `--mode text` or `--mode bridged` run vocabbridge's own drafters inside vLLM instead.")
        notes.append(
            '"model" is the drafter you passed; give vLLM the drafter model\'s path or hub id if that was a tokenizer folder.'
        )
        return Section("vLLM hand-off", [], [], notes)

    def sections(self, *, written: bool = False) -> list[Section]:
        covs = sorted(self.coverages, key=lambda c: c.mode)  # bytes, then vllm
        out = [map_section(self.map, self.path if written else None), *coverage_sections(covs)]
        if self.vllm_config is not None:
            out.append(self._vllm_section(covs[-1]))
        return out


def analyze_pair(
    drafter: TokenizerView,
    target: TokenizerView,
    *,
    mode: str = "bytes",
    texts: dict[str, str],
    drafter_vocab_size: int | None = None,
    target_vocab_size: int | None = None,
    check_bridge: bool = False,
) -> MapReport:
    """Build the ``mode`` map and its coverage beside vLLM's own map's. The caller sets the vLLM
    hand-off (``vllm_config``, ``serve_line``: the mapping floor does not speak vLLM)."""
    sizes = {"drafter_vocab_size": drafter_vocab_size, "target_vocab_size": target_vocab_size}
    tm = build_token_map(drafter, target, mode=mode, **sizes)
    vm = tm if mode == "vllm" else build_token_map(drafter, target, mode="vllm", **sizes)
    covs = [compute_coverage(tm, drafter, target, texts=texts, vllm_map=vm, check_bridge=check_bridge)]
    if mode != "vllm":
        covs.append(compute_coverage(vm, drafter, target, texts=texts))
    return MapReport(tm, covs)


def analyze_map(
    tm: TokenMap,
    drafter: TokenizerView,
    target: TokenizerView,
    *,
    texts: dict[str, str],
    compare_modes: bool = False,
    path: str | None = None,
) -> MapReport:
    """Coverage of an existing map (and, with ``compare_modes``, of the other mode's map beside it)."""
    tm.check(drafter, target, path=path)
    other = None
    if compare_modes:
        other = build_token_map(
            drafter,
            target,
            mode="vllm" if tm.mode == "bytes" else "bytes",
            drafter_vocab_size=tm.drafter.model_vocab_size,
            target_vocab_size=tm.target.model_vocab_size,
        )
    vm = other if other is not None and other.mode == "vllm" else None
    covs = [compute_coverage(tm, drafter, target, texts=texts, vllm_map=vm)]
    if other is not None:
        covs.append(compute_coverage(other, drafter, target, texts=texts, vllm_map=tm if tm.mode == "vllm" else None))
    return MapReport(tm, covs, path=path)


def serve_command(target_model: str, config: dict | None, *, map_path: str | None = None) -> str:
    """``vllm serve`` itself; with ``map_path`` and a heterogeneous config, the environment variable
    that has the vocabbridge plugin (installed beside vLLM) build vLLM's VocabMapping from the map."""
    env = f"VOCABBRIDGE_VLLM_MAP={shlex.quote(map_path)} " if map_path and (config or {}).get("use_heterogeneous_vocab") else ""
    cmd = f"{env}vllm serve {shlex.quote(target_model)}"
    return cmd + (f" --speculative-config {shlex.quote(json.dumps(config))}" if config else "")


def map_section(tm: TokenMap, path: str | None = None) -> Section:
    d, t = tm.drafter, tm.target
    rows = [
        ["source", d.source, t.source],
        ["tokenizer ids", fmt_int(d.tokenizer_size), fmt_int(t.tokenizer_size)],
        [
            "model vocabulary",
            fmt_int(d.model_vocab_size) if d.model_vocab_size else "unknown (tokenizer size used)",
            fmt_int(t.model_vocab_size) if t.model_vocab_size else "unknown (tokenizer size used)",
        ],
        ["fingerprint", d.fingerprint[:16], t.fingerprint[:16]],
        ["vLLM fallback for unpaired ids (unk, else eos)", _id(tm.draft_unk_id), _id(tm.target_unk_id)],
    ]
    s = tm.stats
    how = [f"mode {tm.mode}"]
    if tm.mode == "bytes":
        how.append(
            f"{s.role_pairs} special tokens paired by role, {s.content_pairs} by content, {s.byte_pairs:,} tokens by bytes"
        )
        if s.normalizer_rejected:
            how.append(f"{s.normalizer_rejected:,} drafter tokens refused: the target's normalizer rewrites their text")
    else:
        markers = ", ".join(f"{k} {'/'.join(v)}" for k, v in s.space_markers.items())
        how.append(f"{s.byte_pairs:,} strings paired; space markers: {markers}")
        if s.dropped_beyond_vocab:
            how.append(f"{s.dropped_beyond_vocab:,} common strings dropped (an id beyond the model vocabulary)")
    if s.ambiguous:
        how.append(
            f"{s.ambiguous:,} ids share their {'string' if tm.mode == 'vllm' else 'bytes'} with another id of the same side"
        )
    notes = ["; ".join(how) + "."]
    if path:
        notes.append(f"written to {path}")
    return Section("Token map", ["", "drafter", "target"], rows, notes)


def _id(i: int | None) -> str:
    return "none" if i is None else str(i)


def vocab_section(covs: list[Coverage]) -> Section:
    c0 = covs[0]
    rows = [
        ["pairs (target ids with a single-token partner)", *(fmt_int(c.pairs) for c in covs)],
        [f"% of target vocabulary ({c0.target_vocab:,})", *(fmt_pct(c.pct_target) for c in covs)],
        [f"% of drafter vocabulary ({c0.drafter_vocab:,})", *(fmt_pct(c.pct_drafter) for c in covs)],
        ["special tokens paired by role", *(f"{c.roles_paired} of {c.roles_total}" for c in covs)],
        ["target ids without a partner", *(fmt_int(c.bridged) for c in covs)],
    ]
    if any(c.bridge_lossy is not None for c in covs):
        rows.append(
            [
                "  of them not spelled exactly by the input bridge",
                *("—" if c.bridge_lossy is None else fmt_int(c.bridge_lossy) for c in covs),
            ]
        )
    notes = [
        "Target ids without a partner reach the drafter through the input bridge (their bytes in drafter tokens) "
        "in vocabbridge; vLLM feeds the drafter its unk (else eos) id for them instead."
    ]
    return Section("Vocabulary coverage", ["", *(LABELS[c.mode] for c in covs)], rows, notes)


def script_section(covs: list[Coverage]) -> Section:
    cols = ["script", "target tokens"]
    for c in covs:
        cols += [f"paired ({c.mode})", "%"]
    by = [{s.script: s for s in c.scripts} for c in covs]
    rows = []
    for s in covs[0].scripts:
        row = [SCRIPT_LABELS.get(s.script, s.script), fmt_int(s.target_tokens)]
        for m in by:
            x = m.get(s.script)
            row += [fmt_int(x.paired if x else 0), fmt_pct(x.share if x else None)]
        rows.append(row)
    return Section("Target tokens by script (special tokens excluded)", cols, rows)


def _role_cell(r: RoleCoverage, mode: str) -> str:
    if r.target_id is None:
        return "—"
    if r.status == "paired":
        return "paired"
    if r.status == "other":
        return f"→ drafter {r.mapped_to}"
    return "none → bridge" if mode == "bytes" else "none → unk"


def roles_section(covs: list[Coverage]) -> Section:
    rows = []
    for k, r in enumerate(covs[0].roles):
        tok = lambda i, s: "" if i is None else f"{i} {s}"  # noqa: E731
        rows.append(
            [
                r.role,
                tok(r.target_id, r.target_token),
                tok(r.drafter_id, r.drafter_token),
                *(_role_cell(c.roles[k], c.mode) for c in covs),
            ]
        )
    return Section(
        "Special tokens by role",
        ["role", "target", "drafter", *(f"{c.mode}" for c in covs)],
        rows,
        ["paired: the target's token maps to the drafter's token of the same role."],
    )


def texts_section(covs: list[Coverage]) -> Section | None:
    c0 = covs[0]
    if not c0.texts:
        return None
    cols = [
        "text",
        "chars",
        "target tokens",
        *(f"single-token partner ({c.mode})" for c in covs),
        "reach drafter as unk under vLLM",
    ]
    rows = []
    per = [[*c.texts, c.total_text()] for c in covs]
    for k, t in enumerate(per[0]):
        rows.append(
            [
                t.file,
                fmt_int(t.chars),
                fmt_int(t.target_tokens),
                *(fmt_pct(p[k].partnered_share) for p in per),
                fmt_pct(t.vllm_unk_share),
            ]
        )
    return Section(
        "Corpus coverage (target-token occurrences)",
        cols,
        rows,
        [
            "single-token partner: the drafter can propose the token itself; unk under vLLM: the drafter reads unk "
            "there with vLLM's map (vocabbridge's input bridge spells those tokens in drafter tokens instead)."
        ],
    )


def coverage_sections(covs: list[Coverage]) -> list[Section]:
    out = [vocab_section(covs), script_section(covs), roles_section(covs)]
    t = texts_section(covs)
    return out + ([t] if t else [])


def coverage_dict(c: Coverage) -> dict:
    d = to_jsonable(c)
    d["all_texts"] = to_jsonable(c.total_text()) if c.texts else None
    return d
