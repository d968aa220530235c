"""Keras's compiled step functions (TensorFlow backend, not run_eagerly), one pair per mode.

Steps that save nothing run the function Keras made (no tensortap op in it); saving steps run a second one
Keras makes again while `capture_trace` is on, so that the wrapped `train_step` etc. trace the capture ops into
it (tensortap/tensorflow/step_capture.py). On one device with one step per execution that capturing function
returns its captures as extra outputs (`{OUT: what Keras's step returns, CAPTURED: the captures}`), which the
unpacking wrapper takes off before Keras sees them; otherwise they go through the graph store's shadows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tensortap.tensorflow.common import FUNCTIONS, steps_per_execution
from tensortap.tensorflow.graph_store import local_devices

# keys of what a capturing step function returns in outputs mode: Keras's own outputs and the captures
OUT, CAPTURED = "tensortap_step_out", "tensortap_captured"


class StepFunctions:
    """The pair of compiled step functions of each mode, and which one the model holds for the next batch."""

    def __init__(self) -> None:
        self.swap = False  # swap Keras's compiled step functions between saving and other steps
        self.pairs: dict[str, list[Any]] = {}  # "train_function" -> [plain, capturing]
        self.capture_trace = True  # a compiled step traced now gets the capture ops
        self.outputs_trace = False  # ... and returns them as extra outputs
        self.outputs: tuple[Any, tuple[Any, ...]] | None = None  # (mode, captures) the last capturing call returned
        self._unpacking: set[int] = set()  # ids of the unpacking wrappers of capturing functions

    def start(self, swap: bool) -> None:
        """A model is registered: its functions are made (again) from now on."""
        self.swap = swap
        self.pairs = {}

    def select(self, model: Any, mode: Any, saving: bool) -> None:
        """Put on `model` the step function of this batch: the plain one on steps that save nothing, the
        capturing one on saving steps (made now, traced with `capture_trace` on at its first call)."""
        attr, maker = FUNCTIONS[mode]
        current = getattr(model, attr, None)
        pair = self.pairs.get(attr)
        if pair is None or (current is not pair[0] and current is not pair[1]):
            if current is None:
                return
            pair = self.pairs[attr] = [current, None]  # Keras made (or remade) its function
        if saving and pair[1] is None:
            object.__setattr__(model, attr, None)
            getattr(model, maker)()
            made = getattr(model, attr)
            if made is None:  # (a Keras that makes its function elsewhere: capture in the plain one)
                object.__setattr__(model, attr, pair[0])
                pair[1] = pair[0]
            elif self.outputs_possible(model):
                pair[1] = self._unpacking_function(made, mode)
                self._unpacking.add(id(pair[1]))
            else:
                pair[1] = made
        want = pair[1] if saving else pair[0]
        if current is not want:
            object.__setattr__(model, attr, want)
        self.capture_trace = saving
        self.outputs_trace = saving and id(want) in self._unpacking

    def restore(self, model: Any) -> None:
        """Give `model` back Keras's own functions; the next registration starts afresh."""
        for attr, pair in self.pairs.items():
            if model is not None and getattr(model, attr, None) is pair[1]:
                object.__setattr__(model, attr, pair[0])
        self.pairs = {}
        self.swap = False
        self.capture_trace = True
        self.outputs_trace = False

    @staticmethod
    def outputs_possible(model: Any) -> bool:
        """Whether a capturing step function may return its captures as extra outputs: it runs on saving
        steps only, one step per call, on one device (else they go through shadow variables)."""
        return steps_per_execution(model) == 1 and local_devices(getattr(model, "distribute_strategy", None)) == 1

    def _unpacking_function(self, fn: Callable[..., Any], mode: Any) -> Callable[..., Any]:
        """Keras's capturing step function, returning to Keras what the step returns and keeping the
        captures in `outputs`."""
        functions = self

        def function(*args: Any, **kwargs: Any) -> Any:
            res = fn(*args, **kwargs)
            if isinstance(res, dict) and CAPTURED in res:
                functions.outputs = (mode, res[CAPTURED])
                return res[OUT]
            return res

        function.__wrapped__ = fn  # type: ignore[attr-defined]
        return function
