"""The house: lower floors never import higher ones (lazy imports inside functions included), and no
two modules import each other. CONTRIBUTING.md draws the same floors."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "vocabbridge"

# bottom to top; a package or module may import its own floor and the ones below
FLOORS = [
    {"errors", "util", "report", "presets", "prompts"},
    {"tokenizer"},
    {"diff", "mapping", "chat", "testing", "__init__"},  # __init__: the package's few re-exports
    {"bench"},  # a pure HTTP client of any server: never the engine, the server or vLLM
    {"heads"},  # what the engine runs beside the target
    {"spec"},
    {"engine"},
    {"training", "transplant"},  # what makes heads and drafters: runs the engine, never the bench
    {"server", "vllm"},
    {"launcher", "doctor"},  # starts configurations for the bench
    {"cli", "__main__"},
]
FLOOR = {name: i for i, names in enumerate(FLOORS) for name in names}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every vocabbridge module ``path`` imports, at the top or inside a function."""
    mod = _module(path)
    package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else (node.module or "")
            if target.startswith("vocabbridge"):
                path_of = ROOT.parent / target.replace(".", "/")
                modules = {a.name for a in node.names if (path_of / a.name).is_dir() or (path_of / f"{a.name}.py").is_file()}
                out.update(f"{target}.{name}" for name in modules)
                if len(modules) < len(node.names):  # names defined in the module itself
                    out.add(target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("vocabbridge"))
    return out


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _graph() -> dict[str, set[str]]:
    return {_module(p): _imports(p) for p in ROOT.rglob("*.py")}


def test_every_top_level_module_has_a_floor():
    tops = {_top(m) for m in _graph()}
    assert not tops - set(FLOOR), f"give these a floor in FLOORS: {sorted(tops - set(FLOOR))}"


def test_no_import_runs_back_up_a_floor():
    upward = sorted(
        f"{m} ({_top(m)}, floor {FLOOR[_top(m)]}) imports {t} ({_top(t)}, floor {FLOOR[_top(t)]})"
        for m, targets in _graph().items()
        for t in targets
        if FLOOR[_top(t)] > FLOOR[_top(m)]
    )
    assert not upward, "\n".join(upward)


def test_no_two_modules_import_each_other():
    graph = _graph()
    circles = sorted({tuple(sorted((a, b))) for a, ts in graph.items() for b in ts if b != a and a in graph.get(b, ())})
    assert not circles, circles
