"""``vocabbridge presets``: the named models and what each resolves to here."""

from __future__ import annotations

from pathlib import Path

import click

from ..presets import describe_presets, models_dir, models_dir_problem
from ..report import Section, print_sections, to_json
from .common import json_option


@click.command("presets")
@json_option("Print JSON.")
def presets_cmd(as_json):
    """List the model presets and what each resolves to here.

    A preset resolves to its local GGUF file when VOCABBRIDGE_MODELS points at a folder holding it,
    else to its hub id. A drafter preset names the target it pairs with.
    """
    rows = describe_presets()
    if as_json:
        click.echo(to_json(rows))
        return
    table = [
        [
            r["name"],
            r["role"],
            r["pairs_with"] or "",
            r["vocab"] or "",
            "yes" if r["has_mtp"] else "",
            f"(local) {Path(r['resolves_to']).name}" if r["local"] else r["resolves_to"],
        ]
        for r in rows
    ]
    folder = models_dir()
    notes = [
        models_dir_problem()
        or (
            f"(local): a GGUF file in VOCABBRIDGE_MODELS={folder}"
            if folder
            else "VOCABBRIDGE_MODELS is not set: presets resolve to hub ids (set it to a folder of GGUF files to use them)"
        )
    ]
    notes += [f"{r['name']}: {r['notes']}" for r in rows if r["notes"]]
    print_sections([Section("Presets", ["name", "role", "pairs with", "vocabulary", "MTP", "resolves to"], table, notes)])
