"""graphalloc as PyTorch's CUDA allocator (no LD_PRELOAD).

    import graphalloc.torch as gat
    gat.install(config="max_split_size_mb:256")   # before anything initialises CUDA
    import torch
    x = torch.empty(1 << 20, device="cuda")         # served by graphalloc
    torch.cuda.memory_stats()["allocated_bytes.all.current"]   # graphalloc's statistics
    torch.cuda.get_allocator_backend()              # "graphalloc"

Two ways in, chosen by install(backend=...) or $GRAPHALLOC_TORCH_BACKEND (auto | allocator | pluggable):

  * "allocator" (what "auto" picks when it can): libgraphalloc_torch.so's C++ backend, a complete
    c10::cuda::CUDACachingAllocator::CUDAAllocator named "graphalloc", becomes PyTorch's CUDA allocator.
    Every PyTorch entry point is then served by graphalloc itself, with nothing patched: allocation and
    DataPtr frees, record_stream, empty_cache, memory fractions, memory_stats() and its peaks, cudnn's
    cacheInfo, CUDA graphs and torch.cuda.MemPool / use_mem_pool on graphalloc private pools, the
    checkpoint and restore torch.compile(mode="reduce-overhead") uses (expandable segments included),
    _record_memory_history() / _snapshot() / _dump_snapshot() in PyTorch's own format (memory_viz), OOM
    observers, and torch.cuda.OutOfMemoryError with graphalloc's figures. The library must be built against
    this very PyTorch version (python/CMakeLists.txt). torch.multiprocessing shares CUDA tensors, from
    expandable segments too, when their handles are shareable (GRAPHALLOC_CONF shareable_handles:True;
    docs/sharing.md).
  * "pluggable" (the fallback "auto" takes, with the reason in hooks()["backend"], when the backend cannot
    be used: no library, or one built for another PyTorch): torch.cuda.memory.CUDAPluggableAllocator over
    graphalloc's C ABI. Allocation, frees, record_stream, empty_cache and memory fractions reach graphalloc;
    statistics through torch.cuda.memory_stats() & co. are patched here (patch_torch=True); CUDA graph
    capture works through the shim's pool hooks when libgraphalloc_torch.so matches this PyTorch, and is
    refused with GraphCaptureUnsupported otherwise; torch.compile's CUDA graph trees, MemPool and PyTorch's
    snapshots do not work (PyTorch's pluggable allocator does not forward them): use snapshot() and
    record_history() here instead. Nor does CUDA IPC (sharing a CUDA tensor with torch.multiprocessing):
    it raises an error that says so.

Either way install() must run before CUDA is initialised: PyTorch cannot swap an allocator that has handed
out memory. backend() says which one is installed, hooks() how each PyTorch hook is served.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Any, Dict, Optional, Union

import graphalloc as _ga

try:
    import torch as _torch_module  # noqa: F401  (every function below needs it; fail here, clearly)
except ImportError as _error:
    raise ImportError(
        "graphalloc.torch needs PyTorch, which this Python cannot import (" + str(_error) + "). Install it "
        "(pip install torch), or use the graphalloc package alone: graphalloc.stats(), graphalloc.snapshot() "
        "and the pool functions need no PyTorch.") from _error

# The module's three concepts: installing graphalloc as PyTorch's allocator (here), CUDA graph pools
# (_torch_graph_pools) and the memory functions torch.cuda has (_torch_memory), over one shared state
# (_torch_state). What users call is re-exported here.
from graphalloc import _torch_graph_pools as _pools  # noqa: E402
from graphalloc import _torch_memory as _memory  # noqa: E402
from graphalloc import _torch_state as state  # noqa: E402
from graphalloc._torch_graph_pools import (  # noqa: E402,F401
    GraphCaptureUnsupported, graph_pool_id, graph_pool_stats, open_capture_routes, register_nccl)
from graphalloc._torch_memory import (  # noqa: E402,F401
    config, dump_snapshot, empty_cache, export_torch, max_memory_allocated, max_memory_reserved, memory_allocated,
    memory_reserved, memory_stats, memory_stats_as_nested_dict, record_history, record_stream,
    reset_accumulated_memory_stats, reset_peak_memory_stats, set_per_process_memory_fraction, sleep, sleep_state,
    snapshot, wake)

__all__ = [
    "install", "is_installed", "hooks", "memory_stats", "memory_stats_as_nested_dict", "memory_allocated",
    "max_memory_allocated", "memory_reserved", "max_memory_reserved", "empty_cache", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "set_per_process_memory_fraction", "record_stream", "record_history",
    "snapshot", "dump_snapshot", "export_torch", "config", "library_path", "graph_pool_id", "graph_pool_stats",
    "register_nccl",
    "open_capture_routes", "GraphCaptureUnsupported", "InstallError", "backend", "sleep", "wake", "sleep_state",
]

_BACKENDS = ("auto", "allocator", "pluggable")


class InstallError(RuntimeError):
    pass


def library_path() -> str:
    return _ga.library_path()


def _fn_address(name: str) -> Optional[int]:
    lib = _ga.library()
    if not hasattr(lib, name):
        return None
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def _wire_hook(native, setter: str, hook: str, native_name: str, signature, trampoline, target: str,
               unavailable: str) -> None:
    """Sets one of the pluggable allocator's hooks (PyTorch's `setter`, if it has one): to libgraphalloc's
    C function `native_name` when the library exports it, else to the Python `trampoline` (a C function of
    `signature`) calling `target`; records which in hooks()[hook]."""
    if not hasattr(native, setter):
        state.hooks[hook] = f"unavailable in this PyTorch: {unavailable}"
        return
    addr = _fn_address(native_name)
    if addr is not None:
        getattr(native, setter)(addr)
        state.hooks[hook] = f"native {native_name}"
        return
    fn = signature(trampoline)
    state.keepalive.append(fn)
    getattr(native, setter)(ctypes.cast(fn, ctypes.c_void_p).value)
    state.hooks[hook] = f"python trampoline -> {target}"


def _wire_hooks(native) -> None:
    """Sets the pluggable allocator's C-function-pointer hooks that PyTorch exposes to Python."""
    lib = _ga.library()

    def record_stream(ptr, stream):
        # graphalloc_record_stream needs the device: try the current one, then the others.
        for dev in state.candidate_devices():
            if lib.graphalloc_record_stream(ptr, dev, stream) == _ga.OK:
                return
        sys.stderr.write(f"graphalloc: record_stream({ptr:#x}): {_ga.last_error()}\n")

    def reset():
        for dev in sorted(state.devices_seen | {state.current_device_or_none() or 0}):
            if lib.graphalloc_empty_cache(dev) != _ga.OK:
                sys.stderr.write(f"graphalloc: empty_cache({dev}): {_ga.last_error()}\n")

    def fraction(fraction, device):
        state.devices_seen.add(int(device))
        if lib.graphalloc_set_memory_fraction(fraction, device) != _ga.OK:
            sys.stderr.write(f"graphalloc: set_memory_fraction: {_ga.last_error()}\n")

    # record_stream: void(void* ptr, cudaStream_t stream).
    _wire_hook(native, "set_record_stream_fn", "record_stream", "graphalloc_torch_record_stream",
               ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p), record_stream, "graphalloc_record_stream",
               "call graphalloc.torch.record_stream(t, s) after t.record_stream(s)")
    # reset (emptyCache): void().
    _wire_hook(native, "set_reset_fn", "empty_cache", "graphalloc_torch_empty_cache", ctypes.CFUNCTYPE(None),
               reset, "graphalloc_empty_cache", "call graphalloc.torch.empty_cache()")
    # memory fraction: void(double fraction, int device).
    _wire_hook(native, "set_memory_fraction_fn", "memory_fraction", "graphalloc_torch_set_memory_fraction",
               ctypes.CFUNCTYPE(None, ctypes.c_double, ctypes.c_int), fraction, "graphalloc_set_memory_fraction",
               "call graphalloc.torch.set_per_process_memory_fraction()")


# ---- installation: the C++ backend, or PyTorch's pluggable allocator over the C ABI ----

def _patch_torch(torch) -> None:
    """Routes PyTorch's stats entry points, which raise for a pluggable allocator, to graphalloc."""
    C = torch._C

    def _memory_stats(device):
        return _memory.nested(_ga.stats(state.device_index(device)))

    def _reset_peak(device):
        _ga.reset_peak_stats(state.device_index(device))

    def _reset_accumulated(device):
        _ga.reset_accumulated_stats(state.device_index(device))

    for name, fn in (("_cuda_memoryStats", _memory_stats), ("_cuda_resetPeakMemoryStats", _reset_peak),
                     ("_cuda_resetAccumulatedMemoryStats", _reset_accumulated)):
        if hasattr(C, name):
            setattr(C, name, fn)
    state.hooks["torch_stats"] = "torch.cuda.memory_stats() & co. patched to graphalloc"


def install(device: Union[int, str, None, Any] = None, config: Optional[str] = None,
            patch_torch: bool = True, hooks: bool = True, backend: Optional[str] = None):
    """Makes graphalloc PyTorch's CUDA allocator for this process; returns PyTorch's allocator object.

    Must run before anything initialises CUDA in PyTorch (the first CUDA tensor, torch.cuda.init(),
    torch.cuda.current_device(), ...). `config` (GRAPHALLOC_CONF syntax, e.g. "max_split_size_mb:256,
    record_history:True") is set as GRAPHALLOC_CONF for the allocators graphalloc creates on first use.
    `device` is the device the functions of this module use when theirs is None (default: the current
    one); graphalloc serves every device either way. `backend` ("auto", "allocator" or "pluggable"; default
    $GRAPHALLOC_TORCH_BACKEND, else "auto") picks the way in (see the module's documentation): "auto" takes
    the C++ backend when libgraphalloc_torch.so was built for this PyTorch and the pluggable path otherwise,
    saying why in hooks()["backend"]; "allocator" raises InstallError instead of falling back.
    The pluggable path only: with patch_torch, torch.cuda.memory_stats() and the functions built on it
    report graphalloc's statistics; hooks=False leaves the pluggable allocator's extra hooks (record_stream,
    empty_cache, memory fraction, CUDA graph pools) unset, and CUDA graph capture then raises
    GraphCaptureUnsupported. Calling install() again returns the same allocator.
    """
    import torch

    with state.lock:
        if state.allocator is not None:
            if config is not None and config != os.environ.get("GRAPHALLOC_CONF"):
                raise InstallError("graphalloc is already installed with GRAPHALLOC_CONF="
                                   f"{os.environ.get('GRAPHALLOC_CONF')!r}; cannot change it to {config!r}")
            return state.allocator
        choice = backend if backend is not None else os.environ.get("GRAPHALLOC_TORCH_BACKEND", "auto") or "auto"
        if choice not in _BACKENDS:
            raise InstallError(f"graphalloc.torch.install(): backend must be one of {', '.join(_BACKENDS)}, "
                               f"not {choice!r} (argument backend= or $GRAPHALLOC_TORCH_BACKEND)")
        if not torch.cuda.is_available():
            raise InstallError("graphalloc.torch.install(): PyTorch sees no CUDA device")
        if torch.cuda.is_initialized():
            raise InstallError(
                "graphalloc.torch.install() must run before CUDA is initialised: PyTorch cannot swap an "
                "allocator that already handed out memory. Call it first thing (before creating any CUDA "
                "tensor, model.cuda(), torch.cuda.init() or torch.cuda.current_device()).")
        if config is not None:
            os.environ["GRAPHALLOC_CONF"] = config
        os.environ.setdefault("GRAPHALLOC_DEVICE", "cuda")
        if os.environ["GRAPHALLOC_DEVICE"] == "sim":
            raise InstallError("GRAPHALLOC_DEVICE=sim: the simulated device cannot back PyTorch tensors")
        _ga.library()  # load it first: the shim binds to this very library (one set of allocators)
        shim, shim_reason = _pools.load_shim()
        allocator = None
        if choice != "pluggable":
            allocator, reason = _install_backend(torch, shim, shim_reason)
            if allocator is None and choice == "allocator":
                raise InstallError(f"graphalloc.torch.install(backend='allocator'): {reason}")
        else:
            reason = "the pluggable path was asked for (backend='pluggable' or $GRAPHALLOC_TORCH_BACKEND)"
        if allocator is not None:
            state.backend = "allocator"
            state.hooks["backend"] = (f"allocator: {state.shim_path} is PyTorch's CUDA allocator "
                                      f"(torch.cuda.get_allocator_backend() == 'graphalloc')")
        else:
            allocator = _install_pluggable(torch, shim, shim_reason, patch_torch, hooks)
            state.backend = "pluggable"
            state.hooks["backend"] = f"pluggable: torch.cuda.memory.CUDAPluggableAllocator, because {reason}"
        if device is not None:
            state.default_device = state.device_index(device, allow_uninitialised=True)
        state.allocator = allocator
        return allocator


def _install_backend(torch, shim, shim_reason: str):
    """Installs the C++ backend: (PyTorch's allocator object, "") or (None, why it could not)."""
    if shim is None:
        return None, shim_reason
    if not hasattr(shim, "graphalloc_torch_backend_install"):
        return None, f"{state.shim_path} has no PyTorch backend: rebuild it from this checkout"
    error = ctypes.create_string_buffer(4096)
    if shim.graphalloc_torch_backend_install(error, len(error)) != 0:
        raise InstallError(f"graphalloc.torch.install(): PyTorch refused graphalloc's allocator: "
                           f"{error.value.decode(errors='replace')}")
    for name in ("record_stream", "empty_cache", "memory_fraction", "torch_stats"):
        state.hooks[name] = "served by the backend (PyTorch's own entry points)"
    state.hooks["oom"] = f"raises torch.cuda.OutOfMemoryError (the backend, {state.shim_path})"
    state.hooks["graph_pools"] = (f"wired (the backend, {state.shim_path}): each CUDA graph capture and MemPool "
                                  "allocates from a graphalloc private pool")
    # PyTorch leaves a failed capture's route open (it raises before endAllocateToPool): the same clean-up as
    # the pluggable path's, through the backend's pool table.
    state.pool_table = _pools.backend_pool_table(shim)
    _pools.patch_capture_cleanup(torch, state.pool_table)
    return torch.cuda.memory._get_current_allocator(), ""


def _install_pluggable(torch, shim, shim_reason: str, patch_torch: bool, hooks: bool):
    """Installs graphalloc through torch.cuda.memory.CUDAPluggableAllocator; returns it."""
    if shim is not None:
        # The shim's malloc raises torch.cuda.OutOfMemoryError; its free is graphalloc_torch_free.
        allocator = torch.cuda.memory.CUDAPluggableAllocator(state.shim_path, "graphalloc_torch_shim_malloc",
                                                             "graphalloc_torch_shim_free")
        state.hooks["oom"] = f"raises torch.cuda.OutOfMemoryError ({state.shim_path})"
    else:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(_ga.library_path(), "graphalloc_torch_malloc",
                                                             "graphalloc_torch_free")
        state.hooks["oom"] = (f"NOT raised ({shim_reason}): a failed allocation gives a tensor at address 0; "
                              "memory_stats()['num_ooms'] counts them")
    if hooks:
        _wire_hooks(allocator.allocator())
        _pools.wire_graph_pools(allocator.allocator(), torch, shim, shim_reason)
    else:
        _pools.refuse_captures(torch, "install(hooks=False) leaves PyTorch's pool hooks unset")
        state.hooks["graph_pools"] = "unsupported, captures raise GraphCaptureUnsupported: install(hooks=False)"
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise InstallError(f"graphalloc.torch.install(): PyTorch refused the allocator ({e}); it must be "
                           "installed before CUDA is initialised") from e
    if patch_torch:
        _patch_torch(torch)
    _refuse_ipc(torch)
    return allocator


_PLUGGABLE_NO_IPC = ("graphalloc (pluggable path): this process cannot share CUDA tensors with other processes, "
                     "because PyTorch's CUDAPluggableAllocator has no way to export memory. Use graphalloc's C++ "
                     "backend (graphalloc.torch.install(backend='allocator'), with a libgraphalloc_torch.so built "
                     "for this PyTorch: python/CMakeLists.txt) and GRAPHALLOC_CONF=shareable_handles:True, or "
                     "send tensor.cpu() instead")


def _refuse_ipc(torch) -> None:
    """The pluggable path: sharing a CUDA storage raises graphalloc's explanation instead of PyTorch's
    "CUDAPluggableAllocator does not yet support shareIPcHandle"."""
    original = getattr(torch.UntypedStorage, "_share_cuda_", None)
    if original is None or getattr(original, "_graphalloc_refuses", False):
        return

    def _share_cuda_(self, *args, **kwargs):
        raise RuntimeError(_PLUGGABLE_NO_IPC)

    _share_cuda_._graphalloc_refuses = True
    torch.UntypedStorage._share_cuda_ = _share_cuda_


def backend() -> Optional[str]:
    """How graphalloc serves PyTorch: "allocator" (the C++ backend), "pluggable", or None before install()."""
    return state.backend


def is_installed() -> bool:
    return state.allocator is not None


def hooks() -> Dict[str, str]:
    """How each PyTorch hook is served (native C function, Python trampoline, or not available)."""
    return dict(state.hooks)


# CUDA graphs for PyTorch programs on graphalloc's graph tree (torch_graphs.py): drop-in graphed callables
# and graphed steps, imported on first use (they need more of PyTorch than installing the allocator does).
_GRAPH_NAMES = ("make_graphed_callables", "graphed", "GraphedFunction", "graph_memory", "GraphBackendError")
__all__ += list(_GRAPH_NAMES)


def __getattr__(name: str):
    if name in _GRAPH_NAMES:
        from graphalloc import torch_graphs
        return getattr(torch_graphs, name)
    raise AttributeError(f"module 'graphalloc.torch' has no attribute {name!r}")
