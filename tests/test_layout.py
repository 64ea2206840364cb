"""The folders are the pipeline: a stage imports only from the stages before it, and nothing imports in a circle.

Every import statement is read (lazy imports inside functions too), so a command that would reach into a later
stage, or two modules that need each other, fail here rather than in a reader's head.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "src" / "expertcache"

#: Stage of each top-level folder or module, in pipeline order (docs/design.md §1). Equal ranks may import
#: each other's modules only where no cycle results (checked below).
RANK = {
    "": 0, "errors": 0, "storage": 0, "jsonl": 0, "_jit": 0, "_bits": 0, "_notes": 0, "_threads": 0, "frames": 0,
    "trace": 1, "probes": 1,
    "collect": 2, "events": 2, "examples": 2,
    "replay": 3,
    "analysis": 4, "timing": 4, "execute": 4, "nextuse": 4, "prefetch": 4, "routers": 4, "audit": 4, "plot": 4, "conformance": 4,
    "experiment": 5, "report": 5,
    "cli": 6, "__main__": 6,
}
#: The order the issue of this layout names; each must rank strictly below the next.
PIPELINE = ("trace", "events", "replay", "analysis", "experiment", "cli")


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        if "data" in path.relative_to(ROOT).parts:
            continue
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports (``from . import x`` of a submodule names the submodule)."""
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "expertcache":
                    continue
                targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "expertcache"]
            for target in targets:
                while target not in mods and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    out.add(target)
        edges[name] = out
    return edges


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_every_module_belongs_to_a_known_stage():
    unknown = sorted({_stage(m) for m in _modules()} - set(RANK))
    assert not unknown, f"add these folders/modules to RANK in pipeline order: {unknown}"


def test_the_pipeline_order_is_strict():
    ranks = [RANK[s] for s in PIPELINE]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)


def test_no_module_imports_from_a_later_stage():
    edges = _imports(_modules())
    upward = sorted(f"{m} imports {t}" for m, out in edges.items() for t in out
                    if t != "expertcache" and RANK[_stage(t)] > RANK[_stage(m)])
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    cycles = _cycles(_imports(_modules()))
    assert not cycles, cycles


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}}, [["a", "b", "c"]]),
])
def test_the_cycle_finder_finds_hand_made_cycles(edges, expected):
    assert _cycles(edges) == expected


def test_a_lazy_upward_import_is_seen(tmp_path, monkeypatch):
    """The reader sees an import inside a function body (the kind that hid the affinity experiment in rotation)."""
    pkg = tmp_path / "expertcache"
    (pkg / "events").mkdir(parents=True)
    (pkg / "replay").mkdir()
    for p in (pkg / "__init__.py", pkg / "events" / "__init__.py", pkg / "replay" / "__init__.py"):
        p.write_text("")
    (pkg / "events" / "x.py").write_text("def f():\n    from ..replay import replay\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", pkg)
    edges = _imports(_modules())
    assert edges["expertcache.events.x"] == {"expertcache.replay"}


def test_package_faces_keep_the_public_imports():
    from expertcache.events import EventStream, build_events  # noqa: F401
    from expertcache.replay import ReplayConfig, replay  # noqa: F401
    from expertcache.trace import RoutingTrace  # noqa: F401


def test_every_package_says_what_it_is_for():
    missing = [str(p.relative_to(ROOT)) for p in ROOT.rglob("__init__.py")
               if "data" not in p.relative_to(ROOT).parts and ast.get_docstring(ast.parse(p.read_text())) is None]
    assert not missing, missing
