"""The floor plan holds: imports flow one way between packages, and the cut stays honest.

Read from each file's syntax tree, not by importing it: every ``import`` and ``from ... import``
counts, at module level, inside functions and under ``TYPE_CHECKING`` alike, with relative
imports resolved against the importing module. Four rules, over ``server/``, ``clients/``,
``models/`` and ``livefit/``:

1. A package imports only packages of lower layers (``LAYERS``, bottom first); packages that
   share a layer do not import each other; so no cycle between packages can form.
2. No module imports a private name (``_x``) from another module.
3. No module is only re-exports, and ``__all__`` lists only what its module defines.
4. Every livefit logger is named after its own module (``logging.getLogger(__name__)``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# Where each top-level package of the repository is installed.
SOURCES = {
    "server": "livefit.server",
    "clients": "livefit.clients",
    "models": "livefit.models",
    "livefit": "livefit",
}
# Bottom first. A package may import any package of a lower layer; packages that share a layer
# are independent of each other. The way a sample, a request and a snapshot travel reads upwards.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("livefit.models",),  # networks; nothing of livefit
    ("livefit.server.base",),  # generic parts that know nothing of livefit's data
    ("livefit.server.wire", "livefit.server.config"),  # formats; settings
    ("livefit.server.mqtt", "livefit.server.storage"),  # the one paho wrapper; what is on disk
    ("livefit.server.labels",),  # the delayed-label join and the prediction recorder
    ("livefit.server.ingest",),  # MQTT messages in, into the log and the sample queues
    ("livefit.server.train",),  # sample queues -> trainers -> snapshots
    ("livefit.server.weights",),  # snapshots -> the signed weight stream, and back
    ("livefit.server.serve",),  # snapshots -> batched predictions
    ("livefit.server.http",),  # the FastAPI app
    ("livefit.server.runtime", "livefit.clients"),  # processes wired; other processes' code
    ("livefit",),  # the commands: cli, demo and the tooling they run
)
# The root module holds the version only; every package may read it.
VERSION_ROOT = "livefit"


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the module imported from (for ``from m import n`` where n is a module: m.n)
    name: str | None  # the name taken from ``target`` (None: the module itself)
    line: int


def modules() -> dict[str, Path]:
    """Every module of the four source trees, by its installed dotted name."""
    found = {}
    for folder, package in SOURCES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


MODULES = modules()


def imports(module: str, path: Path) -> Iterator[Import]:
    """Every livefit import in ``module``, wherever it stands in the file."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "livefit":
                    yield Import(module, alias.name, None, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "livefit":
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in MODULES:
                    yield Import(module, submodule, None, node.lineno)
                else:
                    yield Import(module, source, alias.name, node.lineno)


ALL_IMPORTS = [found for module, path in MODULES.items() for found in imports(module, path)]


def layer_of(module: str) -> tuple[int, str]:
    """The layer index and package of ``module`` (the longest listed package it is inside)."""
    best: tuple[int, str] | None = None
    for index, layer in enumerate(LAYERS):
        for package in layer:
            inside = module == package or module.startswith(package + ".")
            if inside and (best is None or len(package) > len(best[1])):
                best = (index, package)
    if best is None:
        raise AssertionError(f"{module} is in no layer of LAYERS")
    return best


def test_every_module_sits_in_a_listed_package() -> None:
    """A new package is placed in LAYERS on purpose; nothing sits loose in ``server/``."""
    for module in MODULES:
        if module in (VERSION_ROOT, "livefit.server"):
            continue
        _, package = layer_of(module)
        loose = package == "livefit" and module.count(".") > 1
        assert not loose, f"{module}: a module outside the packages of LAYERS"


def test_the_version_root_holds_only_the_version() -> None:
    tree = ast.parse(MODULES[VERSION_ROOT].read_text())
    body = [node for node in tree.body if not _is_docstring(node)]
    names = [target.id for node in body if isinstance(node, ast.Assign) for target in node.targets
             if isinstance(target, ast.Name)]  # fmt: skip
    assert len(body) == 1 and names == ["__version__"], "livefit/__init__.py: the version only"


def test_imports_flow_down_the_layers() -> None:
    wrong = []
    for found in ALL_IMPORTS:
        if found.target == VERSION_ROOT:
            continue
        (low, low_package), (high, high_package) = layer_of(found.target), layer_of(found.module)
        if low_package == high_package:
            continue
        if low > high:
            wrong.append(f"{found.module}:{found.line} imports {found.target} (up, {low_package})")
        elif low == high:
            wrong.append(f"{found.module}:{found.line} imports {found.target} (same layer)")
    assert not wrong, "\n".join(wrong)


def test_no_cycle_between_packages() -> None:
    """Implied by the layers; checked on its own so that a wrong LAYERS cannot hide a cycle."""
    edges: dict[str, set[str]] = {}
    for found in ALL_IMPORTS:
        if found.target == VERSION_ROOT:
            continue
        source, target = layer_of(found.module)[1], layer_of(found.target)[1]
        if source != target:
            edges.setdefault(source, set()).add(target)
    state: dict[str, str] = {}

    def visit(package: str, path: list[str]) -> None:
        state[package] = "open"
        for target in sorted(edges.get(package, ())):
            if state.get(target) == "open":
                raise AssertionError(" -> ".join([*path, package, target]))
            if target not in state:
                visit(target, [*path, package])
        state[package] = "done"

    for package in sorted(edges):
        if package not in state:
            visit(package, [])


def test_the_layer_check_sees_relative_and_function_level_imports(tmp_path: Path) -> None:
    """The check's own attack: an upward import hidden in a function, written relatively."""
    path = tmp_path / "wal.py"
    path.write_text("def f():\n    from ..runtime.learner import LearnerRuntime\n")
    (found,) = imports("livefit.server.storage.wal", path)
    assert found.target == "livefit.server.runtime.learner" and found.name == "LearnerRuntime"
    assert layer_of(found.target)[0] > layer_of(found.module)[0]


def test_no_private_name_is_imported_from_another_module() -> None:
    found: dict[str, set[str]] = {}
    for each in ALL_IMPORTS:
        if each.name is None or not each.name.startswith("_") or each.name.startswith("__"):
            continue
        if each.target != each.module:
            found.setdefault(each.module, set()).add(each.name)
    assert not found, f"private names imported across modules: {found}"


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


def _defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_no_module_only_re_exports() -> None:
    shims, exported = [], []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        rest = [
            node
            for node in tree.body
            if not _is_docstring(node) and not isinstance(node, ast.Import | ast.ImportFrom)
            and not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
            and not (isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__")
        ]  # fmt: skip
        has_imports = any(isinstance(node, ast.Import | ast.ImportFrom) for node in tree.body)
        if has_imports and not rest and not module.endswith("__main__"):
            shims.append(module)
        for node in tree.body:
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__":
                listed = ast.literal_eval(node.value)
                exported += [f"{module}.{n}" for n in listed if n not in _defined(tree)]
    assert not shims, f"modules that only import: {shims}"
    assert not exported, f"__all__ names defined elsewhere (import them from there): {exported}"


def test_every_logger_is_named_after_its_module() -> None:
    """A livefit logger is ``getLogger(__name__)``; other libraries' loggers (configured by
    name) and the root logger are not livefit's."""
    wrong = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        top_level = {id(node.value) for node in tree.body if isinstance(node, ast.Assign)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("getLogger")):
                continue
            if not node.args or (
                isinstance(node.args[0], ast.Name) and node.args[0].id == "__name__"
            ):
                continue
            arg = node.args[0]
            ours = isinstance(arg, ast.Constant) and str(arg.value).startswith("livefit")
            if ours or id(node) in top_level:
                wrong.append(f"{module}:{node.lineno}: getLogger({ast.unparse(arg)})")
    assert not wrong, "\n".join(wrong)
