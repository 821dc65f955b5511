"""fusedopt.Trainer: a training loop in a few lines (MindSpore's `Model(net, loss_fn, opt).train()`)::

    trainer = fusedopt.Trainer(model, torch.nn.functional.cross_entropy,
                               fusedopt.FusedAdamW(model.parameters(), lr=1e-3, max_grad_norm=1.0),
                               amp_dtype=torch.bfloat16, schedule=fusedopt.schedules.warmup_cosine(
                                   1e-3, warmup_steps=100, total_steps=10_000),
                               checkpoint_dir="ckpt", checkpoint_every=500, trace="trace.json")
    metrics = trainer.train(loader, epochs=3)

It wires mixed precision, loss scaling, gradient accumulation, clipping, the lr schedule, a progress
bar, checkpoints and a timeline (docs/trace-format.md), and works with the fused optimizers and
with any torch.optim optimizer alike. The two differ in where clipping and accumulation happen:

* a fusedopt optimizer does both inside its step (that is the point: no pass writes the gradients),
  so they are part of the optimizer: `FusedAdamW(..., max_grad_norm=1.0, accumulation_steps=4)`.
  The Trainer adopts the optimizer's settings when its own `max_grad_norm` / `accumulation_steps`
  are left at their defaults, and refuses (ValueError) values that contradict them instead of
  silently reconfiguring an optimizer the caller built. Every micro-batch calls `step()`, which
  adds the gradient into the optimizer's f32 accumulators and updates on every k-th call.
* any other optimizer gets the standard recipe: the loss is divided by k and the gradients add up in
  `.grad`; on every k-th micro-batch the loop unscales (GradScaler), calls
  `torch.nn.utils.clip_grad_norm_`, steps and zeroes the gradients.

Either way one `train_step` is one micro-batch and one optimizer update covers `accumulation_steps`
of them; the schedule advances once per update, and checkpoints are written only at update
boundaries (the fused accumulators are not part of a state_dict).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, Callable

import torch

from . import _C
from ._base import FusedOptimizerMixin
from ._names import optimizer_name
from ._names import unwrap as _unwrap
from .amp import GradScaler
from .checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from .distributed import DistributedOptimizer
from .progress import ProgressBar
from .timeline import Tracer

PHASES = ("data", "forward", "backward", "optimizer", "zero_grad")
_AMP_DTYPES = {None: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
_DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64"}


def optimizer_kind(optimizer: torch.optim.Optimizer) -> str:
    """The trace's implementation name: fused (fusedopt), torch_fused (fused=True), foreach, or torch
    (the for-loop; foreach=None also means the for-loop for CPU tensors)."""
    optimizer = _unwrap(optimizer)
    if isinstance(optimizer, FusedOptimizerMixin):
        return "fused"
    if optimizer.defaults.get("fused"):
        return "torch_fused"
    if optimizer.defaults.get("foreach"):
        return "foreach"
    return "torch"


def optimizer_label(optimizer: torch.optim.Optimizer) -> str:
    """A human name for a trace process, e.g. 'torch.optim.AdamW (foreach)'."""
    kind = optimizer_kind(optimizer)
    if isinstance(optimizer, DistributedOptimizer):
        return f"fusedopt.distributed ZeRO-{optimizer._zero} {optimizer_label(optimizer._inner)}"
    if kind == "fused":
        return f"fusedopt.{type(optimizer).__name__}"
    variant = {"torch": "for-loop", "foreach": "foreach", "torch_fused": "fused=True"}[kind]
    return f"torch.optim.{type(optimizer).__name__} ({variant})"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Trainer:
    """Trains `model` on batches `(x, y)` with `loss_fn(model(x), y)` and `optimizer`.

    amp_dtype          None (f32), torch.bfloat16 or torch.float16: forward and loss run under
                       torch.autocast("cpu", dtype=amp_dtype).
    scaler             None, "dynamic" (fusedopt.GradScaler for a fused optimizer,
                       torch.amp.GradScaler("cpu") otherwise) or a torch.amp.GradScaler instance.
    accumulation_steps micro-batches per optimizer update (see the module docstring for fused ones).
    max_grad_norm      clip the global L2 gradient norm to this (None: no clipping).
    schedule           None, a callable update_index -> lr (e.g. a fusedopt.schedules.Schedule; it sets
                       every group's lr before each update) or a torch LRScheduler over `optimizer`
                       (stepped after each update).
    progress           True: a one-line bar on stderr when stderr is a terminal; "always"; False.
    checkpoint_dir, checkpoint_every, keep_last
                       write checkpoint_dir/step-NNNNNNNN.safetensors every `checkpoint_every` updates
                       (NNNNNNNN: micro-batches trained so far; fusedopt.save_checkpoint: durable and
                       checksummed, the accumulation window included), keeping the newest `keep_last` (all:
                       None); resume with load_checkpoint(path). The folder must be writable when the
                       Trainer is built.
    resume             True: continue from the newest checkpoint in checkpoint_dir that verifies
                       (latest_checkpoint(); a file that does not verify is skipped with a warning that says
                       why; a folder without one starts from step 0). False (default): start from step 0,
                       whatever the folder holds; its checkpoints are overwritten as training reaches
                       their steps.
    trace              None, a path (a Chrome trace JSON written at the end of every train() call) or a
                       fusedopt.timeline.Tracer shared with other trainers (its owner writes it).
    name               the model's name in the trace (default: the model's class name).
    distributed        False; True or a dict of fusedopt.distributed.DistributedOptimizer's keyword
                       arguments (zero, bucket_mb, process_group): data-parallel training on the
                       initialized torch.distributed group, the fused optimizer wrapped in a
                       DistributedOptimizer. Give each rank its own share of the data; rank 0 writes the
                       checkpoints (the whole optimizer state, consolidated from every rank's shard).

    `train()` counts micro-batches in `self.step` and updates in `self.updates`; both survive a
    checkpoint.

    Resuming: build the Trainer as for the first run (same model class, optimizer, scaler and
    schedule), with `resume=True` (or call `load_checkpoint(path)`), then call `train()` with the same
    totals: it skips the micro-batches already trained and continues bit for bit::

        trainer = fusedopt.Trainer(model, loss_fn, opt, checkpoint_dir="ckpt", checkpoint_every=500,
                                   resume=True)
        trainer.train(loader, epochs=3)  # epochs / steps count the whole run, not this call
 The fused optimizers' pre-pass (overflow check + global norm) runs inside the C++
    step call, so in Python it is part of the `optimizer` span and has no `pre_pass` span.
    """

    def __init__(self, model: torch.nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer, *,
                 amp_dtype: torch.dtype | None = None, scaler: Any = None, accumulation_steps: int = 1,
                 max_grad_norm: float | None = None, schedule: Any = None, progress: bool | str = True,
                 checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int = 0,
                 keep_last: int | None = None,
                 trace: str | os.PathLike | Tracer | None = None, name: str | None = None,
                 resume: bool = False, distributed: bool | dict = False):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, got {loss_fn!r}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if amp_dtype not in _AMP_DTYPES:
            raise ValueError(f"amp_dtype must be None, torch.bfloat16 or torch.float16, got {amp_dtype!r}")
        if not _is_int(accumulation_steps) or accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be an int >= 1, got {accumulation_steps!r}")
        if max_grad_norm is not None and (isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float))
                                          or not 0 < max_grad_norm < math.inf):
            raise ValueError(f"max_grad_norm must be a positive finite number or None, got {max_grad_norm!r}")
        if progress not in (True, False, "always"):
            raise ValueError(f"progress must be True, False or 'always', got {progress!r}")
        if not _is_int(checkpoint_every) or checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be an int >= 0, got {checkpoint_every!r}")
        if checkpoint_every and checkpoint_dir is None:
            raise ValueError(f"checkpoint_every={checkpoint_every} needs a checkpoint_dir")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {name!r}")
        if not isinstance(resume, bool):
            raise TypeError(f"resume must be True or False, got {resume!r}")
        if resume and checkpoint_dir is None:
            raise ValueError("resume=True needs a checkpoint_dir")
        if keep_last is not None and (not _is_int(keep_last) or keep_last < 1):
            raise ValueError(f"keep_last must be an int >= 1 or None, got {keep_last!r}")

        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        self.fused = isinstance(_unwrap(optimizer), FusedOptimizerMixin)
        self.accumulation_steps, self.max_grad_norm = self._reconcile_fused_options(
            accumulation_steps, None if max_grad_norm is None else float(max_grad_norm))
        self._distribute(distributed)
        self.amp_dtype = amp_dtype
        self.scaler = self._make_scaler(scaler)
        self.schedule_fn, self.lr_scheduler = self._split_schedule(schedule)
        self.progress = progress
        self.checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self.checkpoint_every = checkpoint_every
        self.keep_last = keep_last
        if self.checkpoint_dir is not None:
            self._prepare_checkpoint_dir()
        self.name = name or type(model).__name__
        self.step = 0  # micro-batches trained
        self.updates = 0  # optimizer updates (one per accumulation window)
        self.batch_size: int | None = None
        # Torch's clip_grad_norm_ in the optimizer's own style: per-tensor loop for the for-loop one.
        self._clip_foreach = optimizer_kind(optimizer) in ("foreach", "torch_fused")
        self._trace_path, self.tracer, self.trace_pid = self._make_tracer(trace)
        newest = self.latest_checkpoint(self.checkpoint_dir) if resume else None
        if newest is not None:
            self.load_checkpoint(newest)

    # ---- construction helpers ----------------------------------------------------------------
    def _reconcile_fused_options(self, accumulation_steps: int, max_grad_norm: float | None):
        if not self.fused:
            return accumulation_steps, max_grad_norm
        opt = _unwrap(self.optimizer)
        own_norm = None if opt._max_grad_norm == math.inf else opt._max_grad_norm
        # (a DistributedOptimizer keeps the window itself)
        own_steps = opt._accumulation_steps if opt is self.optimizer else self.optimizer._accumulation_steps
        cls = type(opt).__name__
        if max_grad_norm is not None and max_grad_norm != own_norm:
            raise ValueError(f"max_grad_norm={max_grad_norm!r} but the {cls} was built with max_grad_norm="
                             f"{own_norm!r}: a fused optimizer clips inside its step, so pass "
                             f"{cls}(..., max_grad_norm={max_grad_norm!r}) (the Trainer then adopts it)")
        if accumulation_steps != 1 and accumulation_steps != own_steps:
            raise ValueError(f"accumulation_steps={accumulation_steps!r} but the {cls} was built with "
                             f"accumulation_steps={own_steps}: a fused optimizer accumulates inside its "
                             f"step, so pass {cls}(..., accumulation_steps={accumulation_steps!r})")
        return own_steps, own_norm

    def _distribute(self, distributed: bool | dict) -> None:
        if distributed is False or isinstance(self.optimizer, DistributedOptimizer):
            return
        if not (distributed is True or isinstance(distributed, dict)):
            raise TypeError(f"distributed must be True, False or a dict of DistributedOptimizer's arguments, "
                            f"got {distributed!r}")
        if not self.fused:
            raise ValueError(f"distributed=True needs a fused optimizer (fusedopt.Fused*), got "
                             f"{type(self.optimizer).__name__}; wrap the model in DistributedDataParallel "
                             "for a torch.optim one")
        self.optimizer = DistributedOptimizer(self.optimizer, **({} if distributed is True else distributed))

    def _make_scaler(self, scaler):
        if scaler is None:
            return None
        if scaler == "dynamic":
            return GradScaler() if self.fused else torch.amp.GradScaler("cpu")
        if isinstance(scaler, torch.amp.GradScaler):
            return scaler
        raise ValueError(f"scaler must be None, 'dynamic' or a torch.amp.GradScaler, got {scaler!r}")

    def _split_schedule(self, schedule):
        if schedule is None:
            return None, None
        if isinstance(schedule, torch.optim.lr_scheduler.LRScheduler):
            if schedule.optimizer not in (self.optimizer, _unwrap(self.optimizer)):
                raise ValueError(f"schedule={schedule!r} drives another optimizer than this Trainer's")
            return None, schedule
        if callable(schedule):
            return schedule, None
        raise TypeError(f"schedule must be None, a callable step -> lr or a torch LRScheduler, got {schedule!r}")

    def _make_tracer(self, trace):
        if trace is None:
            return None, None, None
        if isinstance(trace, Tracer):
            tracer, path = trace, None
        elif isinstance(trace, (str, os.PathLike)):
            tracer, path = Tracer(), os.fspath(trace)
        else:
            raise TypeError(f"trace must be None, a path or a fusedopt.timeline.Tracer, got {trace!r}")
        pid = tracer.add_process(optimizer_kind(self.optimizer), optimizer_label(self.optimizer))
        return path, tracer, pid

    # ---- training ------------------------------------------------------------------------------
    def train(self, dataset: Iterable, epochs: int = 1, steps: int | None = None, warmup_steps: int = 0) -> dict:
        """Trains until `epochs` passes over `dataset` or `steps` micro-batches, whichever comes first.

        Both are totals of the whole run, as in a training config: after load_checkpoint() the
        Trainer skips the micro-batches it has already trained and continues to them, so a resumed
        run sees the same batches as an uninterrupted one if `dataset` yields the same batches in
        the same order on every pass. The first `warmup_steps` steps of this call are trained but
        left out of the means (and flagged in the trace).

        Returns {"steps", "updates", "losses" (one per micro-batch of this call), "samples_per_s",
        "step_ms", "phases_ms" {data, forward, backward, optimizer, zero_grad}, "optimizer_ms",
        "total_s"}: trimmed means over the steps after warm-up (None if there were none).
        """
        if not hasattr(dataset, "__iter__"):
            raise TypeError(f"dataset must be an iterable of (x, y) batches, got {type(dataset).__name__}")
        if not _is_int(epochs) or epochs < 1:
            raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
        if steps is not None and (not _is_int(steps) or steps < 1):
            raise ValueError(f"steps must be an int >= 1 or None, got {steps!r}")
        if not _is_int(warmup_steps) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an int >= 0, got {warmup_steps!r}")
        started = time.perf_counter()
        stream = self._batches(dataset, epochs)
        for _ in range(self.step):  # resume: skip what was trained before the checkpoint
            if next(stream, None) is None:
                break
        total = steps
        if hasattr(dataset, "__len__"):
            total = min(x for x in (steps, epochs * len(dataset)) if x is not None)
        bar = ProgressBar(total, self.name, self.progress)
        records: list[dict] = []
        while steps is None or self.step < steps:
            record = self.train_step(stream, warmup=len(records) < warmup_steps)
            if record is None:
                break
            records.append(record)
            bar.update(self.step, self._progress_text(records))
        bar.close(self.step, self._progress_text(records))
        if self._trace_path is not None:
            self.tracer.other_data.update(self.trace_info())
            self.tracer.write(self._trace_path)
        return summarize(records, time.perf_counter() - started) | {"updates": self.updates}

    @staticmethod
    def _batches(dataset: Iterable, epochs: int) -> Iterator:
        for _ in range(epochs):
            yield from dataset

    @staticmethod
    def _progress_text(records: list[dict]) -> str:
        if not records:
            return ""
        last = records[-1]
        return f"loss {last['loss']:.4f}  {last['samples'] / max(last['step_ms'], 1e-9) * 1e3:.1f} samples/s"

    def train_step(self, batches: Iterator, warmup: bool = False) -> dict | None:
        """One micro-batch taken from the iterator `batches`: forward, backward and, at the end of an
        accumulation window, the update (plus a checkpoint when one is due). Returns its record
        {"step", "loss", "samples", "warmup", "updated", "step_ms", "phases_ms"}, or None when
        `batches` is exhausted."""
        t_start = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            return None
        x, y = self._unpack(batch)
        t_data = time.perf_counter()
        amp = torch.autocast("cpu", dtype=self.amp_dtype) if self.amp_dtype else contextlib.nullcontext()
        with amp:
            loss = self.loss_fn(self.model(x), y)
        loss_value = float(loss.detach())
        t_forward = time.perf_counter()
        if not self.fused and self.accumulation_steps > 1:
            loss = loss / self.accumulation_steps  # the fused step divides the sum by k itself
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        t_backward = time.perf_counter()
        updated, zero = self._optimizer_phase()
        t_optimizer = time.perf_counter()
        if zero:
            # Its own phase: releasing the grads (set_to_none) costs the same for every optimizer.
            self.optimizer.zero_grad()
        t_end = time.perf_counter()

        step = self.step
        self.step += 1
        if self.tracer is not None:
            add = self.tracer.add_span
            add(self.trace_pid, "step", t_start, t_end, step=step, warmup=bool(warmup))
            for phase, a, b in (("data", t_start, t_data), ("forward", t_data, t_forward),
                                ("backward", t_forward, t_backward), ("optimizer", t_backward, t_optimizer),
                                ("zero_grad", t_optimizer, t_end)):
                add(self.trace_pid, phase, a, b, step=step)
        if updated and self.checkpoint_every and self.updates % self.checkpoint_every == 0:
            t0 = time.perf_counter()
            self.save_checkpoint(_C.checkpoint_name(self.checkpoint_dir, self.step))
            self._drop_old_checkpoints()
            if self.tracer is not None:
                self.tracer.add_span(self.trace_pid, "checkpoint", t0, time.perf_counter(), step=step)
        samples = len(x) if hasattr(x, "__len__") else 1
        if self.batch_size is None:
            self.batch_size = samples
        ms = lambda a, b: (b - a) * 1e3  # noqa: E731
        return {"step": step, "loss": loss_value, "samples": samples, "warmup": bool(warmup), "updated": updated,
                "step_ms": ms(t_start, t_end),
                "phases_ms": {"data": ms(t_start, t_data), "forward": ms(t_data, t_forward),
                              "backward": ms(t_forward, t_backward), "optimizer": ms(t_backward, t_optimizer),
                              "zero_grad": ms(t_optimizer, t_end)}}

    @staticmethod
    def _unpack(batch):
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise TypeError(f"dataset items must be (x, y) pairs, got {type(batch).__name__}"
                            + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else ""))
        return batch

    def _optimizer_phase(self) -> tuple[bool, bool]:
        """Clipping/unscaling and the update. Returns whether this micro-batch ended an accumulation
        window (an update, or a step skipped by the loss scaler) and whether to zero the grads now."""
        opt, scaler = self.optimizer, self.scaler
        boundary = (self.step + 1) % self.accumulation_steps == 0
        # A fused optimizer goes through step() on every micro-batch: it accumulates, and updates at
        # the boundary; its scaler updates per micro-batch too (an overflow skips the window and backs
        # off at once). Other optimizers step at the boundary, after torch's unscale_ + clip_grad_norm_.
        if self.fused or boundary:
            self._apply_schedule()
            if not self.fused and self.max_grad_norm is not None:
                if scaler is not None:
                    scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(self._params(), self.max_grad_norm, foreach=self._clip_foreach)
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
        if boundary:
            self.updates += 1
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
        return boundary, self.fused or boundary

    def _apply_schedule(self) -> None:
        if self.schedule_fn is None:
            return
        lr = float(self.schedule_fn(self.updates))
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    # ---- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Model, optimizer (with a fused optimizer's accumulation window), scaler, lr scheduler, step
        counters and torch's RNG state (dropout etc.) in one checkpoint file (fusedopt.save_checkpoint),
        written durably. With distributed=..., every rank calls it and rank 0 writes."""
        if self.step % self.accumulation_steps and not self._window_saved():
            raise RuntimeError(f"save_checkpoint: step {self.step} is inside an accumulation window of "
                               f"{self.accumulation_steps} whose gradient sums live outside the optimizer; "
                               "checkpoint at a window boundary")
        extra = {"step": self.step, "updates": self.updates, "rng": torch.get_rng_state()}
        save_checkpoint(self.optimizer, path, model=self.model, scaler=self.scaler, scheduler=self.lr_scheduler,
                        extra=extra)

    def _window_saved(self) -> bool:
        """Whether the optimizer keeps an accumulation window's sums itself (a fused one), so that a
        checkpoint inside the window holds them."""
        return self.fused and not isinstance(self.optimizer, DistributedOptimizer)

    # The checkpoint folder's policy (names, the writability check, stale temporaries, pruning, the newest that
    # verifies) is the C++ one (src/checkpoint/checkpoint_dir.h), shared with the C++ Trainer and `fusedopt train`.
    def _prepare_checkpoint_dir(self) -> None:
        """Makes the folder, checks that it takes a file now (not after the first update has trained), and
        removes the temporary files of saves that a killed run left behind. OSError(errno, ...) if it cannot."""
        _C.prepare_checkpoint_dir(self.checkpoint_dir, f"checkpoint_dir={self.checkpoint_dir!r}")

    def _drop_old_checkpoints(self) -> None:
        if self.keep_last is not None:
            _C.drop_old_checkpoints(self.checkpoint_dir, self.keep_last)  # a file or a whole shard set each

    @staticmethod
    def _checkpoints(checkpoint_dir: str | os.PathLike) -> dict[int, str]:
        """{step: path} of the checkpoints in checkpoint_dir: files, and shard sets by the path they were saved
        at ({} if the folder does not exist)."""
        return _C.list_checkpoints(os.fspath(checkpoint_dir))

    @staticmethod
    def latest_checkpoint(checkpoint_dir: str | os.PathLike) -> str | None:
        """The path of the newest step-NNNNNNNN.safetensors in checkpoint_dir (the highest step; a shard set
        `fusedopt train --dist` saved there counts as one) that verifies (format and checksum), or None if there
        is none or the folder does not exist. Each newer one that does not verify is skipped with a warning
        naming it and why."""
        latest, skipped = _C.latest_checkpoint(os.fspath(checkpoint_dir))
        for why in skipped:
            warnings.warn(f"fusedopt.Trainer: skipping checkpoint {why}", stacklevel=2)
        return latest

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        """Restores a save_checkpoint() file into this Trainer's model, optimizer, scaler and lr
        scheduler; the next train() continues after the checkpoint's step, bit for bit. A file that does
        not fit (another optimizer or model, no scaler state where this Trainer has a scaler, a corrupted
        file) raises ValueError and changes nothing."""
        ckpt = read_checkpoint(path)
        if (ckpt.meta["scaler"] is None) != (self.scaler is None):
            saved, here = ("with", "none") if self.scaler is None else ("without", "one")
            raise ValueError(f"path={os.fspath(path)!r} was saved {saved} a loss scaler, this Trainer has {here}")
        extra = ckpt.get("extra")
        if not isinstance(extra, dict) or not {"step", "updates", "rng"} <= set(extra):
            raise ValueError(f"path={os.fspath(path)!r} is a checkpoint, but not a fusedopt.Trainer one")
        load_checkpoint(self.optimizer, ckpt, model=self.model, scaler=self.scaler, scheduler=self.lr_scheduler)
        torch.set_rng_state(extra["rng"].clone())
        self.step, self.updates = int(extra["step"]), int(extra["updates"])

    # ---- trace ---------------------------------------------------------------------------------
    def trace_info(self) -> dict:
        """The trace's otherData for this run (docs/trace-format.md), without `impls`."""
        group = self.optimizer.param_groups[0]
        first = next(iter(self._params()), None)
        return {"fusedopt_trace": 1, "model": self.name, "optimizer": optimizer_name(self.optimizer),
                "batch_size": self.batch_size, "threads": torch.get_num_threads(),
                "dtype": _AMP_DTYPES[self.amp_dtype],
                "param_dtype": _DTYPE_NAMES.get(first.dtype, str(first.dtype)) if first is not None else None,
                "param_numels": [p.numel() for p in self._params()],
                "lr": float(group["lr"]), "weight_decay": float(group.get("weight_decay", 0.0)),
                "momentum": float(group.get("momentum", 0.0)), "nesterov": bool(group.get("nesterov", False)),
                "max_grad_norm": self.max_grad_norm}


def trimmed_mean(values: list[float], trim: float = 0.1) -> float | None:
    """The mean after dropping int(n * trim) values at each end: robust to a shared machine's hiccups
    like the median, and, unlike medians, additive (the phases' trimmed means about sum to the step's)."""
    if not values:
        return None
    values = sorted(values)
    drop = int(len(values) * trim)
    kept = values[drop:len(values) - drop]
    return sum(kept) / len(kept)


def summarize(records: list[dict], total_s: float) -> dict:
    """The metrics of a list of step records: trimmed means over the non-warm-up steps."""
    timed = [r for r in records if not r["warmup"]]
    step_ms = trimmed_mean([r["step_ms"] for r in timed])
    phases = {p: trimmed_mean([r["phases_ms"][p] for r in timed]) for p in PHASES}
    seconds = sum(r["step_ms"] for r in timed) / 1e3
    return {"steps": len(records), "losses": [r["loss"] for r in records],
            "samples_per_s": sum(r["samples"] for r in timed) / seconds if seconds > 0 else None,
            "step_ms": step_ms, "phases_ms": phases, "optimizer_ms": phases["optimizer"], "total_s": total_s}


Model = Trainer  # MindSpore's name for the same idea: Model(net, loss_fn, optimizer).train(...)
