"""The torch-format state of fusedopt.distributed's ZeRO-1 shards: every rank's shard state merged into whole
tensors (consolidate_state_dict), and a whole state cut into one rank's pieces (load_state_dict). A shard's
state is keyed by the position of its piece; `slices` says, per piece, (the param's index in the wrapped
optimizer, start, stop) in the param's flat elements. A tensor may be cut into several pieces on one rank."""

from __future__ import annotations

import torch


def merge_shards(shards: list[dict], params: list[torch.Tensor]) -> dict:
    """{param index: {key: value}}: each state tensor put together from every rank's pieces (in element order),
    in its param's shape; a 0-d value (a step count) from the first piece."""
    pieces: dict[int, dict[str, list]] = {}
    for shard in shards:
        for n, (i, start, stop) in enumerate(shard["zero"]["slices"]):
            for key, value in shard["state"].get(n, {}).items():
                pieces.setdefault(i, {}).setdefault(key, []).append((start, stop, value))
    state = {}
    for i, keys in pieces.items():
        p = params[i]
        state[i] = {}
        for key, parts in keys.items():
            parts.sort(key=lambda part: part[0])
            value = parts[0][2]
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                value = torch.cat([v.reshape(-1) for _, _, v in parts]).view(p.shape)
            state[i][key] = value
    return state


def cut_state(state: dict, slices: list[tuple[int, int, int]]) -> dict:
    """A whole torch-format state cut into the pieces `slices` names: {piece position: {key: value}}."""
    out = {}
    for n, (i, start, stop) in enumerate(slices):
        entry = state.get(i)
        if entry is None:
            continue
        out[n] = {key: (value.reshape(-1)[start:stop].clone()
                        if isinstance(value, torch.Tensor) and value.dim() > 0 else value)
                  for key, value in entry.items()}
    return out
