"""Checks the include direction drawn in docs/design.md ("The map"): every `#include "…"` of a project file names
a file of its own folder or of a folder it may depend on; and the few files that must stay apart inside a folder
(NOT_INCLUDED) do, directly or through other project headers. And the Python boundary: no module of the library
(plugin/python/hpac outside hpac/harness) imports from the harness, by any spelling of the import; bench/ is a
package (an __init__.py in every folder with modules) that never edits sys.path, loads a module by file path or
imports test code; and no Python function outside test/ is longer than MAX_FUNCTION_LINES. Prints each offending
include, import or function and exits 1.

Usage: python3 test/layout_check.py [PROJECT_ROOT]
"""
import ast
import os
import re
import sys

CORE = {"policy", "replay", "plugin"}
# folder -> the folders its files may include (besides their own).
ALLOWED = {
    "policy": set(),
    "replay": {"policy"},
    "plugin": {"replay", "policy"},
    "tools/moe": CORE,
    "tools/evidence": CORE | {"tools/moe"},
    "tools/demo": CORE | {"tools/evidence", "tools/moe"},
    "tools/distributed": CORE,
    "tools/explain": CORE | {"tools/moe"},
    "tools/launch": {"plugin"},
    "tools/trainer": CORE | {"tools/moe", "tools/distributed", "tools/launch", "tools/evidence"},
}
# file -> {header it must not include, directly or through other project headers: why}. Inside a folder every
# include is allowed by the map; these keep a general interface from growing a dependency on one of its users.
NOT_INCLUDED = {
    "policy/checkpoint_policy.h": {
        "policy/budget_plan.h": "the policy interface needs only ProfiledOp (policy/profiled_op.h), not the budget "
        "planner; include policy/profiled_op.h",
    },
}
# Test, benchmark and example code may include anything; nothing else may include them.
LEAVES = ("test", "bench", "examples")
SOURCE = re.compile(r"\.(h|hpp|cpp|cc)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder(path):
    parts = path.split("/")
    if parts[0] == "tools" and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0]


def include_chain(graph, start, target):
    """The project headers from `start` to `target` along includes (both ends included), or None."""
    parent = {start: None}
    queue = [start]
    while queue:
        here = queue.pop(0)
        if here == target:
            chain = []
            while here is not None:
                chain.append(here)
                here = parent[here]
            return chain[::-1]
        for inc in graph.get(here, ()):
            if inc not in parent:
                parent[inc] = here
                queue.append(inc)
    return None


PACKAGE = os.path.join("plugin", "python", "hpac")
HARNESS = "harness"  # hpac.harness: test, demo and benchmark scaffolding, not API (its __init__ says so)


def harness_imports(tree, package):
    """(line, what) of every import in `tree` that reaches hpac.harness: `import hpac.harness[.x]`,
    `from hpac.harness[.x] import …`, `from hpac import harness`, relative imports resolved against `package`
    (the module's dotted package, e.g. "hpac" or "hpac.hf"), and __import__ / importlib.import_module of a literal
    name."""
    target = "hpac." + HARNESS

    def reaches(name):
        return name == target or name.startswith(target + ".")

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if reaches(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" for a in node.names]
            if reaches(base) or any(reaches(n) for n in names):
                found.append((node.lineno, f"from {'.' * node.level}{node.module or ''} import "
                                           f"{', '.join(a.name for a in node.names)}"))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if called in ("__import__", "import_module") and isinstance(node.args[0].value, str) \
                    and reaches(node.args[0].value):
                found.append((node.lineno, f"{called}({node.args[0].value!r})"))
    return found


def python_boundary(root):
    """(modules checked, offences): the library's modules that import from the harness."""
    bad, checked = [], 0
    top = os.path.join(root, PACKAGE)
    for dirpath, dirnames, names in os.walk(top):
        rel = os.path.relpath(dirpath, top)
        if rel.split(os.sep)[0] == HARNESS:
            continue
        package = "hpac" + ("" if rel == "." else "." + rel.replace(os.sep, "."))
        for name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            checked += 1
            for line, what in harness_imports(tree, package):
                bad.append(f"{os.path.relpath(path, root)}:{line}: {what}: a library module imports from "
                           f"hpac.{HARNESS}, which is test scaffolding and not API; move what it needs into the "
                           "library, or the importing code into the harness")
    if checked == 0:
        bad.append(f"{PACKAGE}: no Python module found; update PACKAGE")
    return checked, bad


# bench/ is a package run as `python -m bench.<area>.<name>` from the checkout's root (bench/README.md): it finds hpac
# and itself through the package path, never by editing sys.path or loading a file by path, and it never imports test
# code (what tests and benchmarks share lives in hpac.harness).
BENCH = "bench"
PATH_EDITS = {("sys", "path"): "edits sys.path", ("site", "addsitedir"): "adds a site dir",
              ("util", "spec_from_file_location"): "loads a module by file path",
              ("importlib", "spec_from_file_location"): "loads a module by file path"}
MAX_FUNCTION_LINES = 80  # outside test/: a longer function is split (the issue that set it: house, fourth step)


def test_modules(root):
    """The names test code can be imported under: test/python's modules and packages (conftest, drift, test_*...)."""
    names = {"test", "conftest"}
    for dirpath, dirnames, files in os.walk(os.path.join(root, "test")):
        names.update(n[:-3] for n in files if n.endswith(".py"))
        names.update(dirnames)
    return names - {"__init__", "__pycache__"}


def bench_offences(path, tree, tests):
    """(line, what) of a bench module's sys.path edits, loads by path and imports of test code."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute)):
            owner = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
            if (owner, node.attr) in PATH_EDITS and (owner, node.attr) != ("sys", "path"):
                found.append((node.lineno, PATH_EDITS[(owner, node.attr)]))
            elif (owner, node.attr) == ("sys", "path") and not isinstance(node.ctx, ast.Load):
                found.append((node.lineno, "assigns sys.path"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Attribute) and isinstance(node.func.value.value, ast.Name) and \
                (node.func.value.value.id, node.func.value.attr) == ("sys", "path"):
            found.append((node.lineno, f"edits sys.path (sys.path.{node.func.attr})"))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"imports test code ({a.name})") for a in node.names
                      if a.name.split(".")[0] in tests]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                node.module.split(".")[0] in tests:
            found.append((node.lineno, f"imports test code ({node.module})"))
    return found


def bench_package(root):
    """(modules checked, offences): bench/ as a package that neither edits sys.path nor imports test code."""
    bad, checked, tests = [], 0, test_modules(root)
    for dirpath, dirnames, names in os.walk(os.path.join(root, BENCH)):
        dirnames[:] = [d for d in dirnames if d not in ("results", "__pycache__")]
        py = sorted(n for n in names if n.endswith(".py"))
        if py and "__init__.py" not in names:
            bad.append(f"{os.path.relpath(dirpath, root)}: has Python modules but no __init__.py; bench/ is one "
                       "package (python -m bench.<area>.<name>)")
        for name in py:
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            checked += 1
            bad += [f"{os.path.relpath(path, root)}:{line}: {what}: bench/ runs as a package from the checkout's "
                    "root and takes what it shares with tests from hpac.harness" for line, what in
                    bench_offences(path, tree, tests)]
    return checked, bad


def long_functions(root):
    """(functions checked, offences): Python functions outside test/ longer than MAX_FUNCTION_LINES."""
    bad, checked = [], 0
    for top in ("plugin", "bench", "tools", "examples", "policy", "replay"):
        for dirpath, dirnames, names in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if d not in ("results", "__pycache__")]
            for name in sorted(n for n in names if n.endswith(".py")):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), path)
                for node in ast.walk(tree):
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        checked += 1
                        lines = node.end_lineno - node.lineno + 1
                        if lines > MAX_FUNCTION_LINES:
                            bad.append(f"{os.path.relpath(path, root)}:{node.lineno}: {node.name} has {lines} lines "
                                       f"(at most {MAX_FUNCTION_LINES} outside test/): split it")
    return checked, bad


def main(root):
    bad = []
    checked = 0
    graph = {}  # project file -> project files it includes
    for top in ("policy", "replay", "plugin", "tools", "test", "bench", "examples"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if not SOURCE.search(name):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                here = folder(path)
                with open(os.path.join(root, path), errors="replace") as f:
                    text = f.read()
                for inc in INCLUDE.findall(text):
                    if not os.path.exists(os.path.join(root, inc)):
                        continue  # a system or generated header, not a project file
                    checked += 1
                    graph.setdefault(path, []).append(inc)
                    there = folder(inc)
                    if there == here or here.split("/")[0] in LEAVES:
                        continue
                    if there.split("/")[0] in LEAVES:
                        bad.append(f"{path}: includes {inc}, but {here} may not depend on test/bench/example code")
                    elif here not in ALLOWED:
                        bad.append(f"{path}: folder {here} is not on the map of docs/design.md; add it there and here")
                    elif there not in ALLOWED[here]:
                        allowed = ", ".join(sorted(ALLOWED[here])) or "nothing outside itself"
                        bad.append(f"{path}: includes {inc} ({there}), but {here} may include only {allowed}")
    for path, rules in NOT_INCLUDED.items():
        if not os.path.exists(os.path.join(root, path)):
            bad.append(f"{path}: named in NOT_INCLUDED but not in the project; update the rule")
        for header, why in rules.items():
            chain = include_chain(graph, path, header)
            if chain:
                through = f" (through {', '.join(chain[1:-1])})" if len(chain) > 2 else ""
                bad.append(f"{path}: includes {header}{through}, which it must not: {why}")
    modules, python_bad = python_boundary(root)
    bench_modules, bench_bad = bench_package(root)
    functions, long_bad = long_functions(root)
    for line in bad + python_bad + bench_bad + long_bad:
        print("layout:", line)
    print(f"layout: {checked} project includes checked, {len(bad)} against the map; {modules} library modules "
          f"checked, {len(python_bad)} importing from hpac.{HARNESS}; {bench_modules} bench modules checked, "
          f"{len(bench_bad)} editing sys.path or importing test code; {functions} functions outside test/ checked, "
          f"{len(long_bad)} over {MAX_FUNCTION_LINES} lines")
    return 1 if bad or python_bad or bench_bad or long_bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")))
