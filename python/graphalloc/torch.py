"""graphalloc as PyTorch's CUDA allocator, through torch.cuda.memory.CUDAPluggableAllocator (no LD_PRELOAD).

    import graphalloc.torch as gat
    gat.install(config="max_split_size_mb:256")   # before anything initialises CUDA
    import torch
    x = torch.empty(1 << 20, device="cuda")         # served by graphalloc
    gat.memory_stats()["allocated_bytes.all.current"]
    torch.cuda.memory_allocated()                   # works too: install() patches PyTorch's stats entry points

What works:
  * every CUDA tensor allocation and free of the process goes through graphalloc_torch_malloc/free, on the
    stream PyTorch hands over (graphalloc keeps per-stream caches, like PyTorch's allocator);
  * Tensor.record_stream(s): wired through the pluggable allocator's set_record_stream_fn hook (a native C
    function when the library exports graphalloc_torch_record_stream, else a ctypes trampoline);
  * torch.cuda.empty_cache() and torch.cuda.set_per_process_memory_fraction() reach graphalloc through the
    set_reset_fn / set_memory_fraction_fn hooks;
  * statistics: memory_stats() & co. here; with patch_torch=True (default) also torch.cuda.memory_stats(),
    memory_allocated(), max_memory_reserved(), reset_peak_memory_stats(), ... (PyTorch's pluggable allocator
    cannot report them itself, pytorch#133281: without the patch they raise);
  * snapshots: snapshot()/dump_snapshot() (graphalloc's JSON), export_torch() (PyTorch's memory_viz pickle,
    through the `graphalloc` CLI), when the library exports graphalloc_snapshot_json.

What does not work (yet):
  * CUDA graphs with private pools: torch.cuda.graph / make_graphed_callables / torch.compile(mode=
    "reduce-overhead") need the pool hooks (set_begin_allocate_to_pool, set_end_allocate_to_pool_fn,
    set_release_pool), which take C++ types (MempoolId_t, std::function) and need graphalloc's private pools
    (issue 5). Not wired: see tests/torch/graph_capture_test.py for what happens today.
  * torch.cuda.memory._snapshot()/_record_memory_history(), torch.cuda.MemPool with graphalloc: PyTorch's
    pluggable allocator does not forward them. Use snapshot()/record_history() here instead.
  * install() after CUDA is initialised: PyTorch cannot swap an allocator that has handed out memory.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
import threading
from typing import Any, Dict, List, Optional, Union

import graphalloc as _ga

__all__ = [
    "install", "is_installed", "hooks", "memory_stats", "memory_stats_as_nested_dict", "memory_allocated",
    "max_memory_allocated", "memory_reserved", "max_memory_reserved", "empty_cache", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "set_per_process_memory_fraction", "record_stream", "record_history",
    "snapshot", "dump_snapshot", "export_torch", "config", "library_path",
]

_state_lock = threading.Lock()
_allocator = None            # torch.cuda.memory.CUDAPluggableAllocator once installed
_default_device: Optional[int] = None
_hooks: Dict[str, str] = {}
_keepalive: List[Any] = []   # ctypes trampolines PyTorch holds raw pointers to: never collected
_devices_seen = set()


class InstallError(RuntimeError):
    pass


def library_path() -> str:
    return _ga.library_path()


def _fn_address(name: str) -> Optional[int]:
    lib = _ga.library()
    if not hasattr(lib, name):
        return None
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def _wire_hooks(native) -> None:
    """Sets the pluggable allocator's C-function-pointer hooks that PyTorch exposes to Python."""
    lib = _ga.library()

    # record_stream: void(void* ptr, cudaStream_t stream).
    if hasattr(native, "set_record_stream_fn"):
        addr = _fn_address("graphalloc_torch_record_stream")
        if addr is not None:
            native.set_record_stream_fn(addr)
            _hooks["record_stream"] = "native graphalloc_torch_record_stream"
        else:
            @ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
            def _record_stream(ptr, stream):
                # graphalloc_record_stream needs the device: try the current one, then the others.
                for dev in _candidate_devices():
                    if lib.graphalloc_record_stream(ptr, dev, stream) == _ga.OK:
                        return
                sys.stderr.write(f"graphalloc: record_stream({ptr:#x}): {_ga.last_error()}\n")
            _keepalive.append(_record_stream)
            native.set_record_stream_fn(ctypes.cast(_record_stream, ctypes.c_void_p).value)
            _hooks["record_stream"] = "python trampoline -> graphalloc_record_stream"
    else:
        _hooks["record_stream"] = ("unavailable in this PyTorch: call graphalloc.torch.record_stream(t, s) "
                                   "after t.record_stream(s)")

    # reset (emptyCache): void().
    if hasattr(native, "set_reset_fn"):
        addr = _fn_address("graphalloc_torch_empty_cache")
        if addr is not None:
            native.set_reset_fn(addr)
            _hooks["empty_cache"] = "native graphalloc_torch_empty_cache"
        else:
            @ctypes.CFUNCTYPE(None)
            def _reset():
                for dev in sorted(_devices_seen | {_current_device_or_none() or 0}):
                    if lib.graphalloc_empty_cache(dev) != _ga.OK:
                        sys.stderr.write(f"graphalloc: empty_cache({dev}): {_ga.last_error()}\n")
            _keepalive.append(_reset)
            native.set_reset_fn(ctypes.cast(_reset, ctypes.c_void_p).value)
            _hooks["empty_cache"] = "python trampoline -> graphalloc_empty_cache"
    else:
        _hooks["empty_cache"] = "unavailable in this PyTorch: call graphalloc.torch.empty_cache()"

    # memory fraction: void(double fraction, int device).
    if hasattr(native, "set_memory_fraction_fn"):
        addr = _fn_address("graphalloc_torch_set_memory_fraction")
        if addr is not None:
            native.set_memory_fraction_fn(addr)
            _hooks["memory_fraction"] = "native graphalloc_torch_set_memory_fraction"
        else:
            @ctypes.CFUNCTYPE(None, ctypes.c_double, ctypes.c_int)
            def _fraction(fraction, device):
                _devices_seen.add(int(device))
                if lib.graphalloc_set_memory_fraction(fraction, device) != _ga.OK:
                    sys.stderr.write(f"graphalloc: set_memory_fraction: {_ga.last_error()}\n")
            _keepalive.append(_fraction)
            native.set_memory_fraction_fn(ctypes.cast(_fraction, ctypes.c_void_p).value)
            _hooks["memory_fraction"] = "python trampoline -> graphalloc_set_memory_fraction"
    else:
        _hooks["memory_fraction"] = "unavailable in this PyTorch: call graphalloc.torch.set_per_process_memory_fraction()"

    pool_hooks = [h for h in ("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool")
                  if hasattr(native, h)]
    _hooks["graph_pools"] = ("not wired (needs graphalloc private pools, issue 5; PyTorch has "
                             + (", ".join(pool_hooks) or "no pool hooks") + ")")


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
            patch_torch: bool = True, hooks: bool = True):
    """Makes graphalloc PyTorch's CUDA allocator for this process; returns the CUDAPluggableAllocator.

    Must run before anything initialises CUDA in PyTorch (the first CUDA tensor, torch.cuda.init(),
    torch.cuda.current_device(), ...). `config` (GRAPHALLOC_CONF syntax, e.g. "max_split_size_mb:256,
    record_history:True") is set as GRAPHALLOC_CONF for the allocators graphalloc creates on first use.
    `device` is the device the functions of this module use when theirs is None (default: the current
    one); graphalloc serves every device either way. With patch_torch, torch.cuda.memory_stats() and the
    functions built on it report graphalloc's statistics. hooks=False leaves the pluggable allocator's extra
    hooks (record_stream, empty_cache, memory fraction) unset. Calling install() again returns the same
    allocator.
    """
    global _allocator, _default_device
    import torch

    with _state_lock:
        if _allocator is not None:
            if config is not None and config != os.environ.get("GRAPHALLOC_CONF"):
                raise InstallError("graphalloc is already installed with GRAPHALLOC_CONF="
                                   f"{os.environ.get('GRAPHALLOC_CONF')!r}; cannot change it to {config!r}")
            return _allocator
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
        path = _ga.library_path()
        _ga.library()  # load it (same path: PyTorch's ctypes.CDLL gets the same handle)
        allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "graphalloc_torch_malloc",
                                                             "graphalloc_torch_free")
        if hooks:
            _wire_hooks(allocator.allocator())
        try:
            torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            raise InstallError(f"graphalloc.torch.install(): PyTorch refused the allocator ({e}); it must be "
                               "installed before CUDA is initialised") from e
        if device is not None:
            _default_device = _device_index(device, allow_uninitialised=True)
        if patch_torch:
            _patch_torch(torch)
        _allocator = allocator
        return allocator


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
