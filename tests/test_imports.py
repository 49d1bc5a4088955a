"""The import graph of `policyopt`, built from the source with `ast`: every import counts
(top level, inside functions, under `if TYPE_CHECKING:`). No module imports itself back
through others (no cycle), and imports flow down DESIGN.md's layers: cli, bench, pipelines and
recipes -> envs (the single-method environments) -> train -> config -> store -> methods ->
tasks -> rewards -> rollout -> models -> core. Nothing in the library imports an environment:
`policyopt.tasks.environments` names them as strings, imported on first use. Benchmark code
(`policyopt.bench`) is imported by the cli only. The studies (`studies/`, not installed) may
import anything; nothing imports them."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "policyopt"
# Rank of each top-level subpackage: an import may go to an equal or higher rank only.
LAYERS = {
    "cli": 0,
    "bench": 0,
    "pipelines": 0,
    "recipes": 0,
    "envs": 1,
    "train": 2,
    "config": 3,
    "store": 4,
    "methods": 5,
    "tasks": 6,
    "rewards": 7,
    "rollout": 8,
    "models": 9,
    "core": 10,
}
# Within rank 0 imports go one way: cli -> pipelines -> recipes, cli -> bench.
SAME_RANK_ORDER = [
    ("cli", "recipes"),
    ("cli", "bench"),
    ("cli", "pipelines"),
    ("pipelines", "recipes"),
]
# The only packages that may import benchmark code.
BENCH_USERS = {"cli", "bench"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in (SRC / PACKAGE).rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The policyopt modules `name` imports anywhere in its file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from its package
                pkg = name.split(".") if is_package else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            # `from a import b`: the module a.b if it is one, else a
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(name, path, known) for name, path in found.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def upward(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in sorted(g.items()):
        a = layer(src)
        for dst in sorted(targets):
            b = layer(dst)
            if a is None or b is None or a == b:
                continue
            if LAYERS[b] < LAYERS[a] or (b, a) in SAME_RANK_ORDER:
                bad.append(f"{src} -> {dst}")
    return bad


def bench_imports(g: dict[str, set[str]]) -> list[str]:
    """Imports of `policyopt.bench` from outside the cli (library code never runs a bench)."""
    return [
        f"{src} -> {dst}"
        for src, targets in sorted(g.items())
        for dst in sorted(targets)
        if layer(dst) == "bench" and layer(src) not in BENCH_USERS
    ]


def package_cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Cycles between top-level subpackages (e.g. rewards <-> tasks)."""
    pkg: dict[str, set[str]] = {p: set() for p in LAYERS}
    for src, targets in g.items():
        a = layer(src)
        for dst in targets:
            b = layer(dst)
            if a is not None and b is not None and a != b:
                pkg[a].add(b)
    return cycles(pkg)


def test_the_graph_is_read():
    g = graph()
    assert "policyopt.train.step" in g
    assert "policyopt.train.update" in g["policyopt.train.step"]


def test_no_module_cycle():
    assert cycles(graph()) == []


def test_no_package_cycle():
    assert package_cycles(graph()) == []


def test_imports_flow_down_the_layers():
    assert upward(graph()) == []


def test_only_the_cli_imports_bench_code():
    assert bench_imports(graph()) == []


def test_the_checks_can_fail():
    g = {"policyopt.core.a": {"policyopt.train.b"}, "policyopt.train.b": {"policyopt.core.a"}}
    assert cycles(g) == [["policyopt.core.a", "policyopt.train.b"]]
    assert upward(g) == ["policyopt.core.a -> policyopt.train.b"]
    assert package_cycles(g) == [["core", "train"]]
    assert upward({"policyopt.tasks.a": {"policyopt.envs.b"}}) == [
        "policyopt.tasks.a -> policyopt.envs.b"
    ]
    g = {"policyopt.models.x": {"policyopt.bench.y"}, "policyopt.cli.z": {"policyopt.bench.y"}}
    g["policyopt.recipes.w"] = {"policyopt.bench.y"}
    assert bench_imports(g) == [
        "policyopt.models.x -> policyopt.bench.y",
        "policyopt.recipes.w -> policyopt.bench.y",
    ]
