"""Off a terminal (a log, a pipe, CI) long commands still say they are working: rich's spinners and
bars draw only on a terminal, and `eval-drafter` on the 1.5B printed nothing for 15 minutes."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time

from vocabbridge.util import PROGRESS_ENV, heartbeat


def test_a_heartbeat_speaks_off_a_terminal_only(monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, "0.05")
    out = io.StringIO()
    with heartbeat(lambda s: f"working ({s:.2f} s)", stream=out):
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and all(ln.startswith("working (") for ln in lines)
    n = len(lines)
    time.sleep(0.15)
    assert len(out.getvalue().splitlines()) == n  # stopped with the block

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty = Terminal()
    with heartbeat(lambda s: "working", stream=tty):  # there the spinner or the bar shows it
        time.sleep(0.2)
    assert tty.getvalue() == ""


def test_eval_drafter_in_a_log_prints_progress_lines(tiny, tmp_path):
    """The real CLI with stderr a pipe: every phase that shows a spinner on a terminal says it is
    still working, every VOCABBRIDGE_PROGRESS_SECONDS."""
    text = tmp_path / "t.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 40, encoding="utf-8")
    env = os.environ | {PROGRESS_ENV: "0.2", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "vocabbridge", "eval-drafter", "--target", tiny["target"].source, "--drafter", "ngram"]
    r = subprocess.run([*cmd, "--text", str(text), "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "(still working, " in ln]
    assert lines and all(ln.startswith("vocabbridge eval-drafter: ") for ln in lines), r.stderr
    assert any("loading models" in ln for ln in lines), r.stderr


def test_training_progress_speaks_between_updates(monkeypatch):
    from vocabbridge.training.progress import Progress

    monkeypatch.setenv(PROGRESS_ENV, "0.05")
    out = io.StringIO()
    with Progress(4, "data (prompts)", stream=out) as bar:
        time.sleep(0.3)  # a batch of generation: minutes on a CPU
        bar.update(2, batch=1)
    lines = out.getvalue().splitlines()
    assert any(ln.startswith("data (prompts): 0/4") and "(working)" in ln for ln in lines), lines
    assert lines[-1].startswith("data (prompts): 2/4") or "(working)" in lines[-1]
    with Progress(4, "quiet", stream=(quiet := io.StringIO()), quiet=True):
        time.sleep(0.2)
    assert quiet.getvalue() == ""


def test_bench_progress_speaks_while_a_server_starts_or_a_request_runs(monkeypatch, capsys):
    from vocabbridge.cli.bench_cmd import _Progress

    monkeypatch.setenv(PROGRESS_ENV, "0.05")
    with _Progress() as progress:
        progress.message("ngram: starting (vocabbridge serve)…")
        time.sleep(0.3)  # vLLM's start-up: minutes
        progress.config_started("ngram", 2)
        progress.request_started("ngram: measure code_01")
        time.sleep(0.3)  # one long request
    err = capsys.readouterr().err
    assert "still ngram: starting (vocabbridge serve) (" in err, err
    assert "[ngram 0/2] still running measure code_01 (" in err, err
