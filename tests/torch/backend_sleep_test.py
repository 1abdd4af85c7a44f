"""Sleep and wake through graphalloc.torch, with graphalloc's C++ backend as PyTorch's allocator: a model's
weights backed up and a KV-cache-like torch.cuda.MemPool discarded, 20 sleep/wake cycles. Each cycle: every
tensor keeps its address, the device memory really goes (memory_reserved() falls to 0 and the driver's free
memory rises), the weights come back bit for bit, and a torch.cuda.graph and a
torch.compile(mode="reduce-overhead") step, both captured before the first sleep, replay bit-identically to
their results before it (the compiled step without re-recording). Allocating while asleep raises naming
graphalloc; the discarded pool's tensors are usable again after the wake."""
import time
import unittest

import _backend_common as bc

MiB = bc.MiB
CYCLES = 20


class BackendSleepTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.gat, cls.torch = bc.install_backend()

    def test_weights_backed_up_kv_cache_discarded_graphs_replay_after_each_wake(self):
        torch, gat = self.torch, self.gat
        nn = torch.nn
        torch.manual_seed(0)
        torch.backends.cuda.matmul.allow_tf32 = False
        model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512)).cuda().eval()
        weights = {name: p.detach().clone().cpu() for name, p in model.named_parameters()}
        addresses = {name: p.data_ptr() for name, p in model.named_parameters()}

        # The KV cache: a MemPool of its own, discarded at every sleep.
        kv_pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(kv_pool):
            kv = [torch.full((8 * MiB,), float(i), device="cuda") for i in range(4)]
        kv_addresses = [t.data_ptr() for t in kv]

        # A torch.cuda.graph of the forward, on a static input.
        static_x = torch.randn(64, 512, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):
                model(static_x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            static_y = model(static_x)
        graph.replay()
        graph_reference = static_y.clone()

        # A torch.compile(mode="reduce-overhead") step (CUDA graph trees), recorded before the first sleep.
        compiled = torch.compile(lambda x: model(x).relu().sum(dim=1), mode="reduce-overhead")
        compiled_x = torch.randn(32, 512, device="cuda")
        with torch.no_grad():
            for _ in range(3):
                torch.compiler.cudagraph_mark_step_begin()
                compiled_reference = compiled(compiled_x).clone()
        from torch._dynamo.utils import counters
        from torch._inductor import cudagraph_trees
        manager = cudagraph_trees.get_manager(torch.cuda.current_device(), False)
        self.assertIsNotNone(manager, "reduce-overhead recorded no CUDA graph tree")
        recorded_nodes = self.tree_nodes(manager)
        recorded = dict(counters["inductor"])
        torch.cuda.synchronize()

        sleep_s, wake_s = [], []
        for cycle in range(CYCLES):
            with self.subTest(cycle=cycle):
                torch.cuda.synchronize()
                free_awake, _ = torch.cuda.mem_get_info()
                reserved_awake = torch.cuda.memory_reserved()
                self.assertGreater(reserved_awake, 0)
                t0 = time.perf_counter()
                gat.sleep(kv_pool)                # discarded
                gat.sleep(backup=True)            # everything else: kept
                sleep_s.append(time.perf_counter() - t0)
                kv_state, default_state = gat.sleep_state(kv_pool), gat.sleep_state()
                self.assertTrue(kv_state["asleep"])
                self.assertEqual(kv_state["backup_bytes"], 0)
                self.assertTrue(default_state["asleep"])
                self.assertGreater(default_state["backup_bytes"], 0)
                self.assertEqual(torch.cuda.memory_reserved(), 0)
                free_asleep, _ = torch.cuda.mem_get_info()
                # The driver may round or keep a little for itself; most of what was reserved must be back.
                self.assertGreaterEqual(free_asleep - free_awake, reserved_awake // 2,
                                        (free_awake, free_asleep, reserved_awake))
                if cycle == 0:
                    with self.assertRaises(Exception) as cm:
                        torch.empty(MiB, device="cuda")
                    self.assertIn("graphalloc", str(cm.exception))
                    print("allocation while asleep:", type(cm.exception).__name__, str(cm.exception)[:300],
                          flush=True)

                t0 = time.perf_counter()
                gat.wake()
                wake_s.append(time.perf_counter() - t0)
                self.assertFalse(gat.sleep_state(kv_pool)["asleep"])
                self.assertFalse(gat.sleep_state()["asleep"])
                self.assertEqual(torch.cuda.memory_reserved(), reserved_awake)

                for name, p in model.named_parameters():
                    self.assertEqual(p.data_ptr(), addresses[name], name)
                    self.assertTrue(torch.equal(p.detach().cpu(), weights[name]), name)
                self.assertEqual([t.data_ptr() for t in kv], kv_addresses)
                for i, t in enumerate(kv):  # discarded: usable again once refilled
                    t.fill_(float(i + cycle))
                    self.assertEqual(float(t[-1]), float(i + cycle))

                static_y.zero_()
                graph.replay()
                self.assertTrue(torch.equal(static_y, graph_reference), f"graph replay after wake {cycle}")
                with torch.no_grad():
                    torch.compiler.cudagraph_mark_step_begin()
                    out = compiled(compiled_x)
                self.assertTrue(torch.equal(out, compiled_reference), f"compiled step after wake {cycle}")
        self.assertEqual(self.tree_nodes(manager), recorded_nodes, "the compiled step re-recorded")
        self.assertEqual(counters["inductor"].get("cudagraph_skips", 0), 0)
        changed = {k: (recorded.get(k), v) for k, v in counters["inductor"].items() if recorded.get(k) != v}
        print("inductor counters changed over the cycles:", changed, flush=True)
        sleep_s.sort()
        wake_s.sort()
        print(f"{CYCLES} cycles, reserved {torch.cuda.memory_reserved() / MiB:.1f} MiB awake: sleep median "
              f"{sleep_s[CYCLES // 2] * 1e3:.2f} ms (max {sleep_s[-1] * 1e3:.2f}), wake median "
              f"{wake_s[CYCLES // 2] * 1e3:.2f} ms (max {wake_s[-1] * 1e3:.2f})", flush=True)

    @staticmethod
    def tree_nodes(manager):
        seen, stack = 0, [n for nodes in manager.roots.values() for n in nodes]
        while stack:
            node = stack.pop()
            seen += 1
            stack.extend(c for cs in node.children.values() for c in cs)
        return seen

    def test_sleeping_a_pool_pytorch_never_used_is_a_clear_error(self):
        torch, gat = self.torch, self.gat
        pool = torch.cuda.MemPool()
        with self.assertRaises(ValueError) as cm:
            gat.sleep(pool)
        self.assertIn("has no graphalloc pool", str(cm.exception))


if __name__ == "__main__":
    bc.run_main()
