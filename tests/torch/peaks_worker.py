"""Trains a small transformer compiled with mode="reduce-overhead" (CUDA graph trees: a side stream, graph
pools) for a few steps and prints the peaks PyTorch reads: max_memory_allocated() and the requested and active
peaks. --allocator graphalloc installs graphalloc's backend first; native keeps PyTorch's own, with expandable
segments as graphalloc has them (blocks of expandable segments always split, so block sizes agree). Run by
backend_peaks_test.py, once per allocator, each in its own process."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402,F401  (sys.path for graphalloc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--allocator", choices=["graphalloc", "native"], required=True)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    if args.steps < 4:
        ap.error("--steps must be at least 4: the steady peaks are those of the steps after the third")
    if args.allocator == "graphalloc":
        import graphalloc.torch as gat
        gat.install(backend="allocator")
    else:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, dropout=0.0,
                                       batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=2), nn.Linear(256, 256)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(32, 128, 256, device="cuda")
    for step in range(args.steps):
        if step == 3:  # warm-up (step 0), recording (1), and the optimizer's state (2) are behind
            torch.cuda.synchronize()
            whole = peaks(torch)
            torch.cuda.reset_peak_memory_stats()
        opt.zero_grad(set_to_none=True)
        loss = compiled(x).square().mean()
        loss.backward()
        opt.step()
        print(f"loss {step} {loss.item():.6f}", flush=True)
    torch.cuda.synchronize()
    print(f"allocator {torch.cuda.get_allocator_backend()}", flush=True)
    print(f"peaks {whole}", flush=True)
    print(f"steady {peaks(torch)}", flush=True)


def peaks(torch) -> str:
    s = torch.cuda.memory_stats()
    return (f"allocated {torch.cuda.max_memory_allocated()} requested {s['requested_bytes.all.peak']} "
            f"active {s['active_bytes.all.peak']} allocation {s['allocation.all.peak']}")


if __name__ == "__main__":
    main()
