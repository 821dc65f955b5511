"""flatten=True (the seeds' "combine_grad"): the params of each dtype, their grads and their
optimizer states become views into one flat buffer per dtype and role. zero_grad(set_to_none=False)
is then one memset per dtype, a distributed all-reduce can take the whole gradient in one call, and
the step streams through contiguous memory.

With step_in_backward=True the grads stay where autograd writes them: each is released right after its update
inside backward, and a flat gradient buffer would only hold a second copy of the model's gradients.

User code may swap any of these tensors out (p.data = ..., p.grad = new tensor, zero_grad with
set_to_none=True followed by a fresh backward, load_state_dict). Before each step the store checks
every tensor's address against its slot and copies a replaced one back into its slot
("re-combines"), so the step never runs on stale memory. Views keep their flat buffer alive, so
params stay valid after the optimizer is gone."""

from __future__ import annotations

import torch

from ._tensors import first_overlap, grad_shape_error, route_reason

_ALIGN_BYTES = 64  # every tensor starts on a cache line


class _Block:
    """The layout of all params of one dtype: element offsets into each flat buffer of the block."""

    def __init__(self, params: list[torch.Tensor], dtype: torch.dtype):
        self.dtype = dtype
        self.offsets: dict[torch.Tensor, int] = {}
        self.shapes = {p: p.shape for p in params}
        align = max(1, _ALIGN_BYTES // torch.empty((), dtype=dtype).element_size())
        total = 0
        for p in params:
            self.offsets[p] = total
            total += -(-p.numel() // align) * align
        self.total = total
        self.buffers: dict[str, torch.Tensor] = {}  # role ("param", "grad", state key) -> flat buffer

    def view(self, role: str, p: torch.Tensor, dtype: torch.dtype, fill: float = 0.0) -> torch.Tensor:
        buf = self.buffers.get(role)
        if buf is None or buf.dtype != dtype:
            buf = torch.full((self.total,), fill, dtype=dtype)
            self.buffers[role] = buf
        start = self.offsets[p]
        shape = self.shapes[p]
        return buf[start:start + shape.numel()].view(shape)


class FlatStore:
    def __init__(self, optimizer):
        self._opt = optimizer
        self._blocks: dict[torch.dtype, _Block] = {}
        self._block_of: dict[torch.Tensor, _Block] = {}
        self.combine()

    def _params(self) -> list[torch.Tensor]:
        """The params the layout holds: all but those that take torch's own step (route_reason),
        which stay where they are."""
        seen, params = set(), []
        for group in self._opt.param_groups:
            for p in group["params"]:
                if id(p) not in seen and route_reason(p) is None:
                    seen.add(id(p))
                    params.append(p)
        return params

    def combine(self) -> None:
        """(Re)builds the layout from the current params and moves params and existing grads into
        it. States move into their slots at the next step. Checks everything before moving anything."""
        params = self._params()
        overlap = first_overlap(params)
        if overlap is not None:
            a, b = (self._name(params[k]) for k in overlap)
            raise ValueError(f"fusedopt: parameters {a} and {b} overlap in memory (views into one storage); "
                             "flatten=True would have to move them into separate slots and break that "
                             "aliasing: use flatten=False")
        for p in params:  # e.g. p.data resized while p.grad kept the old shape
            if p.grad is not None and p.grad.shape != p.shape:
                raise grad_shape_error(self._name(p), p.grad, p)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        self._blocks = {dt: _Block(ps, dt) for dt, ps in by_dtype.items()}
        self._block_of = {p: b for b in self._blocks.values() for p in b.offsets}
        for p in self._block_of:
            self._place_param(p)
            if p.grad is not None and self.grads_in_slots():
                self.place_grad(p)

    def grads_in_slots(self) -> bool:
        """Whether grads move into the flat gradient buffer (not with step_in_backward=True)."""
        return not self._opt._step_in_backward

    def _name(self, p: torch.Tensor) -> str:
        """p's name in error messages (only called on the way to an error)."""
        for gi, group in enumerate(self._opt.param_groups):
            for j, q in enumerate(group["params"]):
                if q is p:
                    return self._opt._name(gi, j)
        return "?"

    def place(self, p: torch.Tensor) -> bool:
        """Re-combines p and its grad if user code replaced either since the last step. Returns
        True if that took a new layout (every param and grad moved)."""
        block = self._block_of.get(p)
        if block is None or p.dtype != block.dtype or p.shape != block.shapes[p]:
            self.combine()  # a new param, or one whose dtype or size changed: lay everything out anew
            return True
        if p.data_ptr() != self._slot_address(block, "param", p):
            self._place_param(p)
        if p.grad is not None and self.grads_in_slots() and not self.grad_in_slot(p, p.grad):
            self.place_grad(p)
        return False

    def grad_slot_address(self, p: torch.Tensor) -> int:
        return self._slot_address(self._block_of[p], "grad", p)

    def grad_in_slot(self, p: torch.Tensor, g: torch.Tensor) -> bool:
        block = self._block_of[p]
        return g.dtype == block.dtype and g.data_ptr() == self._slot_address(block, "grad", p)

    def place_grad(self, p: torch.Tensor) -> torch.Tensor:
        """Copies p.grad into its slot and makes p.grad the slot's view; returns it."""
        block = self._block_of[p]
        view = block.view("grad", p, block.dtype)
        view.copy_(p.grad)
        p.grad = view
        return view

    def grad_buffers(self) -> list[torch.Tensor]:
        for p in list(self._block_of):
            if p.grad is not None and self.place(p):
                return self.grad_buffers()  # laid out anew: start over
        buffers = []
        for block in self._blocks.values():
            if "grad" not in block.buffers:
                block.buffers["grad"] = torch.zeros(block.total, dtype=block.dtype)
            buffers.append(block.buffers["grad"])
        return buffers

    def zero_grad(self) -> None:
        """zero_grad(set_to_none=False): grads that exist are zeroed, those that are None stay None."""
        for p, block in self._block_of.items():
            g = p.grad
            if g is not None and not self.grad_in_slot(p, g):
                p.grad = block.view("grad", p, block.dtype)
        for block in self._blocks.values():
            if "grad" in block.buffers:
                block.buffers["grad"].zero_()
        for group in self._opt.param_groups:  # the params outside the layout, as torch zeroes them
            for p in group["params"]:
                if p.grad is not None and p not in self._block_of:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    def state_slot(self, p: torch.Tensor, key: str, dtype: torch.dtype, fill: float) -> torch.Tensor | None:
        """The flat view where state `key` of p lives (None for a param the layout does not know)."""
        block = self._block_of.get(p)
        return None if block is None else block.view(key, p, dtype, fill)

    def in_slot(self, p: torch.Tensor, key: str, t: torch.Tensor) -> bool:
        block = self._block_of.get(p)
        if block is None or key not in block.buffers or block.buffers[key].dtype != t.dtype:
            return block is None
        return t.data_ptr() == self._slot_address(block, key, p)

    @staticmethod
    def _slot_address(block: _Block, role: str, p: torch.Tensor) -> int:
        buf = block.buffers.get(role)
        return -1 if buf is None else buf.data_ptr() + block.offsets[p] * buf.element_size()

    def _place_param(self, p: torch.Tensor) -> None:
        block = self._block_of[p]
        view = block.view("param", p, block.dtype)
        view.copy_(p.detach())
        marks = self._opt._param_marks
        in_sync = marks.get(p) == (p.data_ptr(), p._version)  # master copy still matches p
        p.data = view
        if in_sync:
            marks[p] = (p.data_ptr(), p._version)
