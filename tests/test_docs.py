"""Every ``vocabbridge …`` command the README and docs/ show parses with the CLI as it is.

The commands are read from the fenced code blocks of the pages (``bash``/``sh``/``console`` blocks
line by line; ``text`` blocks where a line starts with ``$ ``), split as a shell splits them, and
each is checked with click's own parser: the subcommand exists, every flag is one of its options,
options that take a value get one, the positional arguments fit, and choice and number values
convert. No model loads and no option callback runs (an output path is not created).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from vocabbridge.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "benchmarks" / "README.md",
    ROOT / "maps" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
PAGES = [p for p in PAGES if p.exists()]

FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
SHELL_BLOCKS = {"bash", "sh", "shell", "console", "zsh"}
OPERATORS = {"&&", "||", "|", ";", "&"}
REDIRECTS = {">", ">>", "<", "2>", "2>&1", "&>"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
VALUE_TYPES = (click.Choice, click.types.IntParamType, click.types.FloatParamType, click.types.BoolParamType)


def shell_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command line) for the shell lines of the fenced blocks, continuations joined.

    >>> shell_lines("```bash\\nvocabbridge diff a \\\\\\n    b\\n```\\n```text\\n$ vocabbridge presets\\nout\\n```")
    [(2, 'vocabbridge diff a b'), (6, 'vocabbridge presets')]
    """
    out: list[tuple[int, str]] = []
    lang = None  # None: outside a block
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            lang = None if lang is not None else fence.group(2).lower()
            pending = ""
            continue
        if lang is None:
            continue
        stripped = line.strip()
        if lang not in SHELL_BLOCKS:
            if not stripped.startswith("$ "):
                continue
            stripped = stripped[2:]
        elif stripped.startswith("$ "):
            stripped = stripped[2:]
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        out.append((start, (pending + stripped).strip()))
        pending = ""
    return out


def vocabbridge_commands(line: str) -> list[list[str]]:
    """The argument lists of every ``vocabbridge`` command on a shell line.

    >>> vocabbridge_commands('pip install x && X=1 vocabbridge doctor --fix  # why')
    [['doctor', '--fix']]
    >>> vocabbridge_commands('vocabbridge bench --out "results/$(date +%F)-x" > log')
    [['bench', '--out', 'results/SUBST-x']]
    """
    line = re.sub(r"\$\([^()]*\)", "SUBST", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    segments: list[list[str]] = [[]]
    skip_next = False
    for token in lexer:
        if skip_next:
            skip_next = False
        elif token in OPERATORS:
            segments.append([])
        elif token in REDIRECTS or token.startswith(("2>", ">")):
            skip_next = token in REDIRECTS
        else:
            segments[-1].append(token)
    commands = []
    for words in segments:
        while words and ASSIGNMENT.match(words[0]):
            words = words[1:]
        if words and words[0] == "vocabbridge":
            commands.append(words[1:])
    return commands


def documented() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        for number, line in shell_lines(page.read_text(encoding="utf-8")):
            for argv in vocabbridge_commands(line):
                found.append((f"{page.relative_to(ROOT)}:{number}", argv))
    return found


COMMANDS = documented()


def check(argv: list[str]) -> None:
    """Parse ``vocabbridge ARGV`` with click's parser; raise click.UsageError (or AssertionError)."""
    ctx = click.Context(main, info_name="vocabbridge")
    _, rest, _ = main.make_parser(ctx).parse_args(list(argv))
    assert rest, f"no subcommand in {argv}"
    name, args = rest[0], rest[1:]
    cmd = main.get_command(ctx, name)
    assert cmd is not None, f"no command {name!r}; the CLI has {', '.join(main.list_commands(ctx))}"
    sub = click.Context(cmd, info_name=name, parent=ctx)
    opts, extra, _ = cmd.make_parser(sub).parse_args(list(args))
    assert not extra, f"{name}: unexpected extra arguments {extra}"
    for param in cmd.params:
        value = opts.get(param.name)  # a string or a tuple of strings; anything else: not given
        given = isinstance(value, (str, tuple, list)) and value != ()
        if isinstance(param, click.Argument) and param.required and not given:
            raise AssertionError(f"{name}: the argument {param.human_readable_name} is missing")
        if given and isinstance(param.type, VALUE_TYPES):
            for v in [value] if isinstance(value, str) else value:
                param.type.convert(v, param, sub)


def test_the_pages_show_commands():
    """The extraction finds the commands (a broken fence or regex would make every check vacuous)."""
    pages = {where.split(":")[0] for where, _ in COMMANDS}
    assert "README.md" in pages
    assert len(COMMANDS) >= 20, COMMANDS


def test_the_readme_shows_every_command():
    """One example per command in the README, the commands other changes add included."""
    ctx = click.Context(main, info_name="vocabbridge")
    shown = {argv[0] for where, argv in COMMANDS if where.startswith("README.md:") and argv}
    missing = sorted(set(main.list_commands(ctx)) - shown)
    assert not missing, f"README.md shows no example of: {', '.join(missing)}"


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_documented_command_parses(where, argv):
    try:
        check(argv)
    except click.UsageError as e:
        pytest.fail(f"{where}: vocabbridge {shlex.join(argv)}\n  {e.format_message()}")
    except AssertionError as e:
        pytest.fail(f"{where}: vocabbridge {shlex.join(argv)}\n  {e}")


def test_a_wrong_flag_is_caught():
    """The checker itself: a flag the command does not have, a bad choice and a missing value fail."""
    check(["diff", "a", "b", "--json"])
    with pytest.raises(click.UsageError):
        check(["diff", "a", "b", "--no-such-flag"])
    with pytest.raises(click.UsageError):
        check(["build-map", "a", "b", "--mode", "nonsense"])
    with pytest.raises(click.UsageError):
        check(["diff", "a", "b", "-o"])
    with pytest.raises(AssertionError):
        check(["no-such-command"])
    with pytest.raises(AssertionError):
        check(["diff", "a"])


LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page):
    """Every relative link of a page points at a file or folder of the checkout."""
    broken = [
        target
        for target in LINK.findall(page.read_text(encoding="utf-8"))
        if "://" not in target and not target.startswith("mailto:") and not (page.parent / target).exists()
    ]
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"
