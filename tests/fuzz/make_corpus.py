"""Writes the seed corpus of the checkpoint reader's fuzz target (tests/fuzz/checkpoint_reader_fuzz.cc) to
tests/fuzz/corpus/, or to the folder given: valid checkpoints (fusedopt.save_checkpoint's and
WriteCheckpointFile's through fusedopt._C), files made wrongly but with a correct checksum (each reaching one
check of the header, the dtypes, shapes or data_offsets), and damaged ones (truncated, a byte changed, a bad
length). Deterministic: the same files every run. Needs the release build's Python module (scripts/build):

    .venv/bin/python tests/fuzz/make_corpus.py
"""

import json
import os
import sys
import tempfile

import fusedopt
from fusedopt import _C

import torch

ZEROS = "0" * 16
KEY = b'"checksum":"xxh3-64:'


def checksum_fixed(raw: bytes) -> bytes:
    """raw with its first checksum's 16 digits set as the reader computes them: XXH3-64 of the whole file with
    those digits read as '0' (_C.checkpoint_layout_hash is XXH3-64 of the bytes given)."""
    at = raw.index(KEY) + len(KEY)
    zeroed = raw[:at] + ZEROS.encode() + raw[at + 16:]
    return zeroed[:at] + _C.checkpoint_layout_hash(zeroed).encode() + zeroed[at + 16:]


def craft(header, data: bytes = b"", fix: bool = True) -> bytes:
    """A file of the layout the reader takes: 8-byte little-endian length, the header (a dict dumped as compact
    JSON, or bytes as they are) padded with spaces to a multiple of 8, the data; its checksum set right."""
    text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    raw = len(text).to_bytes(8, "little") + text + data
    return checksum_fixed(raw) if fix and KEY in raw else raw


def meta(**changes) -> dict:
    m = {"checksum": "xxh3-64:" + ZEROS, "format": "fusedopt.checkpoint", "fusedopt": "{}", "version": "1"}
    m.update(changes)
    return {k: v for k, v in m.items() if v is not None}


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"data_offsets": [begin, end], "dtype": dtype, "shape": shape}


def write(path: str, tensors: list, metadata: str = "{}") -> None:
    """tensors: (name, torch tensor); through the C++ writer (WriteCheckpointFile)."""
    kept = [t.contiguous() for _, t in tensors]
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
             torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}
    _C.write_checkpoint(path, metadata, [(n, names[t.dtype], list(t.shape), t.data_ptr(), t.numel() * t.element_size())
                                         for (n, _), t in zip(tensors, kept)])


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    torch.manual_seed(0)
    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        def made(name: str, save) -> bytes:
            path = os.path.join(tmp, name)
            save(path)
            with open(path, "rb") as f:
                files[name] = f.read()
            return files[name]

        # Valid: fusedopt.save_checkpoint after a step (AdamW with a model; Lion whose params travel in the file).
        model = torch.nn.Linear(3, 2)
        opt = fusedopt.FusedAdamW(model.parameters(), lr=1e-2)
        model(torch.randn(4, 3)).square().sum().backward()
        opt.step()
        adamw = made("valid_adamw_model.safetensors", lambda p: fusedopt.save_checkpoint(opt, p, model=model))
        w = torch.nn.Parameter(torch.randn(5))
        lion = fusedopt.FusedLion([w], lr=1e-3)
        w.grad = torch.randn(5)
        lion.step()
        made("valid_lion_params.safetensors", lambda p: fusedopt.save_checkpoint(lion, p))
        # Valid: WriteCheckpointFile's own: every dtype, a 0-d tensor, empty ones, offsets not aligned.
        every = [("a.u8", torch.arange(3, dtype=torch.uint8)), ("b.f32", torch.randn(2, 2)),
                 ("c.f16", torch.randn(3).half()), ("d.bf16", torch.randn(1, 2).bfloat16()),
                 ("e.f64", torch.tensor(1.5, dtype=torch.float64)), ("f.i64", torch.tensor([-1, 7])),
                 ("g.i32", torch.tensor([[3]], dtype=torch.int32)), ("h.bool", torch.tensor([True, False])),
                 ("i.empty", torch.zeros(0)), ("j.empty", torch.zeros(2, 0, 3, dtype=torch.float16))]
        made("valid_every_dtype.safetensors", lambda p: write(p, every, '{"note":"every dtype"}'))
        made("valid_no_tensors.safetensors", lambda p: write(p, [], ""))
        made("valid_only_empty.safetensors", lambda p: write(p, [("z", torch.zeros(0, dtype=torch.int32))], "[]"))
        made("valid_unicode.safetensors", lambda p: write(p, [("é\u00e9\u4e2d", torch.ones(1))], '"\u00fc"'))
        # Shard set files (ReadCheckpointShards): one rank's whole set; rank 0 of 2 (rank 1 missing); pieces with a
        # gap between them.
        def shard(ranks: int, pieces: list):
            """A writer of rank 0's file of a set of `ranks`: param.0 whole, state.0.exp_avg in `pieces`."""
            record = {"set": "7", "rank": 0, "ranks": ranks,
                      "tensors": [["param.0", "F32", [3]], ["state.0.exp_avg", "F32", [3]]]}
            tensors = [("param.0", torch.arange(3.0))] + [(f"state.0.exp_avg@{first}", torch.ones(n) * first)
                                                          for first, n in pieces]
            return lambda p: write(p, tensors, json.dumps({"fusedopt_checkpoint": 1, "shard": record}))
        for name, ranks, pieces in [("valid_shard_set_of_one", 1, [(0, 2), (2, 1)]),
                                    ("shard_rank_1_of_2_missing", 2, [(0, 2)]),
                                    ("shard_pieces_with_a_gap", 1, [(0, 1), (2, 1)])]:
            made(f"{name}.safetensors", shard(ranks, pieces))

    # Valid, crafted: keys in another order, a header with spaces, tensors listed out of data order.
    files["valid_crafted.safetensors"] = craft(
        {"__metadata__": meta(), "y": entry("U8", [1], 1, 2), "x": entry("U8", [1], 0, 1)}, b"\x01\x02")
    files["valid_spaced_header.safetensors"] = craft(
        b'{ "__metadata__" : {"checksum":"xxh3-64:' + ZEROS.encode() +
        b'", "format":"fusedopt.checkpoint", "fusedopt":"{}", "version":"1"},\n "t":{"dtype":"I32","shape":[],'
        b'"data_offsets":[0,4]} }', b"\x00\x00\x00\x01")


    # Made wrongly, checksum right: each reaches one check after the checksum.
    two = b"\x00" * 8
    wrong = {
        "duplicate_name": b'{"__metadata__":' + json.dumps(meta(), separators=(",", ":")).encode() +
                          b',"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                          b'"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
        "duplicate_field": b'{"__metadata__":' + json.dumps(meta(), separators=(",", ":")).encode() +
                           b',"t":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
        "overlap": {"__metadata__": meta(), "a": entry("F32", [2], 0, 8), "b": entry("F32", [1], 4, 8)},
        "hole": {"__metadata__": meta(), "a": entry("F32", [1], 0, 4), "b": entry("U8", [1], 6, 7)},
        "bytes_left_over": {"__metadata__": meta(), "a": entry("F32", [1], 0, 4)},
        "end_past_data": {"__metadata__": meta(), "a": entry("F64", [2], 0, 16)},
        "begin_after_end": {"__metadata__": meta(), "a": entry("U8", [0], 8, 0)},
        "size_mismatch": {"__metadata__": meta(), "a": entry("F16", [3], 0, 8)},
        "negative_dim": {"__metadata__": meta(), "a": entry("U8", [-1], 0, 8)},
        "float_dim": {"__metadata__": meta(), "a": entry("U8", [8.0], 0, 8)},
        "overflowing_shape": {"__metadata__": meta(), "a": entry("F64", [2**62, 2**62], 0, 8)},
        "unknown_dtype": {"__metadata__": meta(), "a": entry("F8_E4M3", [8], 0, 8)},
        "unknown_field": {"__metadata__": meta(), "a": {**entry("U8", [8], 0, 8), "extra": 1}},
        "three_offsets": {"__metadata__": meta(), "a": {**entry("U8", [8], 0, 8), "data_offsets": [0, 4, 8]}},
        "tensor_not_object": {"__metadata__": meta(), "a": [1, 2]},
        "empty_name": {"__metadata__": meta(), "": entry("U8", [8], 0, 8)},
        "version_2": {"__metadata__": meta(version="2"), "a": entry("U8", [8], 0, 8)},
        "other_format": {"__metadata__": meta(format="safetensors"), "a": entry("U8", [8], 0, 8)},
        "metadata_not_string": {"__metadata__": meta(fusedopt={"a": 1}), "a": entry("U8", [8], 0, 8)},
        "no_fusedopt_metadata": {"__metadata__": meta(fusedopt=None), "a": entry("U8", [8], 0, 8)},
        "checksum_twice": b'{"__metadata__":' + json.dumps(meta(), separators=(",", ":")).encode() +
                          b',"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":"\\"checksum\\":\\"'
                          b'","c":{"x":1,"checksum":"xxh3-64:' + ZEROS.encode() + b'"}}',
        "checksum_elsewhere": b'{"__metadata__":{"format":"fusedopt.checkpoint","fusedopt":"{}","version":"1"},'
                              b'"a":{"checksum":"xxh3-64:' + ZEROS.encode() + b'"}}',
        "not_object": b'[{"checksum":"xxh3-64:' + ZEROS.encode() + b'"}]',
        "not_json": b'{"__metadata__":{"checksum":"xxh3-64:' + ZEROS.encode() + b'","format":',
        "not_utf8": b'{"__metadata__":' + json.dumps(meta(), separators=(",", ":")).encode() +
                    b',"\xff\xfe":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}',
        "no_checksum": {"__metadata__": meta(checksum=None), "a": entry("U8", [8], 0, 8)},
    }
    for name, header in wrong.items():
        files[f"wrong_{name}.safetensors"] = craft(header, two)

    # Damaged: the checksum (or the length) catches these.
    files["damaged_truncated_data.safetensors"] = adamw[:-5]
    files["damaged_truncated_header.safetensors"] = adamw[:200]
    files["damaged_length_only.safetensors"] = adamw[:8]
    files["damaged_seven_bytes.safetensors"] = adamw[:7]
    files["damaged_empty.safetensors"] = b""
    files["damaged_data_byte.safetensors"] = adamw[:-1] + bytes([adamw[-1] ^ 1])
    at = adamw.index(b'"dtype"')
    files["damaged_header_byte.safetensors"] = adamw[:at] + b"'" + adamw[at + 1:]
    files["damaged_checksum_upper.safetensors"] = adamw.replace(KEY, KEY[:-8] + b"XXH3-64:")
    files["damaged_length_zero.safetensors"] = bytes(8) + adamw[8:]
    files["damaged_length_huge.safetensors"] = (2**40).to_bytes(8, "little") + adamw[8:]
    files["damaged_length_max.safetensors"] = b"\xff" * 8 + adamw[8:]
    files["damaged_length_past_end.safetensors"] = (len(adamw) - 7).to_bytes(8, "little") + adamw[8:]

    os.makedirs(out, exist_ok=True)
    for old in os.listdir(out):
        if old.endswith(".safetensors"):
            os.remove(os.path.join(out, old))
    for name, raw in sorted(files.items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(raw)
    print(f"make_corpus: {len(files)} files, {sum(map(len, files.values()))} bytes in {out}")


if __name__ == "__main__":
    main()
