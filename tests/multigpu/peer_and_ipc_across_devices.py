"""Peers and IPC across two GPUs with graphalloc as PyTorch's allocator, expandable segments on (issue 21,
item 3).

peer: in one process, a tensor on cuda:0 spanning several physical handles is copied to cuda:1 and back
      (PyTorch enables peer access through the allocator: graphalloc grants it on every mapped chunk, present
      and future), then the cuda:0 segment grows (new chunks after peer access was enabled) and the copies
      are checked again.
ipc:  a producer on GPU 0 puts a cuda:0 tensor on a torch.multiprocessing queue; a consumer whose current
      device is GPU 1 imports it, checks it, copies it to cuda:1, writes 2x its values back into the shared
      tensor, and exits; the producer checks the values, frees the tensor and checks that empty_cache() gives
      the memory back once the consumer is gone.

    python peer_and_ipc_across_devices.py [--config ...]

Prints "RESULT {...}" and exits 0 when both passed, 1 otherwise, 77 (skip) without two GPUs."""
import argparse
import gc
import json
import os
import sys
import traceback

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
MiB = 1 << 20
ELEMENTS = 48 * MiB // 4 + 777


def consumer(config: str, inbox, outbox) -> None:
    import graphalloc.torch as gat
    gat.install(config=config)
    import torch
    torch.cuda.set_device(1)
    try:
        x = inbox.get()
        want = torch.arange(ELEMENTS, device="cuda:1", dtype=torch.float32)
        on_1 = x.to("cuda:1")
        seen_ok = bool(torch.equal(on_1, want))
        x.copy_(on_1 * 2)  # GPU 1's data written into GPU 0's exported block
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        outbox.put({"seen_ok": seen_ok, "device_of_import": str(x.device)})
        del x, on_1
    except Exception as e:
        traceback.print_exc()
        outbox.put({"error": f"{type(e).__name__}: {e}"})
    inbox.get()


def run_peer(torch, result) -> None:
    a = torch.arange(ELEMENTS, device="cuda:0", dtype=torch.float32)
    b = a.to("cuda:1")
    assert torch.equal(b.cpu(), a.cpu()), "cuda:0 -> cuda:1 copy differs"
    b.mul_(3)
    a.copy_(b)
    assert torch.equal(a.cpu(), (torch.arange(ELEMENTS, dtype=torch.float32) * 3)), "cuda:1 -> cuda:0 differs"
    grown = [torch.full((ELEMENTS,), float(i), device="cuda:0") for i in range(4)]  # chunks mapped after
    for i, g in enumerate(grown):
        h = g.to("cuda:1")
        assert bool((h == float(i)).all()), f"copy of a chunk mapped after peer access differs ({i})"
        g.copy_(h + 1)
        assert bool((g == float(i + 1)).all()), f"copy back into a later chunk differs ({i})"
    result["peer"] = {"ok": True, "can_access_peer": torch.cuda.can_device_access_peer(0, 1)}


def run_ipc(torch, config, result) -> None:
    import torch.multiprocessing as mp
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(0)
    x = torch.arange(ELEMENTS, device="cuda:0", dtype=torch.float32)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=consumer, args=(config, inbox, outbox))
    child.start()
    inbox.put(x)
    got = outbox.get(timeout=300)
    assert "error" not in got, f"consumer: {got['error']}"
    assert got["seen_ok"], "the consumer on GPU 1 read other values than GPU 0's"
    want = torch.arange(ELEMENTS, device="cuda:0", dtype=torch.float32) * 2
    assert torch.equal(x, want), "GPU 1's write into the shared block is not visible on GPU 0"
    inbox.put("done")
    child.join(120)
    assert child.exitcode == 0, f"consumer exited with {child.exitcode}"
    del x, want
    gc.collect()
    torch.cuda.ipc_collect()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved(0)
    assert after <= before, f"GPU 0 memory_reserved {after} after the consumer exited, {before} before"
    result["ipc"] = {"ok": True, "reserved_before": before, "reserved_after": after, **got}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="expandable_segments:True,shareable_handles:True")
    args = p.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print(f"SKIP: PyTorch is not installed ({e})")
        return SKIP
    import torch
    if torch.cuda.device_count() < 2:
        print(f"SKIP: needs two GPUs, this machine has {torch.cuda.device_count()}")
        return SKIP
    import graphalloc.torch as gat
    gat.install(config=args.config)
    torch.cuda.init()
    result = {"config": args.config, "backend": gat.backend(), "torch": torch.__version__,
              "devices": [torch.cuda.get_device_name(i) for i in range(2)], "failures": []}
    for name, fn in (("peer", lambda: run_peer(torch, result)), ("ipc", lambda: run_ipc(torch, args.config, result))):
        try:
            fn()
        except Exception as e:
            traceback.print_exc()
            result["failures"].append(f"{name}: {type(e).__name__}: {e}")
    result["ok"] = not result["failures"]
    print("RESULT " + json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
