"""NCCL graph registration of a buffer made by hand, with no graphalloc: the reference against which to read
compute-sanitizer's reports on nccl_in_graphs.py (issue 21).

With handle-aligned placement a graphalloc block lies inside one physical handle, so NCCL's graph
registration can register it: NCCL retains the handle under the pointer, exports it, and the peer maps it and
writes its part of an all-gather straight into it. This program sets up the same thing without any allocator:
each rank's all-gather output is one cuMemCreate handle (POSIX file descriptor shareable, as graphalloc's
`shareable_handles:True` makes them) of the size graphalloc would map, at the start of a larger reserved
range as in an expandable segment, or a plain tensor of PyTorch's own allocator (`--output torch`: cudaMalloc,
which NCCL registers through legacy IPC). Everything else is PyTorch's own allocator. Each rank captures an
all-gather into that buffer in `torch.cuda.graph` (NCCL_GRAPH_REGISTER unset), replays it REPLAYS times with
fresh inputs and compares each result with an eager all-gather.

    compute-sanitizer --tool memcheck --target-processes all python nccl_graph_register_baseline.py

Prints one JSON line per rank ("RESULT {...}") and exits 0 when every replay matched, 1 otherwise, 77 (skip)
without PyTorch, NCCL or two GPUs."""
import argparse
import ctypes
import json
import os
import sys
import traceback

from ranks import SKIP, join_group, run_ranks, world_or_skip

MiB = 1 << 20
ELEMENTS = (3 << 20) + 12345  # as nccl_in_graphs.py: the all-gather output is ~24.1 MiB for two ranks


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class OneHandleBuffer:
    """`size` bytes of one physical handle mapped at the start of a `reserve`-byte range; a CUDA array."""

    def __init__(self, device: int, size: int, reserve: int, elements: int):
        cu = ctypes.CDLL("libcuda.so.1")
        self._cu = cu
        prop = _AllocationProp()
        prop.type = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
        prop.requestedHandleTypes = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        prop.location = _Location(1, device)  # CU_MEM_LOCATION_TYPE_DEVICE
        gran = ctypes.c_size_t()
        self._check(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "granularity")
        g = gran.value
        self.size = (size + g - 1) // g * g
        self.reserve = max((reserve + g - 1) // g * g, self.size)
        self.handle = ctypes.c_uint64()
        self._check(cu.cuMemCreate(ctypes.byref(self.handle), ctypes.c_size_t(self.size), ctypes.byref(prop),
                                   ctypes.c_ulonglong(0)), "cuMemCreate")
        self.ptr = ctypes.c_uint64()
        self._check(cu.cuMemAddressReserve(ctypes.byref(self.ptr), ctypes.c_size_t(self.reserve),
                                           ctypes.c_size_t(0), ctypes.c_uint64(0), ctypes.c_ulonglong(0)),
                    "cuMemAddressReserve")
        self._check(cu.cuMemMap(self.ptr, ctypes.c_size_t(self.size), ctypes.c_size_t(0), self.handle,
                                ctypes.c_ulonglong(0)), "cuMemMap")
        access = _AccessDesc(_Location(1, device), 3)  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._check(cu.cuMemSetAccess(self.ptr, ctypes.c_size_t(self.size), ctypes.byref(access),
                                      ctypes.c_size_t(1)), "cuMemSetAccess")
        self.__cuda_array_interface__ = {"shape": (elements,), "typestr": "<f4", "data": (self.ptr.value, False),
                                         "version": 3, "strides": None}

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed with CUresult {rc}")


def worker(rank: int, world: int, args, port: int) -> None:
    import torch
    import torch.distributed as dist

    join_group(rank, world, port)
    result = {"rank": rank, "output": args.output, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
              "nccl_graph_register": os.environ.get("NCCL_GRAPH_REGISTER", "(unset)"), "failures": []}
    try:
        out_elements = world * ELEMENTS
        if args.output == "cumem":
            buf = OneHandleBuffer(rank, out_elements * 4, args.reserve_mib * MiB, out_elements)
            out = torch.as_tensor(buf, device=f"cuda:{rank}")
            result.update(handle_bytes=buf.size, reserved_bytes=buf.reserve, address=hex(buf.ptr.value))
        else:
            out = torch.empty(out_elements, device="cuda", dtype=torch.float32)

        def inputs(step: int):
            return torch.arange(ELEMENTS, device="cuda", dtype=torch.float32) % 251 + float(rank * 1000 + step)

        static_x = inputs(0)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                dist.all_gather_into_tensor(out, static_x)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            dist.all_gather_into_tensor(out, static_x)
        want = torch.empty_like(out)
        for step in range(1, args.replays + 1):
            static_x.copy_(inputs(step))
            graph.replay()
            dist.all_gather_into_tensor(want, inputs(step))
            if not torch.equal(out, want):
                result["failures"].append(f"replay {step}: {(out != want).sum().item()} elements differ")
        torch.cuda.synchronize()
        result["replays"] = args.replays
    except Exception as e:
        result["failures"].append(f"exception: {type(e).__name__}: {e}")
        traceback.print_exc()
    result["ok"] = not result["failures"]
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0 if result["ok"] else 1)  # not destroy_process_group: see nccl_in_graphs.py


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", choices=("cumem", "torch"), default="cumem")
    p.add_argument("--reserve-mib", type=int, default=64, help="reserved range the handle sits at the start of")
    p.add_argument("--replays", type=int, default=5)
    args = p.parse_args()
    if world_or_skip(2, minimum=2) is None:
        return SKIP
    return run_ranks(worker, 2, args)

if __name__ == "__main__":
    sys.exit(main())
