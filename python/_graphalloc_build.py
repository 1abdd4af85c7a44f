"""The build backend of `pip install ./python` (PEP 517, in-tree: pyproject.toml's backend-path), with no
dependency at all, so that `pip install --no-build-isolation ./python` works offline in a fresh virtual
environment. setuptools needs the `wheel` package for that, which a fresh venv does not have ("invalid command
'bdist_wheel'"), and it writes build/ and graphalloc.egg-info/ into the checkout. This writes nothing there:
a wheel is a zip of the package, its metadata and a RECORD of hashes, made straight into pip's directory.

The wheel holds the package (python/graphalloc/*.py) and, when they are built, libgraphalloc.so,
libgraphalloc_torch.so and the `graphalloc` CLI (bin/graphalloc), so that the installed package finds all
three beside itself, and the checkout it came from (_source_dir.txt), so that a library built there later
is found too. Where the built files are taken from, first found: $GRAPHALLOC_LIBRARY (the library; the
others beside it); $GRAPHALLOC_BUILD_DIR; the checkout's build*/ folders (build/ first). $GRAPHALLOC_CLI
names the CLI. The metadata (name, version, description, extras) is pyproject.toml's [project] table.
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import sysconfig
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent
PACKAGE = "graphalloc"


def _project() -> Dict[str, str]:
    """name, version, description and requires-python from pyproject.toml (the few flat keys this needs;
    Python before 3.11 has no TOML reader)."""
    text = (HERE / "pyproject.toml").read_text()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    out = {}
    for key in ("name", "version", "description", "requires-python"):
        m = re.search(rf'^{key} = "([^"]*)"', project, re.MULTILINE)
        if m is None:
            raise RuntimeError(f"python/pyproject.toml: [project] has no {key}")
        out[key] = m.group(1)
    return out


def _built_dir() -> Optional[Path]:
    """The build folder whose libgraphalloc.so goes into the wheel, or None."""
    env = os.environ.get("GRAPHALLOC_LIBRARY")
    if env and Path(env).is_file():
        return Path(env).resolve().parent
    dirs: List[Path] = []
    if os.environ.get("GRAPHALLOC_BUILD_DIR"):
        dirs.append(Path(os.environ["GRAPHALLOC_BUILD_DIR"]))
    dirs.append(CHECKOUT / "build")
    dirs += sorted(p for p in CHECKOUT.glob("build*") if p.is_dir() and p != CHECKOUT / "build")
    for d in dirs:
        if (d / "libgraphalloc.so").is_file():
            return d.resolve()
    return None


def _files() -> List[Tuple[str, bytes, bool]]:
    """(path in the wheel, contents, executable) of every file of the package."""
    files = [(f"{PACKAGE}/{p.name}", p.read_bytes(), False) for p in sorted((HERE / PACKAGE).glob("*.py"))]
    files.append((f"{PACKAGE}/_source_dir.txt", (str(CHECKOUT) + "\n").encode(), False))
    built = _built_dir()
    if built is None:
        print("graphalloc: no built libgraphalloc.so found; installing the package without it")
        return files
    library = Path(os.environ["GRAPHALLOC_LIBRARY"]) if os.environ.get("GRAPHALLOC_LIBRARY") else built / "libgraphalloc.so"
    files.append((f"{PACKAGE}/libgraphalloc.so", library.read_bytes(), False))
    if (built / "libgraphalloc_torch.so").is_file():
        files.append((f"{PACKAGE}/libgraphalloc_torch.so", (built / "libgraphalloc_torch.so").read_bytes(), False))
    for graphs in sorted(built.glob("_torch_graphs*.so")):  # the PyTorch graph front ends' module
        files.append((f"{PACKAGE}/{graphs.name}", graphs.read_bytes(), False))
    cli = Path(os.environ["GRAPHALLOC_CLI"]) if os.environ.get("GRAPHALLOC_CLI") else built / "tools" / "graphalloc"
    if cli.is_file():
        files.append((f"{PACKAGE}/bin/graphalloc", cli.read_bytes(), True))
    print(f"graphalloc: packaged {library}" + (f" and {cli}" if cli.is_file() else ""))
    return files


def _tag() -> str:
    """py3-none-<platform>: the package carries native libraries, for this platform only."""
    return "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")


def _metadata(project: Dict[str, str]) -> bytes:
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {project['version']}",
             f"Summary: {project['description']}", f"Requires-Python: {project['requires-python']}",
             "License: BSD-3-Clause", "Provides-Extra: torch", "Requires-Dist: torch; extra == \"torch\""]
    readme = HERE / "README.md"
    if readme.is_file():
        lines.append("Description-Content-Type: text/markdown")
        return ("\n".join(lines) + "\n\n" + readme.read_text()).encode()
    return ("\n".join(lines) + "\n").encode()


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_wheel(directory: str, files: List[Tuple[str, bytes, bool]]) -> str:
    project = _project()
    name = f"{project['name']}-{project['version']}"
    dist_info = f"{name}.dist-info"
    tag = _tag()
    files = files + [
        (f"{dist_info}/METADATA", _metadata(project), False),
        (f"{dist_info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: graphalloc\nRoot-Is-Purelib: false\nTag: {tag}\n").encode(),
         False),
        (f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode(), False),
    ]
    license_file = CHECKOUT / "LICENSE"
    if license_file.is_file():
        files.append((f"{dist_info}/LICENSE", license_file.read_bytes(), False))
    record = "".join(f"{path},{_hash(data)},{len(data)}\n" for path, data, _ in files) + f"{dist_info}/RECORD,,\n"
    wheel_name = f"{name}-{tag}.whl"
    with zipfile.ZipFile(Path(directory) / wheel_name, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data, executable in files + [(f"{dist_info}/RECORD", record.encode(), False)]:
            info = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o100755 if executable else 0o100644) << 16  # a regular file, its mode
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return wheel_name


# ---- PEP 517 / PEP 660 hooks ----

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """An editable install: a .pth file that puts python/ on sys.path; the package then finds the library
    and the CLI in the checkout's build folders."""
    return _write_wheel(wheel_directory, [("graphalloc_editable.pth", (str(HERE) + "\n").encode(), False)])
