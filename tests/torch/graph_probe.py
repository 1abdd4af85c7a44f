"""Captures a small model with torch.cuda.graph while graphalloc is PyTorch's allocator and prints what
happened as OUTCOME lines (run by graph_capture_test.py in its own process)."""
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402,F401

import graphalloc.torch as gat  # noqa: E402

gat.install()
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)).cuda()
static_in = torch.randn(64, 256, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        model(static_in)
torch.cuda.current_stream().wait_stream(s)
torch.cuda.synchronize()
print("warmup ok", flush=True)
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        static_out = model(static_in)
    print("OUTCOME capture ok", flush=True)
except Exception as e:  # noqa: BLE001
    msg = str(e).replace("\n", " ")[:400]
    print(f"OUTCOME capture raised {type(e).__name__}: {msg}", flush=True)
    traceback.print_exc()
    static_out = None
if static_out is not None:
    try:
        new_in = torch.randn(64, 256, device="cuda")
        static_in.copy_(new_in)
        g.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            expected = model(new_in)
        same = torch.allclose(static_out, expected)
        print(f"OUTCOME replay {'correct' if same else 'wrong'}", flush=True)
        # Allocations after capture, then replay again: does the graph's memory stay private?
        junk = [torch.full((1 << 16,), 7.0, device="cuda") for _ in range(64)]
        static_in.copy_(new_in)
        g.replay()
        torch.cuda.synchronize()
        junk_ok = all(bool((j == 7.0).all()) for j in junk)
        same2 = torch.allclose(static_out, expected)
        print(f"OUTCOME replay-after-allocs {'correct' if same2 and junk_ok else 'corrupted'}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"OUTCOME replay raised {type(e).__name__}: {str(e)[:300]}", flush=True)
# Is the process still usable?
try:
    t = torch.ones(1000, device="cuda")
    torch.cuda.synchronize()
    print(f"OUTCOME usable-after {float(t.sum()) == 1000.0}", flush=True)
except Exception as e:  # noqa: BLE001
    print(f"OUTCOME usable-after False {type(e).__name__}: {str(e)[:200]}", flush=True)
