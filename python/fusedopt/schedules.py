"""Learning-rate schedules as pure functions of the step (the C++ closed forms of fusedopt._C).

A :class:`Schedule` maps a step to an lr: ``s(t)`` is the lr after ``t`` scheduler steps, exactly where torch's
scheduler would have put it (``t`` is torch's ``last_epoch``; ``s(0)`` is the lr before the first optimizer
step). Schedules have no state, so they can be evaluated at any step, shared and composed::

    from fusedopt import schedules

    s = schedules.warmup_cosine(3e-4, warmup_steps=100, total_steps=10_000, min_lr=3e-5)
    s(0), s(100), s(10_000)

    # The same, spelled with torch's schedulers:
    s = schedules.sequential_lr([schedules.linear_lr(3e-4, start_factor=1 / 3, total_iters=100),
                                 schedules.cosine_annealing_lr(3e-4, T_max=9_900, eta_min=3e-5)],
                                milestones=[100])

To drive an optimizer, :class:`FunctionalLR` is a ``torch.optim.lr_scheduler.LRScheduler`` that builds one
schedule per param group from the group's initial lr and sets ``lr`` (and, for one-cycle, ``momentum`` or
``betas[0]``) on every ``step()``::

    sched = schedules.FunctionalLR(opt, lambda lr: schedules.warmup_cosine(lr, 100, 10_000))
    for batch in data:
        ...
        opt.step()
        sched.step()

Factories take torch's keyword names and defaults; each one names the torch scheduler it reproduces. Invalid
arguments raise ValueError naming the argument. See docs/schedules.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, Union

import torch

from . import _C

Schedule = _C.Schedule

__all__ = ["Schedule", "constant", "constant_lr", "linear_lr", "cosine_annealing_lr", "step_lr",
           "multi_step_lr", "exponential_lr", "polynomial_lr", "one_cycle_lr", "sequential_lr",
           "warmup_cosine", "FunctionalLR"]


def constant(lr: float) -> Schedule:
    """lr at every step."""
    return _C.constant(lr)


def constant_lr(base_lr: float, factor: float = 1.0 / 3, total_iters: int = 5) -> Schedule:
    """torch ConstantLR: base_lr * factor for t < total_iters, then base_lr."""
    return _C.constant_lr(base_lr, factor=factor, total_iters=total_iters)


def linear_lr(base_lr: float, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
              total_iters: int = 5) -> Schedule:
    """torch LinearLR: base_lr * (start_factor + (end_factor - start_factor) * min(t, total_iters) / total_iters)."""
    return _C.linear_lr(base_lr, start_factor=start_factor, end_factor=end_factor, total_iters=total_iters)


def cosine_annealing_lr(base_lr: float, T_max: int, eta_min: float = 0.0) -> Schedule:  # noqa: N803
    """torch CosineAnnealingLR: eta_min + (base_lr - eta_min) * (1 + cos(pi * t / T_max)) / 2 (not clamped:
    past T_max it rises again, as torch's does)."""
    return _C.cosine_annealing_lr(base_lr, T_max=T_max, eta_min=eta_min)


def step_lr(base_lr: float, step_size: int, gamma: float = 0.1) -> Schedule:
    """torch StepLR: base_lr * gamma ** (t // step_size)."""
    return _C.step_lr(base_lr, step_size=step_size, gamma=gamma)


def multi_step_lr(base_lr: float, milestones: Sequence[int], gamma: float = 0.1) -> Schedule:
    """torch MultiStepLR: base_lr * gamma ** (number of milestones <= t). Milestones must be non-decreasing."""
    return _C.multi_step_lr(base_lr, milestones=list(milestones), gamma=gamma)


def exponential_lr(base_lr: float, gamma: float) -> Schedule:
    """torch ExponentialLR: base_lr * gamma ** t."""
    return _C.exponential_lr(base_lr, gamma=gamma)


def polynomial_lr(base_lr: float, total_iters: int = 5, power: float = 1.0) -> Schedule:
    """torch PolynomialLR: base_lr * (1 - min(t, total_iters) / total_iters) ** power."""
    return _C.polynomial_lr(base_lr, total_iters=total_iters, power=power)


def one_cycle_lr(max_lr: float, total_steps: int | None = None, epochs: int | None = None,
                 steps_per_epoch: int | None = None, pct_start: float = 0.3, anneal_strategy: str = "cos",
                 cycle_momentum: bool = True, base_momentum: float = 0.85, max_momentum: float = 0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4, three_phase: bool = False) -> Schedule:
    """torch OneCycleLR; with cycle_momentum, ``s.momentum(t)`` is the cycled momentum (or Adam's beta1).

    Like torch, the schedule is defined for 0 <= t <= total_steps and raises ValueError past that. The
    schedule starts from max_lr / div_factor: it does not depend on the optimizer's lr.
    """
    if total_steps is None:
        if epochs is None or steps_per_epoch is None:
            raise ValueError("You must define either total_steps OR (epochs AND steps_per_epoch)")
        for name, value in (("epochs", epochs), ("steps_per_epoch", steps_per_epoch)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"Expected positive integer {name}, but got {value}")
        total_steps = epochs * steps_per_epoch
    return _C.one_cycle_lr(max_lr, total_steps=total_steps, pct_start=pct_start,
                           anneal_strategy=anneal_strategy, cycle_momentum=cycle_momentum,
                           base_momentum=base_momentum, max_momentum=max_momentum, div_factor=div_factor,
                           final_div_factor=final_div_factor, three_phase=three_phase)


def sequential_lr(schedulers: Sequence[Schedule], milestones: Sequence[int]) -> Schedule:
    """torch SequentialLR: schedulers[i] runs from milestones[i-1] on, restarted at its own step 0."""
    return _C.sequential_lr(list(schedulers), milestones=list(milestones))


def warmup_cosine(base_lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0,
                  warmup_start_factor: float = 1.0 / 3) -> Schedule:
    """Linear warmup from warmup_start_factor * base_lr to base_lr over warmup_steps, then cosine annealing to
    min_lr at total_steps: sequential_lr([linear_lr(base_lr, warmup_start_factor, 1, warmup_steps),
    cosine_annealing_lr(base_lr, total_steps - warmup_steps, min_lr)], [warmup_steps])."""
    return _C.warmup_cosine(base_lr, warmup_steps=warmup_steps, total_steps=total_steps, min_lr=min_lr,
                            warmup_start_factor=warmup_start_factor)


ScheduleSpec = Union[Schedule, Callable[[float], Schedule]]


class FunctionalLR(torch.optim.lr_scheduler.LRScheduler):
    """Drives an optimizer's param groups from fusedopt schedules, as torch's schedulers do.

    ``schedule`` is a :class:`Schedule` (used as is for every group), a callable ``base_lr -> Schedule``
    (called with each group's ``initial_lr``, e.g. ``lambda lr: warmup_cosine(lr, 100, 10_000)`` or
    ``functools.partial(cosine_annealing_lr, T_max=1000)``), or a list with one of those per group. Each
    ``step()`` sets ``group["lr"] = schedule(last_epoch)``; schedules with momentum (one_cycle_lr) also set
    ``betas[0]`` when the optimizer has betas, else ``momentum``. state_dict() holds torch's scheduler fields
    only (the schedules are rebuilt from ``base_lrs`` when loaded), so it pickles like any scheduler's.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: ScheduleSpec | Sequence[ScheduleSpec],
                 last_epoch: int = -1) -> None:
        n = len(optimizer.param_groups)
        specs = list(schedule) if isinstance(schedule, (list, tuple)) else [schedule] * n
        if len(specs) != n:
            raise ValueError(f"schedule must have the same length as optimizer.param_groups. "
                             f"schedule has {len(specs)} values, param_groups has {n}.")
        for i, s in enumerate(specs):
            if not isinstance(s, Schedule) and not callable(s):
                raise TypeError(f"schedule[{i}] is neither a fusedopt Schedule nor a callable: {s!r}")
        self._specs = specs
        self._schedules = None
        self._use_beta1 = "betas" in optimizer.defaults
        self._needs_momentum_key = "momentum" in optimizer.defaults or self._use_beta1
        super().__init__(optimizer, last_epoch)

    @property
    def schedules(self) -> list[Schedule]:
        """The schedule of each param group (built from base_lrs on first use)."""
        if self._schedules is None:
            built = []
            for i, (spec, base_lr) in enumerate(zip(self._specs, self.base_lrs)):
                s = spec if isinstance(spec, Schedule) else spec(float(base_lr))
                if not isinstance(s, Schedule):
                    raise TypeError(f"schedule factory for param group {i} returned {type(s).__name__}, "
                                    "not a fusedopt Schedule")
                if s.has_momentum and not self._needs_momentum_key:
                    raise ValueError("optimizer must support momentum or beta1 with `cycle_momentum` option "
                                     "enabled")
                built.append(s)
            self._schedules = built
        return self._schedules

    def get_lr(self) -> list[float]:
        t = self.last_epoch
        lrs = []
        for group, s in zip(self.optimizer.param_groups, self.schedules):
            lrs.append(s(t))
            if s.has_momentum:
                if self._use_beta1:
                    group["betas"] = (s.momentum(t), *group["betas"][1:])
                else:
                    group["momentum"] = s.momentum(t)
        return lrs

    _get_closed_form_lr = get_lr  # the same pure function; used by the deprecated step(epoch)

    def state_dict(self) -> dict:
        return {k: v for k, v in super().state_dict().items() if k not in ("_specs", "_schedules")}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._schedules = None  # rebuilt from the loaded base_lrs
