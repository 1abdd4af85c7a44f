"""The memory functions of graphalloc.torch (its third concept), as torch.cuda has them: statistics with
PyTorch's keys, empty_cache and memory fractions, record_stream, sleep and wake of PyTorch's pools, history
and snapshots. Each takes a device as torch.cuda does (None: install()'s device, else the current one)."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, List

import graphalloc as _ga
from graphalloc import _torch_state as state
from graphalloc._torch_graph_pools import graph_pool_id

def nested(flat: Dict[str, int]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = value
    return out


# ---- statistics (PyTorch's flat keys, from graphalloc_stats_json) ----

def memory_stats(device=None) -> Dict[str, int]:
    """graphalloc's statistics of `device`, with torch.cuda.memory_stats()'s flat keys, sorted like it."""
    flat = _ga.stats(state.device_index(device))
    return dict(sorted(flat.items()))


def memory_stats_as_nested_dict(device=None) -> Dict[str, Any]:
    return nested(_ga.stats(state.device_index(device)))


def memory_allocated(device=None) -> int:
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None) -> int:
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def empty_cache(device=None) -> None:
    _ga.empty_cache(state.device_index(device))


def reset_peak_memory_stats(device=None) -> None:
    _ga.reset_peak_stats(state.device_index(device))


def reset_accumulated_memory_stats(device=None) -> None:
    _ga.reset_accumulated_stats(state.device_index(device))


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    _ga.set_memory_fraction(fraction, state.device_index(device))


def record_stream(tensor, stream) -> None:
    """Marks `tensor`'s memory as used on `stream` (torch.cuda.Stream) in graphalloc directly.

    Tensor.record_stream(stream) already does this when hooks()['record_stream'] is wired; this is for
    PyTorch builds without the hook. Use the tensor's storage base pointer (what the allocator handed out)."""
    ptr = tensor.untyped_storage().data_ptr()
    _ga.record_stream(ptr, int(stream.cuda_stream), state.device_index(tensor.device))


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
    idx = state.device_index(device)
    if pools is None:
        _ga.sleep(None, backup=backup, device=idx)
        return
    for ga_pool in _graphalloc_pools(pools, idx):
        _ga.pool_sleep(ga_pool, backup=backup, device=idx)


def wake(pools=None, device=None) -> None:
    """Maps fresh device memory under sleeping pools at the same addresses, restoring backups (pools as in
    ``sleep``; None: every sleeping pool of `device`). Awake pools stay as they are."""
    idx = state.device_index(device)
    if pools is None:
        _ga.wake(None, device=idx)
        return
    for ga_pool in _graphalloc_pools(pools, idx):
        _ga.pool_wake(ga_pool, device=idx)


def sleep_state(pool=None, device=None) -> Dict[str, Any]:
    """Whether a PyTorch pool (None: the default pool) sleeps: {"asleep", "sleeping_bytes", "backup_bytes"}
    (graphalloc.pool_sleep_state)."""
    idx = state.device_index(device)
    ga_pool = 0 if pool is None else _graphalloc_pools(pool, idx)[0]
    return _ga.pool_sleep_state(ga_pool, device=idx)


# ---- history and snapshots ----

def record_history(enabled: bool = True, max_entries: int = 100000, stacks: bool = False, device=None) -> None:
    """Turns graphalloc's allocation history on/off (C stacks only: no Python frames)."""
    _ga.record_history(state.device_index(device), enabled, max_entries, stacks)


def snapshot(device=None) -> Dict[str, Any]:
    """A snapshot of `device` in graphalloc's JSON format (docs/snapshot_format.md), as a dict."""
    return json.loads(_ga.snapshot_json(state.device_index(device)))


def dump_snapshot(path: str, device=None) -> str:
    """Writes snapshot(device) to `path` as JSON (opens with `graphalloc snapshot summary|plot PATH`)."""
    text = _ga.snapshot_json(state.device_index(device))
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
