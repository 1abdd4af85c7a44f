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
import json
import os
import sys
import tempfile
import threading
import types
from typing import Any, Dict, List, Optional, Union

import graphalloc as _ga

try:
    import torch as _torch_module  # noqa: F401  (every function below needs it; fail here, clearly)
except ImportError as _error:
    raise ImportError(
        "graphalloc.torch needs PyTorch, which this Python cannot import (" + str(_error) + "). Install it "
        "(pip install torch), or use the graphalloc package alone: graphalloc.stats(), graphalloc.snapshot() "
        "and the pool functions need no PyTorch.") from _error

__all__ = [
    "install", "is_installed", "hooks", "memory_stats", "memory_stats_as_nested_dict", "memory_allocated",
    "max_memory_allocated", "memory_reserved", "max_memory_reserved", "empty_cache", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "set_per_process_memory_fraction", "record_stream", "record_history",
    "snapshot", "dump_snapshot", "export_torch", "config", "library_path", "graph_pool_id", "graph_pool_stats",
    "register_nccl",
    "open_capture_routes", "GraphCaptureUnsupported", "InstallError", "backend", "sleep", "wake", "sleep_state",
]

_state_lock = threading.Lock()
_allocator = None            # torch.cuda.memory.CUDAPluggableAllocator once installed
_default_device: Optional[int] = None
_hooks: Dict[str, str] = {}
_keepalive: List[Any] = []   # ctypes trampolines PyTorch holds raw pointers to: never collected
_devices_seen = set()
_backend: Optional[str] = None   # "allocator" or "pluggable" once installed
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
        _hooks[hook] = f"unavailable in this PyTorch: {unavailable}"
        return
    addr = _fn_address(native_name)
    if addr is not None:
        getattr(native, setter)(addr)
        _hooks[hook] = f"native {native_name}"
        return
    fn = signature(trampoline)
    _keepalive.append(fn)
    getattr(native, setter)(ctypes.cast(fn, ctypes.c_void_p).value)
    _hooks[hook] = f"python trampoline -> {target}"


def _wire_hooks(native) -> None:
    """Sets the pluggable allocator's C-function-pointer hooks that PyTorch exposes to Python."""
    lib = _ga.library()

    def record_stream(ptr, stream):
        # graphalloc_record_stream needs the device: try the current one, then the others.
        for dev in _candidate_devices():
            if lib.graphalloc_record_stream(ptr, dev, stream) == _ga.OK:
                return
        sys.stderr.write(f"graphalloc: record_stream({ptr:#x}): {_ga.last_error()}\n")

    def reset():
        for dev in sorted(_devices_seen | {_current_device_or_none() or 0}):
            if lib.graphalloc_empty_cache(dev) != _ga.OK:
                sys.stderr.write(f"graphalloc: empty_cache({dev}): {_ga.last_error()}\n")

    def fraction(fraction, device):
        _devices_seen.add(int(device))
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


# ---- libgraphalloc_torch.so: out-of-memory errors and CUDA graph pools (python/csrc/torch_shim.cc) ----

_SHIM_NAMES = ("libgraphalloc_torch.so",)
_POOL_SETTERS = (("set_begin_allocate_to_pool", "begin_allocate_to_pool"),
                 ("set_end_allocate_to_pool_fn", "end_allocate_to_pool"),
                 ("set_release_pool", "release_pool"))
_shim: Optional[ctypes.CDLL] = None
_shim_path: Optional[str] = None
# What answers about PyTorch's pools (graphalloc_torch_shim_* functions): the shim's table on the pluggable
# path, the backend's (through _backend_pool_table) once the backend is installed.
_pool_table: Any = None
_ull, _ull_p = ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_ulonglong)
# The pool table's functions, which libgraphalloc_torch.so exports for each of its two tables with the same
# signatures: (graphalloc_torch_shim_ name, graphalloc_torch_backend_ name, restype, argtypes).
_POOL_TABLE_FUNCTIONS = (
    ("last_begun", "last_begun", ctypes.c_int, [ctypes.POINTER(ctypes.c_int), _ull_p, _ull_p]),
    ("pool_of", "route_of", ctypes.c_int,
     [ctypes.c_int, _ull, _ull, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_int)]),
    ("abandon", "abandon", None, [ctypes.c_int, _ull, _ull, ctypes.c_int]),
    ("open_routes", "open_routes", ctypes.c_int, []),
)


class GraphCaptureUnsupported(RuntimeError):
    """A CUDA graph capture was refused: graphalloc cannot give it a private pool in this setup."""


def _find_shim() -> "tuple[Optional[str], str]":
    """(path of libgraphalloc_torch.so, "") or (None, why not). $GRAPHALLOC_TORCH_SHIM: a path, or off."""
    env = os.environ.get("GRAPHALLOC_TORCH_SHIM")
    if env is not None and env.strip().lower() in ("", "0", "off", "none", "false"):
        return None, f"libgraphalloc_torch.so disabled by GRAPHALLOC_TORCH_SHIM={env!r}"
    if env:
        if os.path.isfile(env):
            return os.path.realpath(env), ""
        return None, f"GRAPHALLOC_TORCH_SHIM={env!r} names no file"
    lib_dir = os.path.dirname(_ga.library_path())
    here = os.path.dirname(os.path.abspath(__file__))
    looked = []
    for d in (lib_dir, here, os.path.join(here, os.pardir, "lib")):
        for name in _SHIM_NAMES:
            p = os.path.join(d, name)
            looked.append(p)
            if os.path.isfile(p):
                return os.path.realpath(p), ""
    return None, ("libgraphalloc_torch.so not found (it is built with the rest when python3 imports PyTorch: "
                  "python/CMakeLists.txt; or set GRAPHALLOC_TORCH_SHIM). Looked at: " + ", ".join(looked))


def _load_shim() -> "tuple[Optional[ctypes.CDLL], str]":
    """Loads the shim after libgraphalloc.so (so that it binds to that very library: one set of allocators)."""
    global _shim, _shim_path, _pool_table
    if _shim is not None:
        return _shim, ""
    path, reason = _find_shim()
    if path is None:
        return None, reason
    _ga.library()
    try:
        shim = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    except OSError as e:
        return None, f"cannot load {path}: {e}"
    for name in ("graphalloc_torch_shim_malloc", "graphalloc_torch_shim_free", "graphalloc_torch_shim_hook",
                 "graphalloc_torch_shim_built_for"):
        if not hasattr(shim, name):
            return None, f"{path} does not export {name}: rebuild it from this checkout"
    # Its C++ types and ABI are those of the PyTorch it was compiled against: no other will do.
    _declare(shim, [("graphalloc_torch_shim_built_for", ctypes.c_char_p, [])])
    built_for = (shim.graphalloc_torch_shim_built_for() or b"").decode()
    import torch
    if built_for != torch.__version__:
        return None, (f"{path} was built for PyTorch {built_for or '(unknown)'}, this is {torch.__version__}: "
                      "rebuild it (cmake --build BUILD --target graphalloc_torch)")
    _declare(shim, [("graphalloc_torch_shim_hook", ctypes.c_void_p, [ctypes.c_char_p]),
                    ("graphalloc_torch_shim_pool_hooks_unavailable", ctypes.c_char_p, [])])
    _declare(shim, [(f"graphalloc_torch_shim_{name}", restype, argtypes)
                    for name, _, restype, argtypes in _POOL_TABLE_FUNCTIONS])
    if hasattr(shim, "graphalloc_torch_backend_install"):
        _declare(shim, [("graphalloc_torch_backend_install", ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t])])
        _declare(shim, [(f"graphalloc_torch_backend_{name}", restype, argtypes)
                        for _, name, restype, argtypes in _POOL_TABLE_FUNCTIONS])
    _shim, _shim_path, _pool_table = shim, path, shim
    return shim, ""


def _declare(lib, signatures) -> None:
    """Sets the result and argument types of each (name, restype, argtypes) on `lib`'s function."""
    for name, restype, argtypes in signatures:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


def _last_begun(shim) -> Optional[tuple]:
    dev, first, second = ctypes.c_int(0), ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)
    if not shim.graphalloc_torch_shim_last_begun(ctypes.byref(dev), ctypes.byref(first), ctypes.byref(second)):
        return None
    return (dev.value, first.value, second.value)


def _pool_of(shim, device: int, first: int, second: int) -> "tuple[Optional[int], bool]":
    pool, route_open = ctypes.c_uint64(0), ctypes.c_int(0)
    found = shim.graphalloc_torch_shim_pool_of(int(device), int(first), int(second), ctypes.byref(pool),
                                               ctypes.byref(route_open))
    return (pool.value if found else None), bool(route_open.value)


def _wire_graph_pools(native, torch, shim, shim_reason: str) -> None:
    """Sets PyTorch's pool hooks to the shim's; if that cannot be done, makes every capture raise why."""
    missing = [setter for setter, _ in _POOL_SETTERS if not hasattr(native, setter)]
    reason = ""
    if shim is None:
        reason = shim_reason
    elif missing:
        reason = (f"this PyTorch ({torch.__version__}) has no {', '.join(missing)} on its pluggable allocator, "
                  "so it cannot tell an allocator which allocations belong to a graph")
    else:
        unavailable = shim.graphalloc_torch_shim_pool_hooks_unavailable()
        if unavailable:
            reason = f"{_shim_path} was built without the pool hooks: {unavailable.decode()}"
    if not reason:
        addresses = {setter: shim.graphalloc_torch_shim_hook(hook.encode()) for setter, hook in _POOL_SETTERS}
        if not all(addresses.values()):
            reason = f"{_shim_path} returned no address for some pool hook: {addresses}"
        else:
            for setter, address in addresses.items():
                getattr(native, setter)(address)
            _patch_capture_cleanup(torch, shim)
            _hooks["graph_pools"] = (f"wired ({_shim_path}): each CUDA graph capture allocates from a graphalloc "
                                     "private pool")
            return
    _refuse_captures(torch, reason)
    _hooks["graph_pools"] = f"unsupported, captures raise GraphCaptureUnsupported: {reason}"


def _refuse_captures(torch, reason: str) -> None:
    """Makes CUDA graph capture raise GraphCaptureUnsupported: without a private pool, memory a graph uses
    could be handed to other tensors once freed, and replays would silently overwrite them."""
    message = ("graphalloc is PyTorch's CUDA allocator and cannot give this CUDA graph capture a private pool: "
               f"{reason}. Capturing without one would let other tensors reuse the graph's memory. Build "
               "libgraphalloc_torch.so against this PyTorch (python/README.md), or capture without graphalloc.")
    graphs = torch.cuda.graphs

    def capture_begin(self, *args, **kwargs):
        raise GraphCaptureUnsupported(message)

    def enter(self, *args, **kwargs):
        # Refuse before torch.cuda.graph switches the current stream, which its __exit__ would not undo.
        raise GraphCaptureUnsupported(message)

    graphs.CUDAGraph.capture_begin = capture_begin
    graphs.graph.__enter__ = enter


def _patch_capture_cleanup(torch, shim) -> None:
    """Ends the route of a capture that failed before PyTorch ended it.

    CUDAGraph.capture_end raises when cudaStreamEndCapture fails (an invalidated capture) before it calls
    endAllocateToPool, and a capture_begin that fails after opening the route never gets a capture_end.
    Left open, the route would keep graphalloc in capture mode for good (no event queries, no cache release).
    The reference the route's beginAllocateToPool took is dropped too when PyTorch will never release it:
    graph.pool() raises exactly when the capture did not end (then CUDAGraph.reset skips releasePool)."""
    graph_class = torch.cuda.graphs.CUDAGraph
    original_begin, original_end = graph_class.capture_begin, graph_class.capture_end
    keys: Dict[int, tuple] = {}

    def abandon(key: tuple, release: bool) -> None:
        device, first, second = key
        shim.graphalloc_torch_shim_abandon(device, first, second, 1 if release else 0)

    def capture_begin(self, *args, **kwargs):
        routes_before = shim.graphalloc_torch_shim_open_routes()
        try:
            original_begin(self, *args, **kwargs)
        except BaseException:
            if shim.graphalloc_torch_shim_open_routes() > routes_before:
                key = _last_begun(shim)
                if key is not None:
                    abandon(key, release=True)  # the capture never began: PyTorch never releases
            raise
        key = _last_begun(shim)
        if key is not None:
            keys[id(self)] = key

    def capture_end(self, *args, **kwargs):
        key = keys.pop(id(self), None)
        try:
            return original_end(self, *args, **kwargs)
        except BaseException:
            if key is not None:
                try:
                    self.pool()
                    ended = True
                except Exception:  # noqa: BLE001 - "without a preceding successful capture"
                    ended = False
                _, route_open = _pool_of(shim, *key)
                if route_open or not ended:
                    abandon(key, release=not ended)
            raise

    graph_class.capture_begin = capture_begin
    graph_class.capture_end = capture_end


def graph_pool_id(pool, device=None) -> Optional[int]:
    """The id of the graphalloc private pool behind a PyTorch pool id (CUDAGraph.pool(),
    torch.cuda.graph_pool_handle()), for graphalloc.pool_stats(); None while PyTorch holds no reference to
    it (never captured into, or every graph of it released: the graphalloc pool then goes as soon as its
    last tensor does)."""
    if _pool_table is None:
        return None
    first, second = (int(x) for x in pool)
    ga_pool, _ = _pool_of(_pool_table, _device_index(device), first, second)
    return ga_pool


def graph_pool_stats(pool, device=None) -> Optional[Dict[str, int]]:
    """graphalloc's statistics of the private pool behind a PyTorch pool id, or None (see graph_pool_id)."""
    ga_pool = graph_pool_id(pool, device)
    return None if ga_pool is None else _ga.pool_stats(ga_pool, _device_index(device))


def register_nccl(pool, group=None, device=None):
    """Makes the torch.cuda.MemPool `pool` a communication pool of `group`'s NCCL communicator (default: the
    default process group): every mapping of the pool is registered once with ncclCommRegister when mapped,
    stays mapped (empty_cache() leaves it) and is deregistered when the pool goes; placement is
    handle-aligned, so that every tensor lies inside one registration. Call it before allocating from the
    pool; returns a graphalloc.NcclRegistration (stats(), close(): close before destroying the group).
    The C++ backend only (install(backend="allocator")). docs/sharing.md says more."""
    if _backend != "allocator" or _shim is None:
        raise RuntimeError("graphalloc.torch.register_nccl needs graphalloc's C++ backend "
                           f"(graphalloc.torch.backend() is {_backend!r})")
    import torch
    import torch.distributed as dist
    dev = _device_index(device)
    first, second = (int(x) for x in pool.id)
    fn = getattr(_shim, "graphalloc_torch_backend_pool_for_communication", None)
    if fn is None:
        raise NotImplementedError(f"{_shim_path} predates register_nccl: rebuild libgraphalloc_torch.so")
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int, _ull, _ull, ctypes.c_char_p, ctypes.c_size_t]
    error = ctypes.create_string_buffer(1024)
    if fn(dev, first, second, error, len(error)) != 0:
        raise RuntimeError(error.value.decode("utf-8", "replace"))
    # The graphalloc pool exists from the pool's first allocation on.
    with torch.cuda.use_mem_pool(pool):
        probe = torch.empty(1, device=torch.device("cuda", dev))
    ga_pool = graph_pool_id(pool.id, dev)
    del probe
    if ga_pool is None:
        raise RuntimeError(f"graphalloc.torch.register_nccl: no graphalloc pool behind MemPool {pool.id}")
    group = group if group is not None else dist.group.WORLD
    comm = group._get_backend(torch.device("cuda", dev))._comm_ptr()
    if not comm:
        raise RuntimeError("graphalloc.torch.register_nccl: the group's NCCL communicator is not created yet "
                           "(pass device_id to init_process_group, or run one collective first)")
    return _ga.nccl_register(comm, ga_pool, dev)


def open_capture_routes() -> int:
    """Routes of CUDA graph captures now open (0 outside captures; more means a capture leaked its route)."""
    return _pool_table.graphalloc_torch_shim_open_routes() if _pool_table is not None else 0


def _nested(flat: Dict[str, int]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = value
    return out


def _patch_torch(torch) -> None:
    """Routes PyTorch's stats entry points, which raise for a pluggable allocator, to graphalloc."""
    C = torch._C

    def _memory_stats(device):
        return _nested(_ga.stats(_device_index(device)))

    def _reset_peak(device):
        _ga.reset_peak_stats(_device_index(device))

    def _reset_accumulated(device):
        _ga.reset_accumulated_stats(_device_index(device))

    for name, fn in (("_cuda_memoryStats", _memory_stats), ("_cuda_resetPeakMemoryStats", _reset_peak),
                     ("_cuda_resetAccumulatedMemoryStats", _reset_accumulated)):
        if hasattr(C, name):
            setattr(C, name, fn)
    _hooks["torch_stats"] = "torch.cuda.memory_stats() & co. patched to graphalloc"


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
    global _allocator, _default_device, _backend
    import torch

    with _state_lock:
        if _allocator is not None:
            if config is not None and config != os.environ.get("GRAPHALLOC_CONF"):
                raise InstallError("graphalloc is already installed with GRAPHALLOC_CONF="
                                   f"{os.environ.get('GRAPHALLOC_CONF')!r}; cannot change it to {config!r}")
            return _allocator
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
        shim, shim_reason = _load_shim()
        allocator = None
        if choice != "pluggable":
            allocator, reason = _install_backend(torch, shim, shim_reason)
            if allocator is None and choice == "allocator":
                raise InstallError(f"graphalloc.torch.install(backend='allocator'): {reason}")
        else:
            reason = "the pluggable path was asked for (backend='pluggable' or $GRAPHALLOC_TORCH_BACKEND)"
        if allocator is not None:
            _backend = "allocator"
            _hooks["backend"] = (f"allocator: {_shim_path} is PyTorch's CUDA allocator "
                                 f"(torch.cuda.get_allocator_backend() == 'graphalloc')")
        else:
            allocator = _install_pluggable(torch, shim, shim_reason, patch_torch, hooks)
            _backend = "pluggable"
            _hooks["backend"] = f"pluggable: torch.cuda.memory.CUDAPluggableAllocator, because {reason}"
        if device is not None:
            _default_device = _device_index(device, allow_uninitialised=True)
        _allocator = allocator
        return allocator


def _install_backend(torch, shim, shim_reason: str):
    """Installs the C++ backend: (PyTorch's allocator object, "") or (None, why it could not)."""
    if shim is None:
        return None, shim_reason
    if not hasattr(shim, "graphalloc_torch_backend_install"):
        return None, f"{_shim_path} has no PyTorch backend: rebuild it from this checkout"
    error = ctypes.create_string_buffer(4096)
    if shim.graphalloc_torch_backend_install(error, len(error)) != 0:
        raise InstallError(f"graphalloc.torch.install(): PyTorch refused graphalloc's allocator: "
                           f"{error.value.decode(errors='replace')}")
    for name in ("record_stream", "empty_cache", "memory_fraction", "torch_stats"):
        _hooks[name] = "served by the backend (PyTorch's own entry points)"
    _hooks["oom"] = f"raises torch.cuda.OutOfMemoryError (the backend, {_shim_path})"
    _hooks["graph_pools"] = (f"wired (the backend, {_shim_path}): each CUDA graph capture and MemPool allocates "
                             "from a graphalloc private pool")
    # PyTorch leaves a failed capture's route open (it raises before endAllocateToPool): the same clean-up as
    # the pluggable path's, through the backend's pool table.
    global _pool_table
    _pool_table = _backend_pool_table(shim)
    _patch_capture_cleanup(torch, _pool_table)
    return torch.cuda.memory._get_current_allocator(), ""


def _backend_pool_table(shim):
    """The backend's pool table under the shim's function names, so that one set of callers serves both."""
    return types.SimpleNamespace(**{
        f"graphalloc_torch_shim_{shim_name}": getattr(shim, f"graphalloc_torch_backend_{name}")
        for shim_name, name, _, _ in _POOL_TABLE_FUNCTIONS})


def _install_pluggable(torch, shim, shim_reason: str, patch_torch: bool, hooks: bool):
    """Installs graphalloc through torch.cuda.memory.CUDAPluggableAllocator; returns it."""
    if shim is not None:
        # The shim's malloc raises torch.cuda.OutOfMemoryError; its free is graphalloc_torch_free.
        allocator = torch.cuda.memory.CUDAPluggableAllocator(_shim_path, "graphalloc_torch_shim_malloc",
                                                             "graphalloc_torch_shim_free")
        _hooks["oom"] = f"raises torch.cuda.OutOfMemoryError ({_shim_path})"
    else:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(_ga.library_path(), "graphalloc_torch_malloc",
                                                             "graphalloc_torch_free")
        _hooks["oom"] = (f"NOT raised ({shim_reason}): a failed allocation gives a tensor at address 0; "
                         "memory_stats()['num_ooms'] counts them")
    if hooks:
        _wire_hooks(allocator.allocator())
        _wire_graph_pools(allocator.allocator(), torch, shim, shim_reason)
    else:
        _refuse_captures(torch, "install(hooks=False) leaves PyTorch's pool hooks unset")
        _hooks["graph_pools"] = "unsupported, captures raise GraphCaptureUnsupported: install(hooks=False)"
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
    return _backend


def is_installed() -> bool:
    return _allocator is not None


def hooks() -> Dict[str, str]:
    """How each PyTorch hook is served (native C function, Python trampoline, or not available)."""
    return dict(_hooks)


def _current_device_or_none() -> Optional[int]:
    try:
        import torch
        if torch.cuda.is_initialized():
            return torch.cuda.current_device()
    except Exception:  # noqa: BLE001 - called from C callbacks: never raise
        pass
    return None


def _candidate_devices() -> List[int]:
    cur = _current_device_or_none()
    out = [cur] if cur is not None else []
    try:
        import torch
        out += [d for d in range(torch.cuda.device_count()) if d != cur]
    except Exception:  # noqa: BLE001
        pass
    return out or [0]


def _device_index(device=None, allow_uninitialised: bool = False) -> int:
    import torch
    if device is None:
        if _default_device is not None:
            idx = _default_device
        elif allow_uninitialised and not torch.cuda.is_initialized():
            idx = 0
        else:
            idx = torch.cuda.current_device()
    elif isinstance(device, int):
        idx = device
    else:
        d = torch.device(device)
        if d.type != "cuda":
            raise ValueError(f"graphalloc serves CUDA devices, not {d}")
        idx = d.index if d.index is not None else torch.cuda.current_device()
    _devices_seen.add(idx)
    return idx


# ---- statistics (PyTorch's flat keys, from graphalloc_stats_json) ----

def memory_stats(device=None) -> Dict[str, int]:
    """graphalloc's statistics of `device`, with torch.cuda.memory_stats()'s flat keys, sorted like it."""
    flat = _ga.stats(_device_index(device))
    return dict(sorted(flat.items()))


def memory_stats_as_nested_dict(device=None) -> Dict[str, Any]:
    return _nested(_ga.stats(_device_index(device)))


def memory_allocated(device=None) -> int:
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None) -> int:
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def empty_cache(device=None) -> None:
    _ga.empty_cache(_device_index(device))


def reset_peak_memory_stats(device=None) -> None:
    _ga.reset_peak_stats(_device_index(device))


def reset_accumulated_memory_stats(device=None) -> None:
    _ga.reset_accumulated_stats(_device_index(device))


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    _ga.set_memory_fraction(fraction, _device_index(device))


def record_stream(tensor, stream) -> None:
    """Marks `tensor`'s memory as used on `stream` (torch.cuda.Stream) in graphalloc directly.

    Tensor.record_stream(stream) already does this when hooks()['record_stream'] is wired; this is for
    PyTorch builds without the hook. Use the tensor's storage base pointer (what the allocator handed out)."""
    ptr = tensor.untyped_storage().data_ptr()
    _ga.record_stream(ptr, int(stream.cuda_stream), _device_index(tensor.device))


# ---- sleep and wake of PyTorch's pools (graphalloc.sleep / graphalloc.wake) ----

def _graphalloc_pools(pools, device: int) -> List[int]:
    """The graphalloc pool ids behind `pools`: one PyTorch pool or a list of them, each a torch.cuda.MemPool
    or a PyTorch pool id (MemPool.id, CUDAGraph.pool(), torch.cuda.graph_pool_handle()); (0, 0) is the
    default pool."""
    if isinstance(pools, tuple) and len(pools) == 2 and all(isinstance(x, int) for x in pools):
        pools = [pools]
    elif not isinstance(pools, (list, tuple)):
        pools = [pools]
    ids = []
    for pool in pools:
        key = tuple(int(x) for x in (pool.id if hasattr(pool, "id") else pool))
        if key == (0, 0):
            ids.append(0)
            continue
        ga_pool = graph_pool_id(key, device)
        if ga_pool is None:
            raise ValueError(f"PyTorch pool {key} of cuda:{device} has no graphalloc pool: nothing was allocated "
                             "in it yet, or PyTorch released every reference to it")
        ids.append(ga_pool)
    return ids


def sleep(pools=None, backup: bool = False, device=None) -> None:
    """Gives the device memory of PyTorch's pools back to the device, keeping every tensor's address: tensors
    stay valid to hold (not to touch) and CUDA graphs captured before stay valid to replay after ``wake``.

    pools=None: the whole allocator of `device` (every tensor, every CUDA graph pool, torch.compile's
    included, and every MemPool); else a torch.cuda.MemPool, a PyTorch pool id (MemPool.id,
    CUDAGraph.pool(), torch.cuda.graph_pool_handle()) or a list of them. backup=True copies the tensors'
    contents to pinned host memory and back at the wake; backup=False discards them (a KV cache, say). Pools
    asleep already stay so, so ``sleep(kv_pool)`` then ``sleep(backup=True)`` discards one pool and keeps
    the rest. While a pool sleeps, allocating from it raises (run no PyTorch work that allocates there);
    freeing its tensors is allowed. The sleep waits for the work queued on the device first; it is refused
    during a capture. A list of pools is one graphalloc call per pool: when one fails, the error says so and
    those before it stay asleep."""
    idx = _device_index(device)
    if pools is None:
        _ga.sleep(None, backup=backup, device=idx)
        return
    for ga_pool in _graphalloc_pools(pools, idx):
        _ga.pool_sleep(ga_pool, backup=backup, device=idx)


def wake(pools=None, device=None) -> None:
    """Maps fresh device memory under sleeping pools at the same addresses, restoring backups (pools as in
    ``sleep``; None: every sleeping pool of `device`). Awake pools stay as they are."""
    idx = _device_index(device)
    if pools is None:
        _ga.wake(None, device=idx)
        return
    for ga_pool in _graphalloc_pools(pools, idx):
        _ga.pool_wake(ga_pool, device=idx)


def sleep_state(pool=None, device=None) -> Dict[str, Any]:
    """Whether a PyTorch pool (None: the default pool) sleeps: {"asleep", "sleeping_bytes", "backup_bytes"}
    (graphalloc.pool_sleep_state)."""
    idx = _device_index(device)
    ga_pool = 0 if pool is None else _graphalloc_pools(pool, idx)[0]
    return _ga.pool_sleep_state(ga_pool, device=idx)


# ---- history and snapshots ----

def record_history(enabled: bool = True, max_entries: int = 100000, stacks: bool = False, device=None) -> None:
    """Turns graphalloc's allocation history on/off (C stacks only: no Python frames)."""
    _ga.record_history(_device_index(device), enabled, max_entries, stacks)


def snapshot(device=None) -> Dict[str, Any]:
    """A snapshot of `device` in graphalloc's JSON format (docs/snapshot_format.md), as a dict."""
    return json.loads(_ga.snapshot_json(_device_index(device)))


def dump_snapshot(path: str, device=None) -> str:
    """Writes snapshot(device) to `path` as JSON (opens with `graphalloc snapshot summary|plot PATH`)."""
    text = _ga.snapshot_json(_device_index(device))
    with open(path, "w") as f:
        f.write(text)
    return path


def export_torch(path: str, device=None) -> str:
    """Writes the snapshot in PyTorch's memory_viz pickle format (pytorch.org/memory_viz,
    python -m torch.cuda._memory_viz), through `graphalloc snapshot export-torch`."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "snapshot.json")
        dump_snapshot(src, device)
        r = _ga.run_cli("snapshot", "export-torch", src, "-o", path, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"graphalloc snapshot export-torch failed ({r.returncode}): {r.stderr.strip()}")
    return path


def config(device=None) -> str:
    """The allocator configuration in GRAPHALLOC_CONF syntax: the effective one (from a snapshot) when the
    library can take snapshots, else $GRAPHALLOC_CONF as set ("" = defaults)."""
    if _ga.has_function("graphalloc_snapshot_json"):
        try:
            return snapshot(device).get("config", "")
        except Exception:  # noqa: BLE001
            pass
    return os.environ.get("GRAPHALLOC_CONF", "")


# CUDA graphs for PyTorch programs on graphalloc's graph tree (torch_graphs.py): drop-in graphed callables
# and graphed steps, imported on first use (they need more of PyTorch than installing the allocator does).
_GRAPH_NAMES = ("make_graphed_callables", "graphed", "GraphedFunction", "graph_memory", "GraphBackendError")
__all__ += list(_GRAPH_NAMES)


def __getattr__(name: str):
    if name in _GRAPH_NAMES:
        from graphalloc import torch_graphs
        return getattr(torch_graphs, name)
    raise AttributeError(f"module 'graphalloc.torch' has no attribute {name!r}")
