"""rlvr's import structure: no cycle between its packages and no import of another module's
private names. Parsed from the source (every ``import``, also inside functions), not imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rlvr"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str:
    """The package a module belongs to: ``rlvr.train.grpo`` -> ``train``; a top-level module
    (``rlvr.rewards``) is a unit of its own; ``rlvr`` itself is ``rlvr``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports(path: Path) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every rlvr import in ``path``; an
    ``import rlvr.x.y as z`` / ``from rlvr.x import y`` binding is followed into ``z._name`` /
    ``y._name`` attribute accesses (reported as that name)."""
    tree = ast.parse(path.read_text(), str(path))
    out, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "rlvr" \
                and node.level == 0:
            for a in node.names:
                out.append((node.module, a.name, node.lineno))
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "rlvr":
                    out.append((a.name, None, node.lineno))
                    if a.asname:
                        aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            out.append((aliases[node.value.id], node.attr, node.lineno))
    return out


def graph() -> tuple[dict[str, set[str]], list[str]]:
    edges: dict[str, set[str]] = {}
    private: list[str] = []
    for path in sorted(ROOT.rglob("*.py")):
        src = module_name(path)
        for target, name, line in imports(path):
            where = f"{path.relative_to(ROOT.parent)}:{line}"
            if name and name.startswith("_") and not name.startswith("__"):
                private.append(f"{where} imports {target}.{name}")
            if src == "rlvr" or target == "rlvr":
                continue  # the package's own __init__, or the top-level package
            if unit(src) != unit(target):
                edges.setdefault(unit(src), set()).add(unit(target))
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one package (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_packages():
    edges, _ = graph()
    assert "train" in edges and "rollout" in edges["train"]  # the parser sees the real imports
    assert cycles(edges) == []


def test_no_module_imports_another_modules_private_names():
    _, private = graph()
    assert private == []


def test_the_checks_catch_what_they_claim(tmp_path):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    sample = tmp_path / "m.py"
    sample.write_text("from rlvr.x import _hidden, shown\nimport rlvr.y as y\n\ndef f():\n    return y._secret()\n")
    found = imports(sample)
    assert ("rlvr.x", "_hidden", 1) in found and ("rlvr.y", "_secret", 5) in found
    assert ("rlvr.x", "shown", 1) in found
