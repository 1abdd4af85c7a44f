"""Graphed whole training steps with the collectives inside (issue 35): DDP and FSDP2 through
graphalloc.torch.graphed, bit for bit against the same program run eagerly, and the step time and peak
reserved memory of eager, a torchtitan-style manual capture and graphalloc's graphed step.

One process per GPU joined by NCCL; graphalloc installed as PyTorch's allocator with its default
configuration (expandable segments; --config for another); NCCL_GRAPH_REGISTER left as the environment has
it (unset: NCCL registers the buffers that captured collectives use). The model is examples/torch/gpt.py
with dropout: a small configuration by default, GPT-2 small with --model gpt2.

    python3 tests/multigpu/graphed_ddp_fsdp.py ddp       # the DDP configurations, 50 steps each
    python3 tests/multigpu/graphed_ddp_fsdp.py fsdp      # the FSDP2 variants
    python3 tests/multigpu/graphed_ddp_fsdp.py all       # both
    python3 tests/multigpu/graphed_ddp_fsdp.py timing    # one markdown table row per variant
    ... --world 1                                        # one GPU: NCCL with one rank, same code

Checks (ddp, fsdp, all). For each configuration every rank builds the model from the same seed, trains a copy
eagerly for --steps steps (AdamW, outside any graph), then trains a fresh copy from the same state, data and
seeds with the whole step (forward, loss, backward and the collectives in it) through
graphalloc.torch.graphed, and compares the losses of every step, and the parameters and gradients at the end,
with torch.equal. Each rank prints progress lines and one line per check:

    OUTCOME <check> rank <r>: <RESULT> - <details> [expected <results>: ok | UNEXPECTED]

    MATCH        recorded, replayed, losses, parameters and gradients bit-identical to eager
    MISMATCH     replayed, and some result differs from eager (the first step that differs)
    REFUSED      a graphed call raised: graphalloc's or PyTorch's message says what could not be captured
    FELL_BACK    graphalloc ran the step eagerly after a warning (the reason is printed); results compared
    NOT_GRAPHED  no replay happened (too few steps for the warm-up calls?)
    ERROR        the eager program failed, or a CUDA error (illegal access, ...): never acceptable

A rank exits 1 when a RESULT is not one its check accepts, else 0; 77 (skipped) without PyTorch, NCCL or the
GPUs asked for (--world; default two, or one where there is one). Ranks end with os._exit, as
nccl_in_graphs.py does (destroy_process_group waits forever while graphs that captured NCCL live).

DDP configurations (--ddp-configs; --accum-configs runs the same with two micro-batches per step, the first
under ddp.no_sync(), both in one graphed step); DDP_CONFIGS below says what each one is. What DDP needs to be
captured, and what this program does for it:
  * The DDP reducer keeps every parameter's AccumulateGrad node, which runs (with DDP's hooks, which launch
    the all-reduces) on the stream that was current when DDP was constructed. A capture can fork to another
    stream but cannot wait on the legacy default stream, so DDP is constructed on a side stream (PyTorch's
    CUDA graphs notes; Megatron-LM PR 6021), the same in the eager and the graphed run.
  * DDP rebuilds its buckets after the first iteration (a host synchronisation) and times iterations 1-10
    with CUDA events it reads back: graphed(warmup_calls=11) (--ddp-warmups), the 11 warm-up iterations
    PyTorch's notes ask for. A recording is then the 12th DDP iteration.
  * TORCH_NCCL_ASYNC_ERROR_HANDLING=0 unless the environment sets it (PyTorch's notes).
  * broadcast_buffers=False except in the broadcast_buffers configuration (the buffers are constant masks).
  * Gradients: with zero_grad(set_to_none=True) each step creates .grad inside the graph, which graphed()
    hands back as owned clones; with set_to_none=False they are kept and read in place (static inputs);
    with gradient_as_bucket_view=True they are views of DDP's buckets, which graphed() leaves where DDP put
    them and points .grad at again after each replay (bucket_view_none also accepts REFUSED and FELL_BACK).

FSDP2 variants (--fsdp-variants): fully_shard on every block and on the model. graphed() cannot take
DTensors, so it is given each parameter's and each gradient's local shard (ShardView), read again at every
call: a shard that moved is recorded again, never replayed at its old address. Gradients are created (zero)
before the first step and kept (set_to_none=False, torchtitan's choice), so FSDP accumulates into them in
place; the gathered parameters live in the graph's pool. MATCH, REFUSED and FELL_BACK are all accepted: the
line says which.

Timing (timing): one process group per variant (--variants), each rank timing --timing-steps steps after
--timing-warmup untimed ones (median, CUDA-synchronised, optimizer step included) and reporting its peak
reserved memory; rank 0 prints one markdown row per variant:
    eager-torch         eager, PyTorch's allocator (PYTORCH_CUDA_ALLOC_CONF=--torch-alloc-conf)
    manual-torch        torchtitan's CUDAGraphWrapper reduced to its steps: warm-ups on a side stream, one
                        torch.cuda.graph capture there (thread_local mode), inputs copied into static
                        buffers, replays; PyTorch's allocator
    eager-graphalloc    eager, graphalloc
    graphed-graphalloc  graphalloc.torch.graphed
"""
import argparse
import contextlib
import copy
import dataclasses
import faulthandler
import gc
import os
import statistics
import sys
import time
import traceback
import warnings
from typing import Callable, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "examples", "torch"))

from ranks import SKIP, join_group, run_ranks, world_or_skip  # noqa: E402

# Deterministic cuBLAS, for bit-identical eager and graphed runs: set before CUDA starts (spawned ranks
# inherit it).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

ANY_CLEAR_OUTCOME = ("MATCH", "REFUSED", "FELL_BACK")
# A CUDA error after which the process's context is unusable: later checks would only repeat it.
# The CUDA errors that break the context. "device-side assert triggered", not "device-side assert": PyTorch
# ends every CUDA error's message with "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions".
FATAL_CUDA = ("illegal memory access", "unspecified launch failure", "misaligned address",
              "illegal instruction", "device-side assert triggered")


@dataclasses.dataclass(frozen=True)
class DdpConfig:
    what: str
    static_graph: bool = False
    bucket_view: bool = False  # gradient_as_bucket_view
    set_to_none: bool = True  # optimizer.zero_grad(set_to_none=...)
    broadcast_buffers: bool = False
    expect: Tuple[str, ...] = ("MATCH",)


DDP_CONFIGS = {
    "plain": DdpConfig("DDP's defaults: buckets copied into .grad, zero_grad(set_to_none=True), so each step "
                       "creates .grad inside the graph"),
    "static_graph": DdpConfig("static_graph=True (DDP's first iteration delays every all-reduce to the end)",
                              static_graph=True),
    "keep_grads": DdpConfig("gradients kept between steps (zero_grad(set_to_none=False), torchtitan's choice "
                            "under graphs): .grad read and written in place", set_to_none=False),
    "bucket_view": DdpConfig("gradient_as_bucket_view=True with gradients kept: .grad are views of DDP's "
                             "buckets, written in place", bucket_view=True, set_to_none=False),
    "broadcast_buffers": DdpConfig("broadcast_buffers=True: DDP broadcasts the buffers in every forward",
                                   broadcast_buffers=True),
    "bucket_view_none": DdpConfig("gradient_as_bucket_view=True with zero_grad(set_to_none=True): every step "
                                  "points .grad anew at DDP's buckets, memory the graph did not allocate",
                                  bucket_view=True, set_to_none=True, expect=ANY_CLEAR_OUTCOME),
}
DEFAULT_DDP_CONFIGS = "plain,static_graph,keep_grads,bucket_view,broadcast_buffers,bucket_view_none"
DEFAULT_ACCUM_CONFIGS = "plain,bucket_view"


@dataclasses.dataclass(frozen=True)
class FsdpVariant:
    what: str
    reshard: bool  # reshard_after_forward
    explicit_unshard: bool = False
    expect: Tuple[str, ...] = ANY_CLEAR_OUTCOME


FSDP_VARIANTS = {
    "noreshard": FsdpVariant("reshard_after_forward=False: FSDP gathers each block once in the forward on "
                             "its own streams, reshards after the backward", reshard=False),
    "noreshard_unshard": FsdpVariant("reshard_after_forward=False, and every FSDP module unsharded explicitly "
                                     "at the start of the step (from the second call on: after FSDP's lazy "
                                     "init), on the current stream, as torchtitan does for its last module",
                                     reshard=False, explicit_unshard=True),
    "reshard": FsdpVariant("reshard_after_forward=True (FSDP's default): the backward gathers again on FSDP's "
                           "streams (torchtitan: CUDA_ERROR_STREAM_CAPTURE_ISOLATION with 'always')",
                           reshard=True),
}
DEFAULT_FSDP_VARIANTS = "noreshard,noreshard_unshard,reshard"
TIMING_VARIANTS = ("eager-torch", "manual-torch", "eager-graphalloc", "graphed-graphalloc")


@dataclasses.dataclass
class Outcome:
    check: str
    result: str
    detail: str
    expect: Tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.result in self.expect


@dataclasses.dataclass
class Setup:
    """One model ready to train: `module` holds the parameters that train, `step` is the whole step (a list of
    (idx, targets) micro-batches -> their losses), `graphed_modules` is what graphed() address-checks,
    `local` maps a parameter or gradient to the tensor compared (a DTensor's local shard)."""
    module: object
    step: Callable
    graphed_modules: list
    local: Callable
    keep: list


class Rank:
    """This process's rank, its arguments and its log lines."""

    def __init__(self, rank: int, world: int, args):
        self.rank, self.world, self.args = rank, world, args
        self.mesh = None  # FSDP's device mesh, made once

    def say(self, text: str) -> None:
        print(f"rank {self.rank}: {text}", flush=True)

    def arm_watchdog(self) -> None:
        """A rank stuck in a collective prints every thread's stack and exits, instead of hanging silently."""
        if self.args.hang_timeout > 0:
            faulthandler.dump_traceback_later(self.args.hang_timeout, exit=True)


# ---------------------------------------------------------------------------------------------------------
# What every rank sets up: allocator, process group, model, data, the step.
# ---------------------------------------------------------------------------------------------------------

def setup_process(rank: int, args, allocator: str) -> None:
    """Before CUDA starts in this process: the allocator, and the NCCL settings PyTorch's notes ask for."""
    if args.hang_timeout > 0:
        faulthandler.dump_traceback_later(args.hang_timeout, exit=True)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    if allocator == "graphalloc":
        import graphalloc.torch as gat
        gat.install(config=args.config or None)
    elif args.torch_alloc_conf:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = args.torch_alloc_conf


def describe_setup(r: Rank) -> None:
    import torch
    allocator = torch.cuda.get_allocator_backend()
    line = (f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
            f"{torch.cuda.get_device_name(r.rank)}, world {r.world}, allocator {allocator}")
    if allocator == "graphalloc":
        import graphalloc.torch as gat
        line += f" (backend {gat.backend()}, config '{gat.config(r.rank)}')"
    else:
        line += f" (PYTORCH_CUDA_ALLOC_CONF='{os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')}')"
    env = {k: os.environ.get(k, "(unset)") for k in ("NCCL_GRAPH_REGISTER", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                                      "CUBLAS_WORKSPACE_CONFIG")}
    r.say(line + "; " + ", ".join(f"{k}={v}" for k, v in env.items()))
    if os.environ.get("NCCL_GRAPH_REGISTER") is not None:
        r.say("note: NCCL_GRAPH_REGISTER is set; issue 35 asks for it unset (NCCL's graph registration on)")


def quiet_accumulate_grad_warning() -> None:
    """DDP on a side stream makes PyTorch warn once that AccumulateGrad's stream differs from the producer's:
    intended here (see the module's documentation)."""
    import torch
    setter = getattr(torch.autograd.graph, "set_warn_on_accumulate_grad_stream_mismatch", None)
    if setter is not None:
        setter(False)


def gpt_config(args):
    from gpt import GPTConfig
    if args.model == "gpt2":
        return GPTConfig(seq=128)  # GPT-2 small: 12 layers, 768 wide, 50304 tokens
    return GPTConfig(vocab=1024, seq=64, layers=2, heads=4, dim=128)


def base_model(args):
    """The model every run of a check starts from: the same on every rank (seed 0), on this rank's GPU."""
    import torch
    from gpt import GPT
    torch.manual_seed(0)
    return GPT(gpt_config(args)).cuda()


def make_data(r: Rank, steps: int, micro: int):
    """`steps` steps of `micro` (idx, targets) micro-batches, different on each rank."""
    from gpt import batches
    flat = batches(gpt_config(r.args), steps * micro, batch=r.args.batch, seed=1000 + r.rank)
    return [flat[s * micro:(s + 1) * micro] for s in range(steps)]


def seed_run(r: Rank) -> None:
    """The same seeds before the eager and the graphed run (dropout draws from the CUDA generator)."""
    import torch
    torch.manual_seed(1234 + r.rank)
    torch.cuda.manual_seed(1234 + r.rank)


def make_step(model_ref: list, no_sync: bool, unshard: Sequence = ()):
    """The whole step: forward, loss and backward of each micro-batch (DDP's no_sync for all but the last when
    `no_sync`), returning the micro-batches' losses. `model_ref` is a one-element list so that graphed() does
    not find the model itself (an FSDP model's parameters are DTensors, which it cannot take): what it checks
    is passed as modules=. `unshard`: FSDP modules unsharded explicitly from the second call on."""
    import torch
    calls = [0]

    def step(batch):
        model = model_ref[0]
        if unshard and calls[0] > 0:
            for m in unshard:
                m.unshard()
        calls[0] += 1
        losses = []
        for i, (idx, targets) in enumerate(batch):
            later_sync = no_sync and i < len(batch) - 1
            with model.no_sync() if later_sync else contextlib.nullcontext():
                loss = model(idx, targets)
                (loss / len(batch)).backward()
            losses.append(loss.detach())
        return torch.stack(losses)

    return step


def make_optimizer(module):
    import torch
    return torch.optim.AdamW(module.parameters(), lr=1e-3)


# ---------------------------------------------------------------------------------------------------------
# DDP and FSDP2.
# ---------------------------------------------------------------------------------------------------------

def make_ddp(model, r: Rank, cfg: DdpConfig):
    """DDP constructed on a side stream: its reducer's AccumulateGrad nodes (and hooks) run there, a stream a
    capture on another stream can fork to and join back (never the legacy default stream)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ddp = DDP(model, device_ids=[r.rank], output_device=r.rank, broadcast_buffers=cfg.broadcast_buffers,
                  static_graph=cfg.static_graph, gradient_as_bucket_view=cfg.bucket_view,
                  bucket_cap_mb=1 if r.args.model == "small" else 25)  # several buckets in the small model
    torch.cuda.current_stream().wait_stream(side)
    return ddp, side


def ddp_setup(r: Rank, base, cfg: DdpConfig, micro: int) -> Setup:
    model = copy.deepcopy(base)
    ddp, side = make_ddp(model, r, cfg)
    return Setup(module=ddp.module, step=make_step([ddp], no_sync=micro > 1), graphed_modules=[ddp],
                 local=lambda t: t, keep=[ddp, side])


def fsdp_api():
    """(fully_shard, FSDPModule) of this PyTorch (torch.distributed.fsdp since 2.6, _composable before)."""
    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import FSDPModule, fully_shard
    return fully_shard, FSDPModule


def local_shard(t):
    """A DTensor's local tensor (the same tensor object every time), or the tensor itself."""
    return getattr(t, "_local_tensor", t)


def shard_view_class():
    import torch

    class ShardView(torch.nn.Module):
        """What graphed() address-checks of an FSDP2 model, as plain tensors it can take: each parameter's
        local shard (parameters()), the model's buffers and each gradient's local shard (buffers()). graphed()
        reads them again at every call, so a shard or gradient that FSDP moved is recorded again, never
        replayed at its old address."""

        def __init__(self, model):
            super().__init__()
            self._target = [model]  # a list: not registered as a submodule

        def parameters(self, recurse: bool = True):
            for p in self._target[0].parameters():
                yield local_shard(p)

        def buffers(self, recurse: bool = True):
            model = self._target[0]
            yield from model.buffers()
            for p in model.parameters():
                if p.grad is not None:
                    yield local_shard(p.grad)

    return ShardView


def shard(model, r: Rank, reshard: bool):
    """fully_shard on every block, then on the model; returns the FSDP modules (blocks first)."""
    fully_shard, fsdp_module = fsdp_api()
    if r.mesh is None:
        from torch.distributed.device_mesh import init_device_mesh
        r.mesh = init_device_mesh("cuda", (r.world,))
    for block in model.blocks:
        fully_shard(block, mesh=r.mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=r.mesh, reshard_after_forward=reshard)
    return [m for m in model.modules() if isinstance(m, fsdp_module)]


def fsdp_setup(r: Rank, base, variant: FsdpVariant) -> Setup:
    import torch
    model = copy.deepcopy(base)
    modules = shard(model, r, variant.reshard)
    # Gradients exist from the start and are kept (set_to_none=False): FSDP accumulates each step's
    # reduce-scatter output into them in place, at addresses that stay put.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    step = make_step([model], no_sync=False, unshard=modules if variant.explicit_unshard else ())
    return Setup(module=model, step=step, graphed_modules=[shard_view_class()(model)], local=local_shard,
                 keep=[])


# ---------------------------------------------------------------------------------------------------------
# A check: the eager run, the graphed run, the comparison.
# ---------------------------------------------------------------------------------------------------------

def describe(error: BaseException, limit: int = 700) -> str:
    """The exception on one line, with the notes graphalloc adds."""
    text = f"{type(error).__name__}: {error}"
    notes = getattr(error, "__notes__", None) or []
    if notes:
        text += " | " + " | ".join(str(n) for n in notes)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + " ..."


def train(r: Rank, label: str, step_fn, opt, data, set_to_none: bool, losses: list, progress: dict) -> None:
    """len(data) optimizer steps through `step_fn`; each step's losses are cloned into `losses` (a graphed
    call's outputs are overwritten by the next one); progress["step"] is the step under way (1-based)."""
    import torch
    steps = len(data)
    for s in range(steps):
        progress["step"] = s + 1
        opt.zero_grad(set_to_none=set_to_none)
        out = step_fn(data[s])
        losses.append(out.detach().clone())
        opt.step()
        if s == 0 or (s + 1) % 10 == 0 or s + 1 == steps:
            r.say(f"{label}: step {s + 1}/{steps}, loss {[round(x, 5) for x in losses[-1].tolist()]}")
    torch.cuda.synchronize()


def final_state(setup: Setup):
    """The parameters and gradients at the end (local shards for FSDP), cloned."""
    params, grads = [], []
    for p in setup.module.parameters():
        params.append(setup.local(p).detach().clone())
        grads.append(None if p.grad is None else setup.local(p.grad).detach().clone())
    return params, grads


def free_memory() -> None:
    import torch
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def run_eager(r: Rank, check: str, build: Callable, data, set_to_none: bool):
    """(losses per step, (params, grads) at the end)."""
    seed_run(r)
    setup = build()
    opt = make_optimizer(setup.module)
    losses: list = []
    t0 = time.perf_counter()
    train(r, f"{check} eager", setup.step, opt, data, set_to_none, losses, {})
    r.say(f"{check} eager: {len(data)} steps in {time.perf_counter() - t0:.1f} s")
    return losses, final_state(setup)


def tree_summary(memory: dict) -> dict:
    """graphed()'s trees, summed: counters, the recordings' reasons, pool memory, why recording stopped."""
    lanes = [lane for lane in memory.get("lanes", []) if lane]
    counters = {k: sum(lane.get("counters", {}).get(k, 0) for lane in lanes)
                for k in ("warmup_runs", "recordings", "failed_recordings", "replays", "eager_runs")}
    reasons = []
    for lane in lanes:
        for node in lane.get("nodes", []):
            detail = node.get("reason_detail") or ""
            reasons.append(node.get("reason", "?") + (f" ({detail})" if detail else ""))
    disabled = [lane.get("disabled_reason", "") for lane in lanes if lane.get("recording_disabled")]
    eager_warnings = [s.get("eager_warning", "") for lane in lanes for s in lane.get("sites", [])
                      if s.get("eager_warning")]
    return {"counters": counters, "reasons": reasons, "trees": len(lanes),
            "pool_mib": sum(lane.get("pool_reserved_bytes", 0) for lane in lanes) / 2**20,
            "fell_back": [x for x in [memory.get("eager_reason")] + disabled + eager_warnings if x],
            "text": "\n".join(lane.get("text", "") for lane in lanes)}


def run_graphed(r: Rank, check: str, build: Callable, data, set_to_none: bool, warmups: int):
    """The same training with the step through graphalloc.torch.graphed. Returns a dict: losses, state (at the
    end, or None after an error), error (one line), where (the call that raised), trees (tree_summary),
    warnings (what was warned, deduplicated)."""
    import graphalloc.torch as gat
    seed_run(r)
    setup = build()
    opt = make_optimizer(setup.module)
    graphed_step = gat.graphed(setup.step, modules=setup.graphed_modules, warmup_calls=warmups,
                               max_recordings=r.args.max_recordings, name=check)
    out = {"losses": [], "state": None, "error": None, "where": None}
    progress = {"step": 0}
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            train(r, f"{check} graphed", graphed_step, opt, data, set_to_none, out["losses"], progress)
            out["state"] = final_state(setup)
        except Exception as e:  # noqa: BLE001 (every failure is reported, then the next check runs)
            out["where"] = f"step {progress['step']} ({call_kind(progress['step'], warmups)})"
            out["error"] = describe(e)
            r.say(f"{check} graphed: {out['where']} raised; traceback:")
            traceback.print_exc()
            sys.stderr.flush()
    r.say(f"{check} graphed: {len(out['losses'])} steps in {time.perf_counter() - t0:.1f} s")
    out["trees"] = tree_summary(graphed_step.memory())
    seen, out["warnings"] = set(), []
    for w in caught:
        text = " ".join(str(w.message).split())
        if text not in seen:
            seen.add(text)
            out["warnings"].append(f"{w.category.__name__}: {text[:400]}")
    return out


def call_kind(step: int, warmups: int) -> str:
    """What graphed() did at a step when the tree recorded at the first call after its warm-ups."""
    if step <= warmups:
        return "a warm-up call"
    return "the first recording" if step == warmups + 1 else "after the first recording"


def compare(eager, graphed) -> Tuple[bool, str]:
    """Whether the graphed run's losses (every step), parameters and gradients (at the end) equal the eager
    run's bit for bit, and what differs."""
    import torch
    e_losses, (e_params, e_grads) = eager
    g_losses = graphed["losses"]
    g_params, g_grads = graphed["state"]
    bad_steps = [s for s, (a, b) in enumerate(zip(e_losses, g_losses)) if not torch.equal(a, b)]
    bad_params = [k for k, (a, b) in enumerate(zip(e_params, g_params)) if not torch.equal(a, b)]
    bad_grads = [k for k, (a, b) in enumerate(zip(e_grads, g_grads))
                 if (a is None) != (b is None) or (a is not None and not torch.equal(a, b))]
    if not bad_steps and not bad_params and not bad_grads and len(e_losses) == len(g_losses):
        return True, (f"losses of all {len(e_losses)} steps, {len(e_params)} parameter tensors and their "
                      f"gradients bit-identical to eager")
    parts = []
    if bad_steps:
        s = bad_steps[0]
        diff = (e_losses[s] - g_losses[s]).abs().max().item()
        parts.append(f"losses differ at {len(bad_steps)} of {len(e_losses)} steps, first at step {s + 1} "
                     f"(eager {e_losses[s].tolist()} vs graphed {g_losses[s].tolist()}, max |diff| {diff:.3g})")
    if bad_params:
        k = bad_params[0]
        diff = (e_params[k] - g_params[k]).abs().max().item()
        parts.append(f"{len(bad_params)} of {len(e_params)} parameter tensors differ at the end "
                     f"(first: #{k}, max |diff| {diff:.3g})")
    if bad_grads:
        parts.append(f"{len(bad_grads)} of {len(e_grads)} gradients differ at the end (first: #{bad_grads[0]})")
    return False, "; ".join(parts)


def classify(graphed, eager, warmups: int) -> Tuple[str, str]:
    """RESULT and details of a graphed run against the eager one."""
    t = graphed["trees"]
    c = t["counters"]
    counts = (f"{c['warmup_runs']} warm-up, {c['recordings']} recording(s), {c['replays']} replays, "
              f"{c['eager_runs']} eager, {c['failed_recordings']} failed recording(s) in {t['trees']} tree(s); "
              f"pool {t['pool_mib']:.1f} MiB")
    if t["reasons"]:
        counts += "; recorded because: " + ", ".join(t["reasons"])
    if graphed["error"] is not None:
        fatal = any(f in graphed["error"] for f in FATAL_CUDA)
        kind = "ERROR" if fatal else "REFUSED"
        return kind, f"{graphed['where']} raised: {graphed['error']} ({counts})"
    same, how = compare(eager, graphed)
    if not same:
        return "MISMATCH", f"{how} ({counts})"
    if t["fell_back"]:
        return "FELL_BACK", f"{how}, but graphalloc ran calls eagerly: {' | '.join(t['fell_back'])} ({counts})"
    if c["replays"] == 0:
        return "NOT_GRAPHED", f"{how}, but nothing was replayed (--steps > {warmups + 1} needed) ({counts})"
    return "MATCH", f"{how} ({counts})"


def run_check(r: Rank, check: str, what: str, expect: Tuple[str, ...], build: Callable, micro: int,
              set_to_none: bool, warmups: int) -> Outcome:
    """Eager, then graphed, from the same state; the outcome line."""
    r.say(f"== {check}: {what}")
    data = make_data(r, r.args.steps, micro)
    base = base_model(r.args)
    c = gpt_config(r.args)
    r.say(f"{check}: {sum(p.numel() for p in base.parameters()) / 1e6:.2f} M parameters ({c.layers} layers, "
          f"{c.dim} wide, dropout {c.dropout}); {r.args.steps} steps of {micro} x {r.args.batch} x {c.seq} tokens; "
          f"graphed(warmup_calls={warmups})")
    try:
        eager = run_eager(r, check, lambda: build(base), data, set_to_none)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return Outcome(check, "ERROR", f"the eager run failed: {describe(e)}", expect)
    free_memory()
    graphed = run_graphed(r, check, lambda: build(base), data, set_to_none, warmups)
    for w in graphed["warnings"]:
        r.say(f"{check} graphed warned: {w}")
    result, detail = classify(graphed, eager, warmups)
    if result != "MATCH" and graphed["trees"]["text"]:
        r.say(f"{check} graph tree:\n{graphed['trees']['text']}")
    del eager, graphed, base
    free_memory()
    return Outcome(check, result, detail, expect)


def planned_checks(r: Rank):
    """(name, what, expect, build, micro, set_to_none, warmups) for every check asked for."""
    args, checks = r.args, []
    if args.command in ("ddp", "all"):
        for micro, names in ((1, args.ddp_configs), (2, args.accum_configs)):
            for name in [n for n in names.split(",") if n]:
                cfg = DDP_CONFIGS[name]
                check = f"ddp/{name}" if micro == 1 else f"ddp-accum/{name}"
                what = cfg.what + (f"; {micro} micro-batches, the first under no_sync()" if micro > 1 else "")
                checks.append((check, what, cfg.expect,
                               (lambda cfg, micro: lambda base: ddp_setup(r, base, cfg, micro))(cfg, micro),
                               micro, cfg.set_to_none, args.ddp_warmups))
    if args.command in ("fsdp", "all"):
        for name in [n for n in args.fsdp_variants.split(",") if n]:
            variant = FSDP_VARIANTS[name]
            checks.append((f"fsdp/{name}", variant.what, variant.expect,
                           (lambda variant: lambda base: fsdp_setup(r, base, variant))(variant),
                           1, False, args.fsdp_warmups))
    return checks


def report(rank: int, outcome: Outcome) -> None:
    expected = " or ".join(outcome.expect) or "nothing"
    print(f"OUTCOME {outcome.check} rank {rank}: {outcome.result} - {outcome.detail} "
          f"[expected {expected}: {'ok' if outcome.ok else 'UNEXPECTED'}]", flush=True)


def check_worker(rank: int, world: int, args, port: int) -> None:
    setup_process(rank, args, "graphalloc")
    import torch
    import torch.distributed as dist
    r = Rank(rank, world, args)
    outcomes: List[Outcome] = []
    try:
        join_group(rank, world, port)
        describe_setup(r)
        if args.deterministic:
            torch.use_deterministic_algorithms(True)
        quiet_accumulate_grad_warning()
        for check, what, expect, build, micro, set_to_none, warmups in planned_checks(r):
            r.arm_watchdog()
            if args.steps <= warmups + 1:
                r.say(f"note: --steps {args.steps} leaves no replay after {warmups} warm-up calls and the recording")
            outcome = None
            if check.startswith("fsdp/"):
                try:
                    fsdp_api()
                except ImportError as e:
                    outcome = Outcome(check, "ERROR", f"no FSDP2 fully_shard in this PyTorch ({e})", expect)
            if outcome is None:
                outcome = run_check(r, check, what, expect, build, micro, set_to_none, warmups)
            outcomes.append(outcome)
            report(rank, outcome)
            if outcome.result == "ERROR" and any(f in outcome.detail for f in FATAL_CUDA):
                r.say("stopping: this CUDA error leaves the context unusable for the checks that remain")
                break
            dist.barrier(device_ids=[rank])  # both ranks done with this check before the next one's collectives
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        outcomes.append(Outcome("setup", "ERROR", describe(e), ()))
        report(rank, outcomes[-1])
    unexpected = [o for o in outcomes if not o.ok]
    r.say(f"SUMMARY: {len(outcomes)} checks, {len(outcomes) - len(unexpected)} as expected"
          + (", UNEXPECTED: " + ", ".join(f"{o.check} {o.result}" for o in unexpected) if unexpected else ""))
    sys.stdout.flush()
    sys.stderr.flush()
    # Not dist.destroy_process_group(): see nccl_in_graphs.py. The process ends, NCCL's resources with it.
    os._exit(1 if unexpected or not outcomes else 0)


# ---------------------------------------------------------------------------------------------------------
# Timing.
# ---------------------------------------------------------------------------------------------------------

class ManualGraphStep:
    """torchtitan's CUDAGraphWrapper (torchtitan/distributed/cudagraph.py) reduced to what a step needs:
    `warmups` eager calls on the capture stream, then one torch.cuda.graph capture on that stream
    (capture_error_mode="thread_local", a pool of its own), then replays with the tensors of each call copied
    into the captured call's static inputs. Parameters, gradients and optimizer state are read where they were
    at capture, unchecked, as torchtitan does; outputs are the graph's static buffers."""

    def __init__(self, fn: Callable, warmups: int):
        import torch
        self.fn, self.warmups = fn, warmups
        self.stream = torch.cuda.Stream()
        self.pool = torch.cuda.graph_pool_handle()
        self.graph = None
        self.static_batch = None
        self.output = None

    def __call__(self, batch):
        import torch
        current = torch.cuda.current_stream()
        if self.warmups > 0:
            self.warmups -= 1
            self.stream.wait_stream(current)
            with torch.cuda.stream(self.stream):
                out = self.fn(batch)
            current.wait_stream(self.stream)
            return out
        if self.graph is None:
            self.static_batch = [tuple(t.clone() for t in micro) for micro in batch]
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
                self.output = self.fn(self.static_batch)
        else:
            for static, micro in zip(self.static_batch, batch):
                for s, t in zip(static, micro):
                    s.copy_(t)
        self.graph.replay()
        return self.output


def timing_setup(r: Rank, base):
    """(Setup, set_to_none, warm-up calls) of the parallelism timed."""
    args = r.args
    if args.parallel == "ddp":
        cfg = DDP_CONFIGS[args.timing_config]
        return ddp_setup(r, base, cfg, 1), cfg.set_to_none, args.ddp_warmups
    return fsdp_setup(r, base, FSDP_VARIANTS["noreshard"]), False, args.fsdp_warmups


def time_variant(r: Rank, kind: str) -> dict:
    import torch
    args = r.args
    base = base_model(args)  # seeds with 0 (every rank the same model): the run's seeds come after it
    seed_run(r)
    setup, set_to_none, warmups = timing_setup(r, base)
    if kind == "manual" and set_to_none:
        raise ValueError(f"--timing-config {args.timing_config} sets gradients to None at every step: a manual "
                         "capture would leave .grad None after its replays; use keep_grads or bucket_view")
    if args.timing_warmup <= warmups:
        r.say(f"note: --timing-warmup {args.timing_warmup} <= {warmups} warm-up calls: the recording is timed")
    opt = make_optimizer(setup.module)
    data = make_data(r, 4, 1)  # four batches in turn: inputs are copied in every step
    if kind == "eager":
        fn = setup.step
    elif kind == "manual":
        fn = ManualGraphStep(setup.step, warmups)
    else:
        import graphalloc.torch as gat
        fn = gat.graphed(setup.step, modules=setup.graphed_modules, warmup_calls=warmups,
                         max_recordings=args.max_recordings, name=f"timing-{args.parallel}")
    times = []
    out = None
    for s in range(args.timing_warmup + args.timing_steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=set_to_none)
        out = fn(data[s % len(data)])
        opt.step()
        torch.cuda.synchronize()
        if s >= args.timing_warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    row = {"median": statistics.median(times), "min": min(times), "max": max(times),
           "peak_mib": torch.cuda.max_memory_reserved(r.rank) / 2**20, "loss": float(out[0]),
           "allocator": torch.cuda.get_allocator_backend()}
    if kind == "graphed":
        row["trees"] = tree_summary(fn.memory())["counters"]
    return row


def timing_worker(rank: int, world: int, args, port: int) -> None:
    kind, allocator = args.variant.split("-")
    setup_process(rank, args, allocator)
    import torch.distributed as dist
    r = Rank(rank, world, args)
    code = 0
    try:
        join_group(rank, world, port)
        describe_setup(r)
        quiet_accumulate_grad_warning()
        try:
            row = time_variant(r, kind)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            row = {"error": describe(e, 300)}
            code = 1
        r.say(f"{args.variant}: {row}")
        rows = [None] * world
        dist.all_gather_object(rows, row)
        if rank == 0:
            print(table_row(args, rows), flush=True)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        r.say(f"{args.variant}: {describe(e)}")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def table_header() -> str:
    return ("| variant | allocator | what | step ms, median [min, max], per rank | peak reserved MiB, per rank "
            "| loss at last step |\n| --- | --- | --- | --- | --- | --- |")


def table_row(args, rows) -> str:
    what = (f"{args.parallel} {args.timing_config if args.parallel == 'ddp' else 'noreshard'}, {args.model}, "
            f"world {len(rows)}, {args.timing_steps} steps")
    errors = [row["error"] for row in rows if "error" in row]
    if errors:
        return f"| {args.variant} | - | {what} | failed: {errors[0]} | - | - |"
    steps = " / ".join(f"{row['median']:.3f} [{row['min']:.3f}, {row['max']:.3f}]" for row in rows)
    peaks = " / ".join(f"{row['peak_mib']:,.0f}" for row in rows)
    return (f"| {args.variant} | {rows[0]['allocator']} | {what} | {steps} | {peaks} | "
            f"{rows[0]['loss']:.4f} |")


# ---------------------------------------------------------------------------------------------------------

def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("ddp", "fsdp", "all", "timing"))
    p.add_argument("--world", type=int, default=0, help="ranks (one GPU each); 0: two, or one where there is one")
    p.add_argument("--model", choices=("small", "gpt2"), default="small")
    p.add_argument("--batch", type=int, default=4, help="sequences per micro-batch and rank")
    p.add_argument("--steps", type=int, default=50, help="optimizer steps per check")
    p.add_argument("--ddp-configs", default=DEFAULT_DDP_CONFIGS,
                   help=f"comma-separated, of: {', '.join(DDP_CONFIGS)} ('' for none)")
    p.add_argument("--accum-configs", default=DEFAULT_ACCUM_CONFIGS,
                   help="DDP configurations run with two micro-batches per step ('' for none)")
    p.add_argument("--fsdp-variants", default=DEFAULT_FSDP_VARIANTS,
                   help=f"comma-separated, of: {', '.join(FSDP_VARIANTS)} ('' for none)")
    p.add_argument("--ddp-warmups", type=int, default=11, help="graphed(warmup_calls=) with DDP")
    p.add_argument("--fsdp-warmups", type=int, default=2, help="graphed(warmup_calls=) with FSDP")
    p.add_argument("--max-recordings", type=int, default=5, help="graphed(max_recordings=)")
    p.add_argument("--config", default="", help="GRAPHALLOC_CONF for graphalloc ('': its defaults, expandable)")
    p.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True,
                   help="torch.use_deterministic_algorithms(True) in the checks (not in timing)")
    p.add_argument("--hang-timeout", type=float, default=600,
                   help="seconds per check (timing: per variant) after which a rank prints its stacks and exits; "
                        "0: never")
    t = p.add_argument_group("timing")
    t.add_argument("--variants", default=",".join(TIMING_VARIANTS), help="comma-separated, of: "
                   + ", ".join(TIMING_VARIANTS))
    t.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp")
    t.add_argument("--timing-config", default="keep_grads", help="the DDP configuration timed")
    t.add_argument("--timing-warmup", type=int, default=15, help="untimed steps (more than the warm-up calls)")
    t.add_argument("--timing-steps", type=int, default=50, help="timed steps (at least 1)")
    t.add_argument("--torch-alloc-conf", default="expandable_segments:True",
                   help="PYTORCH_CUDA_ALLOC_CONF of the *-torch variants")
    args = p.parse_args()
    if args.timing_steps < 1 or args.steps < 1:
        p.error("--steps and --timing-steps must be at least 1")
    for names, known in ((args.ddp_configs, DDP_CONFIGS), (args.accum_configs, DDP_CONFIGS),
                         (args.fsdp_variants, FSDP_VARIANTS), (args.timing_config, DDP_CONFIGS),
                         (args.variants, TIMING_VARIANTS)):
        unknown = [n for n in names.split(",") if n and n not in known]
        if unknown:
            p.error(f"unknown: {', '.join(unknown)} (known: {', '.join(known)})")
    return args


def main() -> int:
    args = parse_args()
    world = world_or_skip(args.world)
    if world is None:
        return SKIP
    if args.command != "timing":
        return run_ranks(check_worker, world, args)
    print(table_header(), flush=True)
    failed = 0
    for i, variant in enumerate(v for v in args.variants.split(",") if v):
        variant_args = copy.copy(args)
        variant_args.variant = variant
        # PyTorch's allocator may read its configuration when torch is imported, which the spawned ranks do
        # before the worker runs: set it here, where they inherit it (and not for graphalloc's variants).
        if variant.endswith("-torch") and args.torch_alloc_conf:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = args.torch_alloc_conf
        else:
            os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        failed |= run_ranks(timing_worker, world, variant_args, port_salt=i + 1)
    return failed


if __name__ == "__main__":
    sys.exit(main())
