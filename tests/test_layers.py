"""The layers hold: the import graph read from the source (every import, function-local ones too).

`pose_core` (algorithms) knows no Spark, pandas, configuration, adapters, jobs, table schemas or
environment; `udfs` (adapters) never reaches up to `jobs`; the `jobs` modules import each other
without cycles. See docs/ARCHITECTURE.md, "Layers".
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE_FORBIDDEN = ("conf", "udfs", "jobs", "schemas", "pyspark", "pandas", "pyarrow", "delta")
ADAPTER_FORBIDDEN = ("jobs",)


def _modules(package: str) -> Iterator[tuple[str, ast.Module]]:
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _imports(module: str, tree: ast.Module) -> set[str]:
    """Every module name `tree` imports, absolute; `from a import b` counts as `a` and `a.b`."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: -node.level]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def _top(name: str) -> str:
    return name.split(".", maxsplit=1)[0]


def _environment_reads(tree: ast.Module) -> list[int]:
    """Lines that read the process environment (`os.environ`, `os.getenv`)."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
            and node.attr in ("environ", "getenv", "putenv")]


def test_core_imports_no_spark_config_adapters_or_environment() -> None:
    problems = []
    for name, tree in _modules("pose_core"):
        bad = sorted({_top(i) for i in _imports(name, tree)} & set(CORE_FORBIDDEN))
        problems += [f"{name} imports {b}" for b in bad]
        problems += [f"{name}:{line} reads the environment" for line in _environment_reads(tree)]
    assert not problems, "\n".join(problems)


def test_adapters_do_not_import_jobs() -> None:
    problems = [f"{name} imports {i}" for name, tree in _modules("udfs")
                for i in sorted(_imports(name, tree)) if _top(i) in ADAPTER_FORBIDDEN]
    assert not problems, "\n".join(problems)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as its nodes in order, or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_jobs_modules_form_no_cycle() -> None:
    modules = dict(_modules("jobs"))
    # the package itself ("jobs", its __init__) is left out: it is not a module one imports for code
    graph = {name: {i for i in _imports(name, tree) if i in modules and i not in (name, "jobs")}
             for name, tree in modules.items() if name != "jobs"}
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
])
def test_cycle_finder(graph: dict[str, set[str]], expected: list[str] | None) -> None:
    assert _cycle(graph) == expected
