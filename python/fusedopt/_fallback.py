"""Routing and fallback: which params take the reference's own (unfused) step and why, and that step run for
them alone (cut-down param groups, gradients handed in, everything put back when either part of the step fails)."""

from __future__ import annotations

import math
import os
import sys
import warnings
from itertools import chain
from typing import Callable

import torch

from . import _C
from ._packing import _Packed
from ._shards import shards_fit
from ._signals import _Skipped
from ._tensors import (
    dtensor_route_reason,
    grad_route_reason,
    is_dtensor,
    local,
    partial_over_shards,
    route_error,
    route_reason,
    shard_of,
    whole,
)

_LIBRARY_DIRS = (os.path.dirname(__file__), os.path.dirname(torch.__file__))  # see _user_stacklevel


class TorchFallback:
    """The FusedOptimizerMixin part that steps the params the engine cannot take with the reference's own step."""

    def _route(self, p: torch.Tensor, g: torch.Tensor, gi: int, j: int) -> str | None:
        """Why param p (with grad g) takes torch's own step at this step, or None: the fused path.
        With strict=True that is an error instead; so is a sparse grad where the reference refuses
        it too (with its error)."""
        if g.is_sparse and not self._takes_sparse:
            raise RuntimeError(f"parameter {self._name(gi, j)}: {self._sparse_message}")
        if self.defaults.get("differentiable", False):
            return "differentiable=True (the fused step records no autograd graph)"
        route = self._dtensor_route(p, g) if is_dtensor(p) else route_reason(p) or grad_route_reason(g, p)
        if route is None:
            return None
        if self._strict:
            if g.is_sparse:
                raise RuntimeError(f"parameter {self._name(gi, j)}: {self._sparse_message}")
            raise route_error(route, self._name(gi, j))
        return route[1]

    def _dtensor_route(self, p: torch.Tensor, g: torch.Tensor) -> tuple[type, str] | None:
        """route_reason for a DTensor param p (FSDP2, tensor parallel) with gradient g: the engine steps its local
        shard where the update is element-wise, LAMB's, LARS's and BertAdam's with their per-tensor sums added up
        over the ranks, and AdamP's and Adafactor's with their whole tensors' row sums and factors so, where p is
        cut along its first dimension only (_shards.py). Theirs of params cut otherwise take the reference's step
        on whole copies (_WholeStandIns)."""
        if self._steps_whole_copies and not (self._step_over_shards is not None and shards_fit(p, self._factored)):
            return TypeError, (f"it is a DTensor and the '{self._algorithm}' step reduces over whole tensors, of "
                               "which this rank holds a shard (the reference steps a whole copy on every rank)")
        return dtensor_route_reason(p, g)

    def _step_with_torch(self, packed: _Packed, grad_scale: float, found_out, grads: dict | None = None) -> None:
        """A step where some params take the reference's own step (packed.routed; see _torch_step)
        and the rest the engine's, or where the engine steps DTensor shards whose gradients must be checked
        or clipped as whole tensors (over every rank's shards). What spans both partitions is done here, once for all params,
        before either runs: the Inf/NaN check for fusedopt.GradScaler and the global norm of
        max_grad_norm (torch's clip_grad_norm_ norm, in double); the clip coefficient then scales the
        gradients of both, as the engine folds it into grad_scale. The engine checks the
        hyper-parameters before any update (a call without segments); then torch's step runs, then the
        engine's, so that a failure of either puts the routed params back (see _torch_step). The gradients are the
        params' .grad, or grads[p] when given (as _update takes them)."""
        self._warn_routed(packed.routed)
        self.last_grad_norm = None
        clip = self._max_grad_norm != math.inf

        def grad_of(p):  # (grads: the f32 sums of an accumulation window, or fusedopt.distributed's)
            return p.grad if grads is None else grads[p]

        if clip or found_out is not None:
            norm = _grad_norm([grad_of(p) for p in dict.fromkeys(chain(packed.params, packed.routed))],
                              self._norm_code) * grad_scale
            if clip:
                self.last_grad_norm = norm
            if not math.isfinite(norm):
                if found_out is not None:
                    found_out.fill_(1.0)
                raise _Skipped
            if clip:
                # (the engine's own factor, in f32: torch's clip_grad_norm_ or apex FusedLAMB's, by _clip_rule)
                grad_scale *= _C.clip_coefficient(norm, self._max_grad_norm, self._clip_rule)
        self._check_hypers(packed.hypers)

        def engine():
            if packed.grads:
                self._engine(packed, grad_scale, False, max_grad_norm=math.inf)

        if not packed.routed:  # (DTensor params: only the checks needed every rank's gradients)
            engine()
            return
        if grad_scale == 1.0:
            self._torch_step({p: grad_of(p) for p in packed.routed}, then=engine)
        else:  # as torch's GradScaler.unscale_ multiplies, by an f32 factor
            factor = torch.tensor(grad_scale, dtype=torch.float32)
            self._torch_step({p: grad_of(p) * factor.to(grad_of(p).device) for p in packed.routed}, then=engine)

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
        their .grad set, for its duration. DTensor params of an algorithm that reduces over whole tensors
        take it on whole copies (_WholeStandIns)."""
        stand_ins = _WholeStandIns(self.state, grads if self._steps_whole_copies else {})
        groups = self.param_groups
        kept = [g["params"] for g in groups]
        amp = {k: self.__dict__.pop(k) for k in ("grad_scale", "found_inf") if k in self.__dict__}
        own = {p: p.grad for p in grads}
        swapped: list = []
        try:
            for p, g in grads.items():
                _give_grad(*stand_ins.of(p, g), swapped)
            for g in groups:
                g["params"] = [stand_ins.of(p)[0] for p in g["params"] if p in grads]
            self._reference_step()
            stand_ins.keep_shards()
        finally:
            stand_ins.drop()
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
            # (every FusedOptimizerMixin is a TorchFallback; the twin and its bases are not)
            if step is not None and cls is not torch.optim.Optimizer and not issubclass(cls, TorchFallback):
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



class _WholeStandIns:
    """Plain whole copies of DTensor params for the reference's step, where its DTensor ops would reduce over one
    rank's shard only or refuse an uneven one (AdamP's rows, Adafactor's factors of params cut along columns):
    every rank gathers each param, its gradient and its DTensor states (collectives, which every rank runs alike),
    the reference steps the whole tensors, and each rank keeps its shard of the param and of the states of the
    param's shape (DTensors laid out as the param, as torch.optim makes them). The other states (Adafactor's
    factors, step counts) stay whole, the same on every rank."""

    __slots__ = ("state", "whole")

    def __init__(self, state: dict, grads: dict):
        self.state, self.whole = state, {}
        for p, g in grads.items():
            if not is_dtensor(p):
                continue
            w = p.full_tensor().detach().requires_grad_(p.requires_grad)
            self.whole[p] = (w, whole(g))
            if p in state:
                state[w] = {k: whole(v) if isinstance(v, torch.Tensor) else v for k, v in state[p].items()}

    def of(self, p: torch.Tensor, g: torch.Tensor | None = None) -> tuple:
        """(what the reference steps for p, with gradient g): p's whole copy and gradient, or p and g."""
        return self.whole.get(p, (p, g))

    @torch.no_grad()
    def keep_shards(self) -> None:
        for p, (w, _) in self.whole.items():
            local(p).copy_(shard_of(w, p).to_local())
            entries = self.state.pop(w, None)
            if entries is not None:
                self.state[p] = {k: shard_of(v, p) if isinstance(v, torch.Tensor) and v.dim() and v.shape == p.shape
                                 else v for k, v in entries.items()}

    def drop(self) -> None:
        for w, _ in self.whole.values():
            self.state.pop(w, None)


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
    """The norm of all gradients as one vector (code as norm_type_code), in double. A DTensor gradient's norm is
    that of its whole tensor, the same on every rank: each shard's norm on its rank, combined over the mesh dims
    the tensor is sharded along, one collective for all tensors of a mesh and placements (torch's clip_grad_norm_
    makes one per tensor)."""
    if not grads:
        return 0.0
    order = {2: 2.0, 1: 1.0, 0: math.inf}[code]

    def norm(g):
        return torch.linalg.vector_norm(g.to_dense() if g.is_sparse else g, order,
                                        dtype=torch.complex128 if g.is_complex() else torch.float64)

    norms, sharded = [], {}
    for g in grads:
        if g.device.type == "meta":  # (no values: shape-only, and torch's step takes it)
            continue
        if is_dtensor(g):
            sharded.setdefault((g.device_mesh, tuple(g.placements)), []).append(local(g))
        else:
            norms.append(norm(g).cpu())
    if sharded:
        from torch.distributed.tensor import DTensor

        for (mesh, placements), shards in sharded.items():
            # (each shard's norm ** order, added up (max for inf) over the ranks, then ** (1 / order))
            # (an empty shard, a rank past a tensor's last row, adds 0: torch has no inf norm of no elements)
            local_norms = [norm(t).abs().cpu() if t.numel() else torch.zeros((), dtype=torch.float64) for t in shards]
            powered = torch.stack(local_norms) ** (1.0 if order == math.inf else order)
            op = "max" if order == math.inf else "sum"
            whole = DTensor.from_local(powered, mesh, partial_over_shards(placements, op), run_check=False).full_tensor()
            norms.extend(whole if order == math.inf else whole ** (1.0 / order))
    return float(torch.linalg.vector_norm(torch.stack(norms), order)) if norms else 0.0
