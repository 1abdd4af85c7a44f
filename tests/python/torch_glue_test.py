"""graphalloc.torch's CUDA-graph wiring, without PyTorch: stand-ins for PyTorch's pluggable allocator, its
CUDAGraph and torch.cuda.graph, and for libgraphalloc_torch.so, check the decisions that the GPU tests
(tests/torch) can only see from outside:
  * where the shim is looked for, and GRAPHALLOC_TORCH_SHIM=off;
  * no shim, missing pool setters, or a shim built without pool hooks: capture raises
    GraphCaptureUnsupported with that reason, before torch.cuda.graph switches streams;
  * everything there: the three setters get the shim's hook addresses;
  * a capture that fails before PyTorch ends its route gets the route ended, and the pool reference dropped
    exactly when PyTorch will never release it."""
import ctypes
import importlib.util
import os
import sys
import tempfile
import types
import unittest

if importlib.util.find_spec("torch") is None:
    # graphalloc.torch refuses to import without PyTorch; these tests pass it stand-ins for what it calls.
    sys.modules["torch"] = types.ModuleType("torch")
import graphalloc.torch as gat  # noqa: E402
from graphalloc import _torch_graph_pools as pools  # noqa: E402
from graphalloc import _torch_state as state  # noqa: E402

KEY = (0, 7, 0)  # (device, mempool id first, second) of the fake capture


class FakeShim:
    """The ctypes functions of libgraphalloc_torch.so that graphalloc.torch calls, with a fake route table."""

    def __init__(self, hooks_unavailable=None):
        self.hooks_unavailable = hooks_unavailable
        self.routes = set()
        self.references = 0
        self.abandoned = []
        self.last = None

    # What PyTorch's beginAllocateToPool / endAllocateToPool / releasePool would do through the shim.
    def begin(self):
        self.routes.add(KEY)
        self.references += 1
        self.last = KEY

    def end(self):
        self.routes.discard(KEY)

    def graphalloc_torch_shim_hook(self, name):
        return {b"begin_allocate_to_pool": 0x1000, b"end_allocate_to_pool": 0x2000,
                b"release_pool": 0x3000}.get(name)

    def graphalloc_torch_shim_pool_hooks_unavailable(self):
        return self.hooks_unavailable

    def graphalloc_torch_shim_open_routes(self):
        return len(self.routes)

    def graphalloc_torch_shim_last_begun(self, device, first, second):
        if self.last is None:
            return 0
        device._obj.value, first._obj.value, second._obj.value = self.last
        return 1

    def graphalloc_torch_shim_pool_of(self, device, first, second, pool, route_open):
        route_open._obj.value = 1 if (device, first, second) in self.routes else 0
        pool._obj.value = 42
        return 1

    def graphalloc_torch_shim_abandon(self, device, first, second, release):
        self.abandoned.append(((device, first, second), release))
        self.routes.discard((device, first, second))
        if release:
            self.references -= 1


def fake_torch(shim, fail_at=None):
    """A torch namespace whose CUDAGraph drives `shim` like PyTorch's CUDAGraph drives the allocator hooks.
    fail_at: None, "begin" (after beginAllocateToPool, as a failing cudaStreamBeginCapture), "end_capture"
    (cudaStreamEndCapture failing, before endAllocateToPool) or "instantiate" (after the capture ended)."""

    class CUDAGraph:
        def __init__(self):
            self.ended = False

        def capture_begin(self, pool=None, capture_error_mode="global"):
            shim.begin()
            if fail_at == "begin":
                raise RuntimeError("cudaStreamBeginCapture failed")

        def capture_end(self):
            if fail_at == "end_capture":
                raise RuntimeError("operation not permitted when stream is capturing")
            shim.end()
            self.ended = True
            if fail_at == "instantiate":
                raise RuntimeError("cudaGraphInstantiate failed")

        def pool(self):
            if not self.ended:
                raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
            return KEY[1:]

    class graph:  # noqa: N801 - torch.cuda.graph
        def __enter__(self):
            return "entered"

    graphs = types.SimpleNamespace(CUDAGraph=CUDAGraph, graph=graph)
    return types.SimpleNamespace(__version__="9.9-fake", cuda=types.SimpleNamespace(graphs=graphs))


class FakeNative:
    """PyTorch's _CUDAPluggableAllocator: records the hook addresses set."""

    def __init__(self, setters=("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool")):
        self.set = {}
        for name in setters:
            setattr(self, name, lambda address, name=name: self.set.__setitem__(name, address))


class WiringTest(unittest.TestCase):
    def setUp(self):
        state.hooks.clear()

    def wire(self, shim, native=None, reason="no shim here", fail_at=None):
        torch = fake_torch(shim if shim is not None else FakeShim(), fail_at)
        pools.wire_graph_pools(native or FakeNative(), torch, shim, reason)
        return torch

    def assert_refused(self, torch, reason_part):
        self.assertIn("unsupported", gat.hooks()["graph_pools"])
        self.assertIn(reason_part, gat.hooks()["graph_pools"])
        with self.assertRaises(gat.GraphCaptureUnsupported) as cm:
            torch.cuda.graphs.graph().__enter__()
        self.assertIn(reason_part, str(cm.exception))
        self.assertIn("cannot give this CUDA graph capture a private pool", str(cm.exception))
        with self.assertRaises(gat.GraphCaptureUnsupported):
            torch.cuda.graphs.CUDAGraph().capture_begin()

    def test_without_the_shim_captures_are_refused_with_the_reason(self):
        self.assert_refused(self.wire(None, reason="libgraphalloc_torch.so not found"), "not found")

    def test_without_pytorchs_pool_setters_captures_are_refused(self):
        native = FakeNative(setters=("set_begin_allocate_to_pool",))
        torch = self.wire(FakeShim(), native)
        self.assert_refused(torch, "set_end_allocate_to_pool_fn, set_release_pool")
        self.assertEqual(native.set, {})

    def test_a_shim_built_without_pool_hooks_refuses_with_its_reason(self):
        torch = self.wire(FakeShim(hooks_unavailable=b"hook types differ"))
        self.assert_refused(torch, "hook types differ")

    def test_hooks_get_the_shims_addresses(self):
        native = FakeNative()
        self.wire(FakeShim(), native)
        self.assertEqual(native.set, {"set_begin_allocate_to_pool": 0x1000, "set_end_allocate_to_pool_fn": 0x2000,
                                      "set_release_pool": 0x3000})
        self.assertTrue(gat.hooks()["graph_pools"].startswith("wired"))

    def test_successful_capture_abandons_nothing(self):
        shim = FakeShim()
        torch = self.wire(shim)
        g = torch.cuda.graphs.CUDAGraph()
        g.capture_begin()
        g.capture_end()
        self.assertEqual(shim.abandoned, [])
        self.assertEqual(shim.routes, set())
        self.assertEqual(shim.references, 1)  # PyTorch's releasePool drops it when the graph goes

    def test_invalidated_capture_ends_the_route_and_drops_the_reference(self):
        shim = FakeShim()
        torch = self.wire(shim, fail_at="end_capture")
        g = torch.cuda.graphs.CUDAGraph()
        g.capture_begin()
        with self.assertRaises(RuntimeError):
            g.capture_end()
        self.assertEqual(shim.abandoned, [(KEY, 1)])
        self.assertEqual(shim.routes, set())
        self.assertEqual(shim.references, 0)

    def test_failure_after_the_capture_ended_leaves_the_release_to_pytorch(self):
        shim = FakeShim()
        torch = self.wire(shim, fail_at="instantiate")
        g = torch.cuda.graphs.CUDAGraph()
        g.capture_begin()
        with self.assertRaises(RuntimeError):
            g.capture_end()
        self.assertEqual(shim.abandoned, [])
        self.assertEqual(shim.references, 1)

    def test_capture_begin_failing_after_the_route_opened_abandons_it(self):
        shim = FakeShim()
        torch = self.wire(shim, fail_at="begin")
        with self.assertRaises(RuntimeError):
            torch.cuda.graphs.CUDAGraph().capture_begin()
        self.assertEqual(shim.abandoned, [(KEY, 1)])
        self.assertEqual(shim.references, 0)


class FindShimTest(unittest.TestCase):
    def setUp(self):
        self.saved = os.environ.get("GRAPHALLOC_TORCH_SHIM")

    def tearDown(self):
        if self.saved is None:
            os.environ.pop("GRAPHALLOC_TORCH_SHIM", None)
        else:
            os.environ["GRAPHALLOC_TORCH_SHIM"] = self.saved

    def test_off_disables_it(self):
        os.environ["GRAPHALLOC_TORCH_SHIM"] = "off"
        path, reason = pools.find_shim()
        self.assertIsNone(path)
        self.assertIn("disabled by GRAPHALLOC_TORCH_SHIM", reason)

    def test_a_missing_file_is_named(self):
        os.environ["GRAPHALLOC_TORCH_SHIM"] = "/nonexistent/libgraphalloc_torch.so"
        path, reason = pools.find_shim()
        self.assertIsNone(path)
        self.assertIn("/nonexistent/libgraphalloc_torch.so", reason)

    def test_an_existing_file_is_used(self):
        with tempfile.NamedTemporaryFile(suffix=".so") as f:
            os.environ["GRAPHALLOC_TORCH_SHIM"] = f.name
            path, reason = pools.find_shim()
            self.assertEqual(path, os.path.realpath(f.name))
            self.assertEqual(reason, "")

    def test_default_search_lists_where_it_looked(self):
        os.environ.pop("GRAPHALLOC_TORCH_SHIM", None)
        path, reason = pools.find_shim()
        if path is None:  # a build without PyTorch: no shim beside the library
            self.assertIn(os.path.dirname(gat._ga.library_path()), reason)
        else:
            self.assertTrue(path.endswith("libgraphalloc_torch.so"))



class FakeBackendShim:
    """libgraphalloc_torch.so's backend entry points: install succeeds, or fails with PyTorch's refusal."""

    def __init__(self, refusal=None):
        self.refusal = refusal
        self.calls = 0
        fake = FakeShim()
        self.graphalloc_torch_backend_open_routes = fake.graphalloc_torch_shim_open_routes
        self.graphalloc_torch_backend_last_begun = fake.graphalloc_torch_shim_last_begun
        self.graphalloc_torch_backend_route_of = fake.graphalloc_torch_shim_pool_of
        self.graphalloc_torch_backend_abandon = fake.graphalloc_torch_shim_abandon

    def graphalloc_torch_backend_install(self, error, size):
        self.calls += 1
        if self.refusal is None:
            return 0
        error.value = self.refusal.encode()
        return 1


class BackendChoiceTest(unittest.TestCase):
    """install()'s choice between the C++ backend and the pluggable path, without PyTorch."""

    def setUp(self):
        state.hooks.clear()
        self.torch = fake_torch(FakeShim())
        self.torch.cuda.memory = types.SimpleNamespace(_get_current_allocator=lambda: "pytorch's allocator object")

    def test_without_the_shim_the_backend_is_unavailable_with_the_shims_reason(self):
        allocator, reason = gat._install_backend(self.torch, None, "libgraphalloc_torch.so not found")
        self.assertIsNone(allocator)
        self.assertEqual(reason, "libgraphalloc_torch.so not found")

    def test_a_shim_without_the_backend_says_to_rebuild(self):
        allocator, reason = gat._install_backend(self.torch, types.SimpleNamespace(), "")
        self.assertIsNone(allocator)
        self.assertIn("has no PyTorch backend: rebuild it", reason)

    def test_pytorchs_refusal_is_an_install_error_with_its_message(self):
        shim = FakeBackendShim(refusal="Can't swap an already initialized allocator")
        with self.assertRaises(gat.InstallError) as cm:
            gat._install_backend(self.torch, shim, "")
        self.assertIn("Can't swap an already initialized allocator", str(cm.exception))
        self.assertEqual(shim.calls, 1)

    def test_an_installed_backend_serves_every_hook_itself(self):
        shim = FakeBackendShim()
        allocator, reason = gat._install_backend(self.torch, shim, "")
        self.assertEqual(allocator, "pytorch's allocator object")
        self.assertEqual(reason, "")
        self.assertTrue(gat.hooks()["graph_pools"].startswith("wired (the backend"), gat.hooks()["graph_pools"])
        self.assertTrue(gat.hooks()["oom"].startswith("raises torch.cuda.OutOfMemoryError"), gat.hooks()["oom"])
        self.assertEqual(gat.hooks()["empty_cache"], "served by the backend (PyTorch's own entry points)")
        # Pool questions go to the backend's table once it is installed.
        try:
            self.assertEqual(gat.graph_pool_id((7, 0), device=0), 42)
            self.assertEqual(gat.open_capture_routes(), 0)
        finally:
            state.pool_table = None


if __name__ == "__main__":
    assert ctypes.sizeof(ctypes.c_ulonglong) == 8
    unittest.main(verbosity=2)
