"""graphalloc from Python: find libgraphalloc.so and call its plain C ABI through ctypes.

This module needs neither PyTorch nor a GPU (with GRAPHALLOC_DEVICE=sim the library runs on its simulated
device). ``graphalloc.torch`` builds on it to make graphalloc PyTorch's CUDA allocator.

    import graphalloc
    lib = graphalloc.library()          # the loaded ctypes.CDLL
    graphalloc.stats(0)                 # dict of PyTorch's flat memory_stats keys
    graphalloc.snapshot(0)              # dict in docs/snapshot_format.md's format (needs a recent library)
    graphalloc.sleep("weights", backup=True); graphalloc.wake("weights")  # pools by tag (issue 22)
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import List, Optional, Sequence, Union

from . import _args

__all__ = [
    "__version__", "GraphallocError", "library", "library_path", "cli_path", "has_function", "stats", "stats_json",
    "snapshot_json", "snapshot", "record_history", "empty_cache", "set_memory_fraction", "reset_peak_stats",
    "reset_accumulated_stats", "record_stream", "malloc", "free", "last_error", "pool_create", "pool_retain",
    "pool_release", "pool_stats", "pool_empty_cache", "allocate_to_pool", "sleep", "wake", "pool_sleep",
    "pool_wake", "pool_sleep_state", "NcclRegistration", "nccl_register", "MAX_HISTORY_ENTRIES",
]

# The most history events record_history keeps (kMaxHistoryEntries, allocator/history/history_ring.h).
MAX_HISTORY_ENTRIES = 1 << 28

# graphalloc_status codes (allocator/c_api/graphalloc.h).
OK = 0
INVALID_ARGUMENT = 1
OUT_OF_MEMORY = 2
UNAVAILABLE = 3
FAILED_PRECONDITION = 4
BUFFER_TOO_SMALL = 5
INTERNAL = 6
_STATUS_NAMES = {0: "OK", 1: "INVALID_ARGUMENT", 2: "OUT_OF_MEMORY", 3: "UNAVAILABLE",
                 4: "FAILED_PRECONDITION", 5: "BUFFER_TOO_SMALL", 6: "INTERNAL"}

_LIB_NAMES = ("libgraphalloc.so", "libgraphalloc.so.0")

# The project version (CMakeLists.txt's project(VERSION)), for when the library is not loaded;
# tests/python/version_test.py keeps it equal to graphalloc_version() and to python/pyproject.toml's.
_VERSION = "0.1.0"


class GraphallocError(RuntimeError):
    """A graphalloc C function returned an error; ``code`` is its graphalloc_status."""

    def __init__(self, function: str, code: int, message: str):
        self.function = function
        self.code = code
        super().__init__(f"{function}: {_STATUS_NAMES.get(code, code)}: {message}")


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def _repo_root() -> Path:
    # python/graphalloc/__init__.py -> the repository root (when run from a checkout).
    return Path(__file__).resolve().parent.parent.parent


def _source_checkout() -> Path:
    """The repository the package comes from: this file's checkout, or for a package installed with pip the
    checkout that python/_graphalloc_build.py recorded in _source_dir.txt (so a library built later is found
    too)."""
    recorded = Path(__file__).resolve().parent / "_source_dir.txt"
    if recorded.is_file():
        return Path(recorded.read_text().strip())
    return _repo_root()


def _candidates() -> List[Path]:
    """Where to look for libgraphalloc.so, in order (GRAPHALLOC_LIBRARY is handled before this)."""
    here = Path(__file__).resolve().parent
    out: List[Path] = []
    for name in _LIB_NAMES:
        out.append(here / name)                   # copied next to the package (pip install ./python does)
        out.append(here.parent / "lib" / name)    # an install tree: <prefix>/python/graphalloc + <prefix>/lib
    root = _source_checkout()
    # The build-directory conventions of this repository: build*/ in the checkout (README), and
    # GRAPHALLOC_BUILD_DIR if set.
    build_dirs: List[Path] = []
    if os.environ.get("GRAPHALLOC_BUILD_DIR"):
        build_dirs.append(Path(os.environ["GRAPHALLOC_BUILD_DIR"]))
    build_dirs += sorted(p for p in root.glob("build*") if p.is_dir())
    for d in build_dirs:
        for name in _LIB_NAMES:
            out.append(d / name)
    return out


def library_path() -> str:
    """The path of libgraphalloc.so that ``library()`` loads (or loaded).

    Looks at, in order: $GRAPHALLOC_LIBRARY; the package's own folder and ../lib; $GRAPHALLOC_BUILD_DIR and
    the checkout's build*/ folders; then the dynamic linker's search path (LD_LIBRARY_PATH, ldconfig).
    Raises FileNotFoundError listing every place it looked.
    """
    if _lib_path is not None:
        return _lib_path
    looked: List[str] = []
    env = os.environ.get("GRAPHALLOC_LIBRARY")
    if env:
        if Path(env).is_file():
            return str(Path(env).resolve())
        looked.append(f"$GRAPHALLOC_LIBRARY={env} (no such file)")
    for c in _candidates():
        looked.append(str(c))
        if c.is_file():
            return str(c.resolve())
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if not d:
            continue
        for name in _LIB_NAMES:
            p = Path(d) / name
            looked.append(str(p))
            if p.is_file():
                return str(p.resolve())
    found = ctypes.util.find_library("graphalloc")
    looked.append("ctypes.util.find_library('graphalloc') (ldconfig cache)")
    if found:
        # A bare soname: the dynamic linker resolves it; PyTorch's CUDAPluggableAllocator accepts it too.
        return found
    raise FileNotFoundError(
        "graphalloc: libgraphalloc.so not found. Build it (cmake --build BUILD --target graphalloc_shared) "
        "and set GRAPHALLOC_LIBRARY=/path/to/libgraphalloc.so. Looked at:\n  " + "\n  ".join(looked))


class PoolOptions(ctypes.Structure):
    """graphalloc_pool_options."""
    _fields_ = [("use_on_oom", ctypes.c_int), ("no_split", ctypes.c_int), ("handle_aligned", ctypes.c_int)]


class PoolStats(ctypes.Structure):
    """graphalloc_pool_stats."""
    _fields_ = [("reserved_bytes", ctypes.c_size_t), ("peak_reserved_bytes", ctypes.c_size_t),
                ("allocated_bytes", ctypes.c_size_t), ("peak_allocated_bytes", ctypes.c_size_t),
                ("segments", ctypes.c_size_t), ("live_blocks", ctypes.c_size_t), ("use_count", ctypes.c_int),
                ("graph_pins", ctypes.c_int)]


def _declare(lib: ctypes.CDLL) -> None:
    c_size_p = ctypes.POINTER(ctypes.c_size_t)
    c_u64, c_u64_p = ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)
    sigs = {
        "graphalloc_torch_malloc": (ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
        "graphalloc_torch_free": (None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
        "graphalloc_malloc": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int,
                                             ctypes.c_void_p]),
        "graphalloc_free": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
        "graphalloc_record_stream": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]),
        "graphalloc_empty_cache": (ctypes.c_int, [ctypes.c_int]),
        "graphalloc_set_memory_fraction": (ctypes.c_int, [ctypes.c_double, ctypes.c_int]),
        "graphalloc_stats_json": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, c_size_p]),
        "graphalloc_reset_peak_stats": (ctypes.c_int, [ctypes.c_int]),
        "graphalloc_reset_accumulated_stats": (ctypes.c_int, [ctypes.c_int]),
        "graphalloc_last_error": (ctypes.c_char_p, []),
        # Newer functions: declared when the library has them (has_function()).
        "graphalloc_version": (ctypes.c_char_p, []),
        "graphalloc_snapshot_json": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, c_size_p]),
        "graphalloc_record_history": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_size_t,
                                                     ctypes.c_int]),
        "graphalloc_torch_record_stream": (None, [ctypes.c_void_p, ctypes.c_void_p]),
        "graphalloc_pool_create": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(PoolOptions), c_u64_p]),
        "graphalloc_pool_retain": (ctypes.c_int, [ctypes.c_int, c_u64]),
        "graphalloc_pool_release": (ctypes.c_int, [ctypes.c_int, c_u64]),
        "graphalloc_begin_allocate_to_pool_for_stream": (ctypes.c_int, [ctypes.c_int, c_u64, ctypes.c_void_p,
                                                                        c_u64_p]),
        "graphalloc_begin_allocate_to_pool_for_thread": (ctypes.c_int, [ctypes.c_int, c_u64, c_u64_p]),
        "graphalloc_end_route": (ctypes.c_int, [c_u64]),
        "graphalloc_pool_get_stats": (ctypes.c_int, [ctypes.c_int, c_u64, ctypes.POINTER(PoolStats)]),
        "graphalloc_pool_empty_cache": (ctypes.c_int, [ctypes.c_int, c_u64]),
        "graphalloc_pool_create_with_tag": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(PoolOptions),
                                                           ctypes.c_char_p, c_u64_p]),
        "graphalloc_sleep": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]),
        "graphalloc_wake": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p]),
        "graphalloc_pool_sleep": (ctypes.c_int, [ctypes.c_int, c_u64, ctypes.c_int]),
        "graphalloc_pool_wake": (ctypes.c_int, [ctypes.c_int, c_u64]),
        "graphalloc_pool_sleep_state": (ctypes.c_int, [ctypes.c_int, c_u64, ctypes.POINTER(ctypes.c_int),
                                                       c_size_p, c_size_p]),
        "graphalloc_nccl_register": (ctypes.c_int, [ctypes.c_int, c_u64, ctypes.c_void_p, c_u64_p]),
        "graphalloc_nccl_registration_stats": (ctypes.c_int, [c_u64, c_size_p, c_size_p]),
        "graphalloc_nccl_unregister": (ctypes.c_int, [c_u64]),
    }
    for name, (restype, argtypes) in sigs.items():
        if hasattr(lib, name):
            f = getattr(lib, name)
            f.restype = restype
            f.argtypes = argtypes


def _dlopen_mode() -> int:
    """How libgraphalloc.so is loaded: $GRAPHALLOC_DLOPEN = deepbind (default), local or global.

    Never RTLD_GLOBAL by default: libgraphalloc.so exports the C++ template instantiations it uses (nlohmann
    json, absl, libstdc++ vague linkage), and loaded into the global scope they interpose on PyTorch's own
    copies: on the H100 with PyTorch 2.11 a cuDNN convolution then segfaulted in the host code. RTLD_LOCAL
    keeps ours out of the others' lookups and RTLD_DEEPBIND keeps theirs out of ours. The first load's flags
    stay for the process (PyTorch's CUDAPluggableAllocator later dlopens the same file and gets this handle).
    """
    choice = os.environ.get("GRAPHALLOC_DLOPEN", "deepbind")
    if choice == "global":
        return ctypes.RTLD_GLOBAL
    if choice == "local":
        return ctypes.RTLD_LOCAL
    return ctypes.RTLD_LOCAL | getattr(os, "RTLD_DEEPBIND", 0)


def library() -> ctypes.CDLL:
    """The loaded libgraphalloc.so (loaded once, from ``library_path()``, with ``_dlopen_mode()``)."""
    global _lib, _lib_path
    with _lock:
        if _lib is None:
            path = library_path()
            lib = ctypes.CDLL(path, mode=_dlopen_mode())
            _declare(lib)
            _lib, _lib_path = lib, path
        return _lib


def __getattr__(name: str):
    # graphalloc.__version__: the loaded library's own version when it is loaded (it is the one that runs),
    # else the version this package was released with; importing never loads the library.
    if name == "__version__":
        if _lib is not None and hasattr(_lib, "graphalloc_version"):
            return _lib.graphalloc_version().decode().split()[-1]
        return _VERSION
    raise AttributeError(f"module 'graphalloc' has no attribute {name!r}")


def has_function(name: str) -> bool:
    """Whether the loaded library exports the C function `name` (newer functions may be missing)."""
    return hasattr(library(), name)


def last_error() -> str:
    msg = library().graphalloc_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def _check(function: str, code: int) -> None:
    if code != OK:
        raise GraphallocError(function, code, last_error())


def _json_call(function: str, device: int) -> str:
    device = _args.device(function.replace("graphalloc_", ""), device)
    lib = library()
    if not hasattr(lib, function):
        raise NotImplementedError(
            f"{_lib_path} does not export {function}: rebuild graphalloc_shared from a newer checkout")
    f = getattr(lib, function)
    size = 1 << 16
    for _ in range(8):  # the content can grow between the size query and the copy: retry
        buf = ctypes.create_string_buffer(size)
        required = ctypes.c_size_t(0)
        code = f(device, buf, size, ctypes.byref(required))
        if code == OK:
            return buf.value.decode("utf-8")
        if code != BUFFER_TOO_SMALL:
            _check(function, code)
        size = max(size * 2, int(required.value) + 4096)
    raise GraphallocError(function, BUFFER_TOO_SMALL, "the JSON kept growing")


def stats_json(device: int = 0) -> str:
    """graphalloc_stats_json: the statistics of `device` as a JSON string (PyTorch's flat keys)."""
    return _json_call("graphalloc_stats_json", device)


def stats(device: int = 0) -> dict:
    """The statistics of `device` as a dict with PyTorch's flat memory_stats keys."""
    return json.loads(stats_json(device))


def snapshot_json(device: int = 0) -> str:
    """graphalloc_snapshot_json: a snapshot of `device` (docs/snapshot_format.md) as a JSON string."""
    return _json_call("graphalloc_snapshot_json", device)


def snapshot(device: int = 0) -> dict:
    return json.loads(snapshot_json(device))


def record_history(device: int = 0, enabled: bool = True, max_entries: int = 100000,
                   stacks: bool = False) -> None:
    """Turns the allocation history of `device` on or off (graphalloc_record_history).

    Without that C function, history can still be turned on from the start with GRAPHALLOC_CONF
    (``record_history:True,history_max_entries:N,history_stacks:False``) before the allocator is created.
    """
    device = _args.device("record_history", device)
    max_entries = _args.integer("record_history", "max_entries", max_entries, 1, MAX_HISTORY_ENTRIES + 1)
    lib = library()
    if not hasattr(lib, "graphalloc_record_history"):
        raise NotImplementedError(
            f"{_lib_path} does not export graphalloc_record_history; set GRAPHALLOC_CONF="
            "record_history:True before the first allocation instead")
    _check("graphalloc_record_history",
           lib.graphalloc_record_history(device, 1 if enabled else 0, max_entries, 1 if stacks else 0))


def empty_cache(device: int = 0) -> None:
    """Returns `device`'s unused cached memory to the driver, and frees the pinned buffers wakes kept for the
    next backed-up sleep."""
    _check("graphalloc_empty_cache", library().graphalloc_empty_cache(_args.device("empty_cache", device)))


def set_memory_fraction(fraction: float, device: int = 0) -> None:
    fraction = _args.fraction("set_memory_fraction", "fraction", fraction)
    device = _args.device("set_memory_fraction", device)
    _check("graphalloc_set_memory_fraction", library().graphalloc_set_memory_fraction(fraction, device))


def reset_peak_stats(device: int = 0) -> None:
    _check("graphalloc_reset_peak_stats",
           library().graphalloc_reset_peak_stats(_args.device("reset_peak_stats", device)))


def reset_accumulated_stats(device: int = 0) -> None:
    _check("graphalloc_reset_accumulated_stats",
           library().graphalloc_reset_accumulated_stats(_args.device("reset_accumulated_stats", device)))


def record_stream(ptr: int, stream: int, device: int = 0) -> None:
    """graphalloc_record_stream: the block at `ptr` is used on `stream` (a cudaStream_t as an int) too."""
    ptr = _args.size("record_stream", "ptr", ptr)
    stream = _args.size("record_stream", "stream", stream)
    device = _args.device("record_stream", device)
    _check("graphalloc_record_stream",
           library().graphalloc_record_stream(ctypes.c_void_p(ptr), device, ctypes.c_void_p(stream)))


def malloc(size: int, device: int = 0, stream: int = 0) -> int:
    """`size` bytes of device memory usable on `stream` (a cudaStream_t as an int; 0: the default stream).
    malloc(0) returns 0 (the null address), which free() accepts."""
    size = _args.size("malloc", "size", size)
    device = _args.device("malloc", device)
    stream = _args.size("malloc", "stream", stream)
    out = ctypes.c_void_p(0)
    _check("graphalloc_malloc", library().graphalloc_malloc(ctypes.byref(out), size, device,
                                                            ctypes.c_void_p(stream)))
    return out.value or 0


def free(ptr: int, device: int = 0) -> None:
    ptr = _args.size("free", "ptr", ptr)
    device = _args.device("free", device)
    _check("graphalloc_free", library().graphalloc_free(ctypes.c_void_p(ptr), device))


# ---- private pools (allocator/c_api/graphalloc.h) ----

def _exported(name: str, feature: str):
    """The library's function `name`, or NotImplementedError naming `feature` when the library predates it."""
    lib = library()
    if not hasattr(lib, name):
        raise NotImplementedError(f"{_lib_path} does not export {name}: rebuild graphalloc_shared from a newer "
                                  f"checkout ({feature})")
    return getattr(lib, name)


def _pool_function(name: str):
    return _exported(name, "private pools")


def pool_create(device: int = 0, use_on_oom: bool = False, no_split: bool = False,
                tag: Optional[str] = None, handle_aligned: bool = False) -> int:
    """A new private pool on `device`; returns its id, with one reference held (pool_release drops it).

    `tag` (None or "": none) names the pool for ``sleep(tags=...)`` and ``wake(tags=...)``; several pools may
    share a tag. `handle_aligned`: no block of the pool spans two physical handles (for NCCL or RDMA
    registration of its memory; docs/sharing.md)."""
    device = _args.device("pool_create", device)
    out = ctypes.c_uint64(0)
    options = PoolOptions(1 if use_on_oom else 0, 1 if no_split else 0, 1 if handle_aligned else 0)
    if tag:
        _check("graphalloc_pool_create_with_tag",
               _sleep_function("graphalloc_pool_create_with_tag")(device, ctypes.byref(options),
                                                                  _tag_bytes(tag), ctypes.byref(out)))
    else:
        _check("graphalloc_pool_create",
               _pool_function("graphalloc_pool_create")(device, ctypes.byref(options), ctypes.byref(out)))
    return out.value


def _pool_and_device(function: str, pool, device):
    return _args.size(function, "pool", pool), _args.device(function, device)


def pool_retain(pool: int, device: int = 0) -> None:
    pool, device = _pool_and_device("pool_retain", pool, device)
    _check("graphalloc_pool_retain", _pool_function("graphalloc_pool_retain")(device, pool))


def pool_release(pool: int, device: int = 0) -> None:
    pool, device = _pool_and_device("pool_release", pool, device)
    _check("graphalloc_pool_release", _pool_function("graphalloc_pool_release")(device, pool))


def pool_stats(pool: int, device: int = 0) -> dict:
    """The statistics of one private pool (graphalloc_pool_stats's fields) as a dict."""
    pool, device = _pool_and_device("pool_stats", pool, device)
    out = PoolStats()
    _check("graphalloc_pool_get_stats",
           _pool_function("graphalloc_pool_get_stats")(device, pool, ctypes.byref(out)))
    return {name: getattr(out, name) for name, _ in PoolStats._fields_}


def pool_empty_cache(pool: int, device: int = 0) -> None:
    pool, device = _pool_and_device("pool_empty_cache", pool, device)
    _check("graphalloc_pool_empty_cache", _pool_function("graphalloc_pool_empty_cache")(device, pool))


class allocate_to_pool:  # noqa: N801 - used as a context manager, like torch.cuda.use_mem_pool
    """``with allocate_to_pool(pool, device, stream=None):`` routes to `pool` the allocations made on `stream`
    (a cudaStream_t as an int), or with stream=None those made by the calling thread, until the block ends."""

    def __init__(self, pool: int, device: int = 0, stream: Optional[int] = None):
        self.pool, self.device = _pool_and_device("allocate_to_pool", pool, device)
        self.stream = None if stream is None else _args.size("allocate_to_pool", "stream", stream)
        self.route: Optional[int] = None

    def __enter__(self) -> "allocate_to_pool":
        out = ctypes.c_uint64(0)
        if self.stream is None:
            name = "graphalloc_begin_allocate_to_pool_for_thread"
            code = _pool_function(name)(self.device, self.pool, ctypes.byref(out))
        else:
            name = "graphalloc_begin_allocate_to_pool_for_stream"
            code = _pool_function(name)(self.device, self.pool, ctypes.c_void_p(self.stream), ctypes.byref(out))
        _check(name, code)
        self.route = out.value
        return self

    def __exit__(self, *exc) -> None:
        route, self.route = self.route, None
        if route is not None:
            _check("graphalloc_end_route", _pool_function("graphalloc_end_route")(route))


# ---- sleep and wake (allocator/c_api/graphalloc.h, allocator/core/pool_sleep.h) ----

def _sleep_function(name: str):
    return _exported(name, "sleep and wake")


def _tag_bytes(tag: str) -> bytes:
    if not isinstance(tag, str):
        raise TypeError(f"graphalloc: a pool tag is a str, not {type(tag).__name__}")
    return tag.encode("utf-8")


def _tag_list(tags: Union[None, str, Sequence[str]]) -> Optional[List[str]]:
    """None (the whole allocator), or the tags in order, each once; a str is one tag."""
    if tags is None:
        return None
    if isinstance(tags, str):
        tags = [tags]
    out: List[str] = []
    for t in tags:
        _tag_bytes(t)
        if t == "":
            raise ValueError("graphalloc: an empty tag names no pool (tags=None means the whole allocator)")
        if t not in out:
            out.append(t)
    if not out:
        raise ValueError("graphalloc: tags is empty (tags=None means the whole allocator)")
    return out


def _for_each_tag(function: str, tags: List[str], call, done_word: str) -> None:
    """Calls call(tag) for each tag in order; on an error, raises it saying which tags were already done."""
    done: List[str] = []
    for t in tags:
        code = call(_tag_bytes(t))
        if code != OK:
            message = last_error()
            if done:
                message += f" (the tags before it are {done_word} now: {', '.join(repr(d) for d in done)})"
            raise GraphallocError(function, code, message)
        done.append(t)


def sleep(tags: Union[None, str, Sequence[str]] = None, backup: bool = False, device: int = 0) -> None:
    """Puts pools of `device` to sleep: their device memory goes back to the device while every allocation
    keeps its address (pointers and CUDA graphs stay valid across a ``wake``).

    tags=None sleeps the whole allocator (the default pool and every private pool); a str or a list of str
    sleeps the pools created with those tags (``pool_create(tag=...)``; a tag no pool has raises
    INVALID_ARGUMENT). backup=True copies the live allocations to pinned host memory and back at the wake;
    backup=False discards them. Pools asleep already stay so. While a pool sleeps, allocations routed to it
    raise GraphallocError (FAILED_PRECONDITION, naming the pool); frees are allowed. Each tag is one
    graphalloc_sleep call, which leaves its pools as they were when it fails; with several tags, the error
    names the tags already asleep (they stay asleep).
    """
    device = _args.device("sleep", device)
    f = _sleep_function("graphalloc_sleep")
    flag = 1 if backup else 0
    tag_list = _tag_list(tags)
    if tag_list is None:
        _check("graphalloc_sleep", f(device, None, flag))
        return
    _for_each_tag("graphalloc_sleep", tag_list, lambda t: f(device, t, flag), "asleep")


def wake(tags: Union[None, str, Sequence[str]] = None, device: int = 0) -> None:
    """Wakes sleeping pools of `device` at the same addresses (restoring their backups): tags=None every
    sleeping pool, a str or a list of str those with the tags. Awake pools stay as they are."""
    device = _args.device("wake", device)
    f = _sleep_function("graphalloc_wake")
    tag_list = _tag_list(tags)
    if tag_list is None:
        _check("graphalloc_wake", f(device, None))
        return
    _for_each_tag("graphalloc_wake", tag_list, lambda t: f(device, t), "awake")


def pool_sleep(pool: int, backup: bool = False, device: int = 0) -> None:
    """Puts one pool to sleep (pool 0: the default pool), as ``sleep``."""
    pool, device = _pool_and_device("pool_sleep", pool, device)
    _check("graphalloc_pool_sleep", _sleep_function("graphalloc_pool_sleep")(device, pool, 1 if backup else 0))


def pool_wake(pool: int, device: int = 0) -> None:
    """Wakes one pool (pool 0: the default pool), as ``wake``."""
    pool, device = _pool_and_device("pool_wake", pool, device)
    _check("graphalloc_pool_wake", _sleep_function("graphalloc_pool_wake")(device, pool))


def pool_sleep_state(pool: int = 0, device: int = 0) -> dict:
    """Whether `pool` (0: the default pool) sleeps: {"asleep": bool, "sleeping_bytes": bytes of its address
    space whose memory is asleep, "backup_bytes": pinned host bytes held for its backup (asleep: the backup;
    awake: the buffer the wake kept for the next backed-up sleep, until empty_cache())}."""
    pool, device = _pool_and_device("pool_sleep_state", pool, device)
    asleep = ctypes.c_int(0)
    sleeping, backup = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _check("graphalloc_pool_sleep_state",
           _sleep_function("graphalloc_pool_sleep_state")(device, pool, ctypes.byref(asleep),
                                                           ctypes.byref(sleeping), ctypes.byref(backup)))
    return {"asleep": bool(asleep.value), "sleeping_bytes": sleeping.value, "backup_bytes": backup.value}


ALL_POOLS = (1 << 64) - 1  # GRAPHALLOC_ALL_POOLS


class NcclRegistration:
    """Every mapping of one pool (or of every pool) registered with an NCCL communicator, present and future
    (graphalloc_nccl_register; docs/sharing.md). close() deregisters everything; call it before the
    communicator is destroyed."""

    def __init__(self, handle: int, device: int, pool: int):
        self.handle, self.device, self.pool = handle, device, pool

    def stats(self) -> dict:
        """{"registered": mappings registered now, "errors": NCCL errors so far, "first_error": its message}."""
        registered, errors = ctypes.c_size_t(0), ctypes.c_size_t(0)
        code = _exported("graphalloc_nccl_registration_stats", "NCCL registration")(
            self.handle, ctypes.byref(registered), ctypes.byref(errors))
        return {"registered": registered.value, "errors": errors.value,
                "first_error": last_error() if code != OK else ""}

    def close(self) -> None:
        if self.handle:
            handle, self.handle = self.handle, 0
            _check("graphalloc_nccl_unregister",
                   _exported("graphalloc_nccl_unregister", "NCCL registration")(handle))

    def __repr__(self) -> str:
        return f"NcclRegistration(device={self.device}, pool={self.pool}, handle={self.handle})"


def nccl_register(comm: int, pool: int = ALL_POOLS, device: int = 0) -> NcclRegistration:
    """Registers every mapping of `pool` (a graphalloc pool id; ALL_POOLS: every pool) of `device` with the
    NCCL communicator `comm` (an ncclComm_t as an int), now and whenever one is mapped, and deregisters each
    before it is unmapped. libnccl is loaded at run time ($GRAPHALLOC_NCCL_LIBRARY, else libnccl.so.2)."""
    pool, device = _pool_and_device("nccl_register", pool, device)
    comm = _args.size("nccl_register", "comm", comm)
    handle = ctypes.c_uint64(0)
    _check("graphalloc_nccl_register", _exported("graphalloc_nccl_register", "NCCL registration")(
        device, pool, ctypes.c_void_p(comm), ctypes.byref(handle)))
    return NcclRegistration(handle.value, device, pool)


def cli_path() -> Optional[str]:
    """The `graphalloc` command-line tool: $GRAPHALLOC_CLI, the package's own bin/graphalloc (pip install
    packs it), next to the library (build/tools/graphalloc, <prefix>/bin/graphalloc), the build*/tools of the
    checkout the package comes from, then $PATH. None when not found."""
    env = os.environ.get("GRAPHALLOC_CLI")
    if env and Path(env).is_file():
        return env
    cands: List[Path] = [Path(__file__).resolve().parent / "bin" / "graphalloc"]
    try:
        lib_dir = Path(library_path()).parent
        cands += [lib_dir / "tools" / "graphalloc", lib_dir.parent / "bin" / "graphalloc"]
    except FileNotFoundError:
        pass
    cands += [d / "tools" / "graphalloc" for d in sorted(_source_checkout().glob("build*")) if d.is_dir()]
    for c in cands:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return shutil.which("graphalloc")


def run_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Runs the graphalloc CLI with `args`; raises FileNotFoundError if it is not found."""
    cli = cli_path()
    if cli is None:
        raise FileNotFoundError("graphalloc CLI not found: set GRAPHALLOC_CLI=/path/to/graphalloc "
                                "(cmake --build BUILD --target graphalloc_cli)")
    return subprocess.run([cli, *args], check=check, capture_output=True, text=True)
