"""torch.multiprocessing shares CUDA tensors allocated by graphalloc (the C++ backend), expandable segments
included: PyTorch's native allocator refuses those (it needs pidfd_getfd, which unprivileged containers
forbid); graphalloc passes the physical handles' file descriptors over a Unix socket instead (docs/sharing.md).

Each scenario runs in a fresh interpreter (graphalloc is installed once per process, with the scenario's
GRAPHALLOC_CONF): a producer allocates a tensor, puts it on a torch.multiprocessing queue; a spawned consumer
(graphalloc installed too) checks its contents, modifies it in place, and exits; the producer checks the
change, frees the tensor and checks that empty_cache() gives its memory back. Skips (77) without PyTorch, a
GPU or the shim."""
import sys
import unittest

import _backend_common as common
import _common

MiB = 1 << 20
# Large enough that an expandable segment maps it with several physical handles.
ELEMENTS = 40 * MiB // 4 + 1234


def consumer(config: str, inbox, outbox) -> None:
    """Spawned: graphalloc first (before CUDA), then the tensor; adds 1 in place, reports what it saw."""
    import graphalloc.torch as gat
    gat.install(config=config)
    import torch
    torch.cuda.init()
    try:
        x, view = inbox.get()
        expect = torch.arange(ELEMENTS, device="cuda", dtype=torch.float32)
        seen_ok = bool(torch.equal(x, expect)) and bool(torch.equal(view, expect[1000:]))
        x.add_(1)
        view[:10].fill_(-5)  # a view at an offset within the same storage
        torch.cuda.synchronize()
        outbox.put({"seen_ok": seen_ok, "backend": gat.backend(), "ptr": x.data_ptr()})
        del x, view
    except Exception as e:  # reported to the producer, which fails the scenario with it
        outbox.put({"error": f"{type(e).__name__}: {e}"})
    inbox.get()  # wait until the producer has checked, so that our mapping outlives its check


def scenario_share(config: str) -> None:
    import graphalloc.torch as gat
    gat.install(config=config)
    import torch
    import torch.multiprocessing as mp
    torch.cuda.init()
    assert gat.backend() == "allocator", gat.hooks()
    before = torch.cuda.memory_reserved()
    x = torch.arange(ELEMENTS, device="cuda", dtype=torch.float32)
    view = x[1000:]
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=consumer, args=(config, inbox, outbox))
    child.start()
    inbox.put((x, view))
    got = outbox.get(timeout=300)
    assert "error" not in got, f"the consumer failed: {got['error']}"
    assert got["seen_ok"], "the consumer saw other contents than the producer wrote"
    assert got["backend"] == "allocator", got
    torch.cuda.synchronize()
    want = torch.arange(ELEMENTS, device="cuda", dtype=torch.float32) + 1
    want[1000:1010] = -5
    assert torch.equal(x, want), "the consumer's in-place change is not visible to the producer"
    inbox.put("done")
    child.join(120)
    assert child.exitcode == 0, f"consumer exited with {child.exitcode}"
    del x, view, want
    # PyTorch keeps a sent storage until the consumer's reference counter says it is gone; collect it.
    import gc
    gc.collect()
    torch.cuda.ipc_collect()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved()
    assert after <= before, f"memory_reserved {after} after the share and empty_cache, {before} before"
    print(f"OK share: config {config!r}, consumer pointer {got['ptr']:#x}", flush=True)


def scenario_refused(config: str) -> None:
    import graphalloc.torch as gat
    gat.install(config=config)
    import torch
    from torch.multiprocessing.reductions import reduce_tensor
    torch.cuda.init()
    x = torch.ones(4 * MiB, device="cuda")
    try:
        reduce_tensor(x)
    except Exception as e:
        message = str(e)
        print("refused:", message, flush=True)
        assert "graphalloc" in message and "shareable_handles" in message, message
        print("OK refused", flush=True)
        return
    raise AssertionError("sharing a tensor of a pool without shareable handles was not refused")


class BackendIpcTest(unittest.TestCase):
    def run_scenario(self, name: str, config: str) -> str:
        r = _common.run([common.python(), __file__, "--scenario", name, "--config", config], timeout=600)
        self.assertIn(f"OK {name}", r.stdout)
        return r.stdout

    def test_expandable_segment_tensor_is_modified_in_place_by_a_child(self):
        self.run_scenario("share", "expandable_segments:True,shareable_handles:True")

    def test_handle_aligned_expandable_tensor_is_shared(self):
        self.run_scenario("share", "expandable_segments:True,shareable_handles:True,handle_aligned:True")

    def test_regular_segment_tensor_is_modified_in_place_by_a_child(self):
        self.run_scenario("share", "expandable_segments:False")

    def test_expandable_tensor_without_shareable_handles_is_refused_clearly(self):
        self.run_scenario("refused", "expandable_segments:True")


if __name__ == "__main__":
    if "--scenario" in sys.argv:
        name = sys.argv[sys.argv.index("--scenario") + 1]
        config = sys.argv[sys.argv.index("--config") + 1]
        {"share": scenario_share, "refused": scenario_refused}[name](config)
        sys.exit(0)
    common.run_main()
