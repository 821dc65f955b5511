"""State creation with its undo log: each param's state tensors as the engine needs them (dtype, size, layout,
flat slot), created on a param's first step as torch creates them; every dict change a step makes is logged first,
so that a failed or skipped step leaves no trace (_roll_back)."""

from __future__ import annotations

import math

import torch

from . import _C
from ._shards import factor_state
from ._tensors import is_dense, is_dtensor, local, number_error, shard_of

_LOW_PRECISION = (torch.float16, torch.bfloat16)
# The largest state['step'] the engine takes (src/python/module.cc): every f32 below it is an exact
# int64, with room to count on.
_MAX_STEP = 2.0**62
# The per-param count that keys stochastic rounding's noise for an algorithm without torch's state['step'].
ROUNDING_STEP = "rounding_step"
_ABSENT = object()  # in an undo log: the key was not there


class StateCreation:
    """The FusedOptimizerMixin part that creates and converts per-param state."""

    def _has_master(self, p: torch.Tensor) -> bool:
        return self._master_weights and p.dtype in _LOW_PRECISION

    def _state_dtype(self, p: torch.Tensor) -> torch.dtype:
        """The dtype of p's states; torch.uint8: 8-bit block-wise codes, each with an f32 absmax tensor."""
        if p.is_complex():  # states of p's dtype, as torch keeps them
            return p.dtype
        option = self._state_dtype_option
        if option is torch.uint8:
            # bitsandbytes' policy: small tensors (biases, norms) keep full states, their memory is negligible
            # (a ZeRO-1 shard's piece goes by its whole tensor's size: _dist_shard.py)
            numel = p.numel() if self._whole_numels is None else self._whole_numels.get(p, p.numel())
            if numel >= self._min_8bit_size:
                return torch.uint8
            option = None
        if option is not None:
            return option
        return torch.float32 if self._has_master(p) else p.dtype

    def _absmax_key(self, key: str) -> str:
        """The state key of the f32 absmax tensor (one value per block of _C.quant_block) of 8-bit state[key]."""
        return key + "_absmax"

    def _signed_map(self, key: str) -> bool:
        """Whether 8-bit state[key] uses bitsandbytes' signed map ("dynamic"), else the unsigned one ("udynamic"):
        the algorithm's choice (_C.algorithms[name]["unsigned_map_states"], one bit per state slot)."""
        return not self._unsigned_maps >> self._slot_keys.index(key) & 1

    def _dequantized(self, codes: torch.Tensor, absmax: torch.Tensor, key: str, what: str) -> torch.Tensor:
        """The f32 values of 8-bit codes (laid out as `codes`, blocks in its memory order) with their absmax; of a
        DTensor's codes (their blocks counted in this rank's shard), a DTensor laid out as the codes."""
        if is_dtensor(codes):
            from torch.distributed.tensor import DTensor

            out = self._dequantized(local(codes), absmax, key, what)
            return DTensor.from_local(out, codes.device_mesh, codes.placements, run_check=False, shape=codes.shape,
                                      stride=codes.stride())
        blocks = -(-codes.numel() // _C.quant_block)
        if not (isinstance(absmax, torch.Tensor) and absmax.numel() == blocks and absmax.is_floating_point()):
            raise ValueError(f"fusedopt: {what} holds 8-bit codes but its absmax ('{self._absmax_key(key)}') is "
                             f"{_describe(absmax)}; it needs {blocks} floating values (one per {_C.quant_block})")
        if not is_dense(codes):
            raise ValueError(f"fusedopt: {what} holds 8-bit codes that are not dense in memory "
                             f"(strides {codes.stride()})")
        absmax = absmax.detach().to(torch.float32).contiguous()
        out = torch.empty_like(codes, dtype=torch.float32, memory_format=torch.preserve_format)
        _C.dequantize(codes.data_ptr(), absmax.data_ptr(), codes.numel(), self._signed_map(key), out.data_ptr())
        return out

    @staticmethod
    def _codes_role(key: str) -> str:
        """The flat buffer (flatten=True) of the 8-bit codes of state[key]: not key's own, which holds the f32 values
        of the params under min_8bit_size."""
        return key + "/codes"

    def _ensure_quantized(self, p, state, key, gi, j, undo, hyper):
        """state[key] as 8-bit codes laid out as p (with flatten=True, in their slot of the flat uint8 buffer), with
        state[_absmax_key(key)] its f32 absmax: as it is when it already is; codes outside their flat slot are
        copied into it, their absmax kept; else made from what is there (codes of another layout or a 16-bit absmax,
        an f32 state of an optimizer without 8-bit states), or from the slot's initial value when missing. A
        block's codes never span two params: each param's blocks start at its own first element (a DTensor's: at
        its shard's first element on this rank; the absmax, one per block of the shard, a plain tensor).
        Returns (codes, absmax, whether the state was created)."""
        akey = self._absmax_key(key)
        t, a = state.get(key), state.get(akey)
        if t is not None and t.dtype != torch.uint8 and is_dtensor(p) and t.shape == p.shape:
            t = shard_of(t, p)  # (values, as a DTensor's 8-bit states are exported: StateCreation._exported)
        blocks = -(-local(p).numel() // _C.quant_block)
        what = f"state '{key}' of parameter {self._name(gi, j)}"
        if t is not None and t.numel() != p.numel():
            raise ValueError(f"fusedopt: {what} has {t.numel()} elements but the parameter has {p.numel()}")
        if t is not None and t.dtype == torch.uint8:
            if (isinstance(a, torch.Tensor) and a.dtype == torch.float32 and a.numel() == blocks
                    and a.is_contiguous() and a.device == p.device
                    and (t.stride() == p.stride() or (t.is_contiguous() and p.is_contiguous()))):
                if self._flat is None or self._flat.in_slot(p, self._codes_role(key), t):
                    return t, a, False
                slot = self._flat.state_slot(p, self._codes_role(key), torch.uint8, 0)  # in_slot knows p
                slot.copy_(t.reshape(p.shape))
                undo.append((state, key, t))
                state[key] = slot
                return slot, a, False
            t = self._dequantized(t, a, key, what)
        values = torch.empty_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
        if t is None:
            values.fill_(self._initial_state_value(key, self.param_groups[gi], p, hyper))
        else:
            values.copy_(t.detach().reshape(p.shape))
        codes = self._flat.state_slot(p, self._codes_role(key), torch.uint8, 0) if self._flat is not None else None
        if codes is None:
            codes = torch.empty_like(p, dtype=torch.uint8, memory_format=torch.preserve_format)
        absmax = torch.empty(blocks, dtype=torch.float32, device=p.device)
        _C.quantize(local(values).data_ptr(), local(p).numel(), self._signed_map(key), local(codes).data_ptr(),
                    absmax.data_ptr())
        for k, new in ((key, codes), (akey, absmax)):  # a failed step puts the loaded tensors back
            undo.append((state, k, state.get(k, _ABSENT)))
            state[k] = new
        return codes, absmax, t is None

    def _count_key(self) -> str | None:
        """The state key of the per-param step count the engine reads and advances: torch's 'step', or for an
        algorithm without one (SGD, Lion, LARS) under stochastic rounding 'rounding_step', which keys the noise
        so that it changes every step; None where nothing is counted."""
        if self._counts_steps:
            return "step"
        return ROUNDING_STEP if self._rounding[0] else None

    def _ensure_count(self, state: dict, key: str, gi: int, j: int, undo: list) -> torch.Tensor:
        """state[key] as torch keeps state['step']: a one-element f32 CPU tensor the engine reads and writes
        back, 0 when missing; a loaded value of another kind (an int, a tensor of another dtype) is converted
        after its check."""
        s = state.get(key)
        count = 0.0 if s is None else self._step_count(s, key, gi, j)
        if not (isinstance(s, torch.Tensor) and s.dtype == torch.float32 and s.device.type == "cpu"
                and s.numel() == 1):
            undo.append((state, key, _ABSENT if s is None else s))
            s = torch.tensor(count, dtype=torch.float32)
            state[key] = s
        return s

    def _step_count(self, s, key: str, gi: int, j: int) -> float:
        """The value of a state['step'] or state['rounding_step'] (e.g. loaded from a state_dict), checked
        before the engine converts it to an integer."""
        what = f"state['{key}'] of parameter {self._name(gi, j)}"
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

    def _ensure_state(self, p, state, key, dtype, gi, j, undo, hyper=None):
        """state[key] as the engine needs it: dtype, size, p's memory layout and, with flatten=True,
        its slot in the flat buffer. A loaded or replaced tensor is converted or moved; a missing one
        is created (the slot's initial value under `hyper`, the group's Hyper, or the param itself for
        master_param, with hyper None).
        Returns (tensor, whether it was created)."""
        shape = self._state_shape(p, key)
        if shape is not None:
            return self._ensure_shaped_state(p, state, key, dtype, shape, gi, j, undo)
        t = state.get(key)
        if t is not None and is_dtensor(p) and t.shape == p.shape:  # as torch.optim keeps it: a DTensor laid out as p
            shard = shard_of(t, p)
            if shard is not t:
                undo.append((state, key, t))
                state[key] = t = shard
        if t is not None and t.dtype == dtype and t.numel() == p.numel() and (
                t.stride() == p.stride() or (t.is_contiguous() and p.is_contiguous())) and (
                self._flat is None or self._flat.in_slot(p, key, t)):
            return t, False
        old = t
        if t is not None and t.dtype == torch.uint8 and key != "master_param":
            # 8-bit codes (a state_dict of 8-bit states, or a param now under min_8bit_size): their values
            akey = self._absmax_key(key)
            t = self._dequantized(t, state.get(akey), key, f"state '{key}' of parameter {self._name(gi, j)}")
            undo.append((state, akey, state.pop(akey)))
        if t is not None and t.numel() != p.numel():
            raise ValueError(f"fusedopt: state '{key}' of parameter {self._name(gi, j)} has "
                             f"{t.numel()} elements but the parameter has {p.numel()}")
        fill = self._initial_state_value(key, self.param_groups[gi], p, hyper)
        new = self._flat.state_slot(p, key, dtype, fill) if self._flat is not None else None
        if new is None:
            new = torch.empty_like(p, dtype=dtype, memory_format=torch.preserve_format)
        if t is not None:
            new.copy_(t.reshape(p.shape))
        elif key == "master_param":
            new.copy_(p.detach())
        elif not (key == "momentum_buffer" and not self._counts_steps):  # SGD's is filled by the step
            new.fill_(fill)
        undo.append((state, key, _ABSENT if old is None else old))  # a failed step puts a loaded tensor back
        state[key] = new
        return new, t is None

    def _ensure_shaped_state(self, p, state, key, dtype, shape, gi, j, undo):
        """As _ensure_state, for a state of another shape than p's (Adafactor's row_var and col_var): contiguous,
        created with zeros; a loaded one of the same number of elements is converted or reshaped."""
        t = state.get(key)
        if is_dtensor(p):  # (a shard of a tensor cut along its first dimension: _shards.shards_fit)
            new = factor_state(p, t, key, dtype)
            if new is not t:
                undo.append((state, key, _ABSENT if t is None else t))
                state[key] = new
            return new, t is None
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

    def _exported(self, state_dict: dict) -> dict:
        """state_dict (torch's, of this optimizer) with the 8-bit states of DTensor params as their f32 values, a
        DTensor of the param's layout each, and no absmax: each rank's absmax counts the blocks of its own shard,
        which a DCP checkpoint (which reshards DTensors and keeps one copy of a plain tensor) could not restore. A
        load quantizes them again at the next step: bit for bit the same codes where the shards are the same."""
        index: dict[torch.Tensor, int] = {}
        for group in self.param_groups:
            for p in group["params"]:
                index.setdefault(p, len(index))
        for p, i in index.items():
            entry = state_dict["state"].get(i)
            if not is_dtensor(p) or not entry:
                continue
            codes = [k for k, v in entry.items() if isinstance(v, torch.Tensor) and v.dtype == torch.uint8
                     and self._absmax_key(k) in entry]
            if codes:
                entry = dict(entry)  # (torch's state_dict holds the optimizer's own dicts)
                for k in codes:
                    entry[k] = self._dequantized(entry[k], entry.pop(self._absmax_key(k)), k, f"state '{k}'")
                state_dict["state"][i] = entry
        return state_dict

    def _f32_states_to_keep(self, state_dict: dict) -> dict:
        """What torch's load_state_dict would cast to each param's dtype and must not: by param index, copies of
        the f32 master copies and moments of 16-bit params (master_weights=True), of every 8-bit state (uint8 codes,
        which torch casts to a floating param's dtype) with its f32 absmax, and of state['rounding_step'] (a
        count that a bf16 param's dtype would round)."""
        params = [p for g in self.param_groups for p in g["params"]]
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        keep = {}
        for pid, sid in enumerate(saved_ids):
            if pid >= len(params):
                continue
            entry = state_dict["state"].get(sid, {})
            kept = {}
            if self._master_weights and params[pid].dtype in _LOW_PRECISION:
                kept = {k: v.detach().to(torch.float32, copy=True) for k, v in entry.items()
                        if k != "step" and isinstance(v, torch.Tensor) and v.is_floating_point()}
            count = entry.get(ROUNDING_STEP)
            if isinstance(count, torch.Tensor) and count.is_floating_point():  # a count, not a bf16 value
                kept[ROUNDING_STEP] = count.detach().to(torch.float32, copy=True)
            for k, v in entry.items():
                if isinstance(v, torch.Tensor) and v.dtype == torch.uint8:
                    kept[k] = v.detach().clone()
                    absmax = entry.get(self._absmax_key(k))
                    if isinstance(absmax, torch.Tensor) and absmax.is_floating_point():
                        kept[self._absmax_key(k)] = absmax.detach().to(torch.float32, copy=True)
            if kept:
                keep[pid] = kept
        return keep


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"a {t.dtype} tensor of {t.numel()} elements"
    return "missing" if t is None else f"a {type(t).__name__}"


def _roll_back(undo: list) -> None:
    """Undoes the dict changes of a failed or skipped step, newest first: entries it created are
    removed, tensors it replaced (e.g. a loaded f32 state converted to state_dtype) put back."""
    for d, key, old in reversed(undo):
        if old is _ABSENT:
            d.pop(key, None)
        else:
            d[key] = old
