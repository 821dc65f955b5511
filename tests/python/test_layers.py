"""The folders of src/ are layers, each depending only on those below it, and the engine (src/core)
special-cases no algorithm: what differs between algorithms is a descriptor trait (src/algos/).

Read from the #include lines of the C++ sources, so a new include that points upwards, or an
algorithm named in the engine, fails here rather than in a review; and the Python package's modules
import each other without a cycle.
"""

import ast
import pathlib
import re

from fusedopt import _C

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

# Each folder of src/ and its layer: a file may include its own folder and folders of a lower
# layer only (folders of one layer are independent of each other). The public headers
# (include/fusedopt/) are below all of them.
LAYERS = {
    "math": 0,  # the math bodies, scalar and SIMD alike
    "core": 1,  # the engine: plan, loop dispatch, generic step templates, training step, runtime
    "algos": 2,  # the descriptors, and the step functions instantiated from the registry
    "cpu": 3,  # the per-target kernels each descriptor declares
    "optimizer": 3,  # Optimizer<Hyper>: the stateful API
    "distributed": 4,  # DistributedOptimizer: data parallel and ZeRO-1 over a Communicator
    "checkpoint": 5,  # checkpoints of Optimizer and DistributedOptimizer
    "mpi": 5,  # the MPI Communicator
    "python": 6,  # the Python bindings
    # the Python step's unchanged-step check over torch's C++ tensors, which runs the step _C prepared
    # (src/python/prepared_step.h)
    "python_torch": 7,
    "torch": 6,  # the libtorch adapter
    "tool_util": 6,  # what the tools share
    "baselines": 7,  # the for-loop step and traffic ceiling the fused step is timed against
    "doctor": 8,  # `fusedopt doctor`
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"src/([a-z_]+)/', re.MULTILINE)

# Any algorithm's name (its descriptor, Hyper struct, state enum, step function: each spelled from the stem of
# the descriptor's Hyper struct, "<Stem>Hyper") or an include of the algorithms' folder.
STEMS = sorted(entry["hyper"].__name__.removesuffix("Hyper") for entry in _C.algorithms.values())
ALGORITHM_NAME = re.compile("|".join(["src/algos", *map(re.escape, STEMS)]))


def sources(folder):
    return sorted(p for p in folder.rglob("*") if p.suffix in {".h", ".cc"})


def test_every_folder_has_a_layer():
    folders = {p.name for p in SRC.iterdir() if p.is_dir() and sources(p)}
    assert folders <= set(LAYERS), f"folders without a layer in LAYERS: {folders - set(LAYERS)}"


def test_folders_include_only_lower_layers():
    upward = []
    for folder in sorted(p for p in SRC.iterdir() if p.is_dir() and p.name in LAYERS):
        for path in sources(folder):
            for target in INCLUDE.findall(path.read_text(encoding="utf-8")):
                if target == folder.name:
                    continue
                if target not in LAYERS or LAYERS[target] >= LAYERS[folder.name]:
                    upward.append(f"{path.relative_to(ROOT)} includes src/{target}/")
    assert not upward, "includes that do not point to a lower layer:\n" + "\n".join(upward)


def test_public_headers_include_only_public_headers():
    wrong = []
    for path in sources(ROOT / "include" / "fusedopt"):
        for target in INCLUDE.findall(path.read_text(encoding="utf-8")):
            wrong.append(f"{path.relative_to(ROOT)} includes src/{target}/")
    assert not wrong, "\n".join(wrong)


def test_core_names_no_algorithm():
    named = []
    for path in sources(SRC / "core"):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if ALGORITHM_NAME.search(line):
                named.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not named, "src/core names an algorithm (make it a descriptor trait):\n" + "\n".join(
        named
    )


def python_imports(package):
    """{module: the package's modules it imports}, every import (top-level or inside a function)
    included: an import deferred into a function to dodge a cycle is still the cycle."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = here.split(".")[: len(here.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                targets |= {module} | {f"{module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        # A module may import its own package's __init__ (the public names); the package is the root.
        graph[name] = {t for t in targets if t in modules and t != name and t != package.name}
    return graph


def import_cycle(graph):
    """One cycle of the graph as [a, b, ..., a], or None."""
    state, path = {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_python_package_has_no_import_cycle():
    cycle = import_cycle(python_imports(ROOT / "python" / "fusedopt"))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_cycle_check_finds_a_cycle():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": set()}) is None
