"""Checks the include direction drawn in docs/design.md ("The map"): every `#include "…"` of a project file names
a file of its own folder or of a folder it may depend on; and the few files that must stay apart inside a folder
(NOT_INCLUDED) do, directly or through other project headers. And the Python boundary: no module of the library
(plugin/python/hpac outside hpac/harness) imports from the harness, by any spelling of the import; bench/ is a
package (an __init__.py in every folder with modules) that never edits sys.path, loads a module by file path or
imports test code, and whose modules import no other bench module outside bench/common (a benchmark may import its own
<name>_report; bench/report.py gathers them all); and no function is longer than MAX_FUNCTION_LINES: Python outside
test/, C++ (.h/.hpp/.cpp/.cc, read by a brace-matching scanner, Note [Reading C++ function spans]) outside test/,
bench/ and examples/. Prints each offending include, import or function and exits 1.

Usage: python3 test/layout_check.py [PROJECT_ROOT]
"""
import ast
import bisect
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


# Benchmarks do not import each other: a bench module imports the library and bench.common (what benchmarks share)
# and, a benchmark <name>.py, its own report section <name>_report.py beside it (bench/README.md: one unit); only
# bench/report.py, the documents' renderer, gathers the report sections of every benchmark.
BENCH_SHARED = "bench.common"
BENCH_RENDERER = "bench.report"


def bench_imports(root, tree, module):
    """(line, module name) of every bench module that `tree` (bench module `module`, dotted) imports: `import bench.x`,
    `from bench.x import y` (y a module where bench/x is a folder), relative imports resolved against `module`, and
    __import__ / importlib.import_module of a literal name."""
    package = module.split(".")[:-1]  # bench.budget.meta_plan and bench.budget.__init__ alike: bench.budget
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == BENCH]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - (node.level - 1)] + ([base] if base else []))
            if base.split(".")[0] != BENCH:
                continue
            if os.path.isdir(os.path.join(root, *base.split("."))):  # a package: what it names are modules
                found += [(node.lineno, f"{base}.{a.name}") for a in node.names
                          if os.path.exists(os.path.join(root, *base.split("."), a.name + ".py"))
                          or os.path.isdir(os.path.join(root, *base.split("."), a.name))]
            else:
                found.append((node.lineno, base))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            name = node.args[0].value
            if called in ("__import__", "import_module") and isinstance(name, str) and name.split(".")[0] == BENCH:
                found.append((node.lineno, name))
    return found


def bench_import_allowed(module, target):
    """Whether bench module `module` may import bench module `target` (the rule above)."""
    if target == BENCH_SHARED or target.startswith(BENCH_SHARED + "."):
        return True
    if module == BENCH_RENDERER:
        return target.endswith("_report")
    return target == module + "_report"


def bench_package(root):
    """(modules checked, offences): bench/ as a package that neither edits sys.path nor imports test code, and whose
    modules do not import each other outside bench.common."""
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
            rel = os.path.relpath(path, root)
            bad += [f"{rel}:{line}: {what}: bench/ runs as a package from the checkout's root and takes what it "
                    "shares with tests from hpac.harness" for line, what in bench_offences(path, tree, tests)]
            module = rel[:-3].replace(os.sep, ".")
            bad += [f"{rel}:{line}: imports {target}: a bench module imports only {BENCH_SHARED}, the library and "
                    "(a benchmark) its own <name>_report; move what benchmarks share into bench/common/ (or "
                    "hpac.harness where tests share it too)" for line, target in bench_imports(root, tree, module)
                    if not bench_import_allowed(module, target)]
    return checked, bad


# Note [Reading C++ function spans]
# No C++ parser here, only what the length check needs: cpp_code() blanks comments, string and character literals
# (raw strings too) and preprocessor lines, keeping every newline so offsets keep their lines, and keeps of each
# #if ... #endif only its first branch (so a brace opened differently per branch still balances); cpp_functions()
# then matches braces. At namespace and class scope every `{` opens one of: a namespace (or extern "C") body, a
# class / struct / union body (read the same way, its name prefixed to its members'), an enum or an initializer
# (part of a declaration that ends at its `;`), or a function body: a head that ends in a name, its parameter list
# and qualifiers (const, noexcept, override, a trailing return type, a constructor's initializers). A function spans
# from the line of its name to its closing brace; everything inside, lambdas and local classes included, is its own.
# A `{` inside parentheses or brackets is an initializer. A file whose braces do not balance is reported, not skipped.
CPP_TOPS = sorted({f.split("/")[0] for f in ALLOWED})  # the folders on the map; test/, bench/, examples/ are leaves
RAW_STRING_PREFIXES = ("R", "u8R", "uR", "UR", "LR")
CONDITIONAL = re.compile(r"#\s*(if|ifdef|ifndef|elif|else|endif)\b")
CLASS_HEAD = re.compile(r"\s*(?:(?:typedef|static|inline|constexpr|const|volatile|extern|alignas\(\)|\[\])\s*)*"
                        r"(class|struct|union|enum)\b(.*)", re.S)
FUNCTION_HEAD = re.compile(
    r"(?<![\w~])(?P<name>(?:[A-Za-z_]\w*(?:<[^<>;]*>)?::)*(?:operator\s*(?:\(\)|\[\]|[^\s\w(]+|\w[\w:<>*&]*)"
    r"|~?[A-Za-z_]\w*))\s*(?:<[^;]*>)?\s*\(\)"
    r"(?:\s*(?:const|volatile|noexcept(?:\s*\(\))?|override|final|mutable|throw\s*\(\)|&&|&))*"
    r"\s*(?:->.*|:.*)?$", re.S)


def _word_before(text, i):
    """The identifier characters just before offset i."""
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] == "_"):
        j -= 1
    return text[j:i]


def cpp_code(text):
    """`text` with comments, literals and preprocessor lines blanked (Note [Reading C++ function spans])."""
    out, i, n = [], 0, len(text)
    line_start, skipping = True, []  # skipping: per open #if, whether a later branch is being read

    def blank(a, b):
        out.append("".join(ch if ch == "\n" else " " for ch in text[a:b]))

    while i < n:
        c = text[i]
        if c == "\n":
            out.append(c)
            i, line_start = i + 1, True
        elif c in " \t\r\f\v":
            out.append(c)
            i += 1
        elif c == "#" and line_start:
            end = i
            while True:  # through its continuation lines
                end = text.find("\n", end)
                if end < 0:
                    end = n
                    break
                if text[end - 1] != "\\" and text[end - 2:end] != "\\\r":
                    break
                end += 1
            cond = CONDITIONAL.match(text, i)
            if cond and cond.group(1).startswith("if"):
                skipping.append(False)
            elif cond and cond.group(1) in ("elif", "else") and skipping:
                skipping[-1] = True
            elif cond and cond.group(1) == "endif" and skipping:
                skipping.pop()
            blank(i, end)
            i = end
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            blank(i, end)
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            blank(i, end)
            i = end
        elif c == '"' and _word_before(text, i) in RAW_STRING_PREFIXES:
            open_paren = text.find("(", i)
            close = text.find(")" + text[i + 1:open_paren] + '"', open_paren) if open_paren > 0 else -1
            end = n if close < 0 else close + open_paren - i + 1
            out.append('"')
            blank(i + 1, end - 1)
            out.append('"')
            i, line_start = end, False
        elif c == "'" and _word_before(text, i)[:1].isdigit():  # a digit separator: 1'000'000
            out.append(" ")
            i += 1
        elif c in "\"'":
            end = i + 1
            while end < n and text[end] != c and text[end] != "\n":
                end += 2 if text[end] == "\\" else 1
            end = min(end + 1, n)
            out.append(c)
            blank(i + 1, end - 1)
            out.append(c)
            i, line_start = end, False
        else:
            out.append(" " if any(skipping) else c)
            i, line_start = i + 1, False
    return "".join(out)


def _collapse(head):
    """(the head with every bracketed group's inside dropped, the head's offset of each character kept)."""
    chars, where, depth = [], [], 0
    for k, c in enumerate(head):
        if c in "([{":
            depth += 1
            if depth == 1:
                chars.append(c), where.append(k)
        elif c in ")]}":
            depth = max(depth - 1, 0)
            if depth == 0:
                chars.append(c), where.append(k)
        elif depth == 0:
            chars.append(" " if c.isspace() else c), where.append(k)
    return "".join(chars), where


def _strip_template(head):
    """The head without a leading `template <...>`."""
    m = re.match(r"\s*template\s*<", head)
    if not m:
        return head
    depth = 1
    for k in range(m.end(), len(head)):
        depth += {"<": 1, ">": -1}.get(head[k], 0)
        if depth == 0:
            return _strip_template(head[k + 1:])
    return head


def _classify(head):
    """(kind, name, offset of the name in `head`) of the declaration whose `{` follows `head`: kind "namespace",
    "class", "function" or "other" (an enum or an initializer)."""
    flat, where = _collapse(head)
    if re.search(r"\bnamespace\b", flat) or re.search(r'\bextern\s*"[^"]*"\s*$', flat):
        return "namespace", None, None
    body = re.sub(r"^\s*(?:(?:public|private|protected)\s*:\s*)+", "", flat)
    cls = CLASS_HEAD.match(_strip_template(body))
    if cls:
        if cls.group(1) == "enum":
            return "other", None, None
        before_bases = re.sub(r"<.*", "", re.split(r"(?<!:):(?!:)", cls.group(2))[0])
        words = [w for w in re.findall(r"[A-Za-z_][\w:]*", before_bases) if w != "final"]
        return "class", (words[-1] if words else ""), None
    fn = FUNCTION_HEAD.search(flat)
    if fn and fn.group("name") not in ("if", "for", "while", "switch", "catch", "return", "sizeof", "decltype"):
        return "function", fn.group("name"), where[fn.start("name")]
    return "other", None, None


def _closing(code, i):
    """The offset after the `}` matching the `{` at offset i, or None."""
    depth = 0
    for k in range(i, len(code)):
        if code[k] == "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k + 1
    return None


def cpp_functions(code):
    """[(name, first line, last line)] of the function definitions at namespace and class scope of `code`
    (cpp_code's output), and the offset where the braces stop balancing or None."""
    newlines = [k for k, c in enumerate(code) if c == "\n"]
    line = lambda offset: bisect.bisect_left(newlines, offset) + 1  # noqa: E731
    found = []

    def scope(i, classes, top=False):
        """Reads declarations from offset i up to this scope's `}` (the file's end at the top); returns the offset
        after it and the offset where the braces stop balancing, or None."""
        start, head, parens = i, i, 0
        while i < len(code):
            c = code[i]
            if c in "([":
                parens += 1
            elif c in ")]":
                parens = max(parens - 1, 0)
            elif c == ";" and not parens:
                head = i + 1
            elif c == "}" and not parens:
                return (len(code), i) if top else (i + 1, None)
            elif c == "{":
                end = _closing(code, i)
                if end is None:
                    return len(code), i
                kind, name, at = ("other", None, None) if parens else _classify(code[head:i])
                if kind in ("namespace", "class"):
                    inner, bad = scope(i + 1, classes + [name] if kind == "class" else classes)
                    if bad is not None:
                        return len(code), bad
                    i = head = inner
                    continue
                if kind == "function":
                    found.append(("::".join(classes + [name]), line(head + at), line(end - 1)))
                    head = end
                i = end
                continue
            i += 1
        return len(code), (None if top else start - 1)

    return found, scope(0, [], top=True)[1]


def long_functions(root):
    """(functions checked, offences): Python functions outside test/ and C++ functions outside test/, bench/ and
    examples/ (Note [Reading C++ function spans]) longer than MAX_FUNCTION_LINES, and C++ files the scanner cannot
    read."""
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
                            bad.append(f"{os.path.relpath(path, root)}:{node.lineno} {node.name} ({lines} lines; at "
                                       f"most {MAX_FUNCTION_LINES} outside test/): split it by what it does")
    for top in CPP_TOPS:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(n for n in names if SOURCE.search(n)):
                path = os.path.relpath(os.path.join(dirpath, name), root)
                with open(os.path.join(root, path), errors="replace") as f:
                    code = cpp_code(f.read())
                functions, unbalanced = cpp_functions(code)
                checked += len(functions)
                if unbalanced is not None:
                    at = code.count("\n", 0, unbalanced) + 1
                    bad.append(f"{path}:{at}: the braces stop balancing here "
                               "(comments, literals and preprocessor lines set aside, each #if's first branch "
                               "kept), so its functions' lengths cannot be read; make each #if branch balance")
                bad += [f"{path}:{first} {fn} ({last - first + 1} lines; at most {MAX_FUNCTION_LINES} outside test/, "
                        "bench/, examples/): split it by what it does" for fn, first, last in functions
                        if last - first + 1 > MAX_FUNCTION_LINES]
    return checked, bad


def _package_modules(root):
    """{dotted name: path} of every module of the hpac package (harness included); a package is its __init__."""
    base = os.path.join(root, "plugin", "python")
    out = {}
    for dirpath, _, names in os.walk(os.path.join(base, "hpac")):
        for name in names:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, name), base)[:-3].split(os.sep)
                out[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = os.path.join(dirpath, name)
    return out


def package_import_cycles(root):
    """The import cycles inside the hpac package, counting every import: inside functions, under TYPE_CHECKING,
    relative or absolute. An edge goes to the module imported (`from hpac import plan`: hpac.plan; `from hpac import
    name`: hpac's __init__). Returns (modules, offences)."""
    modules = _package_modules(root)
    graph = {}
    for name, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    bad, state, stack = [], {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                bad.append("import cycle in the Python package: " + " -> ".join(stack[stack.index(n):] + [n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2
    for m in sorted(graph):
        if m not in state:
            visit(m)
    return len(modules), bad


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
    package_modules, cycle_bad = package_import_cycles(root)
    for line in bad + python_bad + bench_bad + long_bad + cycle_bad:
        print("layout:", line)
    print(f"layout: {checked} project includes checked, {len(bad)} against the map; {modules} library modules "
          f"checked, {len(python_bad)} importing from hpac.{HARNESS}; {bench_modules} bench modules checked, "
          f"{len(bench_bad)} editing sys.path or importing test code or another benchmark; {functions} Python and "
          f"C++ functions checked, {len(long_bad)} over {MAX_FUNCTION_LINES} lines; {package_modules} package modules "
          f"checked, {len(cycle_bad)} import cycles")
    return 1 if bad or python_bad or bench_bad or long_bad or cycle_bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")))
