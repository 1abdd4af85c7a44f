"""Builds the graphalloc wheel with the built libraries inside, so that an installed `import graphalloc`
finds libgraphalloc.so beside the package, and records the checkout it came from, so that a library built
there later is found too (graphalloc._candidates). The metadata is in pyproject.toml.

Where it takes libgraphalloc.so from, first found: $GRAPHALLOC_LIBRARY; $GRAPHALLOC_BUILD_DIR; the
checkout's build*/ folders (build/ first). libgraphalloc_torch.so is taken from the same folder when there.
Without a library the package installs alone and says at import time where it looked."""
import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent


def _find_library():
    env = os.environ.get("GRAPHALLOC_LIBRARY")
    if env and Path(env).is_file():
        return Path(env).resolve()
    dirs = []
    if os.environ.get("GRAPHALLOC_BUILD_DIR"):
        dirs.append(Path(os.environ["GRAPHALLOC_BUILD_DIR"]))
    dirs.append(CHECKOUT / "build")
    dirs += sorted(p for p in CHECKOUT.glob("build*") if p.is_dir() and p != CHECKOUT / "build")
    for d in dirs:
        if (d / "libgraphalloc.so").is_file():
            return (d / "libgraphalloc.so").resolve()
    return None


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "graphalloc"
        target.mkdir(parents=True, exist_ok=True)
        (target / "_source_dir.txt").write_text(str(CHECKOUT) + "\n")
        library = _find_library()
        if library is None:
            print("graphalloc: no built libgraphalloc.so found; installing the package without it")
            return
        shutil.copyfile(library, target / "libgraphalloc.so")
        shim = library.parent / "libgraphalloc_torch.so"
        if shim.is_file():
            shutil.copyfile(shim, target / "libgraphalloc_torch.so")
        for graphs in library.parent.glob("_torch_graphs*.so"):  # the graph front ends' module
            shutil.copyfile(graphs, target / graphs.name)
        print(f"graphalloc: packaged {library}")


setup(cmdclass={"build_py": BuildPyWithLibrary})
