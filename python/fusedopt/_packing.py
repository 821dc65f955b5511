"""Segments and packing: each param with a gradient as one _C.SegmentRow (its param, states, master copy and step
counter addresses), the step's arguments packed param by param or, when nothing changed, reused in bulk from the
last step (and then, where the groups hold the same values, checked and stepped in one call into C++), and
overlapping params put into waves."""

from __future__ import annotations

import math
import operator

import torch

from . import _C
from ._hypers import _BadNumber
from ._signals import _Relaid
from ._state import _ABSENT
from ._tensors import DTYPE_CODES, first_overlap, grad_shape_error, is_dtensor, local, mark, number_error, shard_offset

_ITEM_SIZES = {0: 4, 1: 2, 2: 2}  # bytes per element of each engine dtype code
# (a complex64 tensor is read as its f32 real view; uint8 states are 8-bit block-wise codes, DType::kQ8)
_ENGINE_CODES = {**DTYPE_CODES, torch.complex64: 0, torch.uint8: 3}
_SPAN = operator.attrgetter("param", "numel", "param_dtype")  # of a _C.SegmentRow
_REQUIRED_STATES = operator.methodcaller("required_states")


def _load_unchanged():
    """fusedopt._unchanged (src/python_torch), the unchanged step's check in C++, when this build has it and it was
    compiled against the torch in use (it reads torch's C++ tensors); else None: every step packs param by param."""
    try:
        from . import _unchanged
    except ImportError:
        return None
    return _unchanged if torch.__version__.split("+")[0] == _unchanged.torch_version else None


_unchanged = _load_unchanged()
# Its check of the state dicts: by their versions (CPython <= 3.11), else by lookups.
_DICT_VERSIONS = _unchanged is not None and _unchanged.dict_versions


# Values a param group may hold that nothing can change in place: the same objects mean the same Hyper.
_IMMUTABLE = frozenset({float, int, bool, str, type(None)})
_PARAM_LISTS = frozenset({"params", "param_names"})  # (a Hyper never reads them)


def _frozen_values(group: dict) -> tuple | None:
    """The group's keys and values, when every value but its param lists is immutable (a float, a tuple of floats,
    ...; not a tensor lr, which may change in place): if the group holds these very objects at a later step, its Hyper
    is the same. Else None."""
    for key, value in group.items():
        if key not in _PARAM_LISTS and not (type(value) in _IMMUTABLE or (
                type(value) is tuple and all(type(item) in _IMMUTABLE for item in value))):
            return None
    return tuple(group), tuple(group.values())


def _same_values(group: dict, frozen: tuple) -> bool:
    """The group holds the keys and the very value objects of _frozen_values' snapshot (a scheduler's new lr is a new
    float: no)."""
    keys, values = frozen
    return len(group) == len(keys) and all(map(operator.is_, group.values(), values)) and tuple(group) == keys


class SegmentPacking:
    """The FusedOptimizerMixin part that turns params, grads and states into the engine's segment table."""

    # The Hyper depends on the group's values alone (see _group_hypers); not where _hyper_arguments reads more.
    _hypers_read_group_only = True

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

    def _group_hypers(self) -> list:
        """Each group's Hyper (see _hyper_arguments): the last step's object where the group holds the very values it
        held then (see _frozen_values) or its arguments are the same, as making one costs more than comparing them."""
        hypers, made = [], []
        last = self._last_hypers
        for gi, group in enumerate(self.param_groups):
            if gi < len(last) and last[gi][2] is not None and _same_values(group, last[gi][2]):
                hypers.append(last[gi][1])
                made.append(last[gi])
                continue
            try:
                arguments = self._hyper_arguments(group)
            except _BadNumber as e:
                raise number_error(f"param_groups[{gi}]{e.field}", e.value, e.index) from None
            same = gi < len(last) and last[gi][0] == arguments
            hypers.append(last[gi][1] if same else self._hyper_type(**arguments))
            made.append((arguments, hypers[-1], _frozen_values(group) if self._hypers_read_group_only else None))
        self._last_hypers = made
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
            needed = self._group_slots(hypers[gi])
            for j, p in enumerate(group["params"]):
                g = p.grad if grads is None else grads.get(p)
                index += 1
                if g is None:
                    packed.none_at.append(index)
                    continue
                mine = self._needed_states(p, needed) if self._factored else needed
                if seen is None:  # the common case, kept as lean as it was
                    segment = self._segment(p, g, gi, j, mine, undo, grads is None, hypers[gi])
                else:
                    if p not in seen:
                        seen[p] = self._segment(p, g, gi, j, mine, undo, grads is None, hypers[gi])
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

    def _group_slots(self, hyper) -> tuple:
        """Which state slots a group's params need under its Hyper (a factored algorithm's params may need fewer:
        _needed_states)."""
        slots = hyper.required_states()
        return tuple(bool(slots >> k & 1) for k in range(len(self._slot_keys)))

    def _step_unchanged(self, inv_scale: float, found_out) -> bool:
        """The common step in one call into C++: when the last step was prepared (see _remember) and each group
        still holds the values its Hyper was made from, _unchanged.LastStep.step checks what _pack_unchanged
        checks and runs the engine on the last step's table itself. True when it did (stepped, or skipped for an
        Inf/NaN its pre-pass found); False when the step must take the ordinary path, none of it done."""
        last = self._last
        if last is None or not last.prepared:
            return False
        outcome = last.check.step(self.param_groups, self.state, self._place_grad(), inv_scale,
                                  torch.get_num_threads(), self._max_grad_norm, self._norm_code, self._clip_rule,
                                  found_out is not None)
        if outcome is None:
            return False
        _, found_inf, self.last_grad_norm = outcome
        if found_inf and found_out is not None:
            found_out.fill_(1.0)
        return True

    def _place_grad(self):
        """With flatten=True and grads in slots, FlatStore.place_grad, which moves a new p.grad into its slot;
        else None."""
        return self._flat.place_grad if self._flat is not None and self._flat.grads_in_slots() else None

    def _pack_unchanged(self, hypers: list) -> _Packed | None:
        """The common step, in bulk: when the same params hold gradients as at the last step() and
        nothing its packing depended on has changed (what _segment's cache entries check, checked for
        all params in one C++ call: _unchanged.LastStep.grads), the last step's segment table with this
        step's gradients. Otherwise None: pack param by param."""
        last = self._last
        if last is None or (not all(map(operator.is_, hypers, last.hypers))
                            and list(map(_REQUIRED_STATES, hypers)) != last.needed):
            return None
        grads = last.check.grads(self.param_groups, self.state, self._place_grad())
        if grads is None:
            return None
        packed = _Packed(hypers)
        packed.params, packed.none_at, packed.table = last.params, last.none_at, last.table
        packed.grads, packed.codes = grads
        return packed

    def _remember(self, packed: _Packed) -> None:
        """After a step packed param by param: what _pack_unchanged checks at the next one. Not
        with a param listed twice or params that overlap (their segments run in waves), nor without
        the _unchanged module (a build without torch's C++ API)."""
        if _unchanged is None or self._duplicates or not self._overlap_free or not isinstance(self.state, dict):
            return
        if any(map(is_dtensor, packed.params)):  # (the C++ check reads tensors' own memory, which a DTensor lacks)
            return
        cached = [self._segment_cache[p] for p in packed.params]
        all_params = [p for group in self.param_groups for p in group["params"]]
        entries = [(c.state, key, t, address) for c in cached for key, t, address in c.tensors]
        none_at = set(packed.none_at)
        # The table of the next steps: the cached rows. They are this step's, except where SGD's
        # first step counted from a fresh buffer (the next ones count from the buffer it made).
        rows = [c.row for c in cached]
        same = packed.table is not None and all(map(operator.is_, rows, packed.rows))
        table = packed.table if same else _C.SegmentTable(rows)
        # The step in one call (_step_unchanged): where the engine's own step runs it and each group's Hyper
        # depends on immutable values alone.
        frozen = [made[2] for made in self._last_hypers]
        prepare = type(self)._engine_prepare
        prepared = (None if prepare is None or not packed.params or len(frozen) != len(packed.hypers)
                    or None in frozen else prepare(packed.hypers, table))
        check = _unchanged.LastStep(
            state=self.state, all_params=all_params,
            group_sizes=[len(group["params"]) for group in self.param_groups],
            has_grad=[i not in none_at for i in range(len(all_params))],
            params=packed.params, shapes=[tuple(c.shape) for c in cached],
            param_ptrs=[c.param_ptr for c in cached], states=[c.state for c in cached],
            entry_dicts=[e[0] for e in entries], entry_keys=[e[1] for e in entries],
            entry_tensors=[e[2] for e in entries], entry_ptrs=[e[3] for e in entries],
            versions=[-1 if c.version is None else c.version for c in cached],
            grad_slots=[c.grad_slot for c in cached] if self._flat is not None and self._flat.grads_in_slots() else [],
            dict_versions=_DICT_VERSIONS, frozen=frozen, prepared=prepared)
        last = _LastStep()
        last.prepared = prepared is not None
        last.hypers, last.needed = packed.hypers, list(map(_REQUIRED_STATES, packed.hypers))
        last.check, last.params, last.none_at, last.table = check, packed.params, packed.none_at, table
        self._last = last

    def _segment(self, p, g, gi, j, needed, undo, own_grad, hyper) -> tuple:
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
        shard = local(p)  # (a DTensor's memory on this rank; a plain tensor itself)
        if c is not None and c.needed == needed and c.group == gi and c.param_ptr == shard.data_ptr() and (
                c.version is None or c.version == shard._version):
            state = self.state.get(p)
            intact = state is c.state
            for key, t, address in c.tensors:
                intact = intact and state.get(key) is t and local(t).data_ptr() == address
            if shard is not p:  # a DTensor: its gradient's shard is what the engine reads, laid out as p's shard
                intact = intact and is_dtensor(g) and g.placements == p.placements
                g = local(g)
            if intact and not g.is_sparse and g.is_contiguous() and g.shape == c.shape:
                gcode = DTYPE_CODES.get(g.dtype)
                grad_ptr = g.data_ptr()
                if gcode is not None:
                    if own_grad and c.grad_slot is not None and grad_ptr != c.grad_slot:  # flatten, new p.grad
                        g = self._flat.place_grad(p)
                        grad_ptr, gcode = g.data_ptr(), DTYPE_CODES[g.dtype]
                    return c.row, grad_ptr, gcode
        return self._segment_slow(p, g, gi, j, needed, undo, own_grad, hyper)

    def _segment_slow(self, p, g, gi, j, needed, undo, own_grad, hyper) -> tuple:
        self._overlap_free = False  # p may have moved: _waves checks the addresses again
        if g.shape != p.shape:  # (also before flatten=True moves the grad into a slot)
            raise grad_shape_error(self._name(gi, j), g, p)
        route = self._route(p, g, gi, j)
        if route is not None:
            return None, route, None
        shard = local(p)
        if self._flat is not None and shard is p:  # (a DTensor's shard stays where FSDP2 or TP keeps it)
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
        quantized = sdtype == torch.uint8
        ptrs, absmax_ptrs = [0, 0, 0], [0, 0, 0]
        fresh_buffer = False
        for slot, (key, need) in enumerate(zip(self._slot_keys, needed)):
            if need and quantized:  # 8-bit codes, and an f32 absmax per block
                t, absmax, fresh = self._ensure_quantized(p, state, key, gi, j, undo, hyper)
                absmax_ptrs[slot] = absmax.data_ptr()
            elif need:
                t, fresh = self._ensure_state(p, state, key, sdtype, gi, j, undo, hyper)
            if need:
                ptrs[slot] = local(t).data_ptr()
                fresh_buffer |= fresh
        step_ptr, step, rounding_ptr = 0, 0, 0
        count_key = self._count_key()
        if self._counts_steps:
            step_ptr = self._ensure_count(state, count_key, gi, j, undo).data_ptr()
        else:
            step = 1 if fresh_buffer else 2  # SGD: a new momentum buffer starts as a copy of d
            if count_key:  # stochastic rounding's noise needs a count all the same (docs/numerics.md)
                rounding_ptr = self._ensure_count(state, count_key, gi, j, undo).data_ptr()
        scalar_ptrs = [0, 0]
        for k, key in enumerate(self._scalar_keys):
            scalar_ptrs[k] = self._ensure_scalar(state, key, gi, j, k, undo).data_ptr()
        master = 0
        if self._has_master(p):
            last_mark = self._param_marks.get(p, _ABSENT)
            if last_mark != mark(p):
                # First step, or the param was changed outside the optimizer (a model checkpoint
                # loaded into it, p.data = ...): the master copy restarts from the param.
                if "master_param" in state:
                    undo.append((state, "master_param", state.pop("master_param")))
                undo.append((self._param_marks, p, last_mark))
            self._param_marks[p] = mark(p)  # our raw writes leave both as they are
            master = local(self._ensure_state(p, state, "master_param", torch.float32, gi, j, undo)[0]).data_ptr()
        def row(step):
            return _C.SegmentRow(param=shard.data_ptr(), states=ptrs, absmax=absmax_ptrs, master=master,
                                 numel=shard.numel() * (2 if p.is_complex() else 1), param_dtype=pcode,
                                 state_dtype=_ENGINE_CODES[sdtype], group=gi, step_counter=step_ptr, step=step,
                                 stochastic_rounding=self._rounding[0], rounding_seed=self._rounding[1],
                                 global_offset=self._global_offset(p), scalars=scalar_ptrs,
                                 rows=rows, cols=cols, rounding_counter=rounding_ptr)

        # AdamP's channel rows: its shard's size(0); Adafactor's matrices: its shard's last two sizes (a shard
        # holding no row of a matrix cut between its rows is no matrix here: _shards.shards_of describes the whole)
        rows = cols = 0
        if self._row_reductions and p.dim() > 1:
            rows = shard.shape[0]
        elif self._factored and p.dim() > 1 and shard.shape[-2] > 0:
            rows, cols = shard.shape[-2], shard.shape[-1]

        now = row(step)
        keys = [k for k, need in zip(self._slot_keys, needed) if need]
        keys += [self._absmax_key(k) for k in keys] if quantized else []  # (a replaced absmax is noticed too)
        keys += [count_key] if count_key else []
        keys += self._scalar_keys
        keys += ["master_param"] if master else []
        tensors = tuple((k, state[k], local(state[k]).data_ptr()) for k in keys)
        if state and attached is None:
            undo.append((self.state, p, _ABSENT))
            self.state[p] = attached = state
        grad_slot = (self._flat.grad_slot_address(p) if self._flat is not None and self._flat.grads_in_slots()
                     and shard is p else None)
        # SGD's next steps find the buffer made by this one.
        self._segment_cache[p] = _Cached(needed, gi, shard.data_ptr(), attached, tensors,
                                         shard._version if master else None, now if step != 1 else row(2),
                                         local(g).shape, grad_slot)
        return now, local(g).data_ptr(), gcode

    def _global_offset(self, p: torch.Tensor) -> int:
        """Index of p's first element in all params of all groups laid end to end: the element index
        that keys stochastic rounding, independent of which params have grads this step."""
        if self._offsets is None:
            self._offsets, total = {}, 0
            for group in self.param_groups:
                for q in group["params"]:
                    self._offsets.setdefault(q, total)
                    total += q.numel()
        if self._rounding[0] and is_dtensor(p):  # where this rank's shard starts (only stochastic rounding reads it)
            return self._offsets[p] + shard_offset(p)
        return self._offsets[p]


class _Packed:
    """One step call's arguments: the groups' hypers and, per segment, its param, its SegmentRow
    and its gradient's address and dtype code; `table`, the _C.SegmentTable of the rows once made;
    `none_at`, the indices (in all groups' params) of the params without a gradient."""

    __slots__ = ("hypers", "params", "rows", "grads", "codes", "table", "none_at", "routed")

    def __init__(self, hypers: list):
        self.hypers, self.table = hypers, None
        self.params, self.rows, self.grads, self.codes, self.none_at = [], [], [], [], []
        self.routed: dict[torch.Tensor, str] = {}  # params that take torch's step: their name and reason



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
    """What _pack_unchanged compares with: the groups' Hypers and the state slots they need, the C++ check of
    everything else (_unchanged.LastStep), and the last step's packed params, params without a
    gradient and segment table; `prepared`: whether the check may run the step itself (_step_unchanged)."""

    __slots__ = ("hypers", "needed", "check", "params", "none_at", "table", "prepared")


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
