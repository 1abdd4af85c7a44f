"""CUDA graphs for PyTorch programs on graphalloc's graph tree: drop-in graphed callables and graphed steps.

    import graphalloc.torch as gat
    gat.install()                                   # once, before CUDA is first used
    model = gat.make_graphed_callables(model, (sample_x,))      # was torch.cuda.make_graphed_callables
    step = gat.graphed(train_step)                  # a whole step: forward, loss, backward (and optimizer)

Recording, replay, re-recording, output liveness, micro-batch lanes, gradient ownership and deferred
releases are graphalloc's C++ graph layers (graph/graph_tree.h, lifetime/graphed_step.h), reached
through the module graphalloc._torch_graphs (python/csrc/graphs). This file adapts PyTorch to them:
flattening arguments, running the callables with autograd, and wrapping each graphed stage in a
torch.autograd.Function. The rules, and the PyTorch behaviour each replaces, are in docs/torch_graphs.md:

  * a parameter (or any static input) whose address changed is recorded again, up to max_recordings per
    place in the tree, then runs eagerly with one warning naming the function, the input and both
    addresses; never a replay of the old address;
  * a graph output that a later replay overwrote raises when read or passed, saying how to keep it;
  * parameter gradients are owned by default (accumulation gives g1 + g2; a held gradient never changes);
    per parameter, `skip_backward_post_hook = True` or `clone_param_grads_on_return` opts out, fixed when
    graphed; in graphed(), a gradient the step points at a view of a longer-lived tensor (DDP's bucket under
    gradient_as_bucket_view) stays that view, as it would eagerly;
  * each outstanding forward (micro-batches, pipeline schedules) gets its own lane, up to
    max_outstanding_forwards; a forward whose backward never runs ends when its autograd graph is freed;
  * loss.backward(retain_graph=True) then another backward works; releases asked for through
    `graphed.graphalloc_graphs.request_release(what, fn)` wait for the last one;
  * PyTorch's CUDA generators (the device's default one and those named) take part in every recording:
    graphed dropout draws exactly what the same eager calls draw, and the RNG state is restored after the
    warm-up iterations;
  * what a capture cannot do (a host synchronisation, .item()) fails the recording with the function's
    name, and the function runs eagerly from then on.
"""
from __future__ import annotations

import functools
import glob
import importlib.machinery
import importlib.util
import os
import sysconfig
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils import _pytree as pytree

import graphalloc as _ga

__all__ = ["make_graphed_callables", "graphed", "GraphedFunction", "graph_memory", "GraphBackendError"]

_lock = threading.Lock()
_native_module = None
_front_ends: "weakref.WeakSet[Any]" = weakref.WeakSet()
# The native parts (graphs, pools, lanes) of front ends whose Python side was collected, destroyed at the
# next safe point (_destroy_collected).
_collected: List[Any] = []
# How many graphed bodies this thread is running (a graphed call inside another's body runs at depth 1).
_in_body = threading.local()
# TransformerEngine keyword arguments with no meaning here: accepted when they ask for nothing.
_TE_ONLY = ("fp8_enabled", "fp8_calibrating", "fp8_recipe", "fp8_group", "fp8_weight_caching", "enabled",
            "calibrating", "recipe", "amax_reduction_group", "cache_quantized_params", "capture_time_hooks",
            "capture_stream")
# TransformerEngine keyword arguments that need nothing here: _reuse_graph_input_output_buffers (the tree
# reuses memory by liveness, and keeps what is still read), _num_layers_per_chunk (read with _order).
_TE_ACCEPTED = ("_reuse_graph_input_output_buffers", "_num_layers_per_chunk")


class GraphBackendError(RuntimeError):
    """graphalloc is not PyTorch's allocator, or its graph module is missing."""


def _native():
    """The graphalloc._torch_graphs module, loaded from beside libgraphalloc_torch.so."""
    global _native_module
    with _lock:
        if _native_module is not None:
            return _native_module
        import graphalloc.torch as gat
        from graphalloc import _torch_state
        if gat.backend() != "allocator":
            raise GraphBackendError(
                "graphalloc's CUDA graphs need graphalloc as PyTorch's allocator: call graphalloc.torch.install() "
                "before CUDA is first used (backend now: "
                f"{gat.backend() or 'not installed'}; {gat.hooks().get('backend', '')})")
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        here = os.path.dirname(os.path.abspath(__file__))
        dirs = [os.path.dirname(_torch_state.shim_path or _ga.library_path()), os.path.dirname(_ga.library_path()), here]
        env = os.environ.get("GRAPHALLOC_TORCH_GRAPHS")
        candidates = [env] if env else [p for d in dirs for p in sorted(glob.glob(os.path.join(d, "_torch_graphs" + suffix)))]
        for path in candidates:
            if path and os.path.isfile(path):
                loader = importlib.machinery.ExtensionFileLoader("graphalloc._torch_graphs", path)
                spec = importlib.util.spec_from_file_location("graphalloc._torch_graphs", path, loader=loader)
                module = importlib.util.module_from_spec(spec)
                loader.exec_module(module)
                _native_module = module
                return module
        raise GraphBackendError(
            f"graphalloc._torch_graphs{suffix} not found (built with libgraphalloc_torch.so when python3 imports "
            f"PyTorch and has Python.h; or set GRAPHALLOC_TORCH_GRAPHS). Looked in: {', '.join(dirs)}")


def _device_of(tensors: Sequence[Any], default: Optional[int] = None) -> int:
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            return t.get_device()
    return torch.cuda.current_device() if default is None else default


def _cuda_generators(generators) -> List[torch.Generator]:
    out = []
    for g in generators or ():
        if not isinstance(g, torch.Generator) or g.device.type != "cuda":
            raise TypeError(f"generators must be CUDA torch.Generator objects, got {g!r}")
        out.append(g)
    return out


def _constants_tag(spec, constants) -> int:
    """A non-zero tag of a call's non-tensor arguments (part of the recording key)."""
    try:
        h = hash((str(spec), tuple(constants)))
    except TypeError:
        h = hash((str(spec), repr(constants)))
    return (h & 0xFFFFFFFFFFFFFFFF) or 1


def _add_note(error: BaseException, note: str) -> None:
    if note and hasattr(error, "add_note"):
        error.add_note(note)


def _on_collected(natives) -> None:
    """weakref.finalize's callback when a front end's Python side is collected: its native part waits for a
    safe point. The collector runs wherever Python allocates, for example inside another front end's
    recording, where the destructor's device synchronization would break that capture and its copies of the
    outputs still held would be recorded into it; so nothing is destroyed here."""
    _collected.extend(natives)  # no lock: the collector may run while this thread holds any of them


def _destroy_collected() -> None:
    """Destroys the native parts of collected front ends, unless this thread is inside a graphed body (whose
    front end may hold what a destructor waits for) or capturing; called where the program calls in: a
    graphed call, graph_memory(), a new front end."""
    if not _collected or getattr(_in_body, "depth", 0) > 0 or torch.cuda.is_current_stream_capturing():
        return
    natives = _collected[:]
    del _collected[:len(natives)]  # (a collection between the two lines only appends)
    del natives  # the last references: each native front end's destructor runs here, outside the collector


def _weak_body(method: Callable) -> Callable:
    """`method` (a bound method of a front end), callable by the native front end without keeping its object
    alive. The native object is invisible to Python's cycle collector: a strong reference from it back to
    the Python object that owns it would be a cycle nothing collects, and the front end, its graphs and its
    pool would live as long as the process."""
    ref = weakref.WeakMethod(method)
    name = method.__qualname__  # not `method` itself, which would hold its object

    def body(*args):
        bound = ref()
        if bound is None:
            raise RuntimeError(f"graphalloc: '{name}' ran after its front end was deleted")
        _in_body.depth = getattr(_in_body, "depth", 0) + 1
        try:
            return bound(*args)
        finally:
            _in_body.depth -= 1

    return body


def _memory_note(front, lane_dumps) -> str:
    held = sum(d.get("pool_reserved_bytes", 0) for d in lane_dumps)
    used = sum(d.get("pool_allocated_bytes", 0) for d in lane_dumps)
    return (f"graphalloc: while recording '{front}': its graph pool holds {held / 2**20:.1f} MiB reserved, "
            f"{used / 2**20:.1f} MiB allocated across {len(lane_dumps)} lane(s) (graphalloc.torch.graph_memory())")


# ---------------------------------------------------------------------------------------------------------
# graphed(): any function of tensors, a whole training step included.
# ---------------------------------------------------------------------------------------------------------

def _modules_and_optimizers(fn, modules, optimizers):
    """Modules and optimizers a function uses that graphed() can see: the function itself, the object of a
    bound method (and its attributes), closure cells, and those named."""
    mods: List[torch.nn.Module] = []
    opts: List[torch.optim.Optimizer] = []

    def consider(obj, depth=0):
        if isinstance(obj, torch.nn.Module):
            if all(obj is not m for m in mods):
                mods.append(obj)
        elif isinstance(obj, torch.optim.Optimizer):
            if all(obj is not o for o in opts):
                opts.append(obj)
        elif depth == 0 and hasattr(obj, "__dict__") and not isinstance(obj, type):
            for value in list(vars(obj).values()):
                consider(value, depth + 1)

    consider(fn)
    owner = getattr(fn, "__self__", None)
    if owner is not None:
        consider(owner)
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            consider(cell.cell_contents, 1)
        except ValueError:  # an empty cell
            pass
    for m in modules or ():
        consider(m, 1)
    for o in optimizers or ():
        consider(o, 1)
    return mods, opts


class GraphedFunction:
    """A function of tensors run through a CUDA graph tree: see graphed()."""

    def __init__(self, fn: Callable, *, static: Sequence[torch.Tensor] = (), modules: Sequence[Any] = (),
                 optimizers: Sequence[Any] = (), max_recordings: int = 5, warmup_calls: int = 1,
                 generators: Sequence[torch.Generator] = (), grads: str = "clone", name: Optional[str] = None,
                 device: Optional[int] = None):
        if grads not in ("clone", "alias"):
            raise ValueError(f"grads must be 'clone' or 'alias', not {grads!r}")
        if not isinstance(max_recordings, int) or max_recordings < 0:
            raise ValueError(f"max_recordings must be an int >= 0, not {max_recordings!r}")
        if not isinstance(warmup_calls, int) or warmup_calls < 1:
            raise ValueError(f"warmup_calls must be an int >= 1 (a warmup builds lazy state before any capture), "
                             f"not {warmup_calls!r}")
        for t in static:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"static must hold tensors, got {type(t).__name__}")
        self._fn = fn
        self._name = name or getattr(fn, "__qualname__", None) or type(fn).__name__
        self._mods, self._opts = _modules_and_optimizers(fn, modules, optimizers)
        self._static_named = list(static)
        self._max_recordings = max_recordings
        self._warmup_calls = warmup_calls
        self._generators = _cuda_generators(generators)
        self._grads = grads
        self._device = device
        self._native = None
        self._grad_pool = None
        self._natives: Dict[int, Any] = {}
        self._structures_by_native: Dict[int, Dict[int, Any]] = {}
        self._eager_reason: Optional[str] = None
        self._structures: Dict[int, Any] = {}  # recorded node -> (output spec, constants, grad params, views)
        self._pending = None
        self._call = None
        functools.update_wrapper(self, fn, updated=())

    # The static tensors of a call: parameters, their gradients (None where absent), buffers, optimizer
    # state, and those named. Their number must stay the same from call to call.
    def _params(self) -> List[torch.nn.Parameter]:
        seen, out = set(), []
        for m in self._mods:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        for o in self._opts:
            for group in o.param_groups:
                for p in group["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        out.append(p)
        return out

    def _statics(self, params) -> List[Optional[torch.Tensor]]:
        statics: List[Optional[torch.Tensor]] = list(params)
        statics += [p.grad if p.requires_grad else None for p in params]
        for m in self._mods:
            statics += [b for b in m.buffers()]
        for o in self._opts:
            for state in o.state.values():
                statics += [v for _, v in sorted(state.items(), key=lambda kv: str(kv[0]))
                            if isinstance(v, torch.Tensor) and v.is_cuda]
        statics += self._static_named
        return statics

    def __call__(self, *args, **kwargs):
        _destroy_collected()
        if self._eager_reason is not None:
            return self._fn(*args, **kwargs)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        tensor_positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        constants = [x for x in leaves if not isinstance(x, torch.Tensor)]
        params = self._params()
        statics = self._statics(params)
        # One tree per number of static tensors: optimizer state appears after the first step, a gradient
        # slot after the first backward; each such shape of the call warms up and records on its own.
        self._native = self._natives.get(len(statics))
        if self._native is None:
            device = self._device if self._device is not None else _device_of(
                [leaves[i] for i in tensor_positions] + list(params))
            self._native = _native().GraphedFunction(_weak_body(self._body), self._name, device,
                                                     self._max_recordings, self._warmup_calls, self._generators)
            if not self._natives:  # the first native part: handed to the finalizer once, with the dict
                weakref.finalize(self, _on_collected, self._natives.values())
            self._natives[len(statics)] = self._native
            self._structures_by_native[len(statics)] = {}
            _front_ends.add(self)
        self._structures = self._structures_by_native[len(statics)]
        arg_tensors = [leaves[i] for i in tensor_positions]
        static_ids = {id(t) for t in statics if t is not None}
        # A static tensor passed as an argument is read in place, not copied.
        copied = [None if id(t) in static_ids else t for t in arg_tensors]
        versions = [t._version if t is not None else 0 for t in copied]
        self._call = (leaves, spec, tensor_positions, params, len(statics), statics, arg_tensors)
        self._pending = None
        try:
            # Autocast decides the kernels a call records: its state is part of the key, as the arguments are.
            autocast = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
            outs = self._native.call(list(statics) + copied, len(statics),
                                     _constants_tag(spec, constants + [autocast]))
        except torch.cuda.OutOfMemoryError as error:
            _add_note(error, _memory_note(self._name, [self._native.dump()]))
            raise
        except BaseException as error:
            _add_note(error, f"graphalloc: {self._native.last_error}" if self._native.last_error else "")
            raise
        finally:
            self._call = None
        kind, node = self._native.last_call
        if kind == "record":
            self._structures[node] = self._pending
        structure = self._structures[node] if kind == "replay" else self._pending
        self._pending = None
        if kind in ("warmup", "eager"):
            for t, v in zip(copied, versions):
                if t is not None and t._version != v:
                    self._eager_reason = (
                        f"graphalloc: '{self._name}' wrote one of its tensor arguments in place; a recording would "
                        "write the graph's private copy instead, so it runs eagerly from now on. Pass such a tensor "
                        "as static=[...] to graph it in place")
                    warnings.warn(self._eager_reason, stacklevel=2)
                    break
        out_spec, out_leaves, tensor_slots, grad_params, grad_views = structure
        if kind == "replay":  # what the recorded call pointed .grad at, and the replay wrote in place
            for k, view in grad_views:
                params[k].grad = view
        for slot, t in zip(tensor_slots, outs):
            out_leaves[slot] = t
        n_out = len(tensor_slots)
        # Gradients the call created for parameters that had none: installed as .grad, owned unless asked.
        # The copies come from a pool of their own, in parameter order: freed with zero_grad(set_to_none=True)
        # and taken again the same way each step, they land at the same addresses, so the next call (a
        # micro-batch accumulating into them, static inputs) replays instead of recording again.
        new_grads = [(params[k], g) for k, g in zip(grad_params, outs[n_out:]) if g is not None]
        if new_grads and self._grads == "clone":
            if self._grad_pool is None:
                self._grad_pool = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(self._grad_pool):
                copies = _native().clone_all([g for _, g in new_grads])
            new_grads = [(p, c) for (p, _), c in zip(new_grads, copies)]
        for p, g in new_grads:
            p.grad = g
        return pytree.tree_unflatten(list(out_leaves), out_spec)

    def _body(self, passed: List[Optional[torch.Tensor]]) -> List[Optional[torch.Tensor]]:
        leaves, spec, tensor_positions, params, num_static, statics, arg_tensors = self._call
        leaves = list(leaves)
        copied = passed[num_static:num_static + len(tensor_positions)]
        for pos, original, got in zip(tensor_positions, arg_tensors, copied):
            leaves[pos] = original if got is None else got
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        before = [p.grad for p in params]
        out = self._fn(*args, **kwargs)
        flat, out_spec = pytree.tree_flatten(out)
        tensor_slots = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        out_leaves = [None if isinstance(x, torch.Tensor) else x for x in flat]
        grad_params, grads, grad_views = [], [], []
        for k, p in enumerate(params):
            # A gradient is new when the call made it, not when it re-pointed .grad at the same memory (DDP's
            # gradient_as_bucket_view hands out a new view of its bucket every step).
            b = before[k]
            if p.grad is not None and p.grad is not b and (b is None or p.grad.data_ptr() != b.data_ptr()):
                if p.grad._base is not None:
                    # A view of a larger tensor (DDP's bucket under gradient_as_bucket_view, which re-points
                    # .grad at it whenever .grad is anything else): it stays .grad, as eagerly, and a replay,
                    # which writes it in place, points .grad at it again. The tensor it views outlives the
                    # call: made during a recording, it would be an allocation left over, which fails it.
                    grad_views.append((k, p.grad))
                    continue
                grad_params.append(k)
                grads.append(p.grad)
                p.grad = before[k]  # installed again (owned) once the call is done
        self._pending = (out_spec, out_leaves, tensor_slots, grad_params, grad_views)
        return [flat[i].detach() for i in tensor_slots] + grads

    def memory(self) -> Dict[str, Any]:
        """The graph tree's pool and recordings (graph_memory() for every front end)."""
        return {"name": self._name, "kind": "graphed", "lanes": [n.dump() for n in self._natives.values()],
                "eager_reason": self._eager_reason}


def graphed(fn: Optional[Callable] = None, **options):
    """Graphs `fn`, a function of tensors: a whole training step (forward, loss, backward, optimizer step),
    an inference function, any region. Returns a GraphedFunction; also usable as a decorator.

    Static inputs, read in place and part of the recording key, are found automatically: the parameters,
    gradients and buffers of the modules `fn` uses (`fn` itself, the object of a bound method and its
    attributes, closure cells, `modules=`), the state of the optimizers it uses (same places,
    `optimizers=`), and `static=[tensors]`. Other tensor arguments are copied into the graph's own buffers on
    every call. Non-tensor arguments are part of the key. Options: max_recordings (5), warmup_calls (1),
    generators (CUDA generators besides the default one), grads ("clone": gradients a call creates are
    installed as owned .grad tensors; "alias": as graph buffers, valid until the next call), name, device.

    Outputs are the graph's buffers: valid until the next call, which overwrites them (reading one after
    that raises, saying how to keep it); clone what must outlive the call. They carry no autograd history.
    """
    if fn is None:
        return lambda f: GraphedFunction(f, **options)
    return GraphedFunction(fn, **options)


# ---------------------------------------------------------------------------------------------------------
# make_graphed_callables(): forward and backward graphs of each callable, through torch.autograd.Function.
# ---------------------------------------------------------------------------------------------------------

class _Template:
    """The autograd graph a forward body built, which its backwards run over."""
    __slots__ = ("outputs", "leaves", "params", "out_spec", "out_leaves", "tensor_slots")

    def __init__(self, outputs, leaves, params, out_spec, out_leaves, tensor_slots):
        self.outputs, self.leaves, self.params = outputs, leaves, params
        self.out_spec, self.out_leaves, self.tensor_slots = out_spec, out_leaves, tensor_slots


class _Stage:
    """One graphed callable: its autograd-facing side."""

    def __init__(self, front: "_GraphedCallables", index: int, callable_, sample_leaves, sample_spec,
                 params, buffers, training: Optional[bool]):
        self.front, self.index, self.callable = front, index, callable_
        self.name = getattr(callable_, "__qualname__", None) or type(callable_).__name__
        self.forward_fn = callable_.forward if isinstance(callable_, torch.nn.Module) else callable_
        self.tensor_positions = [i for i, x in enumerate(sample_leaves) if isinstance(x, torch.Tensor)]
        self.constants = [(i, x) for i, x in enumerate(sample_leaves) if not isinstance(x, torch.Tensor)]
        self.spec = sample_spec
        self.requires_grad = [sample_leaves[i].requires_grad for i in self.tensor_positions]
        self.params, self.buffers = params, buffers
        self.param_names = [name for name, _ in callable_.named_parameters()] if params else []
        if len(self.param_names) != len(params):
            raise AssertionError(f"'{self.name}': {len(params)} parameters but {len(self.param_names)} names")
        self.num_inputs = len(self.tensor_positions)
        self.training = training

    def statics(self) -> List[torch.Tensor]:
        return list(self.params) + list(self.buffers)

    # Bodies, run by the C++ step (warmups, recordings, eager calls).
    def forward_body(self, forward_id: int, inputs, statics):
        capturing = torch.cuda.is_current_stream_capturing()
        leaves = []
        for x, rg in zip(inputs, self.requires_grad):
            leaf = x.detach() if x is not None else None
            if leaf is not None and rg:
                leaf.requires_grad_(True)
            leaves.append(leaf)
        all_leaves = [None] * (len(self.tensor_positions) + len(self.constants))
        for pos, leaf in zip(self.tensor_positions, leaves):
            all_leaves[pos] = leaf
        for pos, value in self.constants:
            all_leaves[pos] = value
        args, kwargs = pytree.tree_unflatten(all_leaves, self.spec)
        # The graph's copies of the inputs are reused once the forward's launch has read them: anything the
        # backward keeps of them is copied inside the graph instead.
        staged = {x.untyped_storage().data_ptr() for x in inputs if x is not None} if capturing else set()
        saved: List[torch.Tensor] = []

        # The hook keeps a detached alias, never the tensor itself: a saved output returned as is would hold
        # its own grad_fn, a cycle through C++ that Python's collector cannot see, and every eager or warm-up
        # forward's activations would stay allocated for good (GPT-2 small: 2.2 GiB per warm-up iteration).
        def pack(t):
            t = t.detach()
            if staged and t.untyped_storage().data_ptr() in staged:
                t = t.clone()
            saved.append(t)
            return t

        # The module runs on leaf aliases of its parameters, made here: the gradients are taken with respect to
        # them, so the backward never reaches the parameters' own AccumulateGrad nodes, which PyTorch made on
        # the caller's stream (a capture on the tree's stream must not depend on it).
        params = statics[:len(self.params)]
        aliases = [p.detach().requires_grad_(p.requires_grad) for p in params]
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if aliases:
                mapping = dict(zip(self.param_names, aliases))
                with torch.nn.utils.stateless._reparametrize_module(self.callable, mapping, tie_weights=True):
                    out = self.forward_fn(*args, **kwargs)
            else:
                out = self.forward_fn(*args, **kwargs)
        flat, out_spec = pytree.tree_flatten(out)
        tensor_slots = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        out_leaves = [None if isinstance(x, torch.Tensor) else x for x in flat]
        outputs = [flat[i] for i in tensor_slots]
        self.front.pending[forward_id] = _Template(outputs, leaves, aliases + [None] * len(self.buffers), out_spec,
                                                   out_leaves, tensor_slots)
        return outputs, saved

    def backward_body(self, forward_id: int, lane: int, node: int, grads):
        template = self.front.templates_by_node.get((lane, node)) if node else self.front.templates_by_id.get(forward_id)
        if template is None:
            raise RuntimeError(f"graphalloc: no autograd graph for forward {forward_id} of '{self.name}'")
        wanted = [(k, o) for k, o in enumerate(template.outputs) if o.requires_grad]
        inputs = [leaf for leaf in template.leaves if leaf is not None and leaf.requires_grad]
        params = [p for p in template.params if p is not None and p.requires_grad]
        result: Sequence[Optional[torch.Tensor]] = ()
        if wanted and (inputs or params):
            grad_outputs = []
            for k, o in wanted:
                g = grads[k]
                grad_outputs.append(g if g is not None else torch.zeros_like(o))
            result = torch.autograd.grad([o for _, o in wanted], inputs + params, grad_outputs,
                                         retain_graph=True, allow_unused=self.front.allow_unused_input)
        it = iter(result)
        slots: List[Optional[torch.Tensor]] = []
        for leaf in template.leaves:
            slots.append(next(it) if leaf is not None and leaf.requires_grad else None)
        for p in template.params:
            slots.append(next(it) if p is not None and p.requires_grad else None)
        return slots


class _StageFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, stage: _Stage, *tensors):  # noqa: D401 (autograd's signature)
        front = stage.front
        outputs, forward_id, sentinel = front.run_forward(stage, tensors[:stage.num_inputs],
                                                          tensors[stage.num_inputs:])
        ctx.stage, ctx.forward_id = stage, forward_id
        # Freed by PyTorch when this forward's graph is (after a backward without retain_graph, or when the
        # graph dies unused): the forward then ends and its lane is free again.
        ctx.save_for_backward(sentinel)
        return tuple(o for o in outputs if o is not None)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        grad_inputs = ctx.stage.front.run_backward(ctx.forward_id, grads)
        return (None,) + tuple(grad_inputs)


class _GraphedCallables:
    """The front end of one make_graphed_callables call: its stages, lanes and recordings."""

    def __init__(self, stages_args, name, device, max_outstanding, max_recordings, warmup_calls, generators,
                 allow_unused_input):
        self.name = name
        self.allow_unused_input = allow_unused_input
        self.pending: Dict[int, _Template] = {}
        self.templates_by_node: Dict[Tuple[int, int], _Template] = {}
        self.templates_by_id: Dict[int, _Template] = {}
        self.structures: Dict[Tuple[int, int], Any] = {}
        self.last_structure: Any = None  # of the last forward: (output spec, non-tensor outputs, tensor slots)
        self.stages: List[_Stage] = []
        specs = []
        for index, (callable_, sample_leaves, sample_spec, params, buffers, training, owned) in enumerate(stages_args):
            stage = _Stage(self, index, callable_, sample_leaves, sample_spec, params, buffers, training)
            self.stages.append(stage)
            # Every gradient is handed out over the backward graph's buffer. An owned parameter gradient is
            # copied out only if the caller still holds it (as .grad, or in a hook) when its lane is about to
            # be replayed again; after zero_grad(set_to_none=True), or once AccumulateGrad added it into an
            # existing .grad, nothing is copied.
            specs.append({"name": stage.name, "num_inputs": stage.num_inputs,
                          "num_params": len(params) + len(buffers), "forward": _weak_body(stage.forward_body),
                          "backward": _weak_body(stage.backward_body),
                          "owned_slots": [False] * stage.num_inputs + owned + [False] * len(buffers)})
        _destroy_collected()
        self.native = _native().GraphedCallables(specs, name, device, max_outstanding, max_recordings, warmup_calls,
                                                 generators)
        weakref.finalize(self, _on_collected, [self.native])

    def _forget_ended(self):
        for forward_id in self.native.take_ended_forwards():
            self.templates_by_id.pop(forward_id, None)

    def run_forward(self, stage: _Stage, inputs, statics):
        _destroy_collected()
        # Forwards that ended (their autograd graphs freed) give back their warm-up or eager autograd graphs
        # first: a recording must not run beside the activations of a forward nobody needs any more.
        self._forget_ended()
        try:
            outputs, forward_id, lane, node, sentinel, ended = self.native.forward(stage.index, list(inputs),
                                                                                   list(statics))
        except torch.cuda.OutOfMemoryError as error:
            _add_note(error, _memory_note(self.name, self.native.dump()["lanes"]))
            raise
        except BaseException as error:
            self.pending.clear()
            _add_note(error, f"graphalloc: {self.native.last_error}" if self.native.last_error else "")
            raise
        for gone in ended:
            self.templates_by_id.pop(gone, None)
        template = self.pending.pop(forward_id, None)
        self.pending.clear()
        if template is not None:
            if node:
                self.templates_by_node[(lane, node)] = template
            else:
                self.templates_by_id[forward_id] = template
            structure = (template.out_spec, template.out_leaves, template.tensor_slots)
            if node:
                self.structures[(lane, node)] = structure
        else:
            structure = self.structures[(lane, node)]
        self.last_structure = structure
        return outputs, forward_id, sentinel

    def run_backward(self, forward_id: int, grads):
        try:
            return self.native.backward(forward_id, list(grads))
        except torch.cuda.OutOfMemoryError as error:
            _add_note(error, _memory_note(self.name, self.native.dump()["lanes"]))
            raise
        except BaseException as error:
            _add_note(error, f"graphalloc: {self.native.last_error}" if self.native.last_error else "")
            raise

    def request_release(self, what: str, release: Callable[[], None]) -> None:
        """Runs `release` now, or, while a retained backward (retain_graph=True) of these callables may still
        run, once none can (DeepSpeed's deferred re-partitioning, PR 8045). `what` names it for graph_memory()."""
        self._forget_ended()
        self.native.request_release(what, release)

    def memory(self) -> Dict[str, Any]:
        self._forget_ended()
        d = self.native.dump()
        d["name"] = self.name
        d["kind"] = "make_graphed_callables"
        return d


def _te_order_samples(callables, sample_args, order, layers_per_chunk):
    """TransformerEngine's layout of sample_args with an _order: (chunk, micro-batch, layer), chunks of
    consecutive callables. Returns each callable's first micro-batch sample and the micro-batch count."""
    chunks = max(abs(int(o)) for o in order)
    if len(order) % (2 * chunks):
        raise ValueError(f"_order has {len(order)} entries, not a multiple of 2 * {chunks} model chunks")
    microbatches = len(order) // (2 * chunks)
    sizes = list(layers_per_chunk) if layers_per_chunk else [len(callables) // chunks] * chunks
    if sum(sizes) != len(callables) or len(sizes) != chunks:
        raise ValueError(f"_order describes {chunks} chunks of {sizes} layers for {len(callables)} callables")
    if len(sample_args) != len(callables) * microbatches:
        raise ValueError(f"with _order, sample_args needs one entry per callable and micro-batch "
                         f"({len(callables)} x {microbatches}), got {len(sample_args)}")
    firsts, base = [], 0
    for size in sizes:
        firsts += [sample_args[base + layer] for layer in range(size)]
        base += size * microbatches
    return firsts, microbatches


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3, allow_unused_input: bool = False,
                           pool=None, *, sample_kwargs=None, clone_param_grads_on_return=True,
                           _clone_param_grads_on_return=None, _order=None, retain_graph_in_backward: bool = False,
                           pre_warmup_hook: Optional[Callable] = None, post_warmup_hook: Optional[Callable] = None,
                           max_outstanding_forwards: Optional[int] = None, max_recordings: int = 5,
                           generators: Sequence[torch.Generator] = (), name: Optional[str] = None, **te_options):
    """A drop-in for torch.cuda.make_graphed_callables (same arguments and return shapes) on graphalloc's graph
    tree, also taking TransformerEngine's sample_kwargs, clone_param_grads_on_return (a bool, or a function of
    a parameter; `param.skip_backward_post_hook = True` opts one parameter out), _order (a pipeline schedule:
    one lane per micro-batch) and pre/post warm-up hooks. Modules get a graphed forward (eval mode runs the
    original forward), functions a graphed function.

    Differences from PyTorch's, each deliberate (docs/torch_graphs.md): recordings happen at the first calls
    after the warm-up iterations (PyTorch captures here), so the tree can record per micro-batch lane and
    again when a parameter moved; parameter gradients are owned, not views of static buffers; a forward's
    outputs are valid until that lane's next forward (reading one later raises); RNG state is restored after
    the warm-up iterations; `pool` is accepted and not used (all callables of one call share one pool per
    lane; calls do not share pools); retain_graph_in_backward is not needed (every backward may be retained).
    """
    for key, value in te_options.items():
        if key in _TE_ACCEPTED:
            continue
        if key not in _TE_ONLY:
            raise TypeError(f"make_graphed_callables() got an unexpected keyword argument {key!r}")
        if value:
            raise NotImplementedError(f"graphalloc.torch.make_graphed_callables does not do {key}={value!r} "
                                      "(TransformerEngine's FP8 and buffer-reuse options): use "
                                      "transformer_engine.pytorch.make_graphed_callables for it")
    del pool, retain_graph_in_backward
    if torch.is_autocast_enabled() and torch.is_autocast_cache_enabled():
        raise RuntimeError(
            "make_graphed_callables does not support the autocast caching. Please set `cache_enabled=False`.")
    just_one = not isinstance(callables, tuple)
    if just_one:
        callables = (callables,)
        sample_args = (sample_args,)
        if sample_kwargs is not None:
            sample_kwargs = (sample_kwargs,)
    microbatches = 1
    if _order is not None:
        sample_args, microbatches = _te_order_samples(callables, tuple(sample_args), list(_order),
                                                      te_options.get("_num_layers_per_chunk"))
        if sample_kwargs is not None:
            sample_kwargs, _ = _te_order_samples(callables, tuple(sample_kwargs), list(_order),
                                                 te_options.get("_num_layers_per_chunk"))
    if len(sample_args) != len(callables):
        raise ValueError(f"{len(callables)} callables but {len(sample_args)} sample_args")
    if sample_kwargs is None:
        sample_kwargs = tuple({} for _ in callables)
    if not isinstance(num_warmup_iters, int) or num_warmup_iters < 0:
        raise ValueError(f"num_warmup_iters must be an int >= 0, not {num_warmup_iters!r}")
    clone_policy = clone_param_grads_on_return if _clone_param_grads_on_return is None else _clone_param_grads_on_return

    stages_args = []
    all_tensors: List[torch.Tensor] = []
    for c, args, kwargs in zip(callables, sample_args, sample_kwargs):
        if isinstance(c, torch.nn.Module):
            if not (len(c._backward_hooks) == 0 and len(c._forward_hooks) == 0 and len(c._forward_pre_hooks) == 0):
                raise AssertionError(
                    "Modules must not have hooks registered at the time they are passed. However, registering "
                    "hooks on modules after passing them through make_graphed_callables is allowed.")
            if not all(b.requires_grad is False for b in c.buffers()):
                raise AssertionError(
                    "In any :class:`~torch.nn.Module` passed to :func:`~make_graphed_callables`, only parameters may "
                    "be trainable. All buffers must have ``requires_grad=False``.")
            params, buffers, training = tuple(c.parameters()), tuple(c.buffers()), c.training
        else:
            params, buffers, training = (), (), None
        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        if not tensors and not params:
            raise AssertionError("In the beta API, sample_args for each callable must contain only Tensors. "
                                 "Other types are not allowed.")
        all_tensors += tensors + list(params)
        owned = [not getattr(p, "skip_backward_post_hook", False)
                 and bool(clone_policy(p) if callable(clone_policy) else clone_policy) for p in params]
        stages_args.append((c, leaves, spec, params, buffers, training, owned))

    device = _device_of(all_tensors)
    generators = _cuda_generators(generators)
    front = _GraphedCallables(
        stages_args, name or ("graphed " + ", ".join(getattr(c, "__qualname__", None) or type(c).__name__
                                                      for c in callables)),
        device, max(4, microbatches) if max_outstanding_forwards is None else max_outstanding_forwards,
        max_recordings, max(num_warmup_iters, 1), generators, allow_unused_input)
    _front_ends.add(front)

    graphed = [_make_stage_callable(front, stage) for stage in front.stages]

    # Warm-up, as PyTorch's: each callable forward and backward with its samples, num_warmup_iters times, on
    # the tree's stream (lazy initialisation, cuDNN benchmarking, library workspaces happen outside any
    # capture). The RNG state is put back afterwards, so the first real call draws what it would eagerly.
    if pre_warmup_hook is not None:
        pre_warmup_hook()
    states = [(g, g.get_state()) for g in [torch.cuda.default_generators[device]] + generators]
    torch.cuda.synchronize(device)
    for fn, stage, args, kwargs in zip(graphed, front.stages, sample_args, sample_kwargs):
        for _ in range(num_warmup_iters):
            out = fn(*args, **kwargs)
            outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
            wrt = [x for x in pytree.tree_leaves((tuple(args), dict(kwargs)))
                   if isinstance(x, torch.Tensor) and x.requires_grad] + [p for p in stage.params if p.requires_grad]
            if outs and wrt:
                torch.autograd.grad(outs, wrt, [torch.empty_like(o) for o in outs], allow_unused=True)
            del out, outs
    torch.cuda.synchronize(device)
    front._forget_ended()  # the warm-ups' autograd graphs (and activations) go now
    for g, state in states:
        g.set_state(state)
    if post_warmup_hook is not None:
        post_warmup_hook()

    result = []
    for c, fn, stage in zip(callables, graphed, front.stages):
        if isinstance(c, torch.nn.Module):
            c.forward = _graphed_forward(c, stage.training, fn, stage.forward_fn)
            c.graphalloc_graphs = front
            result.append(c)
        else:
            fn.graphalloc_graphs = front
            result.append(fn)
    return result[0] if just_one else tuple(result)


def _make_stage_callable(front: _GraphedCallables, stage: _Stage):
    def graphed_call(*args, **kwargs):
        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        if spec != stage.spec:
            raise TypeError(f"graphalloc: '{stage.name}' was graphed for arguments shaped like its sample_args "
                            f"({stage.spec}); it was called with {spec}")
        for pos, value in stage.constants:
            if leaves[pos] is not value and leaves[pos] != value:
                raise ValueError(f"graphalloc: non-tensor argument {pos} of '{stage.name}' changed from {value!r} to "
                                 f"{leaves[pos]!r}; graphs bake non-tensor arguments in")
        tensors = [leaves[i] for i in stage.tensor_positions]
        for t in tensors:
            if not isinstance(t, torch.Tensor) or not t.is_cuda:
                raise TypeError(f"graphalloc: '{stage.name}' takes CUDA tensors where its samples had them, got "
                                f"{type(t).__name__}")
        outputs = _StageFunction.apply(stage, *tensors, *stage.statics())
        out_spec, out_leaves, tensor_slots = stage.front.last_structure
        leaves_out = list(out_leaves)
        for slot, t in zip(tensor_slots, outputs):
            leaves_out[slot] = t
        return pytree.tree_unflatten(leaves_out, out_spec)

    graphed_call.__name__ = f"graphed_{stage.name}"
    return graphed_call


def _graphed_forward(module: torch.nn.Module, training: Optional[bool], graphed_call, original):
    def forward(*args, **kwargs):
        if module.training == training:
            return graphed_call(*args, **kwargs)
        return original(*args, **kwargs)

    return forward


def graph_memory() -> List[Dict[str, Any]]:
    """Every live graph front end's memory: per lane, its pool's reserved and allocated bytes, and per
    recording (node) the bytes its pool held right after it was recorded, its replays and why it was
    recorded; the tree's text dump under "text"."""
    _destroy_collected()
    return [f.memory() for f in list(_front_ends)]
