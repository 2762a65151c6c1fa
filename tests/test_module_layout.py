"""The packages' shape: imports run one way (the command line on top, nothing below it imports
from it) and no module imports itself back through others. Read from the source with ast, so a
new import that breaks the shape fails here, whatever it does at run time."""

from __future__ import annotations

import ast
import pathlib

from tests.conftest import REPO

# The entry points: the console script's module, the Python call, and the module that names the
# public transforms where they have always been imported from. They stand above the command line.
_ENTRY_POINTS = {"beam_jobs.__main__", "beam_jobs.api", "beam_jobs.pipeline"}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(package: str, *, top_level_only: bool) -> dict[str, set[str]]:
    """{module: the modules of ``package`` it imports}; with ``top_level_only``, only the imports
    that run when the module is imported (not those inside functions, which run later)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((REPO / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        nodes = tree.body if top_level_only else list(ast.walk(tree))
        if top_level_only:  # imports under `if TYPE_CHECKING:` never run
            nodes = [n for n in nodes if not (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n.test))]
        found: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[_module_name(path)] = {name for name in found if name == package or name.startswith(package + ".")}
    return graph


def test_nothing_below_the_command_line_imports_from_it():
    graph = _imports("beam_jobs", top_level_only=False)
    below = {
        module
        for module in graph
        if not module.startswith("beam_jobs.command_line") and module not in _ENTRY_POINTS and module != "beam_jobs"
    }
    upward = {
        module: sorted(name for name in graph[module] if name.startswith("beam_jobs.command_line")) for module in below
    }
    assert {module: names for module, names in upward.items() if names} == {}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle among the modules, each once (depth-first search)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for name in sorted(graph.get(module, ())):
            if name not in graph:
                continue
            if state.get(name) == 1:
                found.append(path[path.index(name) :] + [name])
            elif name not in state:
                visit(name)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


def test_no_import_circle_among_the_modules():
    for package in ("beam_jobs", "tfdata_readers"):
        # Imports inside functions count too: one that runs back up is a circle put off, not gone.
        graph = _imports(package, top_level_only=False)
        # A package's __init__ re-exports its modules; a module importing its own package's
        # __init__ is the re-export, not a circle of code.
        for names in graph.values():
            names.discard(package)
        assert _cycles(graph) == [], package


def test_the_design_table_names_every_module_in_its_folders_row():
    """docs/design.md's "where things live" table is how a newcomer finds a module: a module
    added, moved or renamed without its row fails here, not months later in a reader's hands."""
    import re  # pylint: disable=import-outside-toplevel

    rows: dict[str, set[str]] = {}
    for line in (REPO / "docs" / "design.md").read_text().splitlines():
        row = re.match(r"\| `([\w/]+/)` \|[^|]*\|(.*)\|$", line)
        if row:
            rows[row.group(1)] = set(re.findall(r"`([\w/.]+)`", row.group(2)))
    unnamed, gone = [], []
    for package in ("beam_jobs", "tfdata_readers"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name in ("__init__.py", "__main__.py"):
                continue
            relative = path.relative_to(REPO)
            folder = f"{relative.parent}/"
            if folder in rows:
                if path.name not in rows[folder]:
                    unnamed.append(str(relative))
            elif not (
                f"{relative.parent.parent}/" in rows
                and f"{relative.parent.name}/" in rows[f"{relative.parent.parent}/"]
            ):
                unnamed.append(f"{relative} (its folder has no row)")
    for folder, names in rows.items():
        gone += [f"{folder}{name}" for name in names if name.endswith(".py") and not (REPO / folder / name).exists()]
    assert not unnamed, f"modules docs/design.md's table does not name: {unnamed}"
    assert not gone, f"docs/design.md's table names modules that do not exist: {gone}"
