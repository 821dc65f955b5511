"""What torch.optim wraps around every step() (Optimizer.profile_hook_step: the profiler's label, the step pre- and
post-hooks), done for the fused step at a fifth of the cost. Right after a step has streamed the model through the
caches, torch's wrapper and the torch.no_grad() decorator take ~0.15 ms (record_function dispatches an op even with no
profiler running: 0.1 ms), 10% of a fused step on mobilenet_v1's shapes. Here the label is recorded only while a
profiler runs (torch's own fast check, autograd.profiler._is_profiler_enabled, and its _RecordFunctionFast, which
records it without the dispatch), and the grad mode is set and restored directly: ~0.03 ms."""

from __future__ import annotations

import functools
from itertools import chain

from torch.autograd import profiler
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

import torch

# torch >= 2.2 has the fast one; older torch records through the op, as its own wrapper does
_RecordFunction = getattr(torch._C._profiler, "_RecordFunctionFast", profiler.record_function)


def hooked_step(step):
    """`step` (a method) run as torch's Optimizer.profile_hook_step runs it, and without grad as @torch.no_grad() would:
    the label "Optimizer.step#<class>.step" (while a profiler runs), the global and the optimizer's pre-hooks (which may
    replace the arguments), the step, Optimizer._optimizer_step_code (the profiler's Python tracer's entry), then the
    post-hooks. Marked `hooked`, so torch's Optimizer.__init__ leaves it as it is. A subclass's step wrapped too that
    calls this one (via super()) runs the hooks once: the outer call runs them, the inner one only the step."""

    @functools.wraps(step)
    def wrapper(*args, **kwargs):
        self = args[0]
        if self._stepping:
            return _without_grad(step, args, kwargs)
        self._stepping = True
        try:
            if profiler._is_profiler_enabled:
                with _RecordFunction(f"Optimizer.step#{type(self).__name__}.step"):
                    return _with_hooks(self, step, args, kwargs)
            return _with_hooks(self, step, args, kwargs)
        finally:
            self._stepping = False

    wrapper.hooked = True
    return wrapper


def _with_hooks(self, step, args, kwargs):
    if _global_optimizer_pre_hooks or self._optimizer_step_pre_hooks:  # (most steps have none)
        for pre_hook in chain(_global_optimizer_pre_hooks.values(), self._optimizer_step_pre_hooks.values()):
            result = pre_hook(self, args, kwargs)
            if result is not None:
                if isinstance(result, tuple) and len(result) == 2:
                    args, kwargs = result
                else:
                    raise RuntimeError(f"{step} must return None or a tuple of (new_args, new_kwargs), but got "
                                       f"{result}.")
    out = _without_grad(step, args, kwargs)
    self._optimizer_step_code()
    if self._optimizer_step_post_hooks or _global_optimizer_post_hooks:
        for post_hook in chain(self._optimizer_step_post_hooks.values(), _global_optimizer_post_hooks.values()):
            post_hook(self, args, kwargs)
    return out


def _without_grad(step, args, kwargs):
    enabled = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)
    try:
        return step(*args, **kwargs)
    finally:
        torch._C._set_grad_enabled(enabled)
