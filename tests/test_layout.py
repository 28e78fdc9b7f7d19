"""The layout of docs/layout.md, checked: rooms by process, imports that flow one way.

Every module of the four code folders is parsed with ``ast`` (nothing is imported), and
each ``import`` of a ``uniun`` module becomes an edge from its room to the target's room:

- ``protocol`` imports only ``protocol``;
- ``models`` imports ``models`` and ``protocol``;
- ``actors/policy`` imports ``actors/policy`` and the pure half of ``protocol``;
- every other ``actors/<room>`` imports itself, the shared ``actors`` modules,
  ``actors/policy``, ``protocol`` and ``models`` -- never another process's room and
  never ``runtime``;
- ``runtime`` imports anything.

A function-level import is allowed (it keeps heavy libraries out of processes that do not
need them), but not to hide a cycle: the graph of all imports, function-level ones
included, must have no cycle between modules.

The kernel library (``models/*.c``) keeps the same rules in C: files under ~400 lines, one
job each, and no cycle between files (a file that uses a symbol another one defines
depends on it; the symbols are read from each file's object code).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import REPO as ROOT

CODE_ROOMS = ("protocol", "models", "actors", "runtime")
# The protocol modules without I/O (no zmq): what the policy may lean on.
PURE_PROTOCOL = {"codec", "messages", "requests", "jobmap", "errors", "runner_records", "home",
                 "power_state"}
# Standard-library names that do not exist on Python 3.10, the oldest we declare.
NEWER_THAN_310_MODULES = {"tomllib", "wsgiref.types"}
NEWER_THAN_310_NAMES = {
    "typing": {"Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type",
               "Required", "NotRequired", "TypeVarTuple", "Unpack", "dataclass_transform",
               "override", "TypeAliasType"},
    "enum": {"StrEnum", "ReprEnum", "verify", "member", "nonmember", "global_enum",
             "EnumCheck", "FlagBoundary"},
    "datetime": {"UTC"}, "hashlib": {"file_digest"}, "contextlib": {"chdir"},
    "asyncio": {"TaskGroup", "Runner", "timeout", "timeout_at"}, "operator": {"call"},
    "itertools": {"batched"},
}


@dataclass(frozen=True)
class Import:
    source: str  # dotted module name of the importing file
    target: str  # dotted module name imported (a module, or a package's __init__)
    line: int
    function_level: bool
    guarded: bool  # inside try/except ImportError or an ``if sys.version_info`` test


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["uniun", *parts])


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for room in CODE_ROOMS for p in (ROOT / room).rglob("*.py")}


MODULES = _modules()


def _resolve(module: str, name: str | None) -> str:
    """``from module import name``: the submodule if ``name`` is one, else ``module``."""
    if name is not None and f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    return module


_IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError")


def _guarded(stack: list[ast.AST]) -> bool:
    for node in stack:
        if isinstance(node, ast.Try) and any(
                (isinstance(h.type, ast.Name) and h.type.id in _IMPORT_ERRORS)
                or (isinstance(h.type, ast.Tuple) and any(
                    isinstance(e, ast.Name) and e.id in _IMPORT_ERRORS for e in h.type.elts))
                for h in node.handlers):
            return True
        if isinstance(node, ast.If) and "version_info" in ast.unparse(node.test):
            return True
    return False


def _imports(module: str, source: str) -> Iterator[Import]:
    tree = ast.parse(source, filename=module)

    def walk(node: ast.AST, stack: list[ast.AST]) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            inner = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                        for n in stack)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(module, alias.name, child.lineno, inner, _guarded(stack))
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names = [a.name for a in child.names]
                targets = {_resolve(child.module, n) for n in names}
                for target in sorted(targets):
                    yield Import(module, target, child.lineno, inner, _guarded(stack))
                for name in names:  # ``from typing import Self``: checked as a name
                    yield Import(module, f"{child.module}:{name}", child.lineno, inner,
                                 _guarded(stack))
            yield from walk(child, [*stack, child])

    yield from walk(tree, [])


ALL_IMPORTS = [imp for module, path in MODULES.items()
               for imp in _imports(module, path.read_text(encoding="utf-8"))]
OURS = [imp for imp in ALL_IMPORTS if imp.target.startswith("uniun.") and ":" not in imp.target]


def room(module: str) -> str:
    """``protocol``, ``models``, ``actors/policy``, ``actors/<room>``, ``actors`` (the
    shared modules at the top of actors/) or ``runtime``."""
    parts = module.split(".")[1:]
    if parts[0] == "actors" and len(parts) > 1 and f"uniun.actors.{parts[1]}" in MODULES \
            and (ROOT / "actors" / parts[1]).is_dir():
        return f"actors/{parts[1]}"
    return parts[0]


def allowed(src: str, dst: str, target: str) -> bool:
    if src == dst or src == "runtime":
        return True
    if src == "protocol":
        return False
    if src == "models":
        return dst == "protocol"
    if src == "actors/policy":
        return dst == "protocol" and target.split(".")[2] in PURE_PROTOCOL
    if src.startswith("actors"):  # a process's room, or the shared actors modules
        return dst in ("actors", "actors/policy", "protocol", "models")
    raise AssertionError(f"unknown room {src}")


def test_every_folder_is_a_declared_package() -> None:
    """Each code folder is an ``uniun`` subpackage listed in pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    for room_name in CODE_ROOMS:
        for init in (ROOT / room_name).rglob("__init__.py"):
            package = _module_name(init)
            folder = init.parent.relative_to(ROOT).as_posix()
            assert f'"{package}"' in text and f'"{package}" = "{folder}"' in text, (
                f"{folder} is not declared in pyproject.toml's packages and package-dir")


def test_imports_flow_one_way() -> None:
    wrong = [f"{imp.source} (line {imp.line}, {room(imp.source)}) imports {imp.target} "
             f"({room(imp.target)})"
             for imp in OURS
             if imp.target in MODULES and not allowed(room(imp.source), room(imp.target),
                                                       imp.target)]
    assert not wrong, "imports against the room order:\n" + "\n".join(wrong)


def test_imports_name_modules_that_exist() -> None:
    missing = [f"{imp.source} (line {imp.line}) imports {imp.target}"
               for imp in OURS if imp.target not in MODULES]
    assert not missing, "\n".join(missing)


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in OURS:
        if imp.target in MODULES and imp.target != imp.source:
            graph[imp.source].add(imp.target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_hidden_by_function_level_imports() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_nothing_newer_than_python_310_is_imported_unguarded() -> None:
    bad = []
    for imp in ALL_IMPORTS:
        if imp.guarded:
            continue
        module, _, name = imp.target.partition(":")
        if not name and module in NEWER_THAN_310_MODULES:
            bad.append(f"{imp.source} (line {imp.line}) imports {module}")
        elif name and name in NEWER_THAN_310_NAMES.get(module, ()):
            bad.append(f"{imp.source} (line {imp.line}) imports {module}.{name}")
    assert not bad, "Python 3.11+ only, import it behind a guard:\n" + "\n".join(bad)


def test_the_checks_see_a_violation_when_there_is_one() -> None:
    """The rules above are not vacuous: a runtime import from models, a cycle and an
    unguarded tomllib would each be caught."""
    assert not allowed("models", "runtime", "uniun.runtime.paths")
    assert not allowed("actors/scheduler", "actors/runner", "uniun.actors.runner.worker")
    assert not allowed("actors/policy", "protocol", "uniun.protocol.client")
    assert allowed("actors/scheduler", "actors", "uniun.actors.socket_pump")
    source = "import tomllib\ntry:\n    import tomllib\nexcept ImportError:\n    pass\n"
    found = [(i.target, i.guarded) for i in _imports("uniun.synthetic", source)]
    assert found == [("tomllib", False), ("tomllib", True)]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("room_name", CODE_ROOMS)
def test_modules_stay_readable(room_name: str) -> None:
    """Modules under ~400 lines (docs/style.md §5); a longer one is split by responsibility."""
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in (ROOT / room_name).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 420]
    assert not long, "\n".join(long)


C_FILES = sorted((ROOT / "models").glob("*.[ch]"))


def test_c_files_stay_readable() -> None:
    """The kernel library's files under ~400 lines too; a longer one is split by job."""
    assert C_FILES
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in C_FILES
            if (n := len(p.read_text().splitlines())) > 420]
    assert not long, "\n".join(long)


def _symbols(obj: Path) -> tuple[set[str], set[str]]:
    """The global symbols an object file defines, and those it uses from elsewhere."""
    out = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBRCVW":
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
    return defined, used


def c_file_graph(objects: dict[str, Path]) -> dict[str, set[str]]:
    symbols = {name: _symbols(obj) for name, obj in objects.items()}
    owner = {sym: name for name, (defined, _) in symbols.items() for sym in defined}
    return {name: {owner[s] for s in used if s in owner and owner[s] != name}
            for name, (_, used) in symbols.items()}


def _compile(tmp_path: Path, *flags: str) -> dict[str, Path]:
    """Every models/*.c compiled to an object file in tmp_path: {file name: object}."""
    cc = os.environ.get("CC", "cc")
    assert shutil.which(cc), f"no C compiler ({cc}): the kernel library cannot be built"
    objects = {}
    for source in (p for p in C_FILES if p.suffix == ".c"):
        obj = tmp_path / f"{source.stem}.o"
        done = subprocess.run([cc, "-std=gnu11", "-fPIC", *flags, "-c", str(source), "-o",
                               str(obj)], check=False, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        objects[source.name] = obj
    return objects


def test_the_library_builds_clean_and_whole_without_its_x86_variants(tmp_path: Path) -> None:
    """bin/setup builds the x86-64 library with warnings as errors; this builds it as a CPU
    without x86 gets it (stubs where a kernel is x86-only) the same way, and links it with
    every symbol resolved."""
    objects = _compile(tmp_path, "-O2", "-DUNIUN_PORTABLE_ONLY", "-Wall", "-Wextra", "-Werror")
    cc = os.environ.get("CC", "cc")
    done = subprocess.run([cc, "-shared", "-Wl,--no-undefined", "-o", str(tmp_path / "lib.so"),
                           *map(str, objects.values()), "-lm"], check=False,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_c_files_form_no_cycle(tmp_path: Path) -> None:
    graph = c_file_graph(_compile(tmp_path))
    assert graph["ort_library.c"] >= {"qmatmul_ort.c", "ggml_ort.c"}  # the graph is read
    cycle = _cycle(graph)
    assert cycle is None, "a cycle between C files: " + " -> ".join(cycle or [])


def test_top_level_folders_are_uniun_subpackages() -> None:
    import uniun.actors
    import uniun.models
    import uniun.protocol
    import uniun.runtime

    for module, folder in [(uniun.actors, "actors"), (uniun.models, "models"),
                           (uniun.protocol, "protocol"), (uniun.runtime, "runtime")]:
        assert Path(module.__file__).resolve().parent == ROOT / folder


def test_cli_help_lists_commands() -> None:
    out = subprocess.run([sys.executable, "-m", "uniun.runtime", "--help"],
                         capture_output=True, text=True, check=True)
    assert "usage: uniun-runtime" in out.stdout
