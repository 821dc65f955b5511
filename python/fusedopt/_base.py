"""What the five fused optimizers share: each class derives from its torch.optim twin (so the
constructor, defaults, validation, param groups, hooks and state_dict format are torch's own) and
replaces step() with one call into the C++ engine that updates every parameter of every group in a
single multi-threaded, vectorized pass."""

from __future__ import annotations

from typing import Any, Callable

import math

import torch

from . import _C
from ._flat import FlatStore
from ._tensors import DTYPE_CODES, check_param, check_same_layout, dtype_code

_LOW_PRECISION = (torch.float16, torch.bfloat16)


class FusedOptimizerMixin:
    """Put before the torch.optim class in the bases. Subclasses set the class attributes below."""

    _engine_step: Callable  # _C.<algo>_step(hypers, segments, num_threads)
    _slot_keys: tuple[str, ...]  # torch state keys of the engine's state slots 0, 1, 2
    _counts_steps = True  # keeps torch's per-param state['step'] (all but SGD)
    _sparse_message = ""  # torch's error text for a sparse gradient

    def __init__(self, params, *args, master_weights: bool = False, flatten: bool = False,
                 max_grad_norm: float | None = None, norm_type: float = 2.0, accumulation_steps: int = 1,
                 state_dtype: torch.dtype | None = None, stochastic_rounding: bool = False, seed: int = 0,
                 **kwargs):
        if kwargs.get("differentiable", False):
            raise RuntimeError(f"{type(self).__name__} does not support differentiable=True")
        if max_grad_norm is not None and not (float(max_grad_norm) >= 0.0):
            raise ValueError(f"Invalid max_grad_norm: {max_grad_norm} (must be >= 0 or None)")
        self._max_grad_norm = math.inf if max_grad_norm is None else float(max_grad_norm)
        self._norm_code = norm_type_code(norm_type)
        if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
            raise ValueError(f"Invalid accumulation_steps: {accumulation_steps!r} (an int >= 1)")
        if accumulation_steps > 1 and flatten:
            raise ValueError("fusedopt: accumulation_steps > 1 does not combine with flatten=True")
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
        self._window: dict[torch.Tensor, None] = {}  # params with a gradient in this window, in order
        self._micro_batches = 0
        self._window_found_inf = False
        self.last_grad_norm: float | None = None  # global grad norm seen by the last step, if computed
        self._master_weights = bool(master_weights)
        self._flat: FlatStore | None = None
        # Per param: (data_ptr, _version) after our last write, to notice params changed behind our
        # back while an f32 master copy exists.
        self._param_marks: dict[torch.Tensor, tuple[int, int]] = {}
        self._segment_cache: dict[torch.Tensor, tuple] = {}  # see _segment
        super().__init__(params, *args, **kwargs)
        self._step_supports_amp_scaling = True  # honours grad_scale / found_inf set by GradScaler
        if flatten:
            self._flat = FlatStore(self)

    # ---- what each algorithm defines ----------------------------------------------------------
    def _hyper(self, group: dict) -> Any:
        raise NotImplementedError

    def _needed_slots(self, group: dict) -> tuple[bool, ...]:
        raise NotImplementedError

    def _initial_state_value(self, key: str) -> float:
        return 0.0

    # ---- torch.optim.Optimizer API --------------------------------------------------------------
    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        names = group.get("param_names")
        gi = len(self.param_groups) - 1
        for j, p in enumerate(group["params"]):
            check_param(p, _param_name(names, gi, j))
        self._offsets = None
        if getattr(self, "_flat", None) is not None:
            self._flat.combine()

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._flat is not None and not set_to_none:
            self._flat.zero_grad()  # one memset per dtype; grads stay views into the flat buffer
            return
        super().zero_grad(set_to_none=set_to_none)

    def load_state_dict(self, state_dict: dict) -> None:
        # torch casts every floating state tensor to its param's dtype; f32 master copies and the
        # f32 moments of 16-bit params must survive that, so keep f32 copies and put them back.
        keep = self._f32_states_to_keep(state_dict)
        super().load_state_dict(state_dict)
        self._segment_cache.clear()
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

    def resync_master_weights(self) -> None:
        """With master_weights=True: restart every f32 master copy from its param at the next step.
        Changes made with tensor ops (`p.copy_()` under no_grad, model.load_state_dict, p.data = t)
        are noticed without this; writes through `p.data` in place (p.data.copy_(), .clamp_()) bypass
        the param's version counter and need it."""
        self._param_marks.clear()
        self._segment_cache.clear()

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("_master_weights", False)
        self.__dict__.setdefault("_flat", None)
        self.__dict__.setdefault("_param_marks", {})
        for key, value in (("_max_grad_norm", math.inf), ("_norm_code", 2), ("_accumulation_steps", 1),
                           ("_state_dtype_option", None), ("_micro_batches", 0),
                           ("_window_found_inf", False), ("last_grad_norm", None),
                           ("_rounding", (False, 0)), ("_offsets", None)):
            self.__dict__.setdefault(key, value)
        self.__dict__.setdefault("_accumulators", {})
        self.__dict__.setdefault("_window", {})
        self.__dict__["_segment_cache"] = {}

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
        grads = None
        if self._accumulation_steps > 1:
            overflowed = self._accumulate(inv_scale, overflowed)
            if overflowed and found_out is not None:
                found_out.fill_(1.0)
            self._micro_batches += 1
            self._window_found_inf |= overflowed
            if self._micro_batches < self._accumulation_steps:
                return loss
            grads = {p: self._accumulators[p] for p in self._window}
            window_ok = not self._window_found_inf
            self._micro_batches, self._window_found_inf, self._window = 0, False, {}
            if not window_ok:
                return loss
            inv_scale, check = 1.0, False  # the accumulators hold unscaled, finite sums
        else:
            if overflowed:
                return loss
            check = found_out is not None
        created = []
        try:
            while True:
                try:
                    hypers, segments = self._pack(inv_scale, created, grads)
                    break
                except _Relaid:  # flatten=True laid the buffers out anew: pack again from the start
                    pass
            report = (True, False, None, 1.0)
            if segments:
                report = type(self)._engine_step(hypers, segments, torch.get_num_threads(),
                                                 self._max_grad_norm, self._norm_code, check)
            stepped, non_finite, self.last_grad_norm = report[0], report[1], report[2]
            if non_finite and found_out is not None:
                found_out.fill_(1.0)
            if not stepped:
                raise _Skipped
        except BaseException as e:
            for state, key in created:  # a rejected or skipped step leaves no trace, not even new state
                state.pop(key, None)
            if not isinstance(e, _Skipped):
                raise
        return loss

    def _accumulate(self, inv_scale: float, overflowed: bool) -> bool:
        """accumulation_steps > 1: adds every gradient, unscaled and divided by the step count, into
        its param's f32 accumulator (the first one of a window overwrites it). Returns whether this
        micro-batch overflowed (then nothing is added: the window will be skipped anyway)."""
        if overflowed:
            return True
        fresh, add = ([], []), ([], [])
        with_grad = []
        for gi, group in enumerate(self.param_groups):
            for j, p in enumerate(group["params"]):
                g = p.grad
                if g is None:
                    continue
                name = self._name(gi, j)
                if g.is_sparse:
                    raise RuntimeError(self._sparse_message)
                code = dtype_code(g, f"the gradient of parameter {name}")
                check_same_layout(g, p, f"the gradient of parameter {name}")
                acc = self._accumulators.get(p)
                if acc is None or acc.shape != p.shape:
                    acc = torch.empty_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
                    self._accumulators[p] = acc
                with_grad.append(p)
                target = add if p in self._window else fresh
                target[0].append((g.data_ptr(), g.numel(), code))
                target[1].append(acc.data_ptr())
        scale = inv_scale / self._accumulation_steps
        threads = torch.get_num_threads()
        bad = False
        for (grads, sums), overwrite in ((fresh, True), (add, False)):
            if grads:
                bad |= _C.accumulate_grads(grads, sums, scale, overwrite, threads)
        self._window.update(dict.fromkeys(with_grad))  # only now: a rejected call changes nothing
        return bad

    # ---- internals ----------------------------------------------------------------------------
    def _pack(self, inv_scale, created, grads=None):
        """Hypers and segments of every param with a gradient (p.grad, or grads[p] when given)."""
        hypers, segments = [], []
        for gi, group in enumerate(self.param_groups):
            hypers.append(self._hyper(group))
            needed = self._needed_slots(group)
            for j, p in enumerate(group["params"]):
                g = p.grad if grads is None else grads.get(p)
                if g is not None:
                    segments.append(self._segment(p, g, gi, j, needed, inv_scale, created))
        return hypers, segments

    def _has_master(self, p: torch.Tensor) -> bool:
        return self._master_weights and p.dtype in _LOW_PRECISION

    def _state_dtype(self, p: torch.Tensor) -> torch.dtype:
        if self._state_dtype_option is not None:
            return self._state_dtype_option
        return torch.float32 if self._has_master(p) else p.dtype

    def _segment(self, p, g, gi, j, needed, inv_scale, created) -> tuple:
        """One parameter as the engine's Segment tuple (src/python/module.cc), creating its state on
        its first step like torch does. `created` collects (state, key) of new entries.

        This runs for every param on every step, so it first tries the entry cached by the last
        step: valid while the param's memory, its state tensors (objects and memory) and the group's
        needs are the same (the grad may be new each step: its dtype, shape and layout are checked)."""
        c = self._segment_cache.get(p)
        if c is not None and c[0] == needed and c[1] == p.data_ptr() and (c[4] is None or c[4] == p._version):
            state = self.state.get(p)
            intact = state is c[2]
            for key, t, address in c[3]:
                intact = intact and state.get(key) is t and t.data_ptr() == address
            if intact and not g.is_sparse and g.is_contiguous() and g.shape == c[6]:
                gcode = DTYPE_CODES.get(g.dtype)
                grad_ptr = g.data_ptr()
                if gcode is not None:
                    if c[7] is not None and grad_ptr != c[7]:  # flatten=True and p.grad was replaced
                        g = self._flat.place_grad(p)
                        grad_ptr, gcode = g.data_ptr(), DTYPE_CODES[g.dtype]
                    return (c[1], grad_ptr, gcode, inv_scale) + c[5]
        return self._segment_slow(p, g, gi, j, needed, inv_scale, created)

    def _segment_slow(self, p, g, gi, j, needed, inv_scale, created) -> tuple:
        if self._flat is not None:  # (never with accumulation: g is p.grad)
            # Re-combine a param or grad replaced since the last step. If that needs a new layout,
            # the segments packed so far point into the old one.
            if self._flat.place(p):
                raise _Relaid
            g = p.grad
        if g.is_sparse:
            raise RuntimeError(self._sparse_message)
        pcode = DTYPE_CODES.get(p.dtype)
        gcode = DTYPE_CODES.get(g.dtype)
        if pcode is None or gcode is None or not (p.is_contiguous() and g.is_contiguous()):
            name = self._name(gi, j)
            check_param(p, name)
            pcode = dtype_code(p, f"parameter {name}")
            gcode = dtype_code(g, f"the gradient of parameter {name}")
            check_same_layout(g, p, f"the gradient of parameter {name}")
        if g.shape != p.shape:
            raise ValueError(f"fusedopt: the gradient of parameter {self._name(gi, j)} has shape "
                             f"{tuple(g.shape)} but the parameter has {tuple(p.shape)}")
        if p not in self.state:
            created.append((self.state, p))
        state = self.state[p]
        sdtype = self._state_dtype(p)
        ptrs = [0, 0, 0]
        fresh_buffer = False
        for slot, (key, need) in enumerate(zip(self._slot_keys, needed)):
            if need:
                t, fresh = self._ensure_state(p, state, key, sdtype, gi, j, created)
                ptrs[slot] = t.data_ptr()
                fresh_buffer |= fresh
        step_ptr, step = 0, 0
        if self._counts_steps:
            s = state.get("step")
            if not (isinstance(s, torch.Tensor) and s.dtype == torch.float32 and s.device.type == "cpu"
                    and s.numel() == 1):
                if s is None:
                    created.append((state, "step"))
                s = torch.tensor(0.0 if s is None else float(s), dtype=torch.float32)
                state["step"] = s
            step_ptr = s.data_ptr()
        else:
            step = 1 if fresh_buffer else 2  # SGD: a new momentum buffer starts as a copy of d
        master = 0
        if self._has_master(p):
            if self._param_marks.get(p) != (p.data_ptr(), p._version):
                # First step, or the param was changed outside the optimizer (a model checkpoint
                # loaded into it, p.data = ...): the master copy restarts from the param.
                state.pop("master_param", None)
            self._param_marks[p] = (p.data_ptr(), p._version)  # our raw writes leave both as they are
            master = self._ensure_state(p, state, "master_param", torch.float32, gi, j, created)[0].data_ptr()
        # SGD's next steps find the buffer made by this one.
        tail = (ptrs[0], ptrs[1], ptrs[2], master, p.numel(), pcode, DTYPE_CODES[sdtype], gi, step_ptr,
                2 if not self._counts_steps and step == 1 else step) + self._rounding + (self._global_offset(p),)
        keys = [k for k, need in zip(self._slot_keys, needed) if need]
        keys += ["step"] if self._counts_steps else []
        keys += ["master_param"] if master else []
        tensors = tuple((k, state[k], state[k].data_ptr()) for k in keys)
        grad_slot = self._flat.grad_slot_address(p) if self._flat is not None else None
        self._segment_cache[p] = (needed, p.data_ptr(), state, tensors, p._version if master else None,
                                  tail, p.shape, grad_slot)
        return (p.data_ptr(), g.data_ptr(), gcode, inv_scale) + tail[:9] + (step,) + tail[10:]

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

    def _ensure_state(self, p, state, key, dtype, gi, j, created):
        """state[key] as the engine needs it: dtype, size, p's memory layout and, with flatten=True,
        its slot in the flat buffer. A loaded or replaced tensor is converted or moved; a missing one
        is created (zeros, Adagrad's initial value, or the param itself for master_param).
        Returns (tensor, whether it was created)."""
        t = state.get(key)
        if t is not None and t.dtype == dtype and t.numel() == p.numel() and (
                t.stride() == p.stride() or (t.is_contiguous() and p.is_contiguous())) and (
                self._flat is None or self._flat.in_slot(p, key, t)):
            return t, False
        if t is not None and t.numel() != p.numel():
            raise ValueError(f"fusedopt: state '{key}' of parameter {self._name(gi, j)} has "
                             f"{t.numel()} elements but the parameter has {p.numel()}")
        fill = self._initial_state_value(key)
        new = self._flat.state_slot(p, key, dtype, fill) if self._flat is not None else None
        if new is None:
            new = torch.empty_like(p, dtype=dtype, memory_format=torch.preserve_format)
        if t is not None:
            new.copy_(t.reshape(p.shape))
        elif key == "master_param":
            new.copy_(p.detach())
        elif not (key == "momentum_buffer" and not self._counts_steps):  # SGD's is filled by the step
            new.fill_(fill)
        if t is None:
            created.append((state, key))
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


class _Relaid(Exception):
    """FlatStore.combine() ran while a step was being packed."""


class _Skipped(Exception):
    """The step's pre-pass found non-finite gradients: nothing was updated."""


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
