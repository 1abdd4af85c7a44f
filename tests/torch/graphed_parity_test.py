"""graphalloc.torch.make_graphed_callables and graphed() against eager PyTorch, bit for bit: 10 training steps
of a GPT-2-small-like model with dropout and gradient accumulation over 2 micro-batches, and of the same model
with activation checkpointing (torch.utils.checkpoint, non-reentrant) in every block. Same seeds,
deterministic algorithms; losses, parameters and gradients compared with torch.equal after every step."""
import copy
import os
import sys
import unittest

import _common

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
_common.require_torch()
import _backend_common  # noqa: E402

_backend_common.require_backend_build()
gat, torch = _backend_common.install_backend()
sys.path.insert(0, str(_common.REPO / "examples" / "torch"))
from gpt import GPT, GPTConfig, batches  # noqa: E402

torch.use_deterministic_algorithms(True)
STEPS, MICRO = 10, 2


def train(model, micro_batch, data, seed):
    """STEPS optimizer steps of MICRO micro-batches each; `micro_batch(idx, targets)` runs forward and
    backward of one and returns its loss. Returns, per step, the losses, gradients and parameters."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    torch.cuda.manual_seed(seed)
    history = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        losses = [micro_batch(*data[step * MICRO + m]).detach().clone() for m in range(MICRO)]
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        history.append((losses, grads, [p.detach().clone() for p in model.parameters()]))
    return history


def forward_backward(forward):
    """A micro-batch through `forward` with its backward (the loss scaled for accumulation)."""
    def run(idx, targets):
        loss = forward(idx, targets)
        (loss / MICRO).backward()
        return loss.detach()
    return run


class ParityTest(unittest.TestCase):
    def compare(self, eager_history, graphed_history, what):
        for step, (e, g) in enumerate(zip(eager_history, graphed_history)):
            for m, (a, b) in enumerate(zip(e[0], g[0])):
                self.assertTrue(torch.equal(a, b), f"{what}: step {step} micro-batch {m} loss {a.item()} vs {b.item()}")
            for k, (a, b) in enumerate(zip(e[1], g[1])):
                self.assertTrue(torch.equal(a, b), f"{what}: step {step} gradient {k} differs")
            for k, (a, b) in enumerate(zip(e[2], g[2])):
                self.assertTrue(torch.equal(a, b), f"{what}: step {step} parameter {k} differs")

    def run_model(self, checkpoint):
        config = GPTConfig(seq=128, checkpoint=checkpoint)
        torch.manual_seed(0)
        base = GPT(config).cuda()
        data = batches(config, STEPS * MICRO, batch=4, seed=1)
        eager_model = copy.deepcopy(base)
        eager = train(eager_model, forward_backward(eager_model), data, seed=42)

        graphed_model = copy.deepcopy(base)
        sample = data[0]
        graphed_model = gat.make_graphed_callables(graphed_model, sample)
        graphed = train(graphed_model, forward_backward(graphed_model), data, seed=42)
        self.compare(eager, graphed, f"make_graphed_callables (checkpoint={checkpoint})")
        lanes = graphed_model.graphalloc_graphs.memory()["lanes"]
        self.assertEqual(len(lanes), 1, "accumulation in order uses one lane")
        self.assertGreaterEqual(lanes[0]["counters"]["replays"], 2 * (STEPS * MICRO - 2))

        # The whole micro-batch, forward, loss and backward, in one graph: gradients accumulate in .grad.
        step_model = copy.deepcopy(base)
        stepped = train(step_model, gat.graphed(forward_backward(step_model), modules=[step_model]), data, seed=42)
        self.compare(eager, stepped, f"graphed whole step (checkpoint={checkpoint})")

    def test_gpt2_small_with_dropout_and_accumulation(self):
        self.run_model(checkpoint=False)

    def test_gpt2_small_with_activation_checkpointing(self):
        self.run_model(checkpoint=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
