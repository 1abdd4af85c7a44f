"""What graphalloc.torch knows of this process's installation, shared by its modules: which backend
serves PyTorch, how each of PyTorch's hooks is served, libgraphalloc_torch.so and its pool table, and the
device a call means when it names none. One module owns it so that each concept (graphalloc.torch's
install, _torch_graph_pools, _torch_memory) reads and writes the same figures."""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

lock = threading.Lock()
allocator: Any = None            # PyTorch's allocator object once installed
backend: Optional[str] = None    # "allocator" or "pluggable" once installed
hooks: Dict[str, str] = {}       # how each PyTorch hook is served (graphalloc.torch.hooks())
keepalive: List[Any] = []        # ctypes trampolines PyTorch holds raw pointers to: never collected
default_device: Optional[int] = None
devices_seen = set()
shim: Any = None                 # libgraphalloc_torch.so (ctypes.CDLL) once loaded
shim_path: Optional[str] = None
# What answers about PyTorch's pools (graphalloc_torch_shim_* functions): the shim's table on the pluggable
# path, the backend's once the backend is installed.
pool_table: Any = None


def current_device_or_none() -> Optional[int]:
    try:
        import torch
        if torch.cuda.is_initialized():
            return torch.cuda.current_device()
    except Exception:  # noqa: BLE001 - called from C callbacks: never raise
        pass
    return None


def candidate_devices() -> List[int]:
    cur = current_device_or_none()
    out = [cur] if cur is not None else []
    try:
        import torch
        out += [d for d in range(torch.cuda.device_count()) if d != cur]
    except Exception:  # noqa: BLE001
        pass
    return out or [0]


def device_index(device=None, allow_uninitialised: bool = False) -> int:
    import torch
    if device is None:
        if default_device is not None:
            idx = default_device
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
    devices_seen.add(idx)
    return idx
