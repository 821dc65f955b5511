"""What the fused optimizers share: each class derives from its torch.optim twin (so the
constructor, defaults, validation, param groups, hooks and state_dict format are torch's own) and
replaces step() with one call into the C++ engine that updates every parameter of every group in a
single multi-threaded, vectorized pass.

This module is the torch API (step, state_dict, copies) and the engine call; the mixin's other jobs
are parts of their own: _packing (segments and the step's arguments), _state (state creation and its
undo log), _fallback (routing to the reference's step) and _accumulation (the accumulation window)."""

from __future__ import annotations

import math
from itertools import chain
from typing import Any, Callable

import torch

from . import _C
from ._accumulation import AccumulationWindow
from ._fallback import TorchFallback
from ._flat import FlatStore
from ._hooks import hooked_step
from ._hypers import group_fields, hyper_arguments
from ._in_backward import BackwardStep
from ._packing import SegmentPacking, _Cached, _LastStep, _Packed
from ._shards import step_over_shards, step_with_mesh_sums
from ._signals import _Skipped, packed_anew_until_laid_out
from ._state import StateCreation, _roll_back
from ._tensors import DTYPE_CODES, check_param, is_dtensor, local, mark, shard_of

# What a copy of an optimizer does not take over (besides torch's hooks, which torch's own copies drop too):
# what is rebuilt from the copy's own params (caches keyed by tensor identity or address, the flat layout, the
# master copies' marks: see __setstate__), and the attributes a GradScaler sets for one step.
_NOT_COPIED = frozenset({"_flat", "_param_marks", "_backward_hooks", "_places", "_bucket", "_bucket_bytes", "_segment_cache", "_last", "_last_hypers", "_offsets", "_overlap_free", "_wave_key",
                         "_wave_plan", "_whole_numels", "_zero_grad_profile_name", "_warned_capturable_if_run_uncaptured",
                         "grad_scale", "found_inf", "_found_inf_out"})


class FusedOptimizerMixin(TorchFallback, AccumulationWindow, SegmentPacking, StateCreation, BackwardStep):
    """Put before the torch.optim class in the bases. Subclasses set the class attributes below."""

    _algorithm: str  # the engine's name of the update rule (a key of _C.algorithms)
    _counts_steps = True  # keeps torch's per-param state['step'] (all but SGD, Lion and LARS: the descriptor's)
    _sparse_message = ""  # torch's error text for a sparse gradient
    _clip_rule = 0  # how max_grad_norm clips: 0 torch's clip_grad_norm_, 1 apex FusedLAMB's
    _takes_sparse = False  # the reference's step takes sparse gradients (torch's SGD and Adagrad)
    _per_tensor_state_keys: tuple[str, ...] = ()  # state_dict keys each param holds whole (bitsandbytes' qmaps)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        step = cls.__dict__.get("step")
        if step is not None and not getattr(step, "hooked", False):  # a subclass's own step: the hooks run once
            cls.step = hooked_step(step)
        algorithm = cls.__dict__.get("_algorithm")
        if algorithm is not None:  # what the engine says of it: its step and its state keys
            # _C's entry, or the one a class of another module's algorithm carries (_generic.generic_class)
            entry = cls.__dict__.get("_entry") or _C.algorithms[algorithm]
            cls._engine_step = staticmethod(entry["step"])
            cls._engine_prepare = staticmethod(entry["prepare"])  # the same step with its Hypers and table fixed
            cls._hyper_type = entry["hyper"]
            cls._fields = group_fields(entry)  # torch's group keys of the Hyper's fields
            cls._counts_steps = entry["counts_steps"]  # keeps torch's per-param state['step']
            cls._slot_keys = entry["state_names"]
            cls._scalar_keys = entry["scalar_names"]  # 0-d state tensors the engine advances (mu_product)
            cls._row_reductions = entry["row_reductions"]  # its step reads each param's size(0) (AdamP)
            # its states are shaped by each param's last two dims, and its step reads them (Adafactor)
            cls._factored = entry["factored"]
            # each element's update reads nothing else: any range of elements can step on its own
            cls._element_wise = entry["element_wise"]
            # state_dtype=torch.uint8 (8-bit block-wise states): an element-wise update pass, and each slot's map
            cls._quantizable = entry.get("quantizable", False)
            cls._why_unquantized = entry.get("why_unquantized")  # the engine's reason where it is not
            cls._unsigned_maps = entry.get("unsigned_map_states", 0)
            # LAMB, LARS, BertAdam: the two-phase step whose per-tensor sums a hook completes across the ranks
            # holding a DTensor's shards, and how many sums a segment has (None, 0 for the others)
            sharded = _C.dtensor_sums.get(algorithm, {})
            cls._step_with_sums = staticmethod(sharded.get("step_with_sums"))
            cls._sums_per_segment = sharded.get("reductions", 0)
            # AdamP, Adafactor: their step over DTensor shards cut along their first dimension (_shards.py), else
            # None; their DTensor params cut otherwise take the reference's step on whole copies
            cls._step_over_shards = staticmethod(getattr(_C, f"{algorithm}_step_over_shards", None))
            cls._steps_whole_copies = not cls._element_wise and cls._step_with_sums is None

    def __init__(self, params, *args, master_weights: bool = False, flatten: bool = False,
                 max_grad_norm: float | None = None, norm_type: float = 2.0, accumulation_steps: int = 1,
                 state_dtype: torch.dtype | None = None, min_8bit_size: int = _C.min_8bit_size,
                 stochastic_rounding: bool = False, seed: int = 0, strict: bool = False,
                 step_in_backward: bool = False, **kwargs):
        # strict=False: params (or steps) the engine cannot take go through the reference's own step
        # (see _torch_step); strict=True: they are errors.
        self._strict = bool(strict)
        self._stepping = False  # inside step()'s hooks (see _hooks.hooked_step)
        if self._strict and kwargs.get("differentiable", False):
            raise RuntimeError(f"{type(self).__name__} does not support differentiable=True (strict=True)")
        self._warned: dict[torch.Tensor, None] = {}  # params the torch-step warning has named
        self._warned_left: dict[torch.Tensor, None] = {}  # and step_in_backward's (_in_backward.py)
        if max_grad_norm is not None and not (float(max_grad_norm) >= 0.0):
            raise ValueError(f"Invalid max_grad_norm: {max_grad_norm} (must be >= 0 or None)")
        self._max_grad_norm = math.inf if max_grad_norm is None else float(max_grad_norm)
        self._norm_code = norm_type_code(norm_type)
        if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
            raise ValueError(f"Invalid accumulation_steps: {accumulation_steps!r} (an int >= 1)")
        if state_dtype is not None and state_dtype not in DTYPE_CODES and state_dtype is not torch.uint8:
            raise TypeError(f"fusedopt: invalid state_dtype {state_dtype}; supported dtypes are torch.float32, "
                            "torch.float16, torch.bfloat16 and torch.uint8 (8-bit block-wise states)")
        if isinstance(min_8bit_size, bool) or not isinstance(min_8bit_size, int) or min_8bit_size < 0:
            raise ValueError(f"Invalid min_8bit_size: {min_8bit_size!r} (an int >= 0)")
        if state_dtype is torch.uint8:
            self._check_8bit()
        self._min_8bit_size = min_8bit_size
        if not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ValueError(f"Invalid seed: {seed!r} (an int in [0, 2**64))")
        self._rounding = (bool(stochastic_rounding), seed)
        self._offsets: dict[torch.Tensor, int] | None = None  # see _global_offset
        self._whole_numels: dict[torch.Tensor, int] | None = None  # ZeRO-1 pieces' tensor sizes (_state_dtype)
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
        self._last_hypers: list[tuple[dict, Any, tuple | None]] = []  # see _group_hypers
        self._duplicates = False  # some group lists a param more than once (torch warns, and allows it)
        self._overlap_free = False  # see _waves
        self._wave_key: list | None = None
        self._wave_plan: tuple | None = None
        # step_in_backward's (_in_backward.py): add_param_group hooks new params once _init_backward_step has run
        self._step_in_backward = False
        self._backward_hooks: dict[torch.Tensor, object] = {}
        self._places: dict[torch.Tensor, tuple[int, int]] | None = None  # param -> (group, index)
        self._bucket: list[torch.Tensor] = []  # params whose gradients wait for their update
        self._bucket_bytes = 0
        super().__init__(params, *args, **kwargs)
        self._step_supports_amp_scaling = True  # honours grad_scale / found_inf set by GradScaler
        self._init_backward_step(step_in_backward)  # (first: the flat store asks it where grads live)
        if flatten:
            self._flat = FlatStore(self)

    def _constructor_hypers(self) -> dict:
        """Constructor arguments that build another optimizer of this class whose defaults pass the constructor's
        checks (a ZeRO-1 shard's: its groups then carry every hyper-parameter)."""
        return {"lr": self.defaults["lr"]}

    def _check_8bit(self) -> None:
        """state_dtype=torch.uint8 needs an element-wise update pass (the engine quantizes each block as it updates
        it), after sums over whole tensors at most."""
        if not self._quantizable:
            raise ValueError(f"fusedopt: {type(self).__name__} does not take state_dtype=torch.uint8 (8-bit "
                             f"block-wise states): {self._why_unquantized} ('{self._algorithm}')")

    # ---- what each algorithm defines ----------------------------------------------------------
    def _hyper(self, group: dict) -> Any:
        """The engine's Hyper of param group `group` (see _hyper_arguments)."""
        return self._hyper_type(**self._hyper_arguments(group))

    def _hyper_arguments(self, group: dict) -> dict:
        """The Hyper's keyword arguments: each field read from torch's group key as the descriptor maps it. A
        class whose reference reads a field otherwise (Lion's decoupled decay) adjusts them."""
        return hyper_arguments(self._fields, group)

    def _initial_state_value(self, key: str, group: dict, p: torch.Tensor, hyper) -> float | complex:
        """What a new state[key] of param p (in param group `group`, whose Hyper is `hyper`, None for master_param) is
        filled with: the engine's InitialState of the slot (RMSpropTF's square_avg: 1), 0 for master_param."""
        return 0.0 if hyper is None else hyper.initial_state(self._slot_keys.index(key))

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
        self._places = None
        if self._step_in_backward:
            for p in group["params"]:
                self._hook(p)
        self._overlap_free = False
        self._offsets = None
        self._last = None
        if getattr(self, "_flat", None) is not None:
            self._flat.combine()

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._flat is not None and not set_to_none and not self._step_in_backward:
            self._flat.zero_grad()  # one memset per dtype; grads stay views into the flat buffer
            return
        super().zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        """torch's state_dict; inside an accumulation window also the window (key "fusedopt_window": where it
        stands and its f32 sums, by param index), which load_state_dict takes back and torch.optim ignores."""
        state_dict = self._exported(super().state_dict())
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
                self._accumulators[p] = torch.empty_like(p, dtype=t.dtype if is_dtensor(p) else torch.float32,
                                                         memory_format=torch.preserve_format).copy_(
                                                             shard_of(t, p) if is_dtensor(p) else t)
            self._torch_sums = {params[i]: t.clone() for i, t in window["torch_sums"].items()}
        self._segment_cache.clear()
        self._last = None
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, saved in keep.items():
            p = params[pid]
            self.state[p].update(saved)
            if "master_param" in saved:  # the loaded master is the truth for the current param
                self._param_marks[p] = mark(p)
        # With flatten=True the loaded states move into their flat slots at the next step.

    def flat_grads(self) -> list[torch.Tensor]:
        """flatten=True: the flat gradient buffer of each param dtype, with every current grad moved
        into it first, e.g. to all-reduce a model's gradients in one call per dtype. Slots of params
        whose grad is None hold zeros or stale values and are not read by the step."""
        if self._flat is None:
            raise RuntimeError(f"{type(self).__name__}.flat_grads() needs flatten=True")
        if self._step_in_backward:
            raise RuntimeError(f"{type(self).__name__}.flat_grads(): with step_in_backward=True each gradient is "
                               "released inside backward, right after its update: there is no flat gradient")
        return self._flat.grad_buffers()

    def state_bytes(self) -> int:
        """Bytes of optimizer state this optimizer holds: moments and other per-param states, f32
        master copies, step counters and the f32 gradient sums of accumulation_steps > 1."""
        tensors = [t for s in self.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        tensors += self._accumulators.values()
        return sum(local(t).numel() * t.element_size() for t in tensors)  # (a DTensor's: this rank's shard)

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
                            [p for p, last in self._param_marks.items() if last == mark(p)])
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
                           ("_state_dtype_option", None), ("_min_8bit_size", _C.min_8bit_size), ("_micro_batches", 0),
                           ("_window_found_inf", False), ("last_grad_norm", None),
                           ("_rounding", (False, 0)), ("_offsets", None), ("_whole_numels", None),
                           ("_duplicates", False),
                           ("_overlap_free", False), ("_wave_key", None), ("_wave_plan", None),
                           ("_strict", False), ("_step_in_backward", False), ("_places", None),
                           ("_stepping", False)):
            self.__dict__.setdefault(key, value)
        self.__dict__.setdefault("_accumulators", {})
        self.__dict__.setdefault("_window", {})
        self.__dict__.setdefault("_warned", {})
        self.__dict__.setdefault("_warned_left", {})
        self.__dict__.setdefault("_torch_sums", {})
        self.__dict__["_segment_cache"] = {}
        self.__dict__["_last"] = None
        self.__dict__["_last_hypers"] = []
        self.__dict__["_backward_hooks"] = {}
        self.__dict__["_bucket"], self.__dict__["_bucket_bytes"] = [], 0
        if copied is not None and self._step_in_backward:  # a copy steps its own params in backward
            for group in self.param_groups:
                for p in group["params"]:
                    self._hook(p)
        if copied is not None:  # a copy's params are new tensors: its marks and flat buffers are its own
            flatten, in_sync = copied
            self._param_marks = {p: mark(p) for p in in_sync}
            self._flat = FlatStore(self) if flatten else None

    @hooked_step
    def step(self, closure: Callable[[], Any] | None = None):
        """Performs one fused optimization step over all param groups (see torch.optim)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._close_backward_step()
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
        if grads is None and self._step_unchanged(inv_scale, found_out):
            return
        undo: list = []
        try:
            hypers = self._group_hypers()
            packed = None if grads is not None else self._pack_unchanged(hypers)
            if packed is None:
                self._last = None
                packed = packed_anew_until_laid_out(lambda: self._pack(hypers, undo, grads))
            # (the Inf/NaN check and the norm of clipping span every rank's shards of DTensor params)
            global_checks = (self._max_grad_norm != math.inf or found_out is not None) and any(
                map(is_dtensor, packed.params))
            if packed.routed or global_checks:
                self._step_with_torch(packed, inv_scale, found_out, grads)
            else:
                self._run_engine(packed, inv_scale, found_out is not None, found_out)
                if self._last is None and grads is None:
                    self._remember(packed)
        except BaseException as e:
            _roll_back(undo)  # a rejected or skipped step leaves no trace, not even new state
            if not isinstance(e, _Skipped):
                raise

    def _check_hypers(self, hypers: list) -> None:
        """The engine's checks of the groups' hyper-parameters alone (a call without segments), for work
        done before the engine's own step: a ValueError naming the group and field."""
        type(self)._engine_step(hypers, _C.SegmentTable([]), [], [], 1.0, 1)

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
        over_shards = self._step_with_sums or self._step_over_shards
        if over_shards is not None and any(map(is_dtensor, packed.params)):  # norms over every rank's shards
            if check or max_norm != math.inf or micro_batch is not None or "wave_ends" in kw:
                raise RuntimeError("fusedopt: a step over DTensor shards takes no pre-pass, accumulation or waves "
                                   "(internal error)")
            if self._step_over_shards is not None:
                return step_over_shards(self._step_over_shards, self._factored, packed.params, packed.hypers, table,
                                        grads, codes, grad_scale, torch.get_num_threads())
            return step_with_mesh_sums(self._step_with_sums, self._sums_per_segment, packed.params, packed.hypers,
                                       table, grads, codes, grad_scale, torch.get_num_threads())
        return type(self)._engine_step(packed.hypers, table, grads, codes, grad_scale, torch.get_num_threads(),
                                       max_norm, self._norm_code, self._clip_rule, check, **kw)

    def _name(self, gi: int, j: int) -> str:
        return _param_name(self.param_groups[gi].get("param_names"), gi, j)



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
