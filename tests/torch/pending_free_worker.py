"""What an allocator reports about a block freed while another stream still uses it (record_stream), the
moment it is freed: memory_allocated(), the block's state in torch.cuda.memory_snapshot(), and, inside a
CUDA graph capture (where the free's events wait for the capture to end), checkPoolLiveAllocations of the
capture's pool, the check PyTorch's graph trees make. The side stream is delayed (torch.cuda._sleep) so
that the free really waits. Prints one JSON line. --allocator graphalloc installs graphalloc's backend;
native keeps PyTorch's own. Run by backend_pending_free_test.py, once per allocator."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402,F401  (sys.path for graphalloc)

MiB = 1 << 20


def state_of(torch, ptr):
    for seg in torch.cuda.memory_snapshot():
        address = seg["address"]
        for block in seg["blocks"]:
            if address == ptr:
                return block["state"]
            address += block["size"]
    return "absent"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--allocator", choices=["graphalloc", "native"], required=True)
    args = ap.parse_args()
    if args.allocator == "graphalloc":
        import graphalloc.torch as gat
        gat.install(backend="allocator")
    import torch

    torch.cuda.init()
    out = {"allocator": torch.cuda.get_allocator_backend()}
    side = torch.cuda.Stream()

    # Eager: the side stream sleeps, then reads the block; the block is freed before it is done.
    x = torch.zeros(4 * MiB, dtype=torch.uint8, device="cuda")
    ptr = x.data_ptr()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        x.add_(1)
    x.record_stream(side)
    del x
    out["eager_allocated_drop"] = before - torch.cuda.memory_allocated()
    out["eager_state"] = state_of(torch, ptr)
    torch.cuda.synchronize()

    # During a capture: the free's events wait for the capture to end; is the block still a live allocation
    # of the capture's pool?
    pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=pool)
        y = torch.zeros(4 * MiB, dtype=torch.uint8, device="cuda")
        side.wait_stream(stream)
        with torch.cuda.stream(side):
            torch.cuda._sleep(1000)
            y.add_(1)
        y.record_stream(side)
        stream.wait_stream(side)
        before = torch.cuda.memory_allocated()
        del y
        out["capture_allocated_drop"] = before - torch.cuda.memory_allocated()
        out["capture_pool_has_no_live_allocation"] = bool(
            torch._C._cuda_checkPoolLiveAllocations(torch.cuda.current_device(), pool, set()))
        graph.capture_end()
    torch.cuda.synchronize()
    print("result " + json.dumps(out, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
