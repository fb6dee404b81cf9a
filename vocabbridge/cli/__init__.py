"""The ``vocabbridge`` command: a thin click layer over the library."""

from __future__ import annotations

import click

from .. import __version__
from .bench_cmd import bench_cmd
from .common import Group
from .diff_cmd import diff_cmd
from .generate_cmd import eval_drafter_cmd, generate_cmd
from .map_cmd import build_map_cmd, coverage_cmd
from .serve_cmd import presets_cmd, serve_cmd


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.version_option(__version__, prog_name="vocabbridge")
def main(debug: bool) -> None:
    """Speculative decoding across tokenizers: diff them, map them, serve and benchmark drafters."""


main.add_command(diff_cmd)
main.add_command(generate_cmd)
main.add_command(eval_drafter_cmd)
main.add_command(build_map_cmd)
main.add_command(coverage_cmd)
main.add_command(serve_cmd)
main.add_command(presets_cmd)
main.add_command(bench_cmd)
