"""What the five fused optimizers share: each class derives from its torch.optim twin (so the
constructor, defaults, validation, param groups, hooks and state_dict format are torch's own) and
replaces step() with one call into the C++ engine that updates every parameter of every group in a
single multi-threaded, vectorized pass."""

from __future__ import annotations

import math
import operator
import os
import sys
import warnings
from itertools import chain
from typing import Any, Callable

import torch

from . import _C
from ._flat import FlatStore
from ._tensors import (
    DTYPE_CODES,
    check_param,
    first_overlap,
    grad_route_reason,
    grad_shape_error,
    number_error,
    route_error,
    route_reason,
)

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_ITEM_SIZES = {0: 4, 1: 2, 2: 2}  # bytes per element of each engine dtype code
_ENGINE_CODES = {**DTYPE_CODES, torch.complex64: 0}  # a complex64 tensor is read as its f32 real view
# The largest state['step'] the engine takes (src/python/module.cc): every f32 below it is an exact
# int64, with room to count on.
_MAX_STEP = 2.0**62
_ABSENT = object()  # in an undo log: the key was not there
# What a copy of an optimizer does not take over (besides torch's hooks, which torch's own copies drop too):
# what is rebuilt from the copy's own params (caches keyed by tensor identity or address, the flat layout, the
# master copies' marks: see __setstate__), and the attributes a GradScaler sets for one step.
_NOT_COPIED = frozenset({"_flat", "_param_marks", "_segment_cache", "_last", "_offsets", "_overlap_free", "_wave_key",
                         "_wave_plan", "_zero_grad_profile_name", "_warned_capturable_if_run_uncaptured",
                         "grad_scale", "found_inf", "_found_inf_out"})
_LIBRARY_DIRS = (os.path.dirname(__file__), os.path.dirname(torch.__file__))  # see _user_stacklevel
_SPAN = operator.attrgetter("param", "numel", "param_dtype")  # of a _C.SegmentRow
# Bound C methods, mapped over lists of tensors by the packing fast path (_pack_unchanged).
_PARAMS = operator.itemgetter("params")
_GRAD = operator.attrgetter("grad")
_DTYPE = operator.attrgetter("dtype")
_SHAPE = operator.attrgetter("shape")
_VERSION = operator.attrgetter("_version")
_DATA_PTR = torch.Tensor.data_ptr
_REQUIRED_STATES = operator.methodcaller("required_states")
_IS_CONTIGUOUS = torch.Tensor.is_contiguous


class FusedOptimizerMixin:
    """Put before the torch.optim class in the bases. Subclasses set the class attributes below."""

    _algorithm: str  # the engine's name of the update rule (a key of _C.algorithms)
    _counts_steps = True  # keeps torch's per-param state['step'] (all but SGD and Lion)
    _sparse_message = ""  # torch's error text for a sparse gradient
    _clip_rule = 0  # how max_grad_norm clips: 0 torch's clip_grad_norm_, 1 apex FusedLAMB's
    _takes_sparse = False  # the reference's step takes sparse gradients (torch's SGD and Adagrad)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        algorithm = cls.__dict__.get("_algorithm")
        if algorithm is not None:  # what the engine says of it: its step and its state keys
            entry = _C.algorithms[algorithm]
            cls._engine_step = staticmethod(entry["step"])
            cls._slot_keys = entry["state_names"]
            cls._scalar_keys = entry["scalar_names"]  # 0-d state tensors the engine advances (mu_product)
            cls._row_reductions = entry["row_reductions"]  # its step reads each param's size(0) (AdamP)
            # its states are shaped by each param's last two dims, and its step reads them (Adafactor)
            cls._factored = entry["factored"]

    def __init__(self, params, *args, master_weights: bool = False, flatten: bool = False,
                 max_grad_norm: float | None = None, norm_type: float = 2.0, accumulation_steps: int = 1,
                 state_dtype: torch.dtype | None = None, stochastic_rounding: bool = False, seed: int = 0,
                 strict: bool = False, **kwargs):
        # strict=False: params (or steps) the engine cannot take go through the reference's own step
        # (see _torch_step); strict=True: they are errors.
        self._strict = bool(strict)
        if self._strict and kwargs.get("differentiable", False):
            raise RuntimeError(f"{type(self).__name__} does not support differentiable=True (strict=True)")
        self._warned: dict[torch.Tensor, None] = {}  # params the torch-step warning has named
        if max_grad_norm is not None and not (float(max_grad_norm) >= 0.0):
            raise ValueError(f"Invalid max_grad_norm: {max_grad_norm} (must be >= 0 or None)")
        self._max_grad_norm = math.inf if max_grad_norm is None else float(max_grad_norm)
        self._norm_code = norm_type_code(norm_type)
        if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
            raise ValueError(f"Invalid accumulation_steps: {accumulation_steps!r} (an int >= 1)")
        if state_dtype is not None and state_dtype not in DTYPE_CODES:
            raise TypeError(f"fusedopt: invalid state_dtype {state_dtype}; supported dtypes are "
                            "torch.float32, torch.float16 and torch.bfloat16")
        if not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ValueError(f"Invalid seed: {seed!r} (an int in [0, 2**64))")
        self._rounding = (bool(stochastic_rounding), seed)
        self._offsets: dict[torch.Tensor, int] | None = None  # see _global_offset
        self._accumulation_steps = accumulation_steps
        self._state_dtype_option = state_dtype
        self._accumulators: dict[torch.Tensor, torch.Tensor] = {}  # f32 gradient sums
        self._torch_sums: dict[torch.Tensor, torch.Tensor] = {}  # those of the params torch steps
        self._window: dict[torch.Tensor, None] = {}  # params with a gradient in this window, in order
        self._micro_batches = 0
        self._window_found_inf = False
        self.last_grad_norm: float | None = None  # global grad norm seen by the last step, if computed
        self._master_weights = bool(master_weights)
        self._flat: FlatStore | None = None
        # Per param: (data_ptr, _version) after our last write, to notice params changed behind our
        # back while an f32 master copy exists.
        self._param_marks: dict[torch.Tensor, tuple[int, int]] = {}
        self._segment_cache: dict[torch.Tensor, _Cached] = {}  # see _segment
        self._last: _LastStep | None = None  # see _pack_unchanged
        self._duplicates = False  # some group lists a param more than once (torch warns, and allows it)
        self._overlap_free = False  # see _waves
        self._wave_key: list | None = None
        self._wave_plan: tuple | None = None
        super().__init__(params, *args, **kwargs)
        self._step_supports_amp_scaling = True  # honours grad_scale / found_inf set by GradScaler
        if flatten:
            self._flat = FlatStore(self)

    # ---- what each algorithm defines ----------------------------------------------------------
    def _hyper(self, group: dict) -> Any:
        raise NotImplementedError

    def _initial_state_value(self, key: str, group: dict, p: torch.Tensor) -> float | complex:
        """What a new state[key] of param p (in param group `group`) is filled with."""
        return 0.0

    def _needed_states(self, p: torch.Tensor, needed: tuple) -> tuple:
        """Which state slots param p needs, of those its group's hyper-parameters may need (`needed`): all of
        them, but for a factored algorithm (Adafactor) that depends on p's shape."""
        return needed

    def _state_shape(self, p: torch.Tensor, key: str) -> tuple | None:
        """The shape of state[key] of param p, or None for p's own shape (all but Adafactor's factors)."""
        return None

    # ---- torch.optim.Optimizer API --------------------------------------------------------------
    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        names = group.get("param_names")
        gi = len(self.param_groups) - 1
        for j, p in enumerate(group["params"]):
            if self._strict:
                check_param(p, _param_name(names, gi, j))
        self._duplicates |= len(set(group["params"])) < len(group["params"])
        self._overlap_free = False
        self._offsets = None
        self._last = None
        if getattr(self, "_flat", None) is not None:
            self._flat.combine()

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._flat is not None and not set_to_none:
            self._flat.zero_grad()  # one memset per dtype; grads stay views into the flat buffer
            return
        super().zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        """torch's state_dict; inside an accumulation window also the window (key "fusedopt_window": where it
        stands and its f32 sums, by param index), which load_state_dict takes back and torch.optim ignores."""
        state_dict = super().state_dict()
        if self._micro_batches:
            index: dict[torch.Tensor, int] = {}
            for p in chain.from_iterable(g["params"] for g in self.param_groups):
                index.setdefault(p, len(index))
            state_dict["fusedopt_window"] = {
                "micro_batches": self._micro_batches, "found_inf": self._window_found_inf,
                "window": [index[p] for p in self._window],
                "sums": {index[p]: self._accumulators[p] for p in self._window},
                "torch_sums": {index[p]: t for p, t in self._torch_sums.items()}}
        return state_dict

    def load_state_dict(self, state_dict: dict) -> None:
        window = state_dict.get("fusedopt_window")
        if window is not None and not 0 < window["micro_batches"] < self._accumulation_steps:
            raise ValueError(f"fusedopt: the state_dict is {window['micro_batches']} micro-batches into an "
                             f"accumulation window; this optimizer's accumulation_steps is {self._accumulation_steps}")
        # torch casts every floating state tensor to its param's dtype; f32 master copies and the
        # f32 moments of 16-bit params must survive that, so keep f32 copies and put them back.
        keep = self._f32_states_to_keep(state_dict)
        super().load_state_dict(state_dict)
        if window is not None:
            params = list(dict.fromkeys(chain.from_iterable(g["params"] for g in self.param_groups)))
            self._micro_batches, self._window_found_inf = window["micro_batches"], window["found_inf"]
            self._window = dict.fromkeys(params[i] for i in window["window"])
            for i, t in window["sums"].items():  # laid out as its param, as the engine reads it beside the grad
                p = params[i]
                self._accumulators[p] = torch.empty_like(p, dtype=torch.float32,
                                                         memory_format=torch.preserve_format).copy_(t)
            self._torch_sums = {params[i]: t.clone() for i, t in window["torch_sums"].items()}
        self._segment_cache.clear()
        self._last = None
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, saved in keep.items():
            p = params[pid]
            self.state[p].update(saved)
            if "master_param" in saved:  # the loaded master is the truth for the current param
                self._param_marks[p] = (p.data_ptr(), p._version)
        # With flatten=True the loaded states move into their flat slots at the next step.

    def flat_grads(self) -> list[torch.Tensor]:
        """flatten=True: the flat gradient buffer of each param dtype, with every current grad moved
        into it first, e.g. to all-reduce a model's gradients in one call per dtype. Slots of params
        whose grad is None hold zeros or stale values and are not read by the step."""
        if self._flat is None:
            raise RuntimeError(f"{type(self).__name__}.flat_grads() needs flatten=True")
        return self._flat.grad_buffers()

    def state_bytes(self) -> int:
        """Bytes of optimizer state this optimizer holds: moments and other per-param states, f32
        master copies, step counters and the f32 gradient sums of accumulation_steps > 1."""
        tensors = [t for s in self.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        tensors += self._accumulators.values()
        return sum(t.numel() * t.element_size() for t in tensors)

    def resync_master_weights(self) -> None:
        """With master_weights=True: restart every f32 master copy from its param at the next step.
        Changes made with tensor ops (`p.copy_()` under no_grad, model.load_state_dict, p.data = t)
        are noticed without this; writes through `p.data` in place (p.data.copy_(), .clamp_()) bypass
        the param's version counter and need it."""
        self._param_marks.clear()
        self._segment_cache.clear()
        self._last = None

    def __getstate__(self) -> dict:
        """What copy.deepcopy and pickle carry: torch's defaults, state and param_groups, and all a copy needs to
        continue as this optimizer would: the options, a subclass's own attributes (FusedLion's decoupled_wd,
        FusedLAMB's set_grad_none), the accumulation window (f32 sums, counters), and which params' f32 master
        copies (in state) are in sync with them. Not what __setstate__ rebuilds over the copy's own params."""
        state = {k: v for k, v in self.__dict__.items() if k not in _NOT_COPIED and not k.startswith("_optimizer_")}
        state["_copied"] = (self._flat is not None,
                            [p for p, mark in self._param_marks.items() if mark == (p.data_ptr(), p._version)])
        return state

    def __setstate__(self, state: dict) -> None:
        # Called by copies (with __getstate__'s dict) and by torch's load_state_dict (state and param_groups only).
        state = dict(state)
        copied = state.pop("_copied", None)
        super().__setstate__(state)
        self.__dict__.setdefault("_master_weights", False)
        self.__dict__.setdefault("_flat", None)
        self.__dict__.setdefault("_param_marks", {})
        for key, value in (("_max_grad_norm", math.inf), ("_norm_code", 2), ("_accumulation_steps", 1),
                           ("_state_dtype_option", None), ("_micro_batches", 0),
                           ("_window_found_inf", False), ("last_grad_norm", None),
                           ("_rounding", (False, 0)), ("_offsets", None), ("_duplicates", False),
                           ("_overlap_free", False), ("_wave_key", None), ("_wave_plan", None),
                           ("_strict", False)):
            self.__dict__.setdefault(key, value)
        self.__dict__.setdefault("_accumulators", {})
        self.__dict__.setdefault("_window", {})
        self.__dict__.setdefault("_warned", {})
        self.__dict__.setdefault("_torch_sums", {})
        self.__dict__["_segment_cache"] = {}
        self.__dict__["_last"] = None
        if copied is not None:  # a copy's params are new tensors: its marks and flat buffers are its own
            flatten, in_sync = copied
            self._param_marks = {p: (p.data_ptr(), p._version) for p in in_sync}
            self._flat = FlatStore(self) if flatten else None

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """Performs one fused optimization step over all param groups (see torch.optim)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Set by (torch.amp or fusedopt).GradScaler.step(): skip on overflow, unscale in the step.
        # fusedopt.GradScaler leaves the overflow check to the step's pre-pass and reads the result
        # from _found_inf_out.
        found_inf = getattr(self, "found_inf", None)
        found_out = getattr(self, "_found_inf_out", None)
        overflowed = found_inf is not None and float(found_inf) != 0.0
        grad_scale = getattr(self, "grad_scale", None)
        # torch's inv_scale: 1/scale in double, rounded to f32 (by the binding).
        inv_scale = 1.0 if grad_scale is None else 1.0 / float(grad_scale)
        if self._accumulation_steps > 1:
            self._step_micro_batch(inv_scale, overflowed, found_out)
            return loss
        if not overflowed:
            self._update(inv_scale, found_out)
        return loss

    def _update(self, inv_scale: float, found_out, grads: dict | None = None) -> None:
        """The update without accumulation: every gradient (p.grad, or grads[p] when given: f32 sums
        of fusedopt.distributed) read as grad * inv_scale and clipped by max_grad_norm. With
        found_out (a GradScaler's overflow flag) or clipping, a pre-pass checks the gradients first,
        and Inf/NaN skips the update (found_out set to 1)."""
        undo: list = []
        try:
            hypers = self._group_hypers()
            packed = None if grads is not None else self._pack_unchanged(hypers)
            if packed is None:
                self._last = None
                while True:
                    try:
                        packed = self._pack(hypers, undo, grads)
                        break
                    except _Relaid:  # flatten=True laid the buffers out anew: pack again from the start
                        pass
            if packed.routed:
                self._step_with_torch(packed, inv_scale, found_out)
            else:
                self._run_engine(packed, inv_scale, found_out is not None, found_out)
                if self._last is None and grads is None:
                    self._remember(packed)
        except BaseException as e:
            _roll_back(undo)  # a rejected or skipped step leaves no trace, not even new state
            if not isinstance(e, _Skipped):
                raise

    def _step_micro_batch(self, inv_scale: float, overflowed: bool, found_out) -> None:
        """accumulation_steps > 1: one engine call adds this micro-batch's gradients, unscaled and
        divided by the step count, into the f32 accumulators and, on the window's last micro-batch,
        updates from them (the core's TrainingStep with a MicroBatch): the window's mean gradient.
        A window where some micro-batch held Inf/NaN is skipped whole; a micro-batch that torch's
        GradScaler found overflowing is not added. A rejected call changes nothing, the window
        included, and can be retried. Params that take the reference's step (_route) have their
        sums here, in their own dtype (`_torch_sums`); the reference steps them from those when the
        engine steps."""
        accumulators = dict(self._accumulators)  # put back if this call is rejected: it made none
        try:
            self._add_micro_batch(inv_scale, overflowed, found_out)
        except BaseException:
            self._accumulators.clear()
            self._accumulators.update(accumulators)
            raise

    def _add_micro_batch(self, inv_scale: float, overflowed: bool, found_out) -> None:
        closes = self._micro_batches + 1 == self._accumulation_steps
        if not closes:
            # The hyper-parameters the window's last call will be refused for are refused now, so a
            # micro-batch is never counted into a window that cannot close.
            self._check_hypers(self._group_hypers())
        grads, sums, fresh, with_grad, routed = [], [], [], {}, {}
        if not overflowed:  # (with_grad holds the grad tensors: flatten=True may replace p.grad below)
            grads, sums, fresh, with_grad, routed = self._micro_batch()
        torch_sums, torch_inf = dict(self._torch_sums), False  # committed with the engine's window
        if routed:
            if self._max_grad_norm != math.inf:
                raise ValueError("fusedopt: max_grad_norm with accumulation_steps > 1 needs every parameter on the "
                                 f"fused path; {'; '.join(routed.values())}")
            self._warn_routed(routed)
            for p in routed:  # sum += grad * inv_scale / k, as the engine's accumulators
                add = p.grad * (inv_scale / self._accumulation_steps)
                if add.device.type != "meta":  # (a meta tensor has no values: shape-only, as torch steps it)
                    torch_inf |= not bool(torch.isfinite(add.coalesce().values() if add.is_sparse else add).all())
                torch_sums[p] = add if p not in torch_sums else torch_sums[p] + add
        batch = (self._accumulation_steps, self._micro_batches, self._window_found_inf or overflowed or torch_inf,
                 grads, sums, fresh, inv_scale)
        undo: list = []
        try:
            packed = _Packed([])
            if closes:
                window = {**self._window, **dict.fromkeys(with_grad)}
                while True:
                    try:  # the step reads the sums
                        packed = self._pack(self._group_hypers(), undo, {p: self._accumulators[p] for p in window})
                        break
                    except _Relaid:
                        pass

            def engine():
                report = self._engine(packed, 1.0, False, micro_batch=batch)
                if (overflowed or torch_inf or report.found_inf) and found_out is not None:
                    found_out.fill_(1.0)
                self._micro_batches, self._window_found_inf = report.pending, report.window_found_inf
                self._window = {} if closes else {**self._window, **dict.fromkeys(with_grad)}
                self._torch_sums = {} if closes else torch_sums
                if closes:
                    self.last_grad_norm = report.grad_norm
                    if not report.stepped:
                        raise _Skipped  # (the window is over: the routed params' step is undone too)

            if closes and torch_sums and not batch[2]:
                # torch's step first, after the engine's checks of the hyper-parameters: a failure of
                # either (or a window the engine skips) puts the routed params back (see _torch_step).
                self._check_hypers(packed.hypers)
                self._torch_step(torch_sums, then=engine)
            else:
                engine()
        except BaseException as e:
            _roll_back(undo)
            if not isinstance(e, _Skipped):
                raise

    def _route(self, p: torch.Tensor, g: torch.Tensor, gi: int, j: int) -> str | None:
        """Why param p (with grad g) takes torch's own step at this step, or None: the fused path.
        With strict=True that is an error instead; so is a sparse grad where the reference refuses
        it too (with its error)."""
        if g.is_sparse and not self._takes_sparse:
            raise RuntimeError(f"parameter {self._name(gi, j)}: {self._sparse_message}")
        if self.defaults.get("differentiable", False):
            return "differentiable=True (the fused step records no autograd graph)"
        route = route_reason(p) or grad_route_reason(g, p)
        if route is None:
            return None
        if self._strict:
            if g.is_sparse:
                raise RuntimeError(f"parameter {self._name(gi, j)}: {self._sparse_message}")
            raise route_error(route, self._name(gi, j))
        return route[1]

    def _step_with_torch(self, packed: _Packed, grad_scale: float, found_out) -> None:
        """A step where some params take the reference's own step (packed.routed; see _torch_step)
        and the rest the engine's. What spans both partitions is done here, once for all params,
        before either runs: the Inf/NaN check for fusedopt.GradScaler and the global norm of
        max_grad_norm (torch's clip_grad_norm_ norm, in double); the clip coefficient then scales the
        gradients of both, as the engine folds it into grad_scale. The engine checks the
        hyper-parameters before any update (a call without segments); then torch's step runs, then the
        engine's, so that a failure of either puts the routed params back (see _torch_step)."""
        self._warn_routed(packed.routed)
        self.last_grad_norm = None
        clip = self._max_grad_norm != math.inf
        if clip or found_out is not None:
            grads = [p.grad for p in dict.fromkeys(chain(packed.params, packed.routed))]
            norm = _grad_norm(grads, self._norm_code) * grad_scale
            if clip:
                self.last_grad_norm = norm
            if not math.isfinite(norm):
                if found_out is not None:
                    found_out.fill_(1.0)
                raise _Skipped
            if clip:
                grad_scale *= _clip_coefficient(norm, self._max_grad_norm, self._clip_rule)
        self._check_hypers(packed.hypers)

        def engine():
            if packed.grads:
                self._engine(packed, grad_scale, False, max_grad_norm=math.inf)

        if grad_scale == 1.0:
            self._torch_step({p: p.grad for p in packed.routed}, then=engine)
        else:  # as torch's GradScaler.unscale_ multiplies, by an f32 factor
            factor = torch.tensor(grad_scale, dtype=torch.float32)
            self._torch_step({p: p.grad * factor.to(p.grad.device) for p in packed.routed}, then=engine)

    def _check_hypers(self, hypers: list) -> None:
        """The engine's checks of the groups' hyper-parameters alone (a call without segments), for work
        done before the engine's own step: a ValueError naming the group and field."""
        type(self)._engine_step(hypers, _C.SegmentTable([]), [], [], 1.0, 1)

    def _torch_step(self, grads: dict, then: Callable[[], None] | None = None) -> None:
        """The reference's own step (_reference_step) for the params of `grads` only, each with the
        gradient given there, then `then` (the engine's part of the step). It keeps torch's state keys
        and values, so state_dict is the same whichever path a param takes. A failed step changes
        nothing: if either part raises, the params of `grads` and their states are put back (torch
        creates a param's state, and may update other params, before it raises), and an error of
        the reference's step names the param it came from."""
        saved = _Saved(self.state, grads)
        try:
            try:
                self._reference_step_for(grads)
            except Exception as e:
                saved.restore()
                self._name_error(e, grads, saved)
                raise
            if then is not None:
                then()
        except BaseException:
            saved.restore()
            raise

    def _reference_step_for(self, grads: dict) -> None:
        """_reference_step for the params of `grads` only: the param groups are cut down to them, and
        their .grad set, for its duration."""
        groups = self.param_groups
        kept = [g["params"] for g in groups]
        amp = {k: self.__dict__.pop(k) for k in ("grad_scale", "found_inf") if k in self.__dict__}
        own = {p: p.grad for p in grads}
        swapped: list = []
        try:
            for p, g in grads.items():
                _give_grad(p, g, swapped)
            for g in groups:
                g["params"] = [p for p in g["params"] if p in grads]
            self._reference_step()
        finally:
            for g, ps in zip(groups, kept):
                g["params"] = ps
            for holder, data in reversed(swapped):
                holder.data = data
            for p, g in own.items():
                if p.grad is not g:
                    p.grad = g
            self.__dict__.update(amp)

    def _name_error(self, e: Exception, grads: dict, saved: _Saved) -> None:
        """Puts the name of the param whose reference step raised `e` before its message: the only
        param of `grads`, or the first one whose step alone raises the same kind of error (each try
        put back). torch's step goes over all of them at once and does not say."""
        if not (e.args and isinstance(e.args[0], str)):
            return
        culprit = next(iter(grads)) if len(grads) == 1 else None
        for p, g in grads.items() if culprit is None else ():
            try:
                self._reference_step_for({p: g})
            except type(e):
                culprit = p
                break
            except Exception:  # another error of another param: not the one asked about
                pass
            finally:
                saved.restore()
        if culprit is not None:
            name = next(self._name(gi, j) for gi, group in enumerate(self.param_groups)
                        for j, q in enumerate(group["params"]) if q is culprit)
            e.args = (f"parameter {name}: {e.args[0]}", *e.args[1:])

    def _reference_step(self) -> None:
        """The step of the torch.optim twin (its for-loop, single-tensor path on the CPU), without
        the hooks torch wraps around it: they ran around this step already."""
        for cls in type(self).__mro__:
            step = cls.__dict__.get("step")
            if step is not None and cls is not torch.optim.Optimizer and not issubclass(cls, FusedOptimizerMixin):
                while getattr(step, "hooked", False):
                    step = step.__wrapped__
                step(self)
                return
        raise NotImplementedError(f"{type(self).__name__} has no reference step")

    def _warn_routed(self, routed: dict) -> None:
        new = [why for p, why in routed.items() if p not in self._warned]
        if new:
            self._warned.update(dict.fromkeys(routed))
            warnings.warn(f"fusedopt: {type(self).__name__} updates these parameters with the reference's own "
                          f"(unfused) step: {'; '.join(new)}. Pass strict=True to make this an error.",
                          stacklevel=_user_stacklevel())

    def _run_engine(self, packed: _Packed, grad_scale: float, check: bool, found_out) -> None:
        """The step call; raises _Skipped when its pre-pass found non-finite gradients."""
        self.last_grad_norm = None
        if not packed.grads:
            return
        report = self._engine(packed, grad_scale, check)
        self.last_grad_norm = report.grad_norm
        if report.found_inf and found_out is not None:
            found_out.fill_(1.0)
        if not report.stepped:
            raise _Skipped

    def _engine(self, packed: _Packed, grad_scale: float, check: bool, micro_batch: tuple | None = None,
                max_grad_norm: float | None = None):
        """The engine's step over `packed`, every gradient read as grad * grad_scale (see RunStep in
        src/python/module.cc), clipped by max_grad_norm (default: the optimizer's); returns its
        _C.StepReport."""
        kw = {} if micro_batch is None else {"micro_batch": micro_batch}
        table, grads, codes = packed.table, packed.grads, packed.codes
        if table is None:
            waves = self._waves(packed.rows)
            if waves is None:
                table = packed.table = _C.SegmentTable(packed.rows)
            else:  # a table of its own, in wave order
                order, kw["wave_ends"] = waves
                rows, grads, codes = ([x[i] for i in order] for x in (packed.rows, grads, codes))
                table = _C.SegmentTable(rows)
        max_norm = self._max_grad_norm if max_grad_norm is None else max_grad_norm
        return type(self)._engine_step(packed.hypers, table, grads, codes, grad_scale, torch.get_num_threads(),
                                       max_norm, self._norm_code, self._clip_rule, check, **kw)

    def _waves(self, segments) -> tuple[list[int], list[int]] | None:
        """None when no two segments share memory (the common case: one parallel pass). Otherwise
        (order, wave_ends): the segments in the order of the waves the engine runs one after the
        other, and where each wave ends (see RunStep in src/python/module.cc). Recomputed only when
        the params' addresses, sizes or dtypes change."""
        if self._overlap_free:
            return None
        if not self._duplicates and first_overlap([p for g in self.param_groups for p in g["params"]]) is None:
            self._overlap_free = True  # until a param moves (_segment_slow) or joins (add_param_group)
            return None
        key = list(map(_SPAN, segments))
        if key != self._wave_key:
            self._wave_key, self._wave_plan = key, _plan_waves(key)
        return self._wave_plan

    def _micro_batch(self) -> tuple:
        """accumulation_steps > 1: this micro-batch's gradients (checked; each as its engine tuple),
        the address of each one's f32 accumulator (created if missing), whether the accumulator
        starts in this window, {param: its gradient} of the params with one, and {param: why} of
        those that take the reference's step."""
        grads, sums, fresh = [], [], []
        with_grad: dict[torch.Tensor, torch.Tensor] = {}
        routed: dict[torch.Tensor, str] = {}
        for gi, group in enumerate(self.param_groups):
            for j, p in enumerate(group["params"]):
                g = p.grad
                if g is None or p in with_grad or p in routed:  # a duplicated param's grad is one gradient
                    continue
                if g.shape != p.shape:  # (one set through .data): the engine would add it into p's sum
                    raise grad_shape_error(self._name(gi, j), g, p)
                route = self._route(p, g, gi, j) or ("it is complex" if p.is_complex() else None)
                if route is not None:
                    routed[p] = f"parameter {self._name(gi, j)}: {route}"
                    continue
                code = DTYPE_CODES[g.dtype]
                acc = self._accumulators.get(p)
                if acc is None or acc.shape != p.shape:
                    acc = torch.empty_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
                    self._accumulators[p] = acc
                with_grad[p] = g
                grads.append((g.data_ptr(), g.numel(), code))
                sums.append(acc.data_ptr())
                fresh.append(0 if p in self._window else 1)
        return grads, sums, fresh, with_grad, routed

    # ---- internals ----------------------------------------------------------------------------
    def _group_hypers(self) -> list:
        hypers = []
        for gi, group in enumerate(self.param_groups):
            try:
                hypers.append(self._hyper(group))
            except _BadNumber as e:
                raise number_error(f"param_groups[{gi}]{e.field}", e.value, e.index) from None
        return hypers

    def _pack(self, hypers: list, undo: list, grads: dict | None = None) -> _Packed:
        """The engine's arguments for every param with a gradient (p.grad, or grads[p] when given),
        param by param. A param listed twice gets the same segment twice: the engine counts its step
        once per occurrence (torch's for-loop: SGD's occurrences on a first step each start from a
        fresh momentum buffer, since torch gathers the buffers before the loop)."""
        packed = _Packed(hypers)
        seen: dict | None = {} if self._duplicates else None
        index = -1  # of the param in all groups' params
        for gi, group in enumerate(self.param_groups):
            slots = hypers[gi].required_states()
            needed = tuple(bool(slots >> k & 1) for k in range(len(self._slot_keys)))
            for j, p in enumerate(group["params"]):
                g = p.grad if grads is None else grads.get(p)
                index += 1
                if g is None:
                    packed.none_at.append(index)
                    continue
                mine = self._needed_states(p, needed) if self._factored else needed
                if seen is None:  # the common case, kept as lean as it was
                    segment = self._segment(p, g, gi, j, mine, undo, grads is None)
                else:
                    if p not in seen:
                        seen[p] = self._segment(p, g, gi, j, mine, undo, grads is None)
                    segment = seen[p]
                row, grad_ptr, code = segment
                if row is None:  # (grad_ptr is why)
                    packed.routed[p] = f"parameter {self._name(gi, j)}: {grad_ptr}"
                    continue
                packed.params.append(p)
                packed.rows.append(row)
                packed.grads.append(grad_ptr)
                packed.codes.append(code)
        return packed

    def _pack_unchanged(self, hypers: list) -> _Packed | None:
        """The common step, in bulk: when the same params hold gradients as at the last step() and
        nothing its packing depended on has changed (the checks of _segment's cache, each mapped
        over all params at once), the last step's segment table with this step's gradients.
        Otherwise None: pack param by param."""
        last = self._last
        if last is None or list(map(_REQUIRED_STATES, hypers)) != last.needed:
            return None
        lists = list(map(_PARAMS, self.param_groups))  # (user code may edit them in place)
        all_params = list(chain.from_iterable(lists))
        if (list(map(len, lists)) != last.group_sizes
                or not all(map(operator.is_, all_params, last.all_params))):
            return None
        grads = list(map(_GRAD, all_params))
        if [i for i, g in enumerate(grads) if g is None] != last.packed.none_at:
            return None
        if last.packed.none_at:
            grads = [g for g in grads if g is not None]
        params = last.packed.params
        try:
            grad_ptrs = list(map(_DATA_PTR, grads))
            if not all(map(_IS_CONTIGUOUS, grads)):
                return None
        except RuntimeError:  # a sparse gradient: the param-by-param path names it
            return None
        codes = list(map(DTYPE_CODES.get, map(_DTYPE, grads)))
        if (None in codes or list(map(_SHAPE, grads)) != last.shapes
                or list(map(_DATA_PTR, params)) != last.param_ptrs
                or not all(map(operator.is_, map(self.state.get, params), last.states))
                or not all(map(operator.is_, map(dict.get, last.entry_dicts, last.entry_keys), last.entry_tensors))
                or list(map(_DATA_PTR, last.entry_tensors)) != last.entry_ptrs
                or list(map(_VERSION, last.masters)) != last.versions):
            return None
        if last.grad_slots is not None and grad_ptrs != last.grad_slots:  # flatten=True, new p.grad
            for i, (address, slot) in enumerate(zip(grad_ptrs, last.grad_slots)):
                if address != slot:
                    g = self._flat.place_grad(params[i])
                    grad_ptrs[i], codes[i] = g.data_ptr(), DTYPE_CODES[g.dtype]
        packed = _Packed(hypers)
        packed.params, packed.none_at, packed.table = params, last.packed.none_at, last.packed.table
        packed.grads, packed.codes = grad_ptrs, codes
        return packed

    def _remember(self, packed: _Packed) -> None:
        """After a step packed param by param: what _pack_unchanged checks at the next one. Not
        with a param listed twice or params that overlap (their segments run in waves)."""
        if self._duplicates or not self._overlap_free:
            return
        cached = [self._segment_cache[p] for p in packed.params]
        last = _LastStep()
        lists = list(map(_PARAMS, self.param_groups))
        last.all_params, last.group_sizes = list(chain.from_iterable(lists)), list(map(len, lists))
        last.needed = list(map(_REQUIRED_STATES, packed.hypers))
        last.shapes = [c.shape for c in cached]
        last.param_ptrs = [c.param_ptr for c in cached]
        last.states = [c.state for c in cached]
        entries = [(c.state, key, t, address) for c in cached for key, t, address in c.tensors]
        last.entry_dicts, last.entry_keys, last.entry_tensors, last.entry_ptrs = (
            [e[k] for e in entries] for k in range(4))
        with_master = [(p, c.version) for p, c in zip(packed.params, cached) if c.version is not None]
        last.masters, last.versions = [m for m, _ in with_master], [v for _, v in with_master]
        last.grad_slots = [c.grad_slot for c in cached] if self._flat is not None else None
        # The table of the next steps: the cached rows. They are this step's, except where SGD's
        # first step counted from a fresh buffer (the next ones count from the buffer it made).
        last.packed = _Packed(packed.hypers)
        last.packed.params, last.packed.none_at = packed.params, packed.none_at
        rows = [c.row for c in cached]
        same = packed.table is not None and all(map(operator.is_, rows, packed.rows))
        last.packed.table = packed.table if same else _C.SegmentTable(rows)
        self._last = last

    def _has_master(self, p: torch.Tensor) -> bool:
        return self._master_weights and p.dtype in _LOW_PRECISION

    def _state_dtype(self, p: torch.Tensor) -> torch.dtype:
        if p.is_complex():  # states of p's dtype, as torch keeps them
            return p.dtype
        if self._state_dtype_option is not None:
            return self._state_dtype_option
        return torch.float32 if self._has_master(p) else p.dtype

    def _segment(self, p, g, gi, j, needed, undo, own_grad) -> tuple:
        """One parameter as (its _C.SegmentRow, its gradient's address, the gradient's dtype code),
        creating its state on its first step like torch does. Every change to a dict (a state entry
        created, converted or dropped, a param mark) goes into the `undo` log first (see
        _roll_back).

        This runs for every param on every step that _pack_unchanged cannot take, so it first tries
        the entry cached by the last step: valid while the param's memory, its state tensors
        (objects and memory) and the group's needs are the same (the grad may be new each step: its
        dtype, shape and layout are checked). `own_grad`: g is p.grad (with flatten=True, it goes into
        its slot), not an accumulator."""
        c = self._segment_cache.get(p)
        if c is not None and c.needed == needed and c.group == gi and c.param_ptr == p.data_ptr() and (
                c.version is None or c.version == p._version):
            state = self.state.get(p)
            intact = state is c.state
            for key, t, address in c.tensors:
                intact = intact and state.get(key) is t and t.data_ptr() == address
            if intact and not g.is_sparse and g.is_contiguous() and g.shape == c.shape:
                gcode = DTYPE_CODES.get(g.dtype)
                grad_ptr = g.data_ptr()
                if gcode is not None:
                    if own_grad and c.grad_slot is not None and grad_ptr != c.grad_slot:  # flatten, new p.grad
                        g = self._flat.place_grad(p)
                        grad_ptr, gcode = g.data_ptr(), DTYPE_CODES[g.dtype]
                    return c.row, grad_ptr, gcode
        return self._segment_slow(p, g, gi, j, needed, undo, own_grad)

    def _segment_slow(self, p, g, gi, j, needed, undo, own_grad) -> tuple:
        self._overlap_free = False  # p may have moved: _waves checks the addresses again
        if g.shape != p.shape:  # (also before flatten=True moves the grad into a slot)
            raise grad_shape_error(self._name(gi, j), g, p)
        route = self._route(p, g, gi, j)
        if route is not None:
            return None, route, None
        if self._flat is not None:
            # Re-combine a param or grad replaced since the last step. If that needs a new layout,
            # the segments packed so far point into the old one.
            if self._flat.place(p):
                raise _Relaid
            if own_grad:
                g = p.grad
        # (a complex64 param, and its grad and states, are read as their f32 real views)
        pcode, gcode = _ENGINE_CODES[p.dtype], _ENGINE_CODES[g.dtype]
        # A param that needs no state (SGD without momentum) gets no entry, as in torch.
        attached = self.state.get(p)
        state = {} if attached is None else attached
        sdtype = self._state_dtype(p)
        ptrs = [0, 0, 0]
        fresh_buffer = False
        for slot, (key, need) in enumerate(zip(self._slot_keys, needed)):
            if need:
                t, fresh = self._ensure_state(p, state, key, sdtype, gi, j, undo)
                ptrs[slot] = t.data_ptr()
                fresh_buffer |= fresh
        step_ptr, step = 0, 0
        if self._counts_steps:
            s = state.get("step")
            count = 0.0 if s is None else self._step_count(s, gi, j)
            if not (isinstance(s, torch.Tensor) and s.dtype == torch.float32 and s.device.type == "cpu"
                    and s.numel() == 1):
                undo.append((state, "step", _ABSENT if s is None else s))
                s = torch.tensor(count, dtype=torch.float32)
                state["step"] = s
            step_ptr = s.data_ptr()
        else:
            step = 1 if fresh_buffer else 2  # SGD: a new momentum buffer starts as a copy of d
        scalar_ptrs = [0, 0]
        for k, key in enumerate(self._scalar_keys):
            scalar_ptrs[k] = self._ensure_scalar(state, key, gi, j, k, undo).data_ptr()
        master = 0
        if self._has_master(p):
            mark = self._param_marks.get(p, _ABSENT)
            if mark != (p.data_ptr(), p._version):
                # First step, or the param was changed outside the optimizer (a model checkpoint
                # loaded into it, p.data = ...): the master copy restarts from the param.
                if "master_param" in state:
                    undo.append((state, "master_param", state.pop("master_param")))
                undo.append((self._param_marks, p, mark))
            self._param_marks[p] = (p.data_ptr(), p._version)  # our raw writes leave both as they are
            master = self._ensure_state(p, state, "master_param", torch.float32, gi, j, undo)[0].data_ptr()
        def row(step):
            return _C.SegmentRow(param=p.data_ptr(), states=ptrs, master=master,
                                 numel=p.numel() * (2 if p.is_complex() else 1), param_dtype=pcode,
                                 state_dtype=_ENGINE_CODES[sdtype], group=gi, step_counter=step_ptr, step=step,
                                 stochastic_rounding=self._rounding[0], rounding_seed=self._rounding[1],
                                 global_offset=self._global_offset(p), scalars=scalar_ptrs,
                                 rows=(p.shape[-2] if self._factored else p.shape[0])
                                 if (self._row_reductions or self._factored) and p.dim() > 1 else 0,
                                 cols=p.shape[-1] if self._factored and p.dim() > 1 else 0)

        now = row(step)
        keys = [k for k, need in zip(self._slot_keys, needed) if need]
        keys += ["step"] if self._counts_steps else []
        keys += self._scalar_keys
        keys += ["master_param"] if master else []
        tensors = tuple((k, state[k], state[k].data_ptr()) for k in keys)
        if state and attached is None:
            undo.append((self.state, p, _ABSENT))
            self.state[p] = attached = state
        grad_slot = self._flat.grad_slot_address(p) if self._flat is not None else None
        # SGD's next steps find the buffer made by this one.
        self._segment_cache[p] = _Cached(needed, gi, p.data_ptr(), attached, tensors, p._version if master else None,
                                         now if step != 1 else row(2), p.shape, grad_slot)
        return now, g.data_ptr(), gcode

    def _global_offset(self, p: torch.Tensor) -> int:
        """Index of p's first element in all params of all groups laid end to end: the element index
        that keys stochastic rounding, independent of which params have grads this step."""
        if self._offsets is None:
            self._offsets, total = {}, 0
            for group in self.param_groups:
                for q in group["params"]:
                    self._offsets.setdefault(q, total)
                    total += q.numel()
        return self._offsets[p]

    def _step_count(self, s, gi: int, j: int) -> float:
        """The value of a state['step'] (e.g. loaded from a state_dict), checked before the engine
        converts it to an integer."""
        what = f"state['step'] of parameter {self._name(gi, j)}"
        try:
            count = float(s)
        except (TypeError, ValueError, RuntimeError):
            raise number_error(what, s) from None
        if not 0.0 <= count < _MAX_STEP:
            raise ValueError(f"fusedopt: {what} is {count:g}; it must be a finite count in [0, 2**62)")
        return count

    def _ensure_scalar(self, state, key, gi, j, k, undo) -> torch.Tensor:
        """state[key], a scalar state the engine reads and advances in place (NAdam's mu_product), as
        torch creates it: a 0-d f32 CPU tensor, filled with the algorithm's initial value when missing.
        A loaded value of another kind (a Python float, another dtype, e.g. bf16 after torch's
        load_state_dict cast it to a bf16 param's dtype) is converted, keeping its value."""
        t = state.get(key)
        if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device.type == "cpu" and t.dim() == 0:
            return t
        if t is None:
            value = self._hyper(self.param_groups[gi]).initial_scalars()[k]
        else:
            try:
                value = float(t)
            except (TypeError, ValueError, RuntimeError):
                raise number_error(f"state['{key}'] of parameter {self._name(gi, j)}", t) from None
        undo.append((state, key, _ABSENT if t is None else t))
        new = torch.tensor(value, dtype=torch.float32)
        state[key] = new
        return new

    def _ensure_state(self, p, state, key, dtype, gi, j, undo):
        """state[key] as the engine needs it: dtype, size, p's memory layout and, with flatten=True,
        its slot in the flat buffer. A loaded or replaced tensor is converted or moved; a missing one
        is created (zeros, Adagrad's initial value, or the param itself for master_param).
        Returns (tensor, whether it was created)."""
        shape = self._state_shape(p, key)
        if shape is not None:
            return self._ensure_shaped_state(p, state, key, dtype, shape, gi, j, undo)
        t = state.get(key)
        if t is not None and t.dtype == dtype and t.numel() == p.numel() and (
                t.stride() == p.stride() or (t.is_contiguous() and p.is_contiguous())) and (
                self._flat is None or self._flat.in_slot(p, key, t)):
            return t, False
        if t is not None and t.numel() != p.numel():
            raise ValueError(f"fusedopt: state '{key}' of parameter {self._name(gi, j)} has "
                             f"{t.numel()} elements but the parameter has {p.numel()}")
        fill = self._initial_state_value(key, self.param_groups[gi], p)
        new = self._flat.state_slot(p, key, dtype, fill) if self._flat is not None else None
        if new is None:
            new = torch.empty_like(p, dtype=dtype, memory_format=torch.preserve_format)
        if t is not None:
            new.copy_(t.reshape(p.shape))
        elif key == "master_param":
            new.copy_(p.detach())
        elif not (key == "momentum_buffer" and not self._counts_steps):  # SGD's is filled by the step
            new.fill_(fill)
        undo.append((state, key, _ABSENT if t is None else t))  # a failed step puts a loaded tensor back
        state[key] = new
        return new, t is None

    def _ensure_shaped_state(self, p, state, key, dtype, shape, gi, j, undo):
        """As _ensure_state, for a state of another shape than p's (Adafactor's row_var and col_var): contiguous,
        created with zeros; a loaded one of the same number of elements is converted or reshaped."""
        t = state.get(key)
        if t is not None and t.dtype == dtype and t.shape == shape and t.is_contiguous() and t.device == p.device:
            return t, False
        if t is not None and t.numel() != math.prod(shape):
            raise ValueError(f"fusedopt: state '{key}' of parameter {self._name(gi, j)} has shape {tuple(t.shape)} "
                             f"but the parameter's shape {tuple(p.shape)} needs {tuple(shape)}")
        new = torch.zeros(shape, dtype=dtype, device=p.device)
        if t is not None:
            new.copy_(t.reshape(shape))
        undo.append((state, key, _ABSENT if t is None else t))  # a failed step puts a loaded tensor back
        state[key] = new
        return new, t is None

    def _f32_states_to_keep(self, state_dict: dict) -> dict:
        if not self._master_weights:
            return {}
        params = [p for g in self.param_groups for p in g["params"]]
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        keep = {}
        for pid, sid in enumerate(saved_ids):
            if pid >= len(params) or params[pid].dtype not in _LOW_PRECISION:
                continue
            entry = state_dict["state"].get(sid, {})
            kept = {k: v.detach().to(torch.float32, copy=True) for k, v in entry.items()
                    if k != "step" and isinstance(v, torch.Tensor) and v.is_floating_point()}
            if kept:
                keep[pid] = kept
        return keep

    def _name(self, gi: int, j: int) -> str:
        return _param_name(self.param_groups[gi].get("param_names"), gi, j)


class _Packed:
    """One step call's arguments: the groups' hypers and, per segment, its param, its SegmentRow
    and its gradient's address and dtype code; `table`, the _C.SegmentTable of the rows once made;
    `none_at`, the indices (in all groups' params) of the params without a gradient."""

    __slots__ = ("hypers", "params", "rows", "grads", "codes", "table", "none_at", "routed")

    def __init__(self, hypers: list):
        self.hypers, self.table = hypers, None
        self.params, self.rows, self.grads, self.codes, self.none_at = [], [], [], [], []
        self.routed: dict[torch.Tensor, str] = {}  # params that take torch's step: their name and reason


class _Saved:
    """What the reference's step may change of some params, to put back if the step fails: each
    param's values, and its state: which entries it holds and their values. Only the params torch
    steps are saved: their copies are what this costs."""

    __slots__ = ("state", "saved")

    def __init__(self, state: dict, params):
        self.state, self.saved = state, []
        for p in params:
            entries = state.get(p)
            tensors = [] if entries is None else [(t, t.clone()) for t in entries.values() if isinstance(t, torch.Tensor)]
            self.saved.append((p, p.detach().clone(), entries, None if entries is None else dict(entries), tensors))

    @torch.no_grad()
    def restore(self) -> None:
        for p, value, entries, items, tensors in self.saved:
            p.data.copy_(value)  # (through .data: torch's step may run with autograd on, differentiable=True)
            if entries is None:
                self.state.pop(p, None)
                continue
            for t, old in tensors:
                t.copy_(old)
            entries.clear()
            entries.update(items)
            self.state[p] = entries


class _Cached:
    """_segment's cache entry of a param: valid while it is in group `group`, which still needs the
    same state slots (`needed`), the param's memory is at param_ptr (with a master copy: its version counter is
    `version`), its state dict is `state` and holds the same (key, tensor, address) `tensors`. Then
    `row` is its segment, and its grad must have `shape`; with flatten=True, grad_slot is where its
    grad belongs."""

    __slots__ = ("needed", "group", "param_ptr", "state", "tensors", "version", "row", "shape", "grad_slot")

    def __init__(self, needed, group, param_ptr, state, tensors, version, row, shape, grad_slot):
        self.needed, self.group, self.param_ptr, self.state, self.tensors = needed, group, param_ptr, state, tensors
        self.version, self.row, self.shape, self.grad_slot = version, row, shape, grad_slot


class _LastStep:
    """What _pack_unchanged compares with: the cache entries of the last step's params, as lists
    (one check maps over all of them at once), and that step's packing with its table."""

    __slots__ = ("all_params", "group_sizes", "needed", "shapes", "param_ptrs", "states", "entry_dicts", "entry_keys",
                 "entry_tensors", "entry_ptrs", "masters", "versions", "grad_slots", "packed")


class _Relaid(Exception):
    """FlatStore.combine() ran while a step was being packed."""


class _Skipped(Exception):
    """The step's pre-pass found non-finite gradients: nothing was updated."""


class _BadNumber(Exception):
    """A group field that float() refused (see group_number); _pack names the group."""

    def __init__(self, field: str, value, index: int | None = None):
        super().__init__(field)
        self.field, self.value, self.index = field, value, index  # index: the value has no element [index]


def group_number(group: dict, key: str, index: int | None = None) -> float:
    """float(group[key]) (or of group[key][index], e.g. betas); a value that is not one number (a
    2-element tensor, a string) raises _BadNumber naming the field."""
    try:
        value = group[key] if index is None else group[key][index]
    except (IndexError, TypeError):  # betas=(0.9,), or not a sequence: torch's step fails to unpack it
        raise _BadNumber(f"['{key}']", group[key], index) from None
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        raise _BadNumber(f"['{key}']" + ("" if index is None else f"[{index}]"), value) from None


def _roll_back(undo: list) -> None:
    """Undoes the dict changes of a failed or skipped step, newest first: entries it created are
    removed, tensors it replaced (e.g. a loaded f32 state converted to state_dtype) put back."""
    for d, key, old in reversed(undo):
        if old is _ABSENT:
            d.pop(key, None)
        else:
            d[key] = old


def _plan_waves(spans: list[tuple[int, int, int]]):
    """_waves' plan for segments given as (address, numel, dtype code). A segment's wave is one
    more than the latest wave of the earlier segments it overlaps (0 if none), so overlapping
    segments run in their packing order, torch's for-loop order. None if nothing overlaps."""
    ranges = sorted((ptr, ptr + numel * _ITEM_SIZES.get(code, 4), i)
                    for i, (ptr, numel, code) in enumerate(spans) if numel)
    wave = [0] * len(spans)
    cluster: list = []  # ranges that overlap, transitively
    cluster_end = -1
    for r in ranges + [(math.inf, math.inf, -1)]:  # a sentinel settles the last cluster
        if r[0] < cluster_end:
            cluster.append(r)
            cluster_end = max(cluster_end, r[1])
            continue
        if len(cluster) > 1:
            cluster.sort(key=lambda c: c[2])
            for k, (start, end, i) in enumerate(cluster):
                wave[i] = 1 + max((wave[o] for s, e, o in cluster[:k] if s < end and start < e), default=-1)
        cluster, cluster_end = [r], r[1]
    last = max(wave, default=0)
    if last == 0:
        return None
    order = sorted(range(len(spans)), key=wave.__getitem__)
    ends = [0] * (last + 1)
    for w in wave:
        ends[w] += 1
    for k in range(1, last + 1):
        ends[k] += ends[k - 1]
    return order, ends


def _give_grad(p: torch.Tensor, g: torch.Tensor, swapped: list) -> None:
    """p.grad = g. torch's setter refuses a gradient whose dtype is not p's, which torch's steps take (one set
    through p.grad.data = ..., as the user did): such a gradient goes in through .data of p's grad (or of a
    placeholder of p's dtype), and `swapped` gets (that grad, its own data) to put back."""
    if p.grad is g:
        return
    if g.dtype == p.dtype and (p.grad is None or p.grad.dtype == p.dtype):
        p.grad = g
        return
    if p.grad is None:
        p.grad = torch.empty((), dtype=p.dtype, device=p.device).expand(p.shape)
    swapped.append((p.grad, p.grad.data))
    p.grad.data = g


def _user_stacklevel() -> int:
    """warnings.warn's stacklevel of the first caller outside fusedopt and torch (the user's
    opt.step()), from the function that calls warn."""
    level, frame = 2, sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
        frame, level = frame.f_back, level + 1
    return level


def _grad_norm(grads: list[torch.Tensor], code: int) -> float:
    """The norm of all gradients as one vector (code as norm_type_code), in double."""
    if not grads:
        return 0.0
    order = {2: 2.0, 1: 1.0, 0: math.inf}[code]
    norms = [torch.linalg.vector_norm(g.to_dense() if g.is_sparse else g, order,
                                      dtype=torch.complex128 if g.is_complex() else torch.float64).cpu()
             for g in grads if g.device.type != "meta"]  # (no values: shape-only, and torch's step takes it)
    return float(torch.linalg.vector_norm(torch.stack(norms), order)) if norms else 0.0


def _clip_coefficient(norm: float, max_norm: float, rule: int) -> float:
    """What max_grad_norm multiplies the gradients by: torch's clip_grad_norm_ (rule 0) or apex
    FusedLAMB's (rule 1)."""
    if rule == 1:
        return max_norm / norm if norm > max_norm else 1.0
    return min(1.0, max_norm / (norm + 1e-6))


def norm_type_code(norm_type) -> int:
    """The engine's code of a vector norm order: 2, 1, or 0 for inf."""
    value = float(norm_type)
    if value == 2.0:
        return 2
    if value == 1.0:
        return 1
    if value == math.inf:
        return 0
    raise ValueError(f"fusedopt: unsupported norm_type {norm_type!r} for a fused step (1, 2 or inf)")


def _param_name(names, gi: int, j: int) -> str:
    if names is not None and j < len(names):
        return f"'{names[j]}' (group {gi}, index {j})"
    return f"{j} of group {gi}"
