"""The MXNet Gluon hook: captures weights, gradients, losses and block inputs/outputs of a Gluon job.

Names follow smdebug's MXNet naming: parameters `param.name` (e.g. `dense0_weight`), gradients
`gradient/<param.name>`, block I/O `<block.name>_input_<i>` / `<block.name>_output_<i>` (inputs and outputs
flattened; the index continues when a block runs again in the same step), losses `<loss.name>_output_0`.

When things are read (each value is the one the step computed with or produced); the training thread never
waits for MXNet's engine:
- a registered block's forward pre-hook starts a step (one step per forward of a registered model);
- weights are copied by MXNet's engine in the model's forward hook, in order with the job's own operations:
  the values this step's forward used, before the optimizer's update (smdebug saved them at the next step's
  start, after the update);
- gradients are copied the same way when the step ends (the next forward, `set_mode`, `close`): the ones this
  step's backward left in the parameters' gradient buffers, before the next backward writes them (with
  grad_req="add", zeroing them before the next forward loses them);
- a loss block's output is kept as it returns it and read in place (nothing changes it afterwards: a script
  that changes it in place before the next step ends changes what is saved); other block inputs and outputs
  are copied by the engine in the forward hooks.
A saving step's tensors go to the writer when the step after it ends (or at close), the engine's copies long
done by then; readers learn that the step passed only after that (`hold_step_marks`). Weights and gradients
(dense CPU arrays of one dtype, saved raw) are copied into a fixed host buffer per list (a second one when
a saving step comes before the last one's hand-over) by one operation (`amp_multicast` for float32) called
straight through MXNet's C API, and go from there into the writer's room as one batch (`write_planned`);
anything else is copied into new arrays and handed over with `write_tensors`. Steps that save nothing cost a
few microseconds.
A hybridized block runs as one graph: its inner blocks' hooks do not fire, so only its own inputs and
outputs (and all weights and gradients) are captured.

The input and output tensors of activation blocks (`nn.Activation('relu'|'sigmoid'|'tanh')`, also the one a
`Dense`/`Conv` makes for `activation=...`) are members of the activation collections (`relu_input`,
`relu_output`, ...), found by the block's type.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import sys
from typing import Any

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, NDArrayHandle, c_str, c_str_array
from mxnet.base import check_call as _check_call

from tensortap.capture.batch import BatchSpec
from tensortap.capture.engine import FORWARD_END
from tensortap.collection import ACTIVATION_COLLECTIONS, Collection, CollectionKeys
from tensortap.exceptions import InvalidConfiguration
from tensortap.hooks.base import Hook as BaseHook
from tensortap.mxnet import singleton

logger = logging.getLogger("tensortap")

INPUT_SUFFIX = "_input_"
OUTPUT_SUFFIX = "_output_"
GRADIENT_PREFIX = "gradient/"

K = CollectionKeys
_ACTIVATION_KEYS = tuple(k for pair in ACTIVATION_COLLECTIONS.values() for k in pair)
# Collections that need no forward hooks on the blocks inside a model: filled from parameters, by the user, or
# (losses) from registered loss blocks.
_NOT_IO = frozenset({K.WEIGHTS, K.BIASES, K.GRADIENTS, K.LOSSES, K.SCALARS, K.OPTIMIZER_VARIABLES})
_HVD_VARS = ("HOROVOD_RANK", "HOROVOD_SIZE")
_NDArray = mx.nd.NDArray  # (mx.np.ndarray is one too)
_DENSE = (_NDArray, mx.np.ndarray)  # (types of dense arrays; sparse ones are subclasses of NDArray)
_Symbol = mx.sym.Symbol
_pause = mx.autograd.pause
_multicast = mx.nd.amp_multicast
_NONE: list = []  # (never mutated)
_wait_to_read = _LIB.MXNDArrayWaitToRead
_get_data = _LIB.MXNDArrayGetData
_invoke = _LIB.MXImperativeInvokeEx
_set_recording = _LIB.MXAutogradSetIsRecording
_MULTICAST_DTYPE = np.dtype("float32")  # (amp_multicast's oneDNN kernel takes no other dtype on the CPU)
_MISSING = object()


def horovod_rank() -> tuple[int, int] | None:
    """(rank, size) from Horovod: `horovod.mxnet` if the job imported and initialised it, else the variables
    horovodrun gives every process (HOROVOD_RANK, HOROVOD_SIZE); None without either."""
    hvd = sys.modules.get("horovod.mxnet")
    if hvd is not None:
        try:
            size = hvd.size()  # (raises ValueError before hvd.init())
            if size:
                return int(hvd.rank()), int(size)
        except Exception:  # noqa: BLE001 - Horovod not initialised yet, or an odd build: try the environment
            pass
    r, w = _HVD_VARS
    if r in os.environ and w in os.environ:
        try:
            return int(os.environ[r]), int(os.environ[w])
        except ValueError:
            logger.warning("tensortap: %s=%r / %s=%r are not integers; ignored", r, os.environ[r], w, os.environ[w])
    return None


def _flat_arrays(value: Any, out: list[Any]) -> bool:
    """Append the NDArrays (legacy or mx.np) in a block's inputs or outputs to `out`, nested lists and tuples
    flattened in order; False if there is a Symbol among them (a call that builds a graph, e.g. for deferred
    shape inference, computes nothing)."""
    if isinstance(value, list | tuple):
        return all(_flat_arrays(v, out) for v in value)
    if isinstance(value, _NDArray):
        out.append(value)
    elif isinstance(value, _Symbol):
        return False
    return True


def _walk(block: mx.gluon.Block) -> list[mx.gluon.Block]:
    """`block` and every block inside it, each once, parents first."""
    seen: set[int] = set()
    out: list[mx.gluon.Block] = []
    stack = [block]
    while stack:
        b = stack.pop()
        if id(b) in seen:
            continue
        seen.add(id(b))
        out.append(b)
        stack.extend(reversed(list(b._children.values())))
    return out


def activation_type(block: mx.gluon.Block) -> str | None:
    """"relu", "sigmoid" or "tanh" for an activation block of that type (by class, not by name), else None."""
    if isinstance(block, mx.gluon.nn.Activation):
        act = getattr(block, "_act_type", None)
        return act if act in ACTIVATION_COLLECTIONS else None
    return None


class _Read:
    """A parameter's value or gradient read at saving steps (its shape and dtype are learned once per array:
    MXNet asks its library for both at every asnumpy()), or a block's input or output, copied."""

    __slots__ = ("name", "param", "colls", "grad", "array", "shape", "dtype", "size", "nbytes", "key", "cpu")

    def __init__(self, name: str, param: Any, colls: list[Collection], grad: bool) -> None:
        self.name, self.param, self.colls, self.grad = name, param, colls, grad
        self.array: Any = None

    def learn(self, arr: Any) -> Any:
        """`arr` (the parameter's array on its first context, or its gradient's), its shape and dtype known."""
        if arr is not self.array:  # (first read, or the parameter was initialised or cast again)
            self.shape, self.dtype = arr.shape, np.dtype(arr.dtype)
            self.size = int(np.prod(self.shape))
            self.nbytes = self.size * self.dtype.itemsize
            ctx = arr.context
            # arrays copied by one engine operation (_copy_all): legacy NDArrays of one dtype and context
            self.key = (self.dtype, ctx) if type(arr) is _NDArray else None
            self.cpu = ctx.device_type == "cpu"  # (its copies are read in place)
            self.array = arr
        return arr


def _host_items(pairs: list[tuple[_Read, Any]]) -> list[tuple[str, np.ndarray, list[Collection]]]:
    """(name, value, collections) of each (read, copy) in `pairs` once MXNet's engine has written the copy: on the
    CPU a numpy view of the copy's own memory (valid while the copy lives), else a host copy of it."""
    items = []
    ptr = ctypes.c_void_p()
    for r, arr in pairs:
        handle = arr.handle
        if r.cpu and r.size:
            _check_call(_wait_to_read(handle))
            _check_call(_get_data(handle, ctypes.byref(ptr)))  # (a dense array in MXNet's default layout)
            value = np.frombuffer((ctypes.c_char * r.nbytes).from_address(ptr.value), r.dtype).reshape(r.shape)
        else:
            value = np.empty(r.shape, r.dtype)
            if r.size:
                _check_call(_LIB.MXNDArraySyncCopyToCPU(handle, ctypes.c_void_p(value.ctypes.data),
                                                        ctypes.c_size_t(r.size)))
        items.append((r.name, value, r.colls))
    return items


def _copy_all(reads: list[_Read], arrays: list[Any]) -> list[Any]:
    """New copies of `arrays` (learned by `reads`), made by MXNet's engine in order with the job's operations.

    float32 arrays of one context are copied by one `amp_multicast` (one operation instead of one per array:
    with inputs of a single dtype it casts nothing and writes each input into a new output array).
    """
    groups: dict[Any, list[int]] = {}
    for i, r in enumerate(reads):
        groups.setdefault(r.key, []).append(i)
    out: list[Any] = [None] * len(arrays)
    with _pause():
        for key, idx in groups.items():
            if key is None or len(idx) == 1 or key[0] != _MULTICAST_DTYPE:
                for i in idx:
                    arr = arrays[i]
                    out[i] = arr.copy() if type(arr) in _DENSE else arr.tostype("default")  # (sparse: dense)
                continue
            copies = _multicast(*[arrays[i] for i in idx], num_outputs=len(idx))
            for i, c in zip(idx, copies, strict=True):
                out[i] = c
    return out


def _op_handle(name: str) -> ctypes.c_void_p:
    handle = ctypes.c_void_p()
    _check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
    return handle


class _Invoke:
    """One MXNet operation on fixed arrays into fixed outputs, called through MXNet's C API as
    `mx.nd.<op>(..., out=...)` calls it, its arguments built once; never recorded by autograd. Pushed to MXNet's
    engine like the job's own operations (in order with them), nothing waited for."""

    __slots__ = ("op", "n_in", "ins", "n_out", "outs", "nout", "n_params", "keys", "vals", "stypes", "prev", "keep")

    def __init__(self, op: str, inputs: list[Any], outputs: list[Any], params: dict[str, Any]) -> None:
        self.op = _op_handle(op)
        self.n_in = len(inputs)
        self.ins = (NDArrayHandle * len(inputs))(*[a.handle for a in inputs])
        self.n_out = len(outputs)
        outs = (NDArrayHandle * len(outputs))(*[a.handle for a in outputs])
        self.outs = ctypes.cast(outs, ctypes.POINTER(NDArrayHandle))
        self.nout = ctypes.c_int(len(outputs))
        self.n_params = len(params)
        self.keys = c_str_array(list(params))
        self.vals = c_str_array([str(v) for v in params.values()])
        self.stypes = ctypes.POINTER(ctypes.c_int)()
        self.prev = ctypes.c_int()
        self.keep = (inputs, outputs, outs)  # (the handles stay valid while these live)

    def __call__(self) -> None:
        prev = self.prev
        _check_call(_set_recording(0, ctypes.byref(prev)))
        try:
            self.nout.value = self.n_out
            _check_call(_invoke(self.op, self.n_in, self.ins, ctypes.byref(self.nout), ctypes.byref(self.outs),
                                self.n_params, self.keys, self.vals, ctypes.byref(self.stypes)))
        finally:
            if prev.value:
                _set_recording(1, ctypes.byref(prev))


class _Layout:
    """What a list of tensors (dense, on the CPU, of one dtype) saved together looks like: their reads, names,
    shapes, dtype, reductions (per tensor, what the writer computes from it) and bytes, back to back."""

    def __init__(self, reads: list[_Read], reductions: tuple) -> None:
        self.reads = reads
        self.names = tuple(r.name for r in reads)
        self.shapes = tuple(r.shape for r in reads)
        self.dtype = reads[0].dtype
        self.reductions = reductions
        self.total = sum(r.size for r in reads)
        self.nbytes = self.total * self.dtype.itemsize
        self.plan = self

    @classmethod
    def make(cls, hook: Hook, reads: list[_Read], *args: Any) -> Any:
        """One for `reads` (shapes and dtypes learned), or None when they must be read another way: not all
        dense legacy NDArrays on the CPU of one dtype, empty, or some saved otherwise than raw (a shape)."""
        if not reads:
            return None
        dtype = reads[0].dtype
        reds = []
        for r in reads:
            if r.key is None or not r.cpu or r.dtype != dtype or not r.size or not r.shape:
                return None
            save_raw, r_reds, save_shape = hook.handoff.plan(r.name, r.colls)
            if not save_raw or save_shape:
                return None
            reds.append(r_reds)
        for r in reads:
            hook.handoff.note_membership(r.name, r.colls)  # (once per layout: write_planned leaves it to the caller)
        return cls(reads, tuple(reds), *args)


class _InPlace:
    """A block's output (a new array every step, which nothing changes afterwards) read in place when handed
    over: no copy by the engine. `plan`: its _Layout."""

    __slots__ = ("plan", "arr")

    def __init__(self, plan: _Layout, arr: Any) -> None:
        self.plan, self.arr = plan, arr

    def addr(self, _parity: int) -> int:
        """The array's address once MXNet's engine has written it."""
        return _address(self.arr.handle)


def _address(handle: Any) -> int:
    """The address of a CPU array's data once MXNet's engine has written it (in MXNet's default layout)."""
    _check_call(_wait_to_read(handle))
    ptr = ctypes.c_void_p()
    _check_call(_get_data(handle, ctypes.byref(ptr)))
    return ptr.value


class _Stage(_Layout):
    """Where MXNet's engine copies a fixed list of arrays (`inputs`: the same at every step, `fits` checks) at
    saving steps: a host buffer, read in place as one source when the step's tensors are handed over (at the
    end of the step after it), and a second one made only for a saving step that comes before that."""

    def __init__(self, reads: list[_Read], reductions: tuple, inputs: list[Any]) -> None:
        super().__init__(reads, reductions)
        self.inputs = inputs
        self.bufs: list[Any] = [None, None]
        self.addrs = [0, 0]
        self.calls: list[list[_Invoke]] = [[], []]

    def _make(self, parity: int) -> None:
        """Buffer `parity`, with the operations that copy into it."""
        inputs, reads = self.inputs, self.reads
        with _pause():
            flat = mx.nd.zeros((self.total,), ctx=mx.cpu(), dtype=self.dtype)
            views, off = [], 0
            for r in reads:
                views.append(flat[off:off + r.size].reshape(r.shape))  # (views of `flat`: its engine variable)
                off += r.size
        if len(inputs) > 1 and self.dtype == _MULTICAST_DTYPE:
            # one operation for all (with inputs of one dtype amp_multicast casts nothing: it copies each)
            calls = [_Invoke("amp_multicast", inputs, views, {"num_outputs": len(inputs)})]
        else:
            calls = [_Invoke("_copyto", [a], [v], {}) for a, v in zip(inputs, views, strict=True)]
        self.addrs[parity] = _address(flat.handle)
        self.bufs[parity], self.calls[parity] = flat, calls

    def fits(self, arrays: list[Any]) -> bool:
        """Whether `arrays` are the arrays this stage copies (not re-initialised or cast since)."""
        mine = self.inputs
        return len(mine) == len(arrays) and all(a is b for a, b in zip(arrays, mine, strict=True))

    def copy(self, parity: int) -> None:
        if self.bufs[parity] is None:
            self._make(parity)
        for call in self.calls[parity]:
            call()

    def addr(self, parity: int) -> int:
        """Buffer `parity`'s address once MXNet's engine has written the copies in it."""
        _check_call(_wait_to_read(self.bufs[parity].handle))
        return self.addrs[parity]


class _Root:
    """A registered model: its forward starts a step."""

    def __init__(self, block: mx.gluon.Block) -> None:
        self.block = block
        self.blocks = _walk(block)
        self.handles: list[Any] = []  # forward pre-hook and forward hook on the block itself
        self.io_handles: list[Any] = []  # forward hooks on the blocks inside, once I/O is wanted
        self._params: list[Any] | None = None

    def params(self) -> list[Any]:
        """The block's parameters (as at its first saving step: a block's parameters are fixed when it is
        built; their values may be initialised later)."""
        if self._params is None:
            self._params = list(self.block.collect_params().values())
        return self._params

    def unhook(self) -> None:
        for h in self.handles + self.io_handles:
            h.detach()
        self.handles.clear()
        self.io_handles.clear()


class Hook(BaseHook):
    """Captures an MXNet Gluon training job; `register_block(net)` and `register_block(loss_fn)` hook it up."""

    def _step_is_over(self) -> bool:
        """A step ends at the next forward pass: `create_trial` in the training thread after the loop ends it
        (issue #35)."""
        return True

    builtin_collections = (
        K.ALL, K.DEFAULT, K.SCALARS, K.WEIGHTS, K.BIASES, K.GRADIENTS, K.LOSSES, K.INPUTS, K.OUTPUTS,
        *_ACTIVATION_KEYS,
    )
    default_include_collections = (K.LOSSES, K.SCALARS)
    always_include_collections = (K.LOSSES,)
    _scalars_wait_for_step = True  # (steps begin at the model's forward)

    # (a hook made before hvd.init(), in a process the launcher gave no rank variables, takes Horovod's rank at
    # the first step and claims its worker's folder then: the engine's late identity)
    identity_source = staticmethod(horovod_rank)

    def __init__(self, out_dir: str, *args: Any, **kwargs: Any):
        super().__init__(out_dir, *args, **kwargs)
        self._mx_roots: list[_Root] = []
        self._mx_losses: list[tuple[mx.gluon.Block, Any]] = []  # (loss block, its forward hook's handle)
        self._mx_registered: set[int] = set()  # ids of every block inside a registered model or loss
        self._mx_activation_blocks: set[int] = set()
        self._mx_started = False  # a registered model's forward has started a step
        self._mx_io = False  # the current step saves some collection that may hold block inputs/outputs
        # this step's (name, parameter, collections) to save: weights per model (by id), gradients
        self._mx_weights: dict[int, list[_Read]] = {}
        self._mx_grads: list[_Read] = _NONE
        self._mx_plan: tuple | None = None  # the plan of the current saving step (see _mx_make_plan)
        # (read, copy) of this step's weights and block inputs and outputs: copies made by MXNet's engine (in
        # order with the job's own operations, without waiting for them), read when the step ends
        self._mx_copied: list[tuple[_Read, Any]] = []
        # this step's copies (weights, gradients: _Stage, their buffer _mx_parity) and losses (_InPlace), in order
        self._mx_staged: list[Any] = []
        self._mx_parity = 0
        # the plan's stages and layouts by what they read: ("w", id(model)), ("g",), ("l", id(loss block));
        # None: another way
        self._mx_stages: dict[tuple, Any] = {}
        self._mx_specs: dict[tuple, BatchSpec] = {}  # (by the layouts in one batch)
        # (step_id(), parity, stages, [(read, copy)]) of the last saving step, handed over when the step after
        # it ends
        self._mx_pending: tuple | None = None
        self._mx_io_counts: dict[str, int] = {}
        self._mx_closed = False
        self._mx_warned_hybrid = False
        singleton.set_hook(self)

    def _init_builtin_collections(self) -> None:
        get = self.collection_manager.get
        get(K.WEIGHTS).include("^(?!gradient).*weight")
        get(K.BIASES).include("^(?!gradient).*bias")
        get(K.GRADIENTS).include("^gradient")
        get(K.LOSSES).include(".*loss._(?!input).*output")
        get(K.INPUTS).include(r"_input_\d+$")
        get(K.OUTPUTS).include(r"_output_\d+$")

    # --- registration ------------------------------------------------------------------------

    def register_block(self, block: mx.gluon.Block) -> None:
        """Hook a Gluon block: a model (its forward starts a step; its parameters, their gradients and the
        inputs/outputs of the blocks inside it become capturable) or a loss (`gluon.loss.Loss`: its output
        is saved in `losses` as `<loss.name>_output_0`)."""
        if not isinstance(block, mx.gluon.Block):
            raise InvalidConfiguration(f"register_block takes an mxnet.gluon.Block, not {type(block).__name__}")
        if self.disabled or self._mx_closed:
            return
        if isinstance(block, mx.gluon.loss.Loss):
            self.register_loss(block)
            return
        if id(block) in self._mx_registered:
            logger.debug("tensortap: %s is already registered (or inside a registered block)", block.name)
            return
        # A registered model inside the new one stops being a root: the new one starts the steps.
        inside = {id(b) for b in _walk(block)}
        for old in [r for r in self._mx_roots if id(r.block) in inside]:
            old.unhook()
            self._mx_roots.remove(old)
        root = _Root(block)
        root.handles.append(block.register_forward_pre_hook(self._mx_root_pre_hook))
        root.handles.append(block.register_forward_hook(self._mx_root_hook))
        self._mx_roots.append(root)
        self._mx_registered.update(inside)
        self._mx_note_activations(root.blocks)
        self.engine.invalidate()

    register_hook = register_block

    def register_loss(self, loss_block: mx.gluon.Block) -> None:
        """Hook a loss block: its output is saved in `losses` (and its inputs when a collection asks)."""
        if not isinstance(loss_block, mx.gluon.Block):
            raise InvalidConfiguration(f"register_loss takes an mxnet.gluon.Block, not {type(loss_block).__name__}")
        if self.disabled or self._mx_closed or any(b is loss_block for b, _h in self._mx_losses):
            return
        self._mx_losses.append((loss_block, loss_block.register_forward_hook(self._mx_loss_hook)))
        self._mx_registered.add(id(loss_block))

    def _mx_note_activations(self, blocks: list[mx.gluon.Block]) -> None:
        """Put the inputs and outputs of activation blocks into the activation collections (by type)."""
        for b in blocks:
            act = activation_type(b)
            if act is None or id(b) in self._mx_activation_blocks:
                continue
            self._mx_activation_blocks.add(id(b))
            name = re.escape(b.name)
            coll_in, coll_out = ACTIVATION_COLLECTIONS[act]
            self.get_collection(coll_in).include(f"^{name}{INPUT_SUFFIX}\\d+$")
            self.get_collection(coll_out).include(f"^{name}{OUTPUT_SUFFIX}\\d+$")

    # --- steps -------------------------------------------------------------------------------

    def on_step_begin(self) -> None:
        if self._mx_io_counts:
            self._mx_io_counts.clear()
        engine = self.engine
        if not engine.saving:
            self._mx_io = False
            if self._mx_weights:
                self._mx_weights = {}
            self._mx_grads = _NONE
            return
        pending = self._mx_pending
        # (the stages' buffer: the other one while the last saving step's copies wait for their hand-over)
        self._mx_parity = 1 - pending[1] if pending is not None else 0
        plan = engine.plans.get(engine.now, None, self._mx_make_plan)
        if plan is not self._mx_plan:
            self._mx_plan = plan
            self._mx_stages = {}
            self._mx_specs = {}
        _now, self._mx_io, weights, self._mx_grads = plan
        self._mx_weights = dict(weights)
        if self._mx_io:
            for root in self._mx_roots:
                if not root.io_handles:
                    root.io_handles = [b.register_forward_hook(self._mx_io_hook) for b in root.blocks[1:]]

    def _mx_make_plan(self, now: list[Collection], _key: Any = None) -> tuple:
        """(now, whether block I/O may be saved, {id(model): weights' reads}, gradients' reads) for steps
        saving the collections `now` (the base hook hands the same list while the set stays the same)."""
        io = any(c.name not in _NOT_IO for c in now)
        weights: dict[int, list[_Read]] = {}
        grads: list[_Read] = []
        seen: set[str] = set()  # (a parameter shared by two models is saved once)
        for root in self._mx_roots:
            mine = weights[id(root.block)] = []
            for p in root.params():
                if p.name in seen:
                    continue
                seen.add(p.name)
                if getattr(p, "_stype", "default") != "default":
                    self._warn_once(f"sparse:{p.name}", f"tensortap: {p.name} is stored sparse: not saved")
                    continue
                colls = self.collections_for(p.name)
                if colls:
                    mine.append(_Read(p.name, p, colls, False))
                if p.grad_req != "null":
                    gname = GRADIENT_PREFIX + p.name
                    colls = self.collections_for(gname)
                    if colls:
                        grads.append(_Read(gname, p, colls, True))
        return now, io, weights, grads

    def _mx_stage(self, key: tuple, reads: list[_Read], arrays: list[Any]) -> _Stage | None:
        """The plan's stage for `arrays` (learned by `reads`), made when they are new."""
        st = self._mx_stages.get(key, _MISSING)
        if st is _MISSING or (st is not None and not st.fits(arrays)):
            st = self._mx_stages[key] = _Stage.make(self, reads, arrays)
        return st

    def _mx_copy(self, key: tuple, reads: list[_Read], arrays: list[Any]) -> None:
        """Have MXNet's engine copy `arrays` now, in order with the job's operations (read when handed over)."""
        st = self._mx_stage(key, reads, arrays)
        if st is not None:
            try:
                st.copy(self._mx_parity)
            except Exception as e:  # noqa: BLE001 - an MXNet whose C API differs: the slower way, not off
                self._warn_once("mx-c-api", f"tensortap: copying through MXNet's C API failed ({e}); copying "
                                "with mx.nd operations instead")
                self._mx_stages[key] = None
            else:
                self._mx_staged.append(st)
                return
        self._mx_copied.extend(zip(reads, _copy_all(reads, arrays), strict=True))

    def on_step_end(self) -> None:
        """Hand over the last saving step's copies (made by MXNet's engine long before: nothing waits), then have
        the engine copy this step's gradients; they are handed over when the next step ends (or at close),
        this step's mark held until then."""
        if self._mx_pending is not None:
            self._mx_hand_over()
        grads = self._mx_grads
        if not grads and not self._mx_copied and not self._mx_staged:
            return
        self._mx_grads = _NONE
        if self.active:
            try:
                if grads:
                    reads, arrays = [], []
                    for r in grads:
                        arrs = r.param._grad
                        if arrs is not None:  # (None: deferred initialisation, the forward did not get that far)
                            reads.append(r)
                            arrays.append(r.learn(arrs[0]))
                    if reads:
                        # (in order after this step's backward, before the next one writes the gradients again)
                        self._mx_copy(("g",), reads, arrays)
                if self._mx_staged or self._mx_copied:
                    self._mx_pending = (self.step_id(), self._mx_parity, self._mx_staged, self._mx_copied)
                    self.hold_step_marks()
            except Exception as e:  # noqa: BLE001 - never break the training job
                self._fail("step end", e)
        self._mx_staged, self._mx_copied = [], []

    def _mx_hand_over(self) -> None:
        """Write the pending step's copies at that step, and send the step marks held for them."""
        at, parity, stages, pairs = self._mx_pending
        self._mx_pending = None
        try:
            if self.active:
                if stages:
                    self._mx_write_stages(at, parity, stages)
                if pairs:
                    # (copy=True: raw values go into the writer's room straight from the copies, anything else
                    # is copied off them before they are freed)
                    self.write_tensors(_host_items(pairs), copy=True, at=at)
            self.release_step_marks()
        except Exception as e:  # noqa: BLE001 - never break the training job
            self._fail("step end", e)

    def _mx_write_stages(self, at: tuple[int, int, int], parity: int, staged: list[Any]) -> None:
        """One batch per dtype, straight from the stages' buffers `parity` and the outputs read in place into
        the writer's room."""
        dtype = staged[0].plan.dtype
        if any(x.plan.dtype != dtype for x in staged):
            groups: dict[np.dtype, list[Any]] = {}
            for x in staged:
                groups.setdefault(x.plan.dtype, []).append(x)
            for group in groups.values():
                self._mx_write_stages(at, parity, group)
            return
        key = tuple(x.plan for x in staged)  # (the layouts themselves: an id is reused once its object is gone)
        spec = self._mx_specs.get(key)
        if spec is None:
            if len(self._mx_specs) >= 64:  # (e.g. a loss of another shape at every step)
                self._mx_specs.clear()
            plans = [x.plan for x in staged]
            reds = tuple(r for lay in plans for r in lay.reductions)
            spec = self._mx_specs[key] = BatchSpec(
                tuple(n for lay in plans for n in lay.names), True, reds if any(reds) else None,
                tuple(sh for lay in plans for sh in lay.shapes), np_dtype=dtype)
        sources = [(x.addr(parity), x.plan.nbytes) for x in staged]
        if not self.write_planned(spec, sources, at):
            # (too large for the writer's room: as records)
            items = []
            for x, (addr, nbytes) in zip(staged, sources, strict=True):
                flat = np.frombuffer((ctypes.c_char * nbytes).from_address(addr), dtype)
                off = 0
                for r in x.plan.reads:
                    items.append((r.name, flat[off:off + r.size].reshape(r.shape), r.colls))
                    off += r.size
            self.write_tensors(items, copy=True, at=at)

    def flush(self, timeout: float | None = 30.0) -> None:
        """Make everything saved so far visible to readers: the last saving step's tensors handed over now."""
        if self._mx_pending is not None:
            self._mx_hand_over()
        super().flush(timeout)

    def save_scalar(self, name: str, value: Any, sm_metric: bool = False, timestamp: float | None = None) -> None:
        """Save a scalar (a number or a one-element NDArray) as `scalar/<name>`, whatever the save config."""
        if isinstance(value, mx.nd.NDArray):
            if value.size != 1:
                raise InvalidConfiguration(f"save_scalar({name!r}, ...) needs a single value, got shape {value.shape}")
            value = value.asnumpy().reshape(())
        super().save_scalar(name, value, sm_metric, timestamp)

    def on_close(self) -> None:
        if self._mx_pending is not None:
            self._mx_hand_over()
        self._mx_closed = True
        self._mx_io = False
        for root in self._mx_roots:
            root.unhook()
        for _b, h in self._mx_losses:
            h.detach()

    # --- callbacks ---------------------------------------------------------------------------

    def _mx_root_pre_hook(self, block: mx.gluon.Block, inputs: Any) -> None:
        if self.disabled or self._mx_closed:
            return
        try:
            if self.engine.count_quiet():
                # A step that saves nothing, after one that saved nothing: only counted (readers learn that it
                # passed when a later step ends).
                if self._mx_pending is not None:
                    self._mx_hand_over()  # (the last saving step's, at the end of the step after it)
                return
            self._mx_started = True
            self.next_step()
        except Exception as e:  # noqa: BLE001 - never break the training job
            self._fail("forward pre-hook", e)

    def _mx_root_hook(self, block: mx.gluon.Block, inputs: Any, outputs: Any) -> None:
        if self.disabled:
            return
        engine = self.engine
        if engine.listening(FORWARD_END) and not self._mx_closed:
            engine.fire(FORWARD_END, {"block": block, "output": outputs})  # (a listener that fails is removed)
        if not engine.saving:
            return
        try:
            weights = self._mx_weights.pop(id(block), None)  # (once per step)
            if weights:
                # The values this forward used: copied by MXNet's engine before the optimizer's update (which
                # comes after the backward), read when they are handed over.
                self._mx_copy(("w", id(block)), weights, [r.learn(r.param._data[0]) for r in weights])
            if self._mx_io and not self._mx_warned_hybrid and getattr(block, "_active", False) and block._children:
                self._mx_warned_hybrid = True
                logger.info("tensortap: %s is hybridized: the inputs and outputs of the blocks inside it are not "
                            "visible, only its own", block.name)
            self._mx_write_io(block.name, inputs, outputs)
        except Exception as e:  # noqa: BLE001
            self._fail("forward hook", e)

    def _mx_io_hook(self, block: mx.gluon.Block, inputs: Any, outputs: Any) -> None:
        if not self._mx_io or self.disabled:
            return
        try:
            self._mx_write_io(block.name, inputs, outputs)
        except Exception as e:  # noqa: BLE001
            self._fail("forward hook", e)

    def _mx_loss_hook(self, block: mx.gluon.Block, inputs: Any, outputs: Any) -> None:
        if self.disabled or self._mx_closed:
            return
        try:
            if not self._mx_started:
                # No model registered (or none ran yet): each call of the loss is a step.
                self.next_step()
            if self.engine.saving and not (type(outputs) is _NDArray and not self._mx_io
                                        and self._mx_copy_loss(block, inputs, outputs)):
                self._mx_write_io(block.name, inputs, outputs)
        except Exception as e:  # noqa: BLE001
            self._fail("loss hook", e)

    def _mx_copy_loss(self, block: mx.gluon.Block, inputs: Any, out: Any) -> bool:
        """Keep a loss block's one output to read in place when it is handed over (nothing changes it after
        the loss block made it); False when it goes another way (`_mx_write_io`)."""
        name = block.name + OUTPUT_SUFFIX
        counts = self._mx_io_counts
        if name in counts:  # (called again in this step)
            return False
        key = ("l", id(block))
        lay = self._mx_stages.get(key, _MISSING)
        if lay is not _MISSING and lay is not None:
            r = lay.reads[0]
            if out.shape != r.shape or np.dtype(out.dtype) != r.dtype or out.context.device_type != "cpu":
                lay = _MISSING
        if lay is _MISSING:
            lay = None
            colls = self.collections_for(name + "0")
            if colls:
                r = _Read(name + "0", None, colls, False)
                r.learn(out)
                lay = _Layout.make(self, [r])
            self._mx_stages[key] = lay
        if lay is None:
            return False
        self._mx_staged.append(_InPlace(lay, out))
        counts[name] = 1
        arrays: list[Any] = []
        _flat_arrays(inputs, arrays)
        counts[block.name + INPUT_SUFFIX] = len(arrays)  # (a second call's inputs are numbered after them)
        return True

    def _mx_write_io(self, name: str, inputs: Any, outputs: Any) -> None:
        arrays_in: list[Any] = []
        arrays_out: list[Any] = []
        if not (_flat_arrays(inputs, arrays_in) and _flat_arrays(outputs, arrays_out)):
            return
        copied = self._mx_copied
        counts = self._mx_io_counts
        for suffix, arrays in ((INPUT_SUFFIX, arrays_in), (OUTPUT_SUFFIX, arrays_out)):
            key = name + suffix
            i = counts.get(key, 0)
            for arr in arrays:
                tname = f"{key}{i}"
                i += 1
                colls = self.collections_for(tname)
                if colls:
                    r = _Read(tname, None, colls, False)
                    with _pause():
                        copy = arr.copy() if type(arr) in _DENSE else arr.tostype("default")  # (sparse: dense)
                    copied.append((r, r.learn(copy)))
            counts[key] = i
