"""graphalloc.torch.make_graphed_callables and graphed(): the graph tree's rules through PyTorch.

Each rule test runs against graphalloc's make_graphed_callables; with GRAPHALLOC_GRAPHED_IMPL=torch the same
tests run against torch.cuda.make_graphed_callables, where the rule tests fail (that is what they show):
    GRAPHALLOC_GRAPHED_IMPL=torch python3 tests/torch/graphed_callables_test.py
Also the semantics of TransformerEngine's test_cuda_graphs.py (owned gradients, accumulation, the opt-out
fixed when graphed, kwargs, the interleaved pipeline order) and of PyTorch's RNG-in-graphs tests, written as
our own. One process: graphalloc is installed once."""
import faulthandler
import gc
import os
import sys
import unittest
import warnings
import weakref

import _common

# A hang prints every thread's stack before CTest's timeout (600 s) kills the process silently.
faulthandler.dump_traceback_later(float(os.environ.get("GRAPHALLOC_TEST_HANG_S", "570")), exit=True)
_common.require_torch()
import _backend_common  # noqa: E402

_backend_common.require_backend_build()
gat, torch = _backend_common.install_backend()

IMPL = os.environ.get("GRAPHALLOC_GRAPHED_IMPL", "graphalloc")
make_graphed = gat.make_graphed_callables if IMPL == "graphalloc" else torch.cuda.make_graphed_callables
ours = IMPL == "graphalloc"


def linear(n_in=8, n_out=4, bias=True, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(n_in, n_out, bias=bias).cuda()


def clone_module(m):
    import copy
    return copy.deepcopy(m)


def referrers(obj) -> str:
    """What still refers to `obj` (for a failure message): each referrer's type, and for a dict or a cell the
    types of what refers to that."""
    def name(r):
        return type(r).__qualname__
    out = []
    for r in gc.get_referrers(obj):
        if isinstance(r, (dict, list, tuple)) or type(r).__name__ == "cell":
            out.append(f"{name(r)} <- " + ", ".join(name(rr) for rr in gc.get_referrers(r)[:4]))
        else:
            out.append(name(r))
    return "; ".join(out)


class OwnedGradientsTest(unittest.TestCase):
    def test_accumulation_over_two_micro_batches_gives_g1_plus_g2(self):
        model = linear(bias=False)
        x0 = torch.randn(2, 8, device="cuda")
        graphed = make_graphed(model, (x0,), allow_unused_input=True)
        xs = [torch.randn(2, 8, device="cuda") for _ in range(2)]
        gs = [torch.randn(2, 4, device="cuda") for _ in range(2)]
        for step in range(3):  # warmed up, recorded, replayed
            model.zero_grad(set_to_none=True)
            for x, g in zip(xs, gs):
                graphed(x).backward(g)
            expected = sum(torch.einsum("bo,bi->oi", g, x) for x, g in zip(xs, gs))
            torch.testing.assert_close(model.weight.grad, expected, rtol=1e-5, atol=1e-5, msg=f"step {step}")

    def test_a_held_gradient_never_changes(self):
        model = linear(bias=False)
        graphed = make_graphed(model, (torch.randn(2, 8, device="cuda"),), allow_unused_input=True)
        seen = []
        hook = model.weight.register_hook(lambda g: seen.append(g))
        try:
            x = torch.randn(2, 8, device="cuda")
            graphed(x).sum().backward()
            first = seen[0].clone()
            model.zero_grad(set_to_none=True)
            graphed(x).sum().mul(3).backward()
            # The held one was moved off the graph's buffer before the next replay wrote it, with its values.
            self.assertNotEqual(seen[0].data_ptr(), seen[1].data_ptr())
            self.assertTrue(torch.equal(seen[0], first), "the first gradient changed under its holder")
            torch.testing.assert_close(seen[1], 3 * first)  # (3 * sum(x) vs sum(3 * x): rounding)
        finally:
            hook.remove()

    def test_nothing_is_copied_when_nothing_holds_the_gradient(self):
        model = linear(bias=False)
        graphed = make_graphed(model, (torch.randn(2, 8, device="cuda"),), allow_unused_input=True)
        ptrs = []
        for _ in range(4):  # recorded, then replayed
            model.zero_grad(set_to_none=True)
            graphed(torch.randn(2, 8, device="cuda")).sum().backward()
            ptrs.append(model.weight.grad.data_ptr())
        # The replays' .grad is the graph's buffer (as PyTorch's): no copy when the previous one was let go.
        self.assertEqual(ptrs[2], ptrs[3])

    @unittest.skipUnless(ours, "graphalloc's front ends are listed by graph_memory()")
    def test_a_held_gradient_outlives_the_graphed_callables(self):
        model = linear(bias=False)
        x = torch.randn(2, 8, device="cuda")
        gc.collect()
        from graphalloc import torch_graphs
        before = {id(f) for f in torch_graphs._front_ends}
        fronts = len(gat.graph_memory())
        make_graphed(model, (x,), allow_unused_input=True)
        self.assertEqual(len(gat.graph_memory()), fronts + 1)
        for _ in range(3):  # recorded, then replayed: .grad is the graph's buffer
            model.zero_grad(set_to_none=True)
            model(x).sum().backward()
        weight = model.weight
        expected = weight.grad.clone()
        del model  # the module held its graphs (model.graphalloc_graphs): nothing refers to them any more
        gc.collect()
        alive = [f for f in torch_graphs._front_ends if id(f) not in before]
        if len(gat.graph_memory()) != fronts:
            self.fail("the graphed callables are still alive: " + " | ".join(referrers(f) for f in alive))
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(weight.grad, expected), "the held gradient did not keep its values")

    @unittest.skipUnless(ours, "graphalloc's opt-out")
    def test_the_clone_opt_out_is_per_parameter_and_fixed_when_graphed(self):
        model = linear()
        model.weight.skip_backward_post_hook = True  # TransformerEngine's per-parameter opt-out
        graphed = make_graphed(model, (torch.randn(2, 8, device="cuda"),))
        model.bias.skip_backward_post_hook = True  # after graphing: no effect
        # The hooks hold every gradient they see and note its address while it is current: the graph's buffer
        # each time. Before the next replay, the held owned ones move to memory of their own; an opted-out
        # one of an earlier step is overwritten: reading it raises.
        held = {"weight": [], "bias": []}
        hooks = [model.weight.register_hook(lambda g: held["weight"].append((g, g.data_ptr()))),
                 model.bias.register_hook(lambda g: held["bias"].append((g, g.data_ptr())))]
        try:
            for _ in range(3):
                model.zero_grad(set_to_none=True)
                graphed(torch.randn(2, 8, device="cuda")).sum().backward()
        finally:
            for h in hooks:
                h.remove()
        self.assertEqual(held["weight"][1][1], held["weight"][2][1], "an opted-out gradient is the graph's buffer")
        with self.assertRaisesRegex(RuntimeError, "graphalloc"):
            held["weight"][1][0].sum()
        self.assertEqual(held["bias"][1][1], held["bias"][2][1])
        self.assertNotEqual(held["bias"][1][0].data_ptr(), held["bias"][2][1],
                            "the bias was opted out after graphing: it must still be copied out when held")
        self.assertTrue(torch.equal(held["bias"][1][0], torch.full_like(held["bias"][1][0], 2.0)))

    @unittest.skipUnless(ours, "graphalloc's opt-out")
    def test_clone_param_grads_on_return_false_aliases(self):
        model = linear(bias=False)
        graphed = make_graphed(model, (torch.randn(2, 8, device="cuda"),), clone_param_grads_on_return=False)
        ptrs = []
        hook = model.weight.register_hook(lambda g: ptrs.append(g.data_ptr()))
        try:
            for _ in range(3):
                model.zero_grad(set_to_none=True)
                graphed(torch.randn(2, 8, device="cuda")).sum().backward()
        finally:
            hook.remove()
        self.assertEqual(ptrs[1], ptrs[2])


class StaticAddressTest(unittest.TestCase):
    def test_a_moved_parameter_is_recorded_again_never_replayed_at_its_old_address(self):
        model = linear()
        reference = clone_module(model)
        graphed = make_graphed(model, (torch.randn(2, 8, device="cuda"),))
        x = torch.randn(2, 8, device="cuda")
        for _ in range(2):
            graphed(x)
        with torch.no_grad():
            new_weight = torch.randn_like(model.weight)
        model.weight.data = new_weight.clone()  # a new address, new values
        reference.weight.data = new_weight.clone()
        torch.testing.assert_close(graphed(x), reference(x), rtol=0, atol=0)

    @unittest.skipUnless(ours, "graphalloc's re-record limit")
    def test_past_the_limit_the_callable_runs_eagerly_with_one_warning(self):
        model = linear()
        reference = clone_module(model)
        graphed = gat.make_graphed_callables(model, (torch.randn(2, 8, device="cuda"),), max_recordings=1)
        x = torch.randn(2, 8, device="cuda")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for k in range(4):
                w = torch.randn_like(model.weight)
                model.weight.data = w.clone()
                reference.weight.data = w.clone()
                torch.testing.assert_close(graphed(x), reference(x), rtol=0, atol=0, msg=f"move {k}")
        ours_ = [str(w.message) for w in caught if "graphalloc" in str(w.message)]
        self.assertEqual(len(ours_), 1, ours_)
        self.assertIn("runs eagerly", ours_[0])
        self.assertRegex(ours_[0], "static input [0-9]+ changed address from 0x[0-9a-f]+ to 0x[0-9a-f]+")


class OverwrittenOutputTest(unittest.TestCase):
    def test_reading_an_output_a_later_replay_overwrote_raises(self):
        model = linear()
        graphed = make_graphed(model, (torch.randn(2, 8, device="cuda"),))
        outs = []
        for k in range(4):
            y = graphed(torch.full((2, 8), float(k), device="cuda"))
            y.sum().backward()
            outs.append(y)
        last = outs[-1].clone()
        with self.assertRaisesRegex(RuntimeError, "overwritten|clone"):
            outs[-2].sum().item()
        self.assertTrue(torch.equal(outs[-1], last))

    def test_an_output_that_is_its_input_is_allowed(self):
        def passthrough(x, y):
            return x, y * 2
        x = torch.randn(4, device="cuda", requires_grad=True)
        y = torch.randn(4, device="cuda", requires_grad=True)
        graphed = make_graphed(passthrough, (x, y))
        for k in range(3):
            a = torch.full((4,), float(k), device="cuda", requires_grad=True)
            b = torch.full((4,), float(k + 1), device="cuda", requires_grad=True)
            out_a, out_b = graphed(a, b)
            self.assertTrue(torch.equal(out_a, a))
            self.assertTrue(torch.equal(out_b, b * 2))


class LanesTest(unittest.TestCase):
    def test_two_outstanding_forwards_each_get_their_own_backward(self):
        model = linear()
        reference = clone_module(model)
        graphed = make_graphed(model, (torch.randn(2, 8, device="cuda", requires_grad=True),))
        for step in range(3):
            xs = [torch.randn(2, 8, device="cuda", requires_grad=True) for _ in range(2)]
            model.zero_grad(set_to_none=True)
            reference.zero_grad(set_to_none=True)
            ys = [graphed(x) for x in xs]  # two forwards before any backward
            for y, x in reversed(list(zip(ys, xs))):
                (y * y).sum().backward()
            for x in xs:
                (reference(x) ** 2).sum().backward()
            torch.testing.assert_close(model.weight.grad, reference.weight.grad, rtol=1e-5, atol=1e-5,
                                       msg=f"step {step}")

    @unittest.skipUnless(ours, "graphalloc's lanes")
    def test_past_the_lane_limit_a_forward_is_refused_with_a_message(self):
        model = linear()
        graphed = gat.make_graphed_callables(model, (torch.randn(2, 8, device="cuda"),), max_outstanding_forwards=2)
        kept = [graphed(torch.randn(2, 8, device="cuda")) for _ in range(2)]
        with self.assertRaisesRegex(RuntimeError, "max_outstanding_forwards"):
            graphed(torch.randn(2, 8, device="cuda"))
        del kept
        graphed(torch.randn(2, 8, device="cuda"))  # the graphs of the dropped forwards freed their lanes

    @unittest.skipUnless(ours, "graphalloc's lanes")
    def test_the_warmups_give_their_activations_back(self):
        # 8 layers whose Linear saves its 8 MiB input and Tanh its 8 MiB output: a warm-up forward whose
        # autograd graph outlived its backward would leave about 64 MiB each, 192 MiB for the three. What may
        # stay is what the graphs write (PyTorch's: the 8 MiB output and 32 MiB of parameter gradients).
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Tanh())
                                      for _ in range(8)]).cuda()
        x = torch.randn(2048, 1024, device="cuda")
        # Earlier tests' garbage (front ends in reference cycles) goes first, and before every measurement:
        # when the collector runs depends on what else the process allocated, and what it frees would move
        # the figures. The leak this test is about is a cycle through C++ that no collection frees.
        gc.collect()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        graphed = make_graphed(model, (x,), num_warmup_iters=3)
        gc.collect()
        torch.cuda.synchronize()
        kept = torch.cuda.memory_allocated() - before
        self.assertLess(kept, 96 << 20, f"{kept / 2**20:.1f} MiB still allocated after the warm-ups")
        steady = []
        for _ in range(4):  # recorded, then replayed: no step leaves anything behind
            model.zero_grad(set_to_none=True)
            graphed(x).sum().backward()
            model.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.synchronize()
            steady.append(torch.cuda.memory_allocated())
        self.assertEqual(steady[1:], [steady[1]] * 3)

    def test_forwards_without_backward_free_their_lane(self):
        model = linear()
        graphed = gat.make_graphed_callables(model, (torch.randn(2, 8, device="cuda"),), max_outstanding_forwards=1)
        for _ in range(5):
            graphed(torch.randn(2, 8, device="cuda"))  # evaluation-style: outputs dropped, no backward
        with torch.no_grad():
            graphed(torch.randn(2, 8, device="cuda"))


class RetainGraphTest(unittest.TestCase):
    def test_a_retained_backward_runs_again_after_another_micro_batch(self):
        model = linear()
        reference = clone_module(model)
        graphed = make_graphed(model, (torch.randn(2, 8, device="cuda", requires_grad=True),))
        for step in range(3):
            x1, x2 = (torch.randn(2, 8, device="cuda") for _ in range(2))
            model.zero_grad(set_to_none=True)
            reference.zero_grad(set_to_none=True)
            loss1 = (graphed(x1) ** 2).sum()
            loss1.backward(retain_graph=True)
            (graphed(x2) ** 2).sum().backward()
            loss1.backward()
            for x, times in ((x1, 2), (x2, 1)):
                for _ in range(times):
                    (reference(x) ** 2).sum().backward()
            torch.testing.assert_close(model.weight.grad, reference.weight.grad, rtol=1e-5, atol=1e-5,
                                       msg=f"step {step}")


    @unittest.skipUnless(ours, "graphalloc's deferred releases")
    def test_a_release_asked_for_while_a_backward_is_retained_waits_for_the_last_one(self):
        model = linear()
        graphed = gat.make_graphed_callables(model, (torch.randn(2, 8, device="cuda"),))
        loss = graphed(torch.randn(2, 8, device="cuda")).sum()
        loss.backward(retain_graph=True)
        ran = []
        graphed.graphalloc_graphs.request_release("a parameter shard", lambda: ran.append("released"))
        self.assertEqual(ran, [], "a retained backward may still run")
        self.assertIn("a parameter shard", graphed.graphalloc_graphs.memory()["deferred_releases"])
        loss.backward()  # the last one: PyTorch frees the forward's saved tensors
        graphed.graphalloc_graphs.memory()
        self.assertEqual(ran, ["released"])


class DropoutModel(torch.nn.Module):
    def __init__(self, checkpointed=False):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 16)
        self.checkpointed = checkpointed

    def block(self, x):
        return torch.nn.functional.dropout(torch.relu(self.a(x)), p=0.3, training=self.training)

    def forward(self, x):
        if self.checkpointed:
            h = torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False, preserve_rng_state=True)
        else:
            h = self.block(x)
        return self.b(h)


class RandomnessTest(unittest.TestCase):
    def run_pair(self, checkpointed):
        torch.manual_seed(3)
        eager = DropoutModel(checkpointed).cuda()
        graphed_model = clone_module(eager)
        graphed = make_graphed(graphed_model, (torch.randn(4, 16, device="cuda"),))
        data = [torch.randn(4, 16, device="cuda") for _ in range(6)]
        results = []
        for m in (graphed, eager):
            torch.cuda.manual_seed(11)
            losses = []
            for x in data:
                m.zero_grad(set_to_none=True)
                loss = m(x).square().mean()
                loss.backward()
                losses.append(loss.detach().clone())
            results.append((losses, [p.grad.clone() for p in m.parameters()]))
        for k, (a, b) in enumerate(zip(results[0][0], results[1][0])):
            self.assertTrue(torch.equal(a, b), f"loss {k}: {a} vs {b}")
        for a, b in zip(results[0][1], results[1][1]):
            self.assertTrue(torch.equal(a, b))

    def test_dropout_draws_exactly_what_eager_draws(self):
        self.run_pair(checkpointed=False)

    def test_activation_checkpointing_recomputes_the_same_masks(self):
        self.run_pair(checkpointed=True)

    def test_the_rng_state_is_restored_after_the_warmup(self):
        model, sample = DropoutModel().cuda(), torch.randn(4, 16, device="cuda")
        torch.cuda.manual_seed(5)
        before = torch.cuda.get_rng_state()
        make_graphed(model, (sample,))  # three warm-up iterations, each drawing dropout masks
        self.assertTrue(torch.equal(torch.cuda.get_rng_state(), before))


class CaptureFailureTest(unittest.TestCase):
    @unittest.skipUnless(ours, "graphalloc's failure handling")
    def test_a_host_sync_fails_the_recording_naming_the_function_then_runs_eagerly(self):
        def syncs(x):
            scale = float(x.abs().max().item())  # a host synchronisation: not capturable
            return x * scale
        f = gat.graphed(syncs, name="syncs")
        x = torch.randn(8, device="cuda")
        f(x)  # warmup: eager
        with self.assertRaises(RuntimeError) as ctx:
            f(x)  # the recording
        text = str(ctx.exception) + "".join(getattr(ctx.exception, "__notes__", []))
        self.assertIn("syncs", text)
        torch.testing.assert_close(f(x), x * float(x.abs().max()), rtol=0, atol=0)


class KwargsAndPipelineTest(unittest.TestCase):
    @unittest.skipUnless(ours, "TransformerEngine's sample_kwargs")
    def test_a_kwarg_mask_that_changes_every_step(self):
        class Masked(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(8, 8)

            def forward(self, x, attention_mask=None):
                return self.lin(x).masked_fill(attention_mask, 0.0)
        model = Masked().cuda()
        reference = clone_module(model)
        mask = torch.zeros(2, 8, dtype=torch.bool, device="cuda")
        graphed = gat.make_graphed_callables(model, (torch.randn(2, 8, device="cuda"),),
                                             sample_kwargs={"attention_mask": mask}, allow_unused_input=True)
        for _ in range(4):
            x = torch.randn(2, 8, device="cuda")
            m = torch.rand(2, 8, device="cuda") > 0.5
            torch.testing.assert_close(graphed(x, attention_mask=m), reference(x, attention_mask=m), rtol=0, atol=0)

    @unittest.skipUnless(ours, "TransformerEngine's _order")
    def test_the_interleaved_pipeline_order_matches_eager(self):
        layers = [linear(8, 8, seed=s) for s in (1, 2)]
        reference = [clone_module(m) for m in layers]
        order = [1, 2, 1, 2, -2, -1, 1, 2, -2, -1, -2, -1]
        samples = [(torch.randn(2, 8, device="cuda", requires_grad=True),) for _ in range(2 * 3)]
        graphed = gat.make_graphed_callables(tuple(layers), tuple(samples), _order=order)
        optims = [torch.optim.SGD([p for m in ms for p in m.parameters()], lr=0.1) for ms in (layers, reference)]
        for step in range(3):
            data = [torch.randn(2, 8, device="cuda") for _ in range(3)]
            for fns, opt, run in ((graphed, optims[0], "graphed"), (reference, optims[1], "eager")):
                # Leaf inputs of their own per run: the gradients of graphed inputs are the graph's buffers,
                # valid until the lane's next micro-batch (reading one later raises), as in TransformerEngine.
                inputs = [x.clone().requires_grad_() for x in data]
                opt.zero_grad(set_to_none=True)
                outs, mb_f, mb_b = {}, [0, 0], [0, 0]
                for entry in order:
                    c = abs(entry) - 1
                    if entry > 0:
                        m = mb_f[c]
                        x = inputs[m] if c == 0 else outs[(0, m)]
                        outs[(c, m)] = fns[c](x)
                        mb_f[c] += 1
                    elif c == 1:
                        m = mb_b[c]
                        outs[(1, m)].square().sum().backward()
                        mb_b[c] += 1
                opt.step()
        for a, b in zip(layers, reference):
            torch.testing.assert_close(a.weight, b.weight, rtol=1e-5, atol=1e-5)


class GraphedStepTest(unittest.TestCase):
    """graphed(): a whole training step (forward, loss, backward, optimizer) in one graph."""

    def make(self, seed=7):
        torch.manual_seed(seed)
        model = DropoutModel().cuda()
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def test_a_whole_step_matches_the_eager_step_bit_for_bit(self):
        for set_to_none in (True, False):
            runs = []
            for use_graph in (True, False):
                model, opt = self.make()

                def step(x, y):
                    opt.zero_grad(set_to_none=set_to_none)
                    loss = (model(x) - y).square().mean()
                    loss.backward()
                    opt.step()
                    return loss
                fn = gat.graphed(step) if use_graph else step
                torch.cuda.manual_seed(23)
                losses = []
                torch.manual_seed(1)
                batches = [(torch.randn(4, 16, device="cuda"), torch.randn(4, 16, device="cuda")) for _ in range(10)]
                for x, y in batches:
                    losses.append(fn(x, y).detach().clone())
                runs.append((losses, [p.detach().clone() for p in model.parameters()]))
            for k, (a, b) in enumerate(zip(runs[0][0], runs[1][0])):
                self.assertTrue(torch.equal(a, b), f"set_to_none={set_to_none}, loss {k}: {a} vs {b}")
            for a, b in zip(runs[0][1], runs[1][1]):
                self.assertTrue(torch.equal(a, b), f"set_to_none={set_to_none}: parameters differ")

    def test_gradients_pointed_at_views_of_a_bucket_stay_there_as_eagerly(self):
        # DDP's gradient_as_bucket_view: after the backward, each .grad that is not already a view of DDP's
        # flat bucket is copied into it and pointed at the view, memory the call did not allocate.
        for set_to_none in (True, False):
            runs = []
            for use_graph in (True, False):
                model, opt = self.make()
                params = list(model.parameters())
                bucket = torch.zeros(sum(p.numel() for p in params), device="cuda")
                views, at = [], 0
                for p in params:
                    views.append(bucket[at:at + p.numel()].view_as(p))
                    at += p.numel()

                def step(x, y):  # zero_grad outside, as DDP programs do: with None, each call points anew
                    loss = (model(x) - y).square().mean()
                    loss.backward()
                    for p, v in zip(params, views):
                        if p.grad.data_ptr() != v.data_ptr():
                            v.copy_(p.grad)
                            p.grad = v
                    opt.step()
                    return loss
                fn = gat.graphed(step, name=f"bucket views {set_to_none}") if use_graph else step
                torch.manual_seed(1)
                losses = []
                for _ in range(6):
                    opt.zero_grad(set_to_none=set_to_none)
                    losses.append(fn(torch.randn(4, 16, device="cuda"), torch.randn(4, 16, device="cuda")).detach()
                                  .clone())
                for p, v in zip(params, views):
                    self.assertEqual(p.grad.data_ptr(), v.data_ptr(), f"set_to_none={set_to_none}: .grad moved")
                runs.append((losses, [p.detach().clone() for p in params], bucket.clone()))
                if use_graph:
                    mine = [d for d in gat.graph_memory() if d.get("name") == f"bucket views {set_to_none}"]
                    self.assertGreaterEqual(mine[0]["lanes"][-1]["counters"]["replays"], 3)
            for k, (a, b) in enumerate(zip(runs[0][0], runs[1][0])):
                self.assertTrue(torch.equal(a, b), f"set_to_none={set_to_none}, loss {k}: {a} vs {b}")
            for a, b in zip(runs[0][1], runs[1][1]):
                self.assertTrue(torch.equal(a, b), f"set_to_none={set_to_none}: parameters differ")
            self.assertTrue(torch.equal(runs[0][2], runs[1][2]), f"set_to_none={set_to_none}: gradients differ")

    def test_the_loss_of_an_earlier_step_is_overwritten_and_says_so(self):
        model, opt = self.make()

        def step(x):
            loss = model(x).square().mean()
            loss.backward()
            return loss
        f = gat.graphed(step)
        losses = [f(torch.randn(4, 16, device="cuda")) for _ in range(4)]
        with self.assertRaisesRegex(RuntimeError, "overwritten|clone"):
            print(losses[1])
        self.assertTrue(torch.isfinite(losses[-1]).item())

    def test_graph_memory_reports_each_recording(self):
        model, _ = self.make()
        f = gat.graphed(lambda x: model(x).sum(), name="sum of model")
        for _ in range(3):
            f(torch.randn(4, 16, device="cuda"))
        mine = [d for d in gat.graph_memory() if d.get("name") == "sum of model"]
        self.assertEqual(len(mine), 1)
        lane = mine[0]["lanes"][-1]
        self.assertEqual(lane["counters"]["recordings"], 1)
        self.assertGreater(lane["pool_reserved_bytes"], 0)
        self.assertGreater(lane["nodes"][0]["allocated_bytes"], 0)

    def test_a_deleted_graphed_step_is_collected_with_its_graphs(self):
        model, _ = self.make()
        f = gat.graphed(lambda x: model(x).sum(), name="collected step")
        for _ in range(3):  # warmed up, recorded, replayed
            f(torch.randn(4, 16, device="cuda"))
        self.assertEqual(len([d for d in gat.graph_memory() if d.get("name") == "collected step"]), 1)
        alive = weakref.ref(f)
        del f
        gc.collect()
        if alive() is not None:
            self.fail("the graphed step outlived its last reference: " + referrers(alive()))
        self.assertEqual([d for d in gat.graph_memory() if d.get("name") == "collected step"], [])

    def test_an_output_held_when_its_graphs_go_keeps_its_values(self):
        f = gat.graphed(lambda x: x * 2 + 1, name="held output")
        for _ in range(3):  # warmed up, recorded, replayed
            f(torch.randn(64, device="cuda"))
        earlier = f(torch.randn(64, device="cuda"))
        held = f(torch.randn(64, device="cuda"))  # `earlier` is overwritten by this replay
        expected, at = held.clone(), held.data_ptr()
        del f
        gc.collect()
        gat.graph_memory()  # a safe point: the collected front end's graphs go here
        self.assertNotEqual(held.data_ptr(), at, "the held output should have moved off the graphs' memory")
        self.assertTrue(torch.equal(held, expected), "the held output lost its values with its graphs")
        with self.assertRaisesRegex(RuntimeError, "graphalloc"):
            earlier.sum()

    def test_a_front_end_dropped_inside_another_ones_body_is_destroyed_after_it(self):
        model, _ = self.make()
        dropped = gat.graphed(lambda x: model(x).sum(), name="dropped step")
        for _ in range(3):
            dropped(torch.randn(4, 16, device="cuda"))
        alive = weakref.ref(dropped)
        holder = [dropped]
        del dropped

        def body(x):
            holder.clear()  # the last reference goes while this body runs (warm-up, then recording)
            gc.collect()
            return x * 2
        recorder = gat.graphed(body, name="recorder")
        outs = [recorder(torch.full((4,), float(i), device="cuda")).clone() for i in range(3)]
        self.assertIsNone(alive())
        self.assertEqual([d for d in gat.graph_memory() if d.get("name") == "dropped step"], [])
        for i, out in enumerate(outs):
            self.assertTrue(torch.equal(out, torch.full((4,), 2.0 * i, device="cuda")), f"call {i}: {out}")

    def test_out_of_memory_while_recording_names_the_recording_and_the_pool(self):
        def greedy(x):
            if torch.cuda.is_current_stream_capturing():
                torch.empty(1 << 46, dtype=torch.uint8, device="cuda")  # 64 TiB
            return x * 2
        f = gat.graphed(greedy, name="greedy")
        f(torch.ones(4, device="cuda"))
        with self.assertRaises(torch.cuda.OutOfMemoryError) as ctx:
            f(torch.ones(4, device="cuda"))
        notes = "".join(getattr(ctx.exception, "__notes__", []))
        self.assertIn("while recording 'greedy'", notes)
        self.assertIn("graph pool holds", notes)


class PortedRngTests(unittest.TestCase):
    """PyTorch's test_graph_rng_functional / test_graph_rng_distributions / test_graph_checkpoint_preserve_rng_state
    semantics through graphed()."""

    def test_graph_rng_functional(self):
        for op, kwargs in ((torch.nn.functional.dropout, {"p": 0.1}), (torch.nn.functional.rrelu, {"training": True})):
            x = torch.randn(1000, device="cuda")
            f = gat.graphed(lambda t, op=op, kwargs=kwargs: op(t, **kwargs))
            torch.cuda.manual_seed(5)
            got = [f(x).clone() for _ in range(3)]  # warmup (eager), recording, replay
            got += [op(x, **kwargs)]                 # eager between graph calls
            got += [f(x).clone() for _ in range(2)]
            torch.cuda.manual_seed(5)
            want = [op(x, **kwargs) for _ in range(6)]
            for k, (a, b) in enumerate(zip(got, want)):
                self.assertTrue(torch.equal(a, b), f"{op.__name__} call {k}")

    def test_graph_rng_distributions(self):
        size = 1000
        ops = [lambda t: torch.bernoulli(t.clamp(0, 1)), lambda t: torch.normal(t, 1.0),
               lambda t: torch.rand_like(t), lambda t: torch.randn_like(t), lambda t: torch.randint_like(t, 10),
               lambda t: t.clone().uniform_(), lambda t: t.clone().exponential_(), lambda t: t.clone().geometric_(0.2)]
        for k, op in enumerate(ops):
            x = torch.rand(size, device="cuda")
            f = gat.graphed(op)
            torch.cuda.manual_seed(9)
            got = [f(x).clone() for _ in range(4)]
            torch.cuda.manual_seed(9)
            want = [op(x) for _ in range(4)]
            for j, (a, b) in enumerate(zip(got, want)):
                self.assertTrue(torch.equal(a, b), f"op {k} call {j}")

    def test_graph_checkpoint_preserve_rng_state(self):
        def fn(x):
            return x * torch.sigmoid(torch.randn(1, device="cuda"))

        def step(x):
            x = x.detach().requires_grad_()
            out = torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False, preserve_rng_state=True)
            (grad,) = torch.autograd.grad(out, x)
            return grad
        f = gat.graphed(step)
        ones = torch.ones(1, device="cuda")
        torch.cuda.manual_seed(42)
        got = [f(ones).clone() for _ in range(3)]
        torch.cuda.manual_seed(42)
        want = [step(ones) for _ in range(3)]
        for a, b in zip(got, want):
            self.assertTrue(torch.equal(a, b))


if __name__ == "__main__":
    unittest.main(verbosity=2)
