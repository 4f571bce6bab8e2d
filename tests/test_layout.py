"""The architecture's import direction, checked on the source: topologies <- parts <-
kit <- designs <- run; registry and errors below all; telemetry <- analysis; nothing in
mpirl/ imports analysis/; no design imports another; no import cycle anywhere.

Every import counts, also one inside a function (the lazy imports that keep torch out
of start-up still tie the modules together)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("mpirl", "topologies", "analysis")

#: package -> the project's packages it may import (besides itself).  The lower layers
#: first; each entry names the layers below it that it uses.
ALLOWED = {
    "topologies": set(),
    "mpirl.registry": set(),                           # the designs' rows: read by all
    "mpirl.errors": set(),                             # ConfigError: raised by all
    "mpirl.launch": {"mpirl.resilience.sentinel"},     # abort_job silences the sentinel
    "mpirl.config": {"topologies", "mpirl.registry",   # validation looks up registries,
                     "mpirl.errors", "mpirl.parts.envs",
                     "mpirl.parts.learner.custom",      # --model's check at start,
                     "mpirl.resilience.faults",         # --fail's syntax,
                     "mpirl.resilience.checkpoint",     # and --resume's files,
                     "mpirl.resilience.elastic",        # an elastic attempt's directory,
                     "mpirl.resilience.schedule"},      # --replay-schedule's
    "mpirl.parts": {"topologies"},
    "mpirl.telemetry": {"mpirl", "mpirl.launch", "mpirl.registry"},   # mpirl: __version__
    "mpirl.resilience": {"topologies", "mpirl.registry", "mpirl.errors", "mpirl.launch"},
    # the design kit: what several designs share (mpirl/kit/__init__.py)
    "mpirl.kit": {"topologies", "mpirl.registry", "mpirl.errors", "mpirl.config",
                  "mpirl.launch", "mpirl.parts", "mpirl.resilience", "mpirl.telemetry"},
    "mpirl.designs": {"topologies", "mpirl.registry", "mpirl.errors", "mpirl.config",
                      "mpirl.launch",
                      "mpirl.kit", "mpirl.parts", "mpirl.resilience", "mpirl.telemetry"},
    # the elastic driver: mpiexec's path; where the ranks keep their commits
    "mpirl.elastic": {"mpirl.launch", "mpirl.resilience.elastic"},
    "mpirl.cluster": {"mpirl.launch", "mpirl.elastic"},  # mpiexec's path, MPI settings
    "mpirl.study": {"topologies", "mpirl.config", "mpirl.launch", "mpirl.resilience",
                    "mpirl.telemetry", "mpirl.cluster"},   # sweep --launcher cluster
    "mpirl.run": {"mpirl.errors", "mpirl.config", "mpirl.launch", "mpirl.designs",
                  "mpirl.resilience"},
    # mpirl.train: checks a configuration here, launches mpirl.run, reads its logs
    "mpirl.api": {"mpirl.errors", "mpirl.config", "mpirl.launch", "mpirl.telemetry"},
    "analysis": {"mpirl.telemetry", "mpirl.study.figures",    # the schema's reader, palette
                 # analysis.cluster: the cost model's and the simulator's predictions
                 # drawn beside the measurements, and the link cap's units
                 "mpirl.study.costmodel", "mpirl.study.simulate", "mpirl.cluster.net"},
}
#: the entry points kept at their old paths: each imports its tool in mpirl.study
SHIMS = {f"mpirl.{name}" for name in ("bench", "soak", "costmodel", "simulate", "sweep")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Every module of ours that ``path`` imports, relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:      # a submodule, or a name from the module
                sub = f"{base}.{alias.name}"
                found.add(sub if existing(sub) else base)
    return {m for m in found if m.split(".")[0] in OURS and existing(m)}


def layer(module: str) -> str | None:
    """The most specific entry of :data:`ALLOWED` that ``module`` belongs to."""
    best = None
    for key in ALLOWED:
        if module == key or module.startswith(key + "."):
            best = key if best is None or len(key) > len(best) else best
    return best


def existing(module: str) -> bool:
    base = ROOT.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


SOURCES = sorted(p for top in OURS for p in (ROOT / top).rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_one_way(path):
    name = module_name(path)
    if name in SHIMS:
        assert imports(path) == {f"mpirl.study.{name.split('.')[1]}"}
        return
    if name == "mpirl":    # the package itself: the Python API and mpirl's env registrations
        assert imports(path) <= {"mpirl.api", "mpirl.errors", "mpirl.parts.envs"}
        return
    mine = layer(name)
    assert mine is not None, f"{name} belongs to no layer of the architecture: add it"
    for target in imports(path):
        theirs = layer(target)
        if theirs == mine or theirs is None and target == "mpirl":
            continue
        allowed = ALLOWED[mine]
        assert theirs in allowed or any(target == a or target.startswith(a + ".")
                                        for a in allowed), \
            f"{name} imports {target} ({theirs}): {mine} may import only {sorted(allowed)}"


def test_nothing_in_mpirl_imports_analysis():
    offenders = [module_name(p) for p in SOURCES if module_name(p).startswith("mpirl")
                 and any(t.startswith("analysis") for t in imports(p))]
    assert not offenders


def test_every_package_has_a_layer():
    packages = {module_name(p) for p in SOURCES if p.name == "__init__.py"}
    assert all(layer(p) is not None or p == "mpirl" for p in packages), \
        [p for p in packages if layer(p) is None]


def modules_in_cycles() -> list[str]:
    """The modules that reach themselves in the import graph (packages as their
    ``__init__``): each lies on an import cycle."""
    graph = {module_name(p): imports(p) for p in SOURCES}

    def reachable(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            fresh = graph.get(todo.pop(), set()) - seen
            seen |= fresh
            todo += fresh
        return seen

    return sorted(m for m in graph if m in reachable(m))


def test_no_module_imports_a_module_that_imports_it_back():
    # every import points down, inside a layer too: a cycle (even through a lazy import
    # inside a function) means two modules that cannot be understood apart
    assert not modules_in_cycles()


def test_no_design_imports_another_design():
    # a design is one module plus one registry row: what two designs share is in the kit
    designs = {module_name(p) for p in (ROOT / "mpirl" / "designs").glob("*.py")
               if p.name != "__init__.py"}
    for name in sorted(designs):
        path = ROOT.joinpath(*name.split(".")).with_suffix(".py")
        assert not imports(path) & designs, f"{name} imports {sorted(imports(path) & designs)}"


def test_every_registered_design_runs_a_function_of_its_module():
    from mpirl import registry

    for design in registry.DESIGNS.values():
        module, _, function = design.entry.partition(":")
        path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
        assert module.startswith("mpirl.designs.") and path.is_file(), design.entry
        assert f"def {function}(" in path.read_text(), design.entry


def _statements(function: ast.FunctionDef, source: list[str]) -> int:
    """Lines of ``function``'s body that hold code: no docstring, blank line or comment."""
    body = function.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    lines = source[body[0].lineno - 1:function.end_lineno]
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def test_every_run_function_reads_as_its_design():
    # a design's run function places the roles and ends the run; the rest is in its
    # roles and the kit (about 20 lines, docs/architecture.md)
    for path in sorted([*(ROOT / "mpirl" / "designs").glob("*.py"),
                        *(ROOT / "mpirl" / "kit").glob("*.py")]):
        source = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(source))):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("run_"):
                assert _statements(node, source) <= 22, f"{path.name}:{node.name}"


def test_no_design_module_or_class_grows_past_its_bound():
    # about 350 lines a design module, about 30 attributes a class
    for path in sorted((ROOT / "mpirl" / "designs").glob("*.py")):
        assert len(path.read_text().splitlines()) <= 370, path.name
    for path in sorted([*(ROOT / "mpirl" / "designs").glob("*.py"),
                        *(ROOT / "mpirl" / "kit").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                attributes = {t.attr for n in ast.walk(node) if isinstance(n, ast.Assign)
                              for t in n.targets for t in ast.walk(t)
                              if isinstance(t, ast.Attribute)
                              and isinstance(t.value, ast.Name) and t.value.id == "self"}
                assert len(attributes) <= 30, f"{path.name}:{node.name} {len(attributes)}"
