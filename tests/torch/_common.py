"""Shared by the tests in tests/torch: skip cleanly (exit 77, CTest's SKIP_RETURN_CODE) without PyTorch or a
GPU, find the graphalloc package and CLI, run helper subprocesses."""
import os
import subprocess
import sys
from pathlib import Path

SKIP = 77
HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))


def skip(reason: str) -> None:
    print(f"SKIP: {reason}", flush=True)
    sys.exit(SKIP)


def require_torch(gpu: bool = True) -> None:
    """Exits with SKIP unless PyTorch (and, with gpu, a CUDA device) is there. Does not initialise CUDA in
    PyTorch (torch.cuda.is_available() only counts devices), so graphalloc can still be installed."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        skip(f"PyTorch is not installed ({e})")
    import torch
    if gpu and not torch.cuda.is_available():
        skip("PyTorch sees no CUDA device")


def cli() -> str:
    import graphalloc
    path = graphalloc.cli_path()
    if path is None:
        raise AssertionError("graphalloc CLI not found: set GRAPHALLOC_CLI")
    return path


def run(cmd, env=None, timeout=600, check=True) -> subprocess.CompletedProcess:
    """Runs cmd, echoing it and its output (visible with ctest --output-on-failure)."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    print("$", " ".join(str(c) for c in cmd), flush=True)
    r = subprocess.run([str(c) for c in cmd], env=full_env, capture_output=True, text=True, timeout=timeout)
    if r.stdout:
        print(r.stdout[-4000:], end="" if r.stdout.endswith("\n") else "\n")
    if r.stderr:
        print(r.stderr[-4000:], end="" if r.stderr.endswith("\n") else "\n", file=sys.stderr)
    if check and r.returncode != 0:
        raise AssertionError(f"{cmd[0]} ... exited with {r.returncode}")
    return r


def out_dir(name: str) -> Path:
    """A folder for a test's files: $GRAPHALLOC_TEST_OUT/name if set (kept), else a fresh temporary one."""
    base = os.environ.get("GRAPHALLOC_TEST_OUT")
    if base:
        p = Path(base) / name
        p.mkdir(parents=True, exist_ok=True)
        return p
    import tempfile
    return Path(tempfile.mkdtemp(prefix=f"graphalloc_{name}_"))


def install_graphalloc():
    """graphalloc.torch.install(), then CUDA started in PyTorch; returns (graphalloc.torch, torch)."""
    import graphalloc.torch as gat
    gat.install()
    import torch
    torch.cuda.init()
    print("hooks:", gat.hooks(), flush=True)
    return gat, torch
