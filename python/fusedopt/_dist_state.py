"""The torch-format state of fusedopt.distributed's ZeRO-1 shards: every rank's shard state merged into whole
tensors (consolidate_state_dict), and a whole state cut into one rank's pieces (load_state_dict). A shard's
state is keyed by the position of its piece; `slices` says, per piece, (the param's index in the wrapped
optimizer, start, stop) in the param's flat elements. A tensor may be cut into several pieces on one rank.

`kinds` names the state keys that are not cut element by element: "blocks" for an 8-bit state's absmax (one value
per _C.quant_block elements; pieces of 8-bit states start on block edges), "whole" for what every piece holds
whole (bitsandbytes' qmap). bitsandbytes' nested quant state (a dict inside an entry) is merged and cut key by
key."""

from __future__ import annotations

import torch

from . import _C


def merge_shards(shards: list[dict], params: list[torch.Tensor], kinds: dict) -> dict:
    """{param index: {key: value}}: each state tensor put together from every rank's pieces (in element order),
    in its param's shape; a 0-d value (a step count) from the first piece."""
    pieces: dict[int, dict[str, list]] = {}
    for shard in shards:
        for n, (i, start, stop) in enumerate(shard["zero"]["slices"]):
            for key, value in shard["state"].get(n, {}).items():
                pieces.setdefault(i, {}).setdefault(key, []).append((start, stop, value))
    state = {}
    for i, keys in pieces.items():
        state[i] = {}
        for key, parts in keys.items():
            parts.sort(key=lambda part: part[0])
            state[i][key] = _merged(key, parts, params[i].shape, kinds)
    return state


def _merged(key: str, parts: list, shape: torch.Size, kinds: dict):
    value = parts[0][2]
    if isinstance(value, dict):
        return {k: _merged(k, [(a, b, v[k]) for a, b, v in parts], shape, kinds) for k in value}
    if not isinstance(value, torch.Tensor) or value.dim() == 0 or kinds.get(key) == "whole":
        return value
    whole = torch.cat([v.reshape(-1) for _, _, v in parts])
    return whole if kinds.get(key) == "blocks" else whole.view(shape)


def cut_state(state: dict, slices: list[tuple[int, int, int]], kinds: dict) -> dict:
    """A whole torch-format state cut into the pieces `slices` names: {piece position: {key: value}}."""
    out = {}
    for n, (i, start, stop) in enumerate(slices):
        entry = state.get(i)
        if entry is not None:
            out[n] = {key: _cut(key, value, start, stop, kinds) for key, value in entry.items()}
    return out


def _cut(key: str, value, start: int, stop: int, kinds: dict):
    if isinstance(value, dict):
        return {k: _cut(k, v, start, stop, kinds) for k, v in value.items()}
    if not isinstance(value, torch.Tensor) or value.dim() == 0 or kinds.get(key) == "whole":
        return value
    if kinds.get(key) == "blocks":
        block = _C.quant_block
        if start % block:
            raise RuntimeError(f"fusedopt.distributed: a slice starting at element {start} cuts a block of 8-bit "
                               f"state '{key}' (blocks of {block}: the layout should start every slice on one)")
        return value.reshape(-1)[start // block:-(-stop // block)].clone()
    return value.reshape(-1)[start:stop].clone()
