"""CUDA graph pools for PyTorch on graphalloc (graphalloc.torch's second concept): libgraphalloc_torch.so
(found, loaded and checked against this PyTorch), the pool table through which PyTorch's captures and
MemPools reach graphalloc private pools, what happens to a capture that cannot get one (it raises
GraphCaptureUnsupported, before torch.cuda.graph switches streams) or that fails half-way (its route is
ended), and the pool functions users call (graph_pool_id, graph_pool_stats, register_nccl,
open_capture_routes)."""
from __future__ import annotations

import ctypes
import os
import types
from typing import Any, Dict, Optional

import graphalloc as _ga
from graphalloc import _torch_state as state

_SHIM_NAMES = ("libgraphalloc_torch.so",)
_POOL_SETTERS = (("set_begin_allocate_to_pool", "begin_allocate_to_pool"),
                 ("set_end_allocate_to_pool_fn", "end_allocate_to_pool"),
                 ("set_release_pool", "release_pool"))
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


def find_shim() -> "tuple[Optional[str], str]":
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


def load_shim() -> "tuple[Optional[ctypes.CDLL], str]":
    """Loads the shim after libgraphalloc.so (so that it binds to that very library: one set of allocators)."""
    if state.shim is not None:
        return state.shim, ""
    path, reason = find_shim()
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
    state.shim, state.shim_path, state.pool_table = shim, path, shim
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


def wire_graph_pools(native, torch, shim, shim_reason: str) -> None:
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
            reason = f"{state.shim_path} was built without the pool hooks: {unavailable.decode()}"
    if not reason:
        addresses = {setter: shim.graphalloc_torch_shim_hook(hook.encode()) for setter, hook in _POOL_SETTERS}
        if not all(addresses.values()):
            reason = f"{state.shim_path} returned no address for some pool hook: {addresses}"
        else:
            for setter, address in addresses.items():
                getattr(native, setter)(address)
            patch_capture_cleanup(torch, shim)
            state.hooks["graph_pools"] = (f"wired ({state.shim_path}): each CUDA graph capture allocates from a "
                                          "graphalloc private pool")
            return
    refuse_captures(torch, reason)
    state.hooks["graph_pools"] = f"unsupported, captures raise GraphCaptureUnsupported: {reason}"


def refuse_captures(torch, reason: str) -> None:
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


def patch_capture_cleanup(torch, shim) -> None:
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
    if state.pool_table is None:
        return None
    first, second = (int(x) for x in pool)
    ga_pool, _ = _pool_of(state.pool_table, state.device_index(device), first, second)
    return ga_pool


def graph_pool_stats(pool, device=None) -> Optional[Dict[str, int]]:
    """graphalloc's statistics of the private pool behind a PyTorch pool id, or None (see graph_pool_id)."""
    ga_pool = graph_pool_id(pool, device)
    return None if ga_pool is None else _ga.pool_stats(ga_pool, state.device_index(device))


def register_nccl(pool, group=None, device=None):
    """Makes the torch.cuda.MemPool `pool` a communication pool of `group`'s NCCL communicator (default: the
    default process group): every mapping of the pool is registered once with ncclCommRegister when mapped,
    stays mapped (empty_cache() leaves it) and is deregistered when the pool goes; placement is
    handle-aligned, so that every tensor lies inside one registration. Call it before allocating from the
    pool; returns a graphalloc.NcclRegistration (stats(), close(): close before destroying the group).
    The C++ backend only (install(backend="allocator")). docs/sharing.md says more."""
    if state.backend != "allocator" or state.shim is None:
        raise RuntimeError("graphalloc.torch.register_nccl needs graphalloc's C++ backend "
                           f"(graphalloc.torch.backend() is {state.backend!r})")
    import torch
    import torch.distributed as dist
    dev = state.device_index(device)
    first, second = (int(x) for x in pool.id)
    fn = getattr(state.shim, "graphalloc_torch_backend_pool_for_communication", None)
    if fn is None:
        raise NotImplementedError(f"{state.shim_path} predates register_nccl: rebuild libgraphalloc_torch.so")
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
    return state.pool_table.graphalloc_torch_shim_open_routes() if state.pool_table is not None else 0


def backend_pool_table(shim):
    """The backend's pool table under the shim's function names, so that one set of callers serves both."""
    return types.SimpleNamespace(**{
        f"graphalloc_torch_shim_{shim_name}": getattr(shim, f"graphalloc_torch_backend_{name}")
        for shim_name, name, _, _ in _POOL_TABLE_FUNCTIONS})
