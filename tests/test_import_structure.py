"""The import structure of the library: no cycle among its packages, the callbacks included.

``callbacks/`` sits at the top of the repository and installs as ``yolo3.callbacks`` (in a
checkout, ``yolo3/callbacks`` is a symbolic link to it), which tools that read the tree do
not follow. Here it is read as the package it installs as. Every import counts, those inside
functions too: a lazy import still makes the importing package depend on the imported one.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Folder -> the package it installs as.
PACKAGES = {ROOT / "yolo3": "yolo3", ROOT / "callbacks": "yolo3.callbacks"}


def library_modules():
    """``{module name: (path, is a package's __init__)}`` of ``yolo3`` and ``callbacks``."""
    modules = {}
    for folder, package in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            relative = path.relative_to(folder)
            if relative.parts[0] == "callbacks" and package == "yolo3":
                continue  # the symbolic link: read as callbacks/ itself
            parts = [package, *relative.with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def imported_modules(name, path, is_package, modules):
    """The library modules that ``name`` imports, anywhere in its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def package_of(module):
    """The room a module belongs to: ``yolo3.engine.trainer`` -> ``yolo3.engine``; a module
    directly in ``yolo3`` is a room of its own."""
    return ".".join(module.split(".")[:2])


def package_graph():
    modules = library_modules()
    edges = {}
    for name, (path, is_package) in modules.items():
        for target in imported_modules(name, path, is_package, modules):
            source, destination = package_of(name), package_of(target)
            if source != destination and "yolo3" not in (source, destination):
                edges.setdefault(source, {}).setdefault(destination, f"{name} -> {target}")
    return edges


def find_cycle(edges):
    """One cycle of ``edges`` as a list of the imports that make it, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        for target, why in sorted(edges.get(node, {}).items()):
            stack.append(why)
            if state.get(target) == "open":
                start = next(
                    i for i, w in enumerate(stack) if package_of(w.split(" -> ")[0]) == target
                )
                return stack[start:]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
            stack.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_packages_import_each_other_without_a_cycle():
    edges = package_graph()
    assert "yolo3.callbacks" in edges  # the symbolic link's package is read
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle between packages: " + "; ".join(cycle)


def test_the_cycle_finder_sees_a_cycle():
    edges = {
        "p.a": {"p.b": "p.a.x -> p.b.y"},
        "p.b": {"p.c": "p.b.y -> p.c.z"},
        "p.c": {"p.b": "p.c.z -> p.b.w"},
    }
    assert find_cycle(edges) == ["p.b.y -> p.c.z", "p.c.z -> p.b.w"]
    assert find_cycle({"p.a": {"p.b": "p.a.x -> p.b.y"}, "p.b": {}}) is None
