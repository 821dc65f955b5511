"""Checkpoints that survive a crash and resume bit for bit: one safetensors file with everything a run needs.

    fusedopt.save_checkpoint(opt, "ckpt/step-100.safetensors", model=model, scaler=scaler, scheduler=sched)
    fusedopt.load_checkpoint(opt, "ckpt/step-100.safetensors", model=model, scaler=scaler, scheduler=sched)

The file (docs/checkpoints.md) is written and read by the engine's own reader/writer (src/checkpoint/checkpoint_file.cc,
the same for C++ and Python): tensors under PyTorch's flattened names (`state.<i>.exp_avg`, `model.<name>`,
`accumulator.<i>`), and a JSON metadata record: format version, the optimizer's class and algorithm, its
param_groups, the layout (each param's shape and dtype) and its hash, the loss scaler's and the LR scheduler's
state, the accumulation window, stochastic rounding's seed, the world size. An XXH3 checksum covers the whole
file. Writes are durable: a temporary file in the same folder, fsync, rename, fsync of the folder, so a crash at
any instant leaves the previous checkpoint whole.

Loading checks everything before it changes anything: a file that is corrupted or truncated, of another
algorithm or layout, or without the part asked for, raises ValueError saying what differs, and the optimizer,
model, scaler and scheduler stay exactly as they were.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import torch

from . import _C
from ._base import FusedOptimizerMixin
from ._names import algorithm_name
from .distributed import DistributedOptimizer

__all__ = ["save_checkpoint", "load_checkpoint", "read_checkpoint", "FORMAT"]

FORMAT = 1  # the metadata's "fusedopt_checkpoint": what this code writes and reads
_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
           torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}
_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPES.items()}


class _Writer:
    """Tensors to write, by name, and JSON-able metadata; a tensor inside the metadata becomes {"tensor": name}."""

    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}

    def add(self, name: str, t: torch.Tensor) -> dict:
        if t.dtype not in _DTYPES:
            raise ValueError(f"fusedopt.save_checkpoint: {name} has dtype {t.dtype}, which a checkpoint does not "
                             f"hold (it holds {', '.join(map(str, _DTYPES))})")
        if t.is_complex() or t.is_sparse or t.device.type != "cpu":
            raise ValueError(f"fusedopt.save_checkpoint: {name} is not a dense CPU tensor")
        self.tensors[name] = t.detach().contiguous()
        return {"tensor": name}

    def value(self, name: str, v: Any) -> Any:
        """v as JSON: tensors stored by name, tuples marked (so they come back as tuples), non-finite floats
        spelled out (JSON has none)."""
        if isinstance(v, torch.Tensor):
            return self.add(name, v)
        if isinstance(v, float) and not math.isfinite(v):
            return {"float": repr(v)}
        if isinstance(v, tuple):
            return {"tuple": [self.value(f"{name}.{k}", x) for k, x in enumerate(v)]}
        if isinstance(v, list):
            return [self.value(f"{name}.{k}", x) for k, x in enumerate(v)]
        if isinstance(v, dict):
            if not all(isinstance(k, (str, int)) for k in v):
                raise ValueError(f"fusedopt.save_checkpoint: {name} has keys that are not str or int")
            # int keys are marked: JSON object keys are strings
            return {"dict": [[k, self.value(f"{name}.{k}", x)] for k, x in v.items()]}
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        raise ValueError(f"fusedopt.save_checkpoint: {name} is a {type(v).__name__}, which a checkpoint does not "
                         "hold (tensors, numbers, strings, lists, tuples and dicts of them)")


def _decode(v: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(v, list):
        return [_decode(x, tensors) for x in v]
    if isinstance(v, dict):
        if "tensor" in v:
            return tensors[v["tensor"]]
        if "float" in v:
            return float(v["float"])
        if "tuple" in v:
            return tuple(_decode(x, tensors) for x in v["tuple"])
        if "dict" in v:
            return {k: _decode(x, tensors) for k, x in v["dict"]}
    return v


def _params(optimizer) -> list[torch.Tensor]:
    return [p for g in optimizer.param_groups for p in g["params"]]


def _layout(optimizer) -> list:
    return [[len(g["params"]) for g in optimizer.param_groups],
            [[list(p.shape), str(p.dtype).removeprefix("torch.")] for p in _params(optimizer)]]


def _hash(layout: list) -> str:
    return _C.checkpoint_layout_hash(json.dumps(layout, separators=(",", ":")))


def _fused_window(optimizer, writer: _Writer) -> dict | None:
    """A fused optimizer's accumulation window (accumulation_steps > 1): its f32 sums and where it stands."""
    if not isinstance(optimizer, FusedOptimizerMixin):
        return None
    index = {p: i for i, p in enumerate(_params(optimizer))}
    return {"micro_batches": optimizer._micro_batches, "found_inf": optimizer._window_found_inf,
            "window": [index[p] for p in optimizer._window],
            "sums": {str(index[p]): writer.add(f"accumulator.{index[p]}", t)
                     for p, t in optimizer._accumulators.items() if p in index},
            "torch_sums": {str(index[p]): writer.add(f"torch_sum.{index[p]}", t)
                           for p, t in optimizer._torch_sums.items() if p in index}}


def save_checkpoint(optimizer: torch.optim.Optimizer, path: str | os.PathLike, *, model: torch.nn.Module | None = None,
                    scaler: Any = None, scheduler: Any = None, extra: dict | None = None) -> None:
    """Writes the optimizer's state (and the model's params and buffers, the GradScaler's and the LR scheduler's
    state when given; `extra`: JSON-able values and tensors of the caller's, e.g. a training loop's counters)
    to `path`, durably: the previous file at `path`, if any, stays whole until the new one is complete.
    Without a model the optimizer's params are written too, as the C++ Optimizer writes its own (load_checkpoint
    then restores them; a C++ run continues from such a file). A fusedopt.distributed.DistributedOptimizer:
    every rank calls it (the state is consolidated from every rank's shard) and rank 0 writes the whole state,
    which any world size loads."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"fusedopt.save_checkpoint: optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if isinstance(optimizer, DistributedOptimizer):
        if optimizer._micro_batches:
            raise ValueError("fusedopt.save_checkpoint: a DistributedOptimizer inside an accumulation window (its "
                             "sums are spread over the ranks); save at a window boundary")
        state_dict = optimizer.consolidate_state_dict(to=0)
        if optimizer._rank != 0:
            return
    else:
        state_dict = optimizer.state_dict()
    writer = _Writer()
    state = {str(i): {k: writer.value(f"state.{i}.{k}", v) for k, v in s.items()}
             for i, s in state_dict["state"].items()}
    layout = _layout(optimizer)
    inner = optimizer._inner if isinstance(optimizer, DistributedOptimizer) else optimizer
    meta = {
        "fusedopt_checkpoint": FORMAT,
        "algorithm": algorithm_name(inner),
        "optimizer_class": type(inner).__name__,
        "param_groups": writer.value("param_groups", state_dict["param_groups"]),
        "state": state,
        "layout": layout,
        "layout_hash": _hash(layout),
        "world_size": getattr(optimizer, "_world", 1),
        "accumulation": _fused_window(inner, writer),
        "stochastic_rounding": list(getattr(inner, "_rounding", (False, 0))),
        "scaler": None if scaler is None else writer.value("scaler", scaler.state_dict()),
        "scheduler": None if scheduler is None else writer.value("scheduler", scheduler.state_dict()),
        "model": None if model is None else [writer.add(f"model.{k}", v)["tensor"]
                                             for k, v in model.state_dict().items()],
        # Without a model the optimizer's params travel in the file, as the C++ Optimizer's (which owns them) do.
        "params": None if model is not None else [writer.add(f"param.{i}", p)["tensor"]
                                                  for i, p in enumerate(_params(optimizer))],
        "extra": writer.value("extra", extra or {}),
    }
    # Widest dtype first (as safetensors' own writer does): each tensor then starts at a multiple of its
    # element size, so the reader can view it in place.
    ordered = sorted(writer.tensors.items(), key=lambda item: -item[1].element_size())
    tensors = [(name, _DTYPES[t.dtype], list(t.shape), t.data_ptr(), t.numel() * t.element_size())
               for name, t in ordered]
    _C.write_checkpoint(os.fspath(path), json.dumps(meta, allow_nan=False), tensors)


class Checkpoint:
    """A verified checkpoint file: its metadata and tensors (views into the file's data, read once)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        raw = _C.read_checkpoint(self.path)  # the format, the checksum and every offset are checked here
        view = memoryview(raw)
        data = torch.frombuffer(view, dtype=torch.uint8) if len(view) else torch.empty(0, dtype=torch.uint8)
        self.tensors = {}
        for name, dtype, shape, offset, nbytes in raw.tensors:
            piece = data[offset:offset + nbytes]
            if offset % max(1, _TORCH_DTYPES[dtype].itemsize):  # written by another writer: copy to align
                piece = piece.clone()
            self.tensors[name] = piece.view(_TORCH_DTYPES[dtype]).view(shape)
        try:
            self.meta = json.loads(raw.metadata)
        except ValueError as e:
            raise ValueError(f"{self.path}: the checkpoint's metadata is not JSON ({e})") from None
        version = self.meta.get("fusedopt_checkpoint") if isinstance(self.meta, dict) else None
        if version != FORMAT:
            raise ValueError(f"{self.path}: not a fusedopt checkpoint of format {FORMAT} (it says {version!r})")

    def get(self, key: str) -> Any:
        return _decode(self.meta.get(key), self.tensors)


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Reads and verifies a checkpoint file without loading it into anything (e.g. to inspect it)."""
    return Checkpoint(path)


def load_checkpoint(optimizer: torch.optim.Optimizer, path: str | os.PathLike, *, model: torch.nn.Module | None = None,
                    scaler: Any = None, scheduler: Any = None) -> dict:
    """Restores what save_checkpoint (or a C++ SaveCheckpoint) wrote into the given objects; returns the `extra`
    it was saved with. Everything is checked first: on any error nothing has changed. Without a model, params
    saved in the file (no model was saved, or a C++ Optimizer's) are loaded into the optimizer's params."""
    ckpt = path if isinstance(path, Checkpoint) else Checkpoint(path)
    where = ckpt.path
    inner = optimizer._inner if isinstance(optimizer, DistributedOptimizer) else optimizer
    meta = ckpt.meta
    if meta["algorithm"] != algorithm_name(inner):
        raise ValueError(f"{where}: a checkpoint of {meta['optimizer_class']} ({meta['algorithm']}); this optimizer "
                         f"is {type(inner).__name__} ({algorithm_name(inner)})")
    # The C++ Optimizer (fusedopt::Optimizer<>) knows element counts, not torch's shapes.
    _check_layout(where, meta["layout"], _layout(optimizer),
                  by_numel=meta["optimizer_class"].startswith("fusedopt::Optimizer<"))
    state_dict = {"state": {int(i): {k: _decode(v, ckpt.tensors).clone() if isinstance(v, dict) and "tensor" in v
                                     else _decode(v, ckpt.tensors) for k, v in s.items()}
                            for i, s in meta["state"].items()},
                  # A key the file lacks (a C++ writer knows the algorithm's hyper-parameters, not torch's
                  # implementation flags such as foreach) keeps this optimizer's value.
                  "param_groups": [{**{k: v for k, v in here.items() if k != "params"}, **saved}
                                   for here, saved in zip(optimizer.param_groups, ckpt.get("param_groups"))]}
    saved_params = None
    if model is None and meta.get("params") is not None:
        saved_params = [ckpt.tensors[name] for name in meta["params"]]
    model_state = None
    if model is not None:
        if meta["model"] is None:
            raise ValueError(f"{where}: the checkpoint holds no model state")
        model_state = {name.removeprefix("model."): ckpt.tensors[name] for name in meta["model"]}
        _check_model(where, model, model_state)
    for what, obj in (("scaler", scaler), ("scheduler", scheduler)):
        if obj is not None and meta[what] is None:
            raise ValueError(f"{where}: the checkpoint holds no {what} state")
    window = meta.get("accumulation")
    if window is not None and window["micro_batches"] and not isinstance(inner, FusedOptimizerMixin):
        raise ValueError(f"{where}: the checkpoint is inside an accumulation window of a fused optimizer")
    # Everything checked: now change things. The model first: the optimizer's f32 masters, loaded after it,
    # are then the truth for the params it just wrote (see FusedOptimizerMixin.load_state_dict).
    if model_state is not None:
        model.load_state_dict(model_state)
    if saved_params is not None:
        with torch.no_grad():
            for p, saved in zip(_params(optimizer), saved_params):
                p.copy_(saved.view(p.shape))
    optimizer.load_state_dict(state_dict)
    if window is not None and isinstance(inner, FusedOptimizerMixin):
        params = _params(inner)
        inner._micro_batches, inner._window_found_inf = window["micro_batches"], window["found_inf"]
        inner._window = dict.fromkeys(params[i] for i in window["window"])
        inner._accumulators = {params[int(i)]: _decode(t, ckpt.tensors).clone() for i, t in window["sums"].items()}
        inner._torch_sums = {params[int(i)]: _decode(t, ckpt.tensors).clone() for i, t in window["torch_sums"].items()}
    if scaler is not None:
        scaler.load_state_dict(ckpt.get("scaler"))
    if scheduler is not None:
        scheduler.load_state_dict(ckpt.get("scheduler"))
    return ckpt.get("extra")


def _check_layout(where: str, saved: list, here: list, by_numel: bool = False) -> None:
    (saved_groups, saved_params), (groups, params) = saved, here
    if saved_groups != groups:
        raise ValueError(f"{where}: the checkpoint's optimizer has param groups of {saved_groups} params; this one "
                         f"has {groups}")
    for i, (a, b) in enumerate(zip(saved_params, params)):
        if by_numel and a[1] == b[1] and math.prod(a[0]) == math.prod(b[0]):
            continue
        if a != b:
            raise ValueError(f"{where}: parameter {i} is {a[1]} of shape {tuple(a[0])} in the checkpoint, {b[1]} of "
                             f"shape {tuple(b[0])} here")


def _check_model(where: str, model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    mine = model.state_dict()
    missing, unexpected = sorted(set(mine) - set(saved)), sorted(set(saved) - set(mine))
    if missing or unexpected:
        raise ValueError(f"{where}: the checkpoint's model differs: missing {missing[:5]}, unexpected "
                         f"{unexpected[:5]}")
    for k, t in mine.items():
        if t.shape != saved[k].shape or t.dtype != saved[k].dtype:
            raise ValueError(f"{where}: model entry {k!r} is {saved[k].dtype} {tuple(saved[k].shape)} in the "
                             f"checkpoint, {t.dtype} {tuple(t.shape)} here")
