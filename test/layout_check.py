"""Checks the include direction drawn in docs/design.md ("The map"): every `#include "…"` of a project file names
a file of its own folder or of a folder it may depend on; and the few files that must stay apart inside a folder
(NOT_INCLUDED) do, directly or through other project headers. Prints each offending include and exits 1.

Usage: python3 test/layout_check.py [PROJECT_ROOT]
"""
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
    for line in bad:
        print("layout:", line)
    print(f"layout: {checked} project includes checked, {len(bad)} against the map")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")))
