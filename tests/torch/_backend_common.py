"""Shared by the backend_*_test.py scripts: graphalloc installed as PyTorch's CUDA allocator through the C++
backend (a c10::cuda::CUDACachingAllocator::CUDAAllocator subclass named "graphalloc", from
libgraphalloc_torch.so). Skips (exit 77) without PyTorch, a GPU or the shim; fails when the shim was built but
install() fell back to the pluggable path (the reason is in graphalloc.torch.hooks()["backend"])."""
import os
import sys

import _common

MiB = 1 << 20


def require_backend_build() -> None:
    """Exit 77 unless PyTorch, a GPU and libgraphalloc_torch.so (CTest sets GRAPHALLOC_TORCH_SHIM) are there."""
    _common.require_torch()
    if not os.environ.get("GRAPHALLOC_TORCH_SHIM") and os.environ.get("GRAPHALLOC_EXPECT_BACKEND") != "1":
        _common.skip("libgraphalloc_torch.so was not built (GRAPHALLOC_TORCH_SHIM unset): no allocator backend")


def install_backend(config=None):
    """graphalloc.torch.install() (backend "auto"), CUDA started; returns (graphalloc.torch, torch). Raises AssertionError when the C++ backend is not the one in use."""
    import graphalloc.torch as gat
    kwargs = {} if config is None else {"config": config}
    gat.install(**kwargs)  # backend="auto": the C++ backend when the shim was built for this PyTorch
    import torch
    torch.cuda.init()
    h = gat.hooks()
    print("hooks:", h, flush=True)
    backend = gat.backend() if hasattr(gat, "backend") else "pluggable (graphalloc.torch has no backend())"
    if backend != "allocator":
        raise AssertionError(f"graphalloc.torch.backend() is {backend!r}, not 'allocator': "
                             f"{h.get('backend', '(no backend entry in hooks())')}")
    return gat, torch


def ga_stats(device: int = 0) -> dict:
    """graphalloc's own statistics through its C ABI (not through PyTorch)."""
    import graphalloc as ga
    fn = getattr(ga, "memory_stats", None) or ga.stats
    return dict(fn(device))


def run_main(unittest_main_kwargs=None) -> None:
    require_backend_build()
    import unittest
    unittest.main(verbosity=2, **(unittest_main_kwargs or {}))


def child_env(extra=None) -> dict:
    env = dict(os.environ)
    env.update(extra or {})
    return env


def here_path(name: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


def python() -> str:
    return sys.executable
