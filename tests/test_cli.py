"""The CLI as a user meets it: exact exit codes, one-line errors, --debug tracebacks."""

import json

from click.testing import CliRunner

from vocabbridge.cli import main


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_diff_json_is_machine_readable(tok_dirs, facts):
    r = run("diff", tok_dirs["base"], tok_dirs["extended"], "--json")
    assert r.exit_code == 0, r.output
    j = json.loads(r.output)
    assert j["vocab"]["only_b"] == facts.only_b and j["vocab"]["identical_prefix"] == facts.identical_prefix


def test_diff_table_shows_the_sections(tok_dirs):
    r = run("diff", tok_dirs["base"], tok_dirs["extended"], "--examples", "3")
    assert r.exit_code == 0, r.output
    for title in ("Vocabulary", "Merges", "Special tokens by role", "Multi-word tokens", "Base tokens by script"):
        assert title in r.output
    assert "moved+renamed" in r.output


def test_diff_markdown_to_a_file(tok_dirs, tmp_path):
    out = tmp_path / "d.md"
    r = run("diff", tok_dirs["base"], tok_dirs["extended"], "--format", "markdown", "-o", out)
    assert r.exit_code == 0, r.output
    assert out.read_text().startswith("## vocabbridge diff:")


def test_diff_text_option(tok_dirs, tmp_path):
    t = tmp_path / "chat.txt"
    t.write_text("I'll give them the results. 안녕하세요!", encoding="utf-8")
    r = run("diff", tok_dirs["base"], tok_dirs["extended"], "--text", t, "--json")
    (row,) = json.loads(r.output)["texts"]
    assert row["file"] == str(t) and row["roundtrip_a"] is True


def test_missing_path_is_one_line_without_traceback(tmp_path):
    r = run("diff", tmp_path / "missing", tmp_path / "also-missing")
    assert r.exit_code == 1
    assert r.output.startswith("Error: ") and "no such file or folder" in r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_debug_shows_the_traceback(tmp_path):
    r = CliRunner().invoke(main, ["--debug", "diff", str(tmp_path / "missing"), str(tmp_path / "x")])
    assert r.exit_code == 1
    from vocabbridge.errors import TokenizerSourceError

    assert isinstance(r.exception, TokenizerSourceError)


def test_corrupt_json_error_names_position(tmp_path, tok_dirs):
    p = tmp_path / "tokenizer.json"
    p.write_text('{"model": {"type": "BPE", "vocab": {"a": 0,}}}')
    r = run("diff", p, tok_dirs["base"])
    assert r.exit_code == 1 and "line 1, column" in r.output


def test_version():
    r = run("--version")
    assert r.exit_code == 0 and "vocabbridge" in r.output
