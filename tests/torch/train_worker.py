"""Trains a small conv net + MLP for a few steps with deterministic algorithms and prints each loss as a
hex float (exact bits). --allocator graphalloc installs graphalloc first; native leaves PyTorch's own.
Run by train_parity_test.py, once per allocator, each in its own process."""
import argparse
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402,F401  (sys.path for graphalloc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--allocator", choices=["graphalloc", "native"], required=True)
    ap.add_argument("--steps", type=int, default=8)
    # Variants, to narrow down a failure: no conv/batch-norm layers, no deterministic mode, no cuDNN,
    # graphalloc without the pluggable allocator's extra hooks.
    ap.add_argument("--mlp-only", action="store_true")
    ap.add_argument("--no-deterministic", action="store_true")
    ap.add_argument("--no-cudnn", action="store_true")
    ap.add_argument("--no-hooks", action="store_true")
    args = ap.parse_args()
    if args.allocator == "graphalloc":
        import graphalloc.torch as gat
        gat.install(hooks=not args.no_hooks)
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(not args.no_deterministic)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = not args.no_deterministic
    torch.backends.cudnn.enabled = not args.no_cudnn
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 32, 3, padding=1)
            self.b1 = nn.BatchNorm2d(32)
            self.c2 = nn.Conv2d(32, 64, 3, padding=1, stride=2)
            self.b2 = nn.BatchNorm2d(64)
            self.fc1 = nn.Linear(64 * 16 * 16, 512)
            self.fc2 = nn.Linear(512, 10)

        def forward(self, x):
            if args.mlp_only:
                x = F.avg_pool2d(torch.cat([x] * 22, dim=1)[:, :64], 2)  # 64 x 16 x 16 without conv
                return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))
            x = F.relu(self.b1(self.c1(x)))
            x = F.relu(self.b2(self.c2(x)))
            x = torch.flatten(x, 1)
            return self.fc2(F.relu(self.fc1(x)))

    dev = torch.device("cuda")
    model = Net().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cpu").manual_seed(99)
    for step in range(args.steps):
        x = torch.randn(64, 3, 32, 32, generator=gen).to(dev)
        y = torch.randint(0, 10, (64,), generator=gen).to(dev)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        print(f"loss {step} {loss.item().hex()}", flush=True)
    if args.allocator == "graphalloc":
        import graphalloc.torch as gat
        s = gat.memory_stats()
        print(f"graphalloc allocations {s['allocation.all.allocated']} peak_reserved "
              f"{s['reserved_bytes.all.peak']}", flush=True)


if __name__ == "__main__":
    main()
