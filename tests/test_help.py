"""Every command's --help says what that command does: the drafter registry in full, and vLLM only
where the command has a vLLM backend (help derived from vocabbridge.spec, per command)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from vocabbridge.cli import main
from vocabbridge.spec import DRAFTERS

ENGINE_COMMANDS = ("generate", "eval-drafter", "serve", "bench")
WITH_VLLM = ("serve", "bench")


def help_text(command: str) -> str:
    """``vocabbridge COMMAND --help`` as one line (wide, so no name is split where a line wraps)."""
    r = CliRunner().invoke(main, [command, "--help"], terminal_width=1000)
    assert r.exit_code == 0, r.output
    return " ".join(r.output.split())


@pytest.mark.parametrize("command", ENGINE_COMMANDS)
def test_every_registered_drafter_is_named_in_each_engine_commands_help(command):
    text = help_text(command)
    missing = [name for name in DRAFTERS if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)]
    assert not missing, f"`vocabbridge {command} --help` does not name {', '.join(missing)}"


@pytest.mark.parametrize("command", ENGINE_COMMANDS)
def test_only_commands_with_a_vllm_backend_describe_it(command):
    text = help_text(command)
    if command in WITH_VLLM:
        assert "--backend vllm" in text and "VocabMapping" in text
    else:
        assert "--backend" not in text, f"`vocabbridge {command}` has no --backend, yet its help names one"
