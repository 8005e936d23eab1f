"""Imports go one way, and in no circle: every module of the package imports only from its own layer or lower
ones, and no chain of imports between the package's modules leads back to where it started.

Layers, lowest first: `kernels` (octopus_audio.kernels) < core (every other module of octopus_audio) <
`aar_patch` (octopus_audio.aar_patch) < the applications and adapters, side by side (none imports another):
`eval` (octopus_audio.eval), `apps` (octopus_audio.apps: the bench and the probe) and `hf` (octopus_audio.hf,
the transformers cache). Above them all is the application entry: the `octopus-audio` dispatcher
(`octopus_audio.cli`, and `octopus_audio.__main__` that runs it), which loads each subcommand's module by name
from its `COMMANDS` table, so it may name modules of any layer; no module may import it. Read with `ast`
(nothing is imported): `import x`, `from x import y` (the target is `x.y`, so `from octopus_audio import eval`
is an import of the eval layer), relative imports resolved against the module's package, at module level or
inside functions, `importlib.import_module("...")` / `__import__("...")` with a literal name, and in a module
that calls either with a computed name, every string literal that is a dotted `octopus_audio.` name (the
tables such a call reads, like the dispatcher's or the package's lazy exports). The files are found where the
installed package has each layer (octopus_audio/kernels/, octopus_audio/aar_patch/, octopus_audio/eval/,
octopus_audio/apps/, octopus_audio/hf/).

Circles: every import above counts, at module level or inside a function (an import deferred into a function
still makes the two modules depend on each other), as an edge from the importing file to the file of the
module it names: the longest dotted prefix of the imported name that is a module of the package, so
`from octopus_audio.kernels import attention` reaches the package's `__init__` and `from . import scalar` the
module `scalar`. The parent packages Python initialises on the way to a submodule are not edges (every
submodule would otherwise close a circle with its package's `__init__`)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "octopus_audio"
RANK = {"kernels": 0, "core": 1, "aar_patch": 2, "eval": 3, "apps": 3, "hf": 3, "entry": 4}  # lowest first
LAYER_PACKAGES = {"octopus_audio.kernels": "kernels", "octopus_audio.aar_patch": "aar_patch",
                  "octopus_audio.eval": "eval", "octopus_audio.apps": "apps", "octopus_audio.hf": "hf",
                  "octopus_audio": "core"}
ENTRY = ("octopus_audio.cli", "octopus_audio.__main__")  # the dispatcher: above every layer


def layer_of(module: str) -> str | None:
    """The layer of a dotted name inside the package (a module, or a name inside one); None outside it."""
    if any(module == e or module.startswith(e + ".") for e in ENTRY):
        return "entry"
    for package in sorted(LAYER_PACKAGES, key=len, reverse=True):
        if module == package or module.startswith(package + "."):
            return LAYER_PACKAGES[package]
    return None


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a `from ... import` reads from (relative levels against the module's package)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if node.level - 1 > len(parts) - 1:
        raise ValueError(f"{module}: relative import beyond the top-level package (level {node.level})")
    base = parts[:len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_dynamic_import(node: ast.Call) -> bool:
    f = node.func
    return ((isinstance(f, ast.Attribute) and f.attr == "import_module")
            or (isinstance(f, ast.Name) and f.id in ("import_module", "__import__")))


def imports_of(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """`(line, imported dotted name)` of every import in `source`, the source of `module`."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    computed = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, module, is_package)
            found += [(node.lineno, base if alias.name == "*" else f"{base}.{alias.name}")
                      for alias in node.names]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append((node.lineno, arg.value))
            else:
                computed = True
    if computed:  # the names such a call can receive: the module's own tables of module names
        found += [(node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value.startswith(PACKAGE + ".") and node.value.replace(".", "").replace("_", "")
                  .isalnum()]
    return sorted(found)


def upward_imports(source: str, module: str, path: str, is_package: bool = False) -> list[str]:
    """One line per import of `module` (in file `path`) that reaches a higher layer than its own, or a layer
    of the same rank beside it (eval and apps)."""
    own = layer_of(module)
    problems = []
    for line, target in imports_of(source, module, is_package):
        layer = layer_of(target)
        if layer is not None and (RANK[layer] > RANK[own] or (RANK[layer] == RANK[own] and layer != own)):
            problems.append(f"{path}:{line}: {module} ({own}) imports {target} ({layer})")
    return problems


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, dict[str, int]]:
    """module -> {module it imports: the first line that does} over `sources` (module -> (source, is
    package)), each import resolved to the file it loads as the module docstring says."""
    graph: dict[str, dict[str, int]] = {}
    for module, (source, is_package) in sources.items():
        edges = graph.setdefault(module, {})
        for line, target in imports_of(source, module, is_package):
            parts = target.split(".")
            found = next((".".join(parts[:i]) for i in range(len(parts), 0, -1)
                          if ".".join(parts[:i]) in sources), None)
            if found is not None and found != module:
                edges.setdefault(found, line)
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The circles of an import graph: each strongly connected group of two or more modules, as one cycle
    through it (module, the module it imports, ..., back to the first), smallest name first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for group in groups:  # one cycle through the group: a shortest path back to its first module
        start = min(group)
        paths = {start: [start]}
        frontier = [start]
        while frontier and start not in [w for v in frontier for w in graph[v]]:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w in group and w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
            frontier = nxt
        last = next(v for v in frontier if start in graph[v])
        out.append(paths[last] + [start])
    return sorted(out)


def package_modules() -> list[tuple[Path, str, bool]]:
    """`(file, module name, is package)` of every module of the package, found through the installed
    package's own mapping of each layer's folder."""
    out, seen = [], set()
    for package in LAYER_PACKAGES:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, f"{package} is not importable"
        (folder,) = [Path(p).resolve() for p in spec.submodule_search_locations]
        for path in sorted(folder.rglob("*.py")):
            if path in seen or any(part.startswith(".") for part in path.relative_to(folder).parts):
                continue
            rel = path.relative_to(folder).with_suffix("").parts
            is_package = rel[-1] == "__init__"
            name = ".".join((package, *(rel[:-1] if is_package else rel)))
            if layer_of(name) != LAYER_PACKAGES[package] and name not in ENTRY:
                continue  # a folder of another layer inside this one: walked as that layer
            seen.add(path)
            out.append((path, name, is_package))
    return out


MODULES = package_modules()


def test_the_walk_finds_every_layer_in_its_real_folder():
    by_name = {name: path for path, name, _ in MODULES}
    for name, rel in (("octopus_audio.kernels.impls.flash", "octopus_audio/kernels/impls/flash.py"),
                      ("octopus_audio.apps.bench", "octopus_audio/apps/bench.py"),
                      ("octopus_audio.aar_patch.patch", "octopus_audio/aar_patch/patch.py"),
                      ("octopus_audio.eval.runner", "octopus_audio/eval/runner.py"),
                      ("octopus_audio.codecs.registry", "octopus_audio/codecs/registry.py"),
                      ("octopus_audio.cache.layer", "octopus_audio/cache/layer.py"),
                      ("octopus_audio.cli", "octopus_audio/cli.py")):
        assert by_name.get(name) == (REPO / rel).resolve(), f"{name} not found at {rel}"
    walked = {path for path, _, _ in MODULES}
    on_disk = {p.resolve() for p in (REPO / PACKAGE).rglob("*.py")}
    assert walked == on_disk, f"not walked: {sorted(map(str, on_disk - walked))}"


def test_every_package_of_the_distribution_is_in_a_layer_and_in_its_folder():
    tomllib = pytest.importorskip("tomllib")
    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "package-dir" not in setup, "each package lives in the folder its name says (octopus_audio/...)"
    assert all(layer_of(p) is not None for p in setup["packages"]), setup["packages"]
    for package in setup["packages"]:
        folder = REPO.joinpath(*package.split("."))
        assert folder.is_dir(), f"{package}: no folder {folder.relative_to(REPO)}"
        if not (folder / "__init__.py").is_file():
            continue  # a folder of data files (octopus_audio/clips)
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations is not None, package
        assert Path(spec.submodule_search_locations[0]).resolve() == folder.resolve(), package


def test_the_repository_root_holds_no_importable_name_but_the_package():
    """`python -m pytest` and `python -m octopus_audio` put the working directory first on sys.path, so a
    package folder or module at the repository root is imported in place of an installed one of that name: a
    root `kernels/` (the kernel layer's old folder) shadowed the `kernels` distribution that transformers 5.25
    imports, and the Hugging Face CLAP failed to load. Folders without `__init__.py` (tests/, benchmarks/) are
    namespace portions, which never shadow a regular package."""
    importable = {p.stem for p in REPO.iterdir() if not p.name.startswith(".")
                  and ((p.is_dir() and (p / "__init__.py").is_file()) or p.suffix == ".py")}
    assert importable == {PACKAGE}, f"importable at the repository root: {sorted(importable)}"


def test_no_module_imports_a_higher_layer():
    problems = [p for path, name, is_package in MODULES
                for p in upward_imports(path.read_text(encoding="utf-8"), name,
                                        str(path.relative_to(REPO)), is_package)]
    assert not problems, "imports against the layer order:\n" + "\n".join(problems)


# the circles the package has, each waiting for its fix (none now: the eval's shared records, EvalConfig and
# Job, live in eval/records.py, which imports none of the modules that read them)
KNOWN_CIRCLES: set[tuple[str, ...]] = set()


def test_no_module_imports_itself_through_others():
    graph = import_graph({name: (path.read_text(encoding="utf-8"), is_package)
                          for path, name, is_package in MODULES})
    found = {tuple(c) for c in circles(graph)}
    new = found - KNOWN_CIRCLES
    assert not new, "import circles:\n" + "\n".join(
        " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(c, c[1:], strict=False)) + f" -> {c[-1]}"
        for c in sorted(new))
    assert KNOWN_CIRCLES <= found, f"fixed, remove from KNOWN_CIRCLES: {sorted(KNOWN_CIRCLES - found)}"


def test_the_dispatcher_is_the_entry_and_names_only_real_command_modules():
    """The dispatcher's table is read like a module's imports: each subcommand module exists, and the walk
    sees them (entry layer, so any layer is allowed)."""
    from octopus_audio.cli import COMMANDS

    names = {name for _, name, _ in MODULES}
    assert {module for module, _ in COMMANDS.values()} <= names
    cli = REPO / "octopus_audio" / "cli.py"
    seen = {target for _, target in imports_of(cli.read_text(), "octopus_audio.cli")}
    assert {module for module, _ in COMMANDS.values()} <= seen
    assert {layer_of(m) for m, _ in COMMANDS.values()} >= {"core", "eval", "apps"}


# --- the check itself: synthetic sources with an upward import are reported ---------------------------------

UPWARD = [
    ("module-level-from", "octopus_audio.aar_patch.train_data", False,
     "import numpy\nfrom octopus_audio.eval.sources import decode\n", 2, "octopus_audio.eval.sources.decode"),
    ("inside-a-function", "octopus_audio.cache", False,
     "def f():\n    import octopus_audio.aar_patch.patch\n", 2, "octopus_audio.aar_patch.patch"),
    ("relative-two-levels", "octopus_audio.aar_patch.train", False,
     "def f():\n    from ..eval import conditioning\n", 2, "octopus_audio.eval.conditioning"),
    ("relative-into-core", "octopus_audio.kernels.flash", False,
     "from .bits import pack\nfrom .. import cache\n", 2, "octopus_audio.cache"),
    ("relative-from-a-package-init", "octopus_audio.kernels", True,
     "from ..values import ValueState\n", 1, "octopus_audio.values.ValueState"),
    ("from-the-package-import-a-layer", "octopus_audio.cache.backend", False,
     "from octopus_audio import eval as e\n", 1, "octopus_audio.eval"),
    ("import-module-literal", "octopus_audio.aar_patch.loading", False,
     "import importlib\n\nm = importlib.import_module('octopus_audio.eval.cli')\n", 3,
     "octopus_audio.eval.cli"),
    ("import-module-table", "octopus_audio.rate_distortion", False,
     "import importlib\nTABLE = {'x': 'octopus_audio.aar_patch.generation'}\n"
     "mods = [importlib.import_module(v) for v in TABLE.values()]\n", 2,
     "octopus_audio.aar_patch.generation"),
    ("dunder-import", "octopus_audio.kernels.spec", False,
     "x = __import__('octopus_audio.codecs')\n", 1, "octopus_audio.codecs"),
    ("the-dispatcher-from-eval", "octopus_audio.eval.report", False,
     "from octopus_audio.cli import main\n", 1, "octopus_audio.cli.main"),
    ("core-imports-the-transformers-adapter", "octopus_audio.cache", False,
     "from octopus_audio.hf import OctopusCache\n", 1, "octopus_audio.hf.OctopusCache"),
    ("a-sibling-application", "octopus_audio.hf.cache", False,
     "from octopus_audio.eval import runner\n", 1, "octopus_audio.eval.runner"),
]


@pytest.mark.parametrize("module,is_package,source,line,target", [c[1:] for c in UPWARD],
                         ids=[c[0] for c in UPWARD])
def test_an_upward_import_is_reported_with_file_line_and_target(module, is_package, source, line, target):
    problems = upward_imports(source, module, "pkg/mod.py", is_package)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"pkg/mod.py:{line}: {module} ") and f" imports {target} " in problems[0]


DOWNWARD = [
    ("eval-imports-every-lower-layer", "octopus_audio.eval.runner",
     "from octopus_audio.aar_patch import patch\nfrom octopus_audio.codecs import CODECS\n"
     "import octopus_audio.kernels\nfrom . import rows\n"),
    ("core-imports-kernels-and-itself", "octopus_audio.cache.plan",
     "def f():\n    import octopus_audio.kernels as ops\n"
     "    from octopus_audio.codecs.qjl import QJL_STREAM\n"),
    ("outside-the-package", "octopus_audio.kernels.bits", "import triton\nimport triton.language as tl\n"),
    ("the-adapter-imports-core-and-kernels", "octopus_audio.hf.layer",
     "from octopus_audio.cache import CompressedKVCache\nimport octopus_audio.kernels\n"),
    ("the-dispatcher-names-any-layer", "octopus_audio.cli",
     "import importlib\nC = {'g': ('octopus_audio.eval.generate_cli', 'help')}\n"
     "def f(n):\n    return importlib.import_module(C[n][0])\n"),
    ("a-docstring-names-a-higher-layer", "octopus_audio.kernels.spec",
     '"""Used by `octopus_audio.eval.runner`."""\nX = "see octopus_audio.eval.cli"\n'),
]


@pytest.mark.parametrize("module,source", [c[1:] for c in DOWNWARD], ids=[c[0] for c in DOWNWARD])
def test_imports_within_the_order_are_not_reported(module, source):
    assert upward_imports(source, module, "pkg/mod.py") == []


# --- the circle check itself: synthetic packages ---------------------------------------------------------

CIRCLES = [
    ("two-modules", {"p.a": "from p import b\n", "p.b": "import p.a\n"}, [["p.a", "p.b", "p.a"]]),
    ("inside-a-function", {"p.a": "from p import b\n", "p.b": "def f():\n    from . import a\n"},
     [["p.a", "p.b", "p.a"]]),
    ("three-relative", {"p.a": "from .b import x\n", "p.b": "from .c import y\n", "p.c": "from . import a\n"},
     [["p.a", "p.b", "p.c", "p.a"]]),
    ("through-a-package-init", {"p": "from .impl import run\n", "p.impl": "from p import helper\n"},
     [["p", "p.impl", "p"]]),
    ("import-module-literal", {"p.a": "import importlib\nm = importlib.import_module('p.b')\n",
                               "p.b": "from p.a import x\n"}, [["p.a", "p.b", "p.a"]]),
]
NO_CIRCLES = [
    ("a-chain", {"p.a": "from p import b\n", "p.b": "from p import c\n", "p.c": "import os\n"}),
    ("submodule-through-its-package", {"p": "from . import a\n", "p.a": "from .b import x\n", "p.b": ""}),
    ("a-name-of-the-package-is-not-its-submodule", {"p": "from .a import f\n", "p.a": "from p.b import g\n",
                                                    "p.b": "x = 1\n"}),
]


def _graph(modules: dict[str, str]) -> dict[str, dict[str, int]]:
    packages = {m for m in modules if any(o.startswith(m + ".") for o in modules)}
    return import_graph({m: (src, m in packages) for m, src in modules.items()})


@pytest.mark.parametrize("modules,expected", [c[1:] for c in CIRCLES], ids=[c[0] for c in CIRCLES])
def test_a_circle_is_found(modules, expected):
    assert circles(_graph(modules)) == expected


@pytest.mark.parametrize("modules", [c[1] for c in NO_CIRCLES], ids=[c[0] for c in NO_CIRCLES])
def test_imports_without_a_circle_are_not_reported(modules):
    assert circles(_graph(modules)) == []
