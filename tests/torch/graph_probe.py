"""CUDA graph scenarios with graphalloc as PyTorch's allocator, each in its own process (PyTorch's allocator
can be chosen only before CUDA starts). Prints what happened as OUTCOME lines; graph_capture_test.py runs
it and checks them. Usage: graph_probe.py model|failed|refused (GRAPHALLOC_CONF, GRAPHALLOC_TORCH_SHIM from
the environment).

  model    a small model captured with torch.cuda.graph: replays equal eager, the capture's memory is a
           graphalloc private pool that eager allocations stay out of, a second graph shares the pool,
           releasing the graphs releases the pool, make_graphed_callables trains like eager;
  failed   a capture that CUDA invalidates: the error reaches Python and graphalloc leaves capture mode;
  refused  no private pools to be had (GRAPHALLOC_TORCH_SHIM=off): capture raises GraphCaptureUnsupported.
"""
import gc
import os
import sys
import traceback
import weakref

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402,F401

import graphalloc  # noqa: E402
import graphalloc.torch as gat  # noqa: E402

gat.install()
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


def outcome(text: str) -> None:
    print(f"OUTCOME {text}", flush=True)


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).replace(chr(10), ' ')[:400]}"


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.LayerNorm(1024), nn.Linear(1024, 256)).cuda()


def warm_up(s: torch.cuda.Stream, fn, *args) -> None:
    # PyTorch's recipe: run the work a few times on a side stream before capturing it. On the stream that
    # captures, so that what PyTorch caches per stream (cuBLAS workspaces) is allocated before the capture
    # and not in the graph's pool, which could then never go back.
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


def compare(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if torch.equal(got, want):
        outcome(f"{name} equal")
    elif torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        outcome(f"{name} close (max diff {float((got - want).abs().max()):.3g})")
    else:
        outcome(f"{name} wrong (max diff {float((got - want).abs().max()):.3g})")


def prepared():
    """The model, its static input and the stream that captures it, warmed up on that stream."""
    model = make_model()
    static_in = torch.randn(64, 256, device="cuda")
    capture_stream = torch.cuda.Stream()
    with torch.no_grad():
        warm_up(capture_stream, model, static_in)
    return model, static_in, capture_stream


def describe_holders(obj, depth: int = 3) -> str:
    """What keeps `obj` alive, `depth` levels up (frames by function and line), for a failed release."""
    if obj is None:
        return "destroyed"
    here = sys._getframe()

    def name(o) -> str:
        if isinstance(o, type(here)):
            return f"frame {o.f_code.co_name}:{o.f_lineno}"
        return type(o).__name__

    def walk(o, level: int) -> list:
        if level == 0:
            return []
        out = []
        for r in gc.get_referrers(o):
            if r is here or isinstance(r, list) and len(r) > 50:
                continue
            out.append(name(r) + (f" <- {walk(r, level - 1)}" if level > 1 else ""))
        return out

    return f"alive, held by {walk(obj, depth)}"


def scenario_model() -> None:
    print("hooks:", gat.hooks(), flush=True)
    model, static_in, capture_stream = prepared()
    with torch.no_grad():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=capture_stream):
            static_out = model(static_in)
    outcome("capture ok")
    outcome(f"open-routes-after-capture {gat.open_capture_routes()}")
    pool = g.pool()
    stats = gat.graph_pool_stats(pool)
    outcome(f"pool has-live-blocks {stats is not None and stats['live_blocks'] > 0}")
    print("pool stats after capture:", stats, flush=True)

    new_in = torch.randn(64, 256, device="cuda")
    with torch.no_grad():
        expected = model(new_in)
    static_in.copy_(new_in)
    g.replay()
    torch.cuda.synchronize()
    compare("replay", static_out, expected)

    # Eager allocations after the capture come from the default pool, never from the graph's.
    allocated_before = gat.graph_pool_stats(pool)["allocated_bytes"]
    junk = [torch.full((1 << 16,), 7.0, device="cuda") for _ in range(64)]
    outcome(f"eager-outside-pool {gat.graph_pool_stats(pool)['allocated_bytes'] == allocated_before}")
    static_in.copy_(new_in)
    g.replay()
    torch.cuda.synchronize()
    junk_ok = all(bool((j == 7.0).all()) for j in junk)
    outcome(f"replay-after-allocs {'correct' if junk_ok and torch.equal(static_out, expected) else 'corrupted'}")

    # A second graph in the same pool (PyTorch's pool sharing): one graphalloc pool, two references.
    g2 = torch.cuda.CUDAGraph()
    with torch.no_grad():
        with torch.cuda.graph(g2, pool=pool, stream=capture_stream):
            static_out2 = model(static_in) * 2
    shared = gat.graph_pool_stats(g2.pool())
    outcome(f"shared-pool same {g2.pool() == pool and shared is not None}")
    static_in.copy_(new_in)
    g.replay()
    g2.replay()
    torch.cuda.synchronize()
    compare("shared-pool replay", static_out2, expected * 2)

    # Graphs and their outputs gone: PyTorch releases the pool, and graphalloc returns its memory.
    ga_pool = gat.graph_pool_id(pool)
    graphs = [weakref.ref(g), weakref.ref(g2)]
    del g, g2, static_out, static_out2
    gc.collect()
    torch.cuda.synchronize()
    try:
        left = graphalloc.pool_stats(ga_pool, torch.cuda.current_device())
        print("pool still there after release:", left, flush=True)
        for i, ref in enumerate(graphs):  # which side kept it: a graph object alive, or PyTorch not releasing
            print(f"graph {i}: {describe_holders(ref())}", flush=True)
        outcome("pool-released False")
    except graphalloc.GraphallocError:
        outcome(f"pool-released {gat.graph_pool_id(pool) is None}")

    # make_graphed_callables: forward and backward captured in one shared pool, trained against eager.
    torch.manual_seed(1)
    eager = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 1)).cuda()
    graphed_module = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 1)).cuda()
    graphed_module.load_state_dict(eager.state_dict())
    x = torch.randn(32, 64, device="cuda", requires_grad=False)
    graphed = torch.cuda.make_graphed_callables(graphed_module, (x,))
    for module in (eager, graphed):
        module.zero_grad(set_to_none=True)
    losses = []
    for module in (eager, graphed):
        out = module(x)
        loss = out.square().mean()
        loss.backward()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    same_loss = torch.allclose(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    same_grads = all(torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6)
                     for a, b in zip(eager.parameters(), graphed_module.parameters()))
    outcome(f"graphed-callables {'correct' if same_loss and same_grads else 'wrong'}")


def scenario_failed() -> None:
    model, static_in, capture_stream = prepared()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.no_grad(), torch.cuda.graph(g, stream=capture_stream):
            model(static_in)
            torch.cuda.synchronize()  # illegal while capturing: CUDA invalidates the capture
        outcome("failed-capture did not fail")
    except Exception as e:  # noqa: BLE001
        outcome(f"failed-capture raised {error_text(e)}")
    del g
    gc.collect()
    outcome(f"open-routes-after-failure {gat.open_capture_routes()}")
    try:
        gat.empty_cache()  # FailedPrecondition while graphalloc is still in capture mode
        outcome("empty-cache-after-failure ok")
    except Exception as e:  # noqa: BLE001
        outcome(f"empty-cache-after-failure raised {error_text(e)}")
    # Capturing works again.
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g, stream=capture_stream):
        out = model(static_in)
    g.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        compare("capture-after-failure", out, model(static_in))


def scenario_refused() -> None:
    print("hooks:", gat.hooks(), flush=True)
    model, static_in, _ = prepared()
    stream_before = torch.cuda.current_stream()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.no_grad(), torch.cuda.graph(g):
            model(static_in)
        outcome("refused-capture ran")
    except gat.GraphCaptureUnsupported as e:
        outcome(f"refused-capture raised GraphCaptureUnsupported: {str(e)[:300]}")
    except Exception as e:  # noqa: BLE001
        outcome(f"refused-capture raised {error_text(e)}")
    outcome(f"stream-unchanged {torch.cuda.current_stream() == stream_before}")
    try:
        g.capture_begin()
        outcome("refused-capture-begin ran")
    except gat.GraphCaptureUnsupported:
        outcome("refused-capture-begin raised GraphCaptureUnsupported")


if __name__ == "__main__":
    scenario = sys.argv[1] if len(sys.argv) > 1 else "model"
    try:
        {"model": scenario_model, "failed": scenario_failed, "refused": scenario_refused}[scenario]()
    except Exception as e:  # noqa: BLE001
        outcome(f"scenario raised {error_text(e)}")
        traceback.print_exc()
    try:
        t = torch.ones(1000, device="cuda")
        torch.cuda.synchronize()
        outcome(f"usable-after {float(t.sum()) == 1000.0}")
    except Exception as e:  # noqa: BLE001
        outcome(f"usable-after False {error_text(e)}")
