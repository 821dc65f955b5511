"""fusedopt: fused CPU optimizers for PyTorch.

    import fusedopt
    opt = fusedopt.FusedAdamW(model.parameters(), lr=1e-3)   # same arguments as torch.optim.AdamW

Every class is a subclass of its torch.optim twin and updates all parameters in one multi-threaded,
vectorized pass of the C++ engine (fusedopt._C, which talks to tensors through data pointers only).
"""

import pkgutil

import torch  # noqa: F401  (loads torch's OpenMP runtime before the engine's)

# A wheel has _C beside this file; a development build keeps it in <build>/python/fusedopt, which
# scripts/build's .pth file puts on the path.
__path__ = pkgutil.extend_path(__path__, __name__)

from . import _C, distributed, schedules, timeline
from .amp import GradScaler
from .bnb import BNB_CLASSES
from .checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from .clip import clip_grad_norm_, clip_grad_value_
from .optim import FUSED_CLASSES
from .trainer import Model, Trainer

globals().update(FUSED_CLASSES)  # FusedSGD, FusedAdam, ...: one per algorithm of the registry
# FusedAdamW8bit, ...: bitsandbytes' 8-bit optimizers (fusedopt.bnb; attributes, not in __all__, whose
# "Fused*" names are the fused classes of the registry's algorithms)
globals().update(BNB_CLASSES)

__all__ = [*FUSED_CLASSES, "GradScaler", "clip_grad_norm_", "clip_grad_value_", "save_checkpoint", "load_checkpoint",
           "read_checkpoint", "distributed", "schedules", "timeline", "Trainer", "Model", "active_target"]
__version__ = "0.1.0"


def active_target() -> str:
    """The SIMD target the engine dispatches to on this CPU (e.g. "AVX2")."""
    return _C.active_target()
