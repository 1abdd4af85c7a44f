#!/usr/bin/env python3
"""Checks that every library source file includes only headers of its own layer or of layers below it.

The layers, their folders and what each may link are declared once, in CMake (cmake/GraphallocLayers.cmake
writes them to a manifest at configure time); docs/architecture.md explains them. A file belongs to the
layer whose folder is the longest prefix of its path. Library files must write project includes as
"graphalloc/<folder>/<file>.h" and must not include anything outside the library (tests, tools, bench,
examples, python). Every spelling is checked: quoted, angled (<graphalloc/...>, which the layers' include
roots resolve as they resolve the quoted one) and relative ("../rng/x.h", "x.h" next to the file), which
the compiler resolves from the including file's folder whatever the include path, so only this test can
refuse it. Prints one line per violation (file:line, what it includes, why) and exits 1 if there is any,
0 otherwise.

usage: check_layers.py MANIFEST SOURCE_ROOT
The manifest has one line per layer, bottom first: "<name> <folder> <dep>,<dep>,..." ("-" for none).
"""
import re
import sys
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)')
SOURCE_SUFFIXES = {".h", ".cc", ".cu", ".cuh", ".inc"}
OUTSIDE_LIBRARY = ("tests/", "tools/", "bench/", "examples/", "python/")
PROJECT_FOLDERS = ("allocator/", "graph/", "rng/", "lifetime/") + OUTSIDE_LIBRARY


def read_manifest(path):
    layers = []  # (name, folder, deps) bottom first
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 3:
            sys.exit(f"{path}:{number}: expected '<name> <folder> <deps>', got {line!r}")
        name, folder, deps = parts
        layers.append((name, folder.rstrip("/"), [] if deps == "-" else deps.split(",")))
    return layers


def allowed_layers(layers):
    """Each layer's own name plus everything it reaches through its deps; errors for deps not below it."""
    problems, reach, seen = [], {}, set()
    for name, _, deps in layers:
        closure = {name}
        for dep in deps:
            if dep not in seen:
                problems.append(f"layer {name} depends on {dep}, which is not a layer below it")
                continue
            closure |= reach[dep]
        reach[name] = closure
        seen.add(name)
    return reach, problems


def layer_of(relative, layers):
    best = None
    for name, folder, _ in layers:
        if relative == folder or relative.startswith(folder + "/"):
            if best is None or len(folder) > len(best[1]):
                best = (name, folder)
    return best[0] if best else None


def check(manifest, root):
    layers = read_manifest(manifest)
    reach, problems = allowed_layers(layers)
    root = Path(root)
    for name, folder, _ in layers:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
                continue
            relative = path.relative_to(root).as_posix()
            if layer_of(relative, layers) != name:
                continue  # a file of a layer nested in this folder
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                quoted, angled = match.group(1), match.group(2)
                included = quoted if quoted is not None else angled
                where = (f"{relative}:{number}: includes \"{included}\"" if quoted is not None
                         else f"{relative}:{number}: includes <{included}>")
                if quoted is not None and not included.startswith("graphalloc/"):
                    beside = (path.parent / included).resolve()
                    if beside.is_file() and root.resolve() in beside.parents:
                        target = beside.relative_to(root.resolve()).as_posix()
                        problems.append(f"{where}: a relative include, which no include path can refuse: write "
                                        f"\"graphalloc/{target}\"")
                        continue
                if included.startswith(PROJECT_FOLDERS):
                    problems.append(f"{where}: write project includes as \"graphalloc/{included}\"")
                    continue
                if not included.startswith("graphalloc/"):
                    continue  # a third-party or system header, or one generated into the build tree
                target = included[len("graphalloc/"):]
                if target.startswith(OUTSIDE_LIBRARY):
                    problems.append(f"{where}: the library never includes tests, tools, bench, examples or python")
                    continue
                target_layer = layer_of(target, layers)
                if target_layer is None:
                    problems.append(f"{where}: no layer holds that folder")
                elif target_layer not in reach[name]:
                    problems.append(f"{where}: layer {name} may not include layer {target_layer} (allowed: "
                                    f"{', '.join(sorted(reach[name]))}; docs/architecture.md)")
    return problems


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    problems = check(argv[1], argv[2])
    for problem in problems:
        print(problem)
    print(f"layering: {len(problems)} violation(s)" if problems else "layering: every include runs downward")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
