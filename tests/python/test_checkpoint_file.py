"""The checkpoint file through fusedopt._C (src/python/checkpoint_bindings.cc): a round trip of torch tensors,
the data section viewed by torch.frombuffer without a copy, and errors: a damaged file raises ValueError, a
failed write OSError with its errno (and the old file stays whole)."""

from __future__ import annotations

import errno
import gc
import json
import os
import resource
import signal

import pytest
from fusedopt import _C

import torch

DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64", torch.float16: "F16",
          torch.uint8: "U8", torch.bool: "BOOL"}


def _entries(tensors: dict[str, torch.Tensor]) -> list[tuple]:
    return [(name, DTYPES[t.dtype], list(t.shape), t.data_ptr(), t.numel() * t.element_size())
            for name, t in tensors.items()]


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {  # widest first, so every tensor's offset suits torch's view(dtype)
        "state.0.exp_avg": torch.randn(2, 3, generator=g),
        "state.0.count": torch.tensor([-1, 0, 2**62, 7], dtype=torch.int64),
        "state.0.step": torch.tensor(5.0),  # 0-d
        "state.1.empty": torch.empty(0, 3),
        "state.1.exp_avg": torch.randn(5, generator=g).to(torch.bfloat16),
        "state.2.mask": torch.tensor([True, False, True]),
    }


def _views(f) -> dict[str, torch.Tensor]:
    data = torch.frombuffer(memoryview(f), dtype=torch.uint8) if f.nbytes else torch.empty(0, dtype=torch.uint8)
    inverse = {v: k for k, v in DTYPES.items()}
    return {name: data[offset:offset + nbytes].view(inverse[dtype]).view(shape)
            for name, dtype, shape, offset, nbytes in f.tensors}


def test_round_trip(tmp_path):
    tensors = _tensors()
    meta = json.dumps({"optimizer": "AdamW", "lr": 1e-3, "text": "ünïcode"})
    path = tmp_path / "ckpt.safetensors"
    _C.write_checkpoint(str(path), meta, _entries(tensors))
    assert sorted(os.listdir(tmp_path)) == ["ckpt.safetensors"]  # no temporary file left

    f = _C.read_checkpoint(str(path))
    assert f.metadata == meta
    assert [(name, dtype, shape, nbytes) for name, dtype, shape, _, nbytes in f.tensors] == [
        (name, DTYPES[t.dtype], list(t.shape), t.numel() * t.element_size()) for name, t in tensors.items()]
    assert f.nbytes == sum(t.numel() * t.element_size() for t in tensors.values())
    got = _views(f)
    assert list(got) == list(tensors)
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name], t), name
    assert got["state.0.step"].dim() == 0


def test_data_section_is_viewed_without_a_copy(tmp_path):
    tensors = _tensors()
    path = str(tmp_path / "ckpt.safetensors")
    _C.write_checkpoint(path, "{}", _entries(tensors))
    f = _C.read_checkpoint(path)
    view = memoryview(f)
    assert (view.format, view.ndim, view.itemsize, view.nbytes, view.readonly) == ("B", 1, 1, f.nbytes, False)
    a = torch.frombuffer(memoryview(f), dtype=torch.uint8)
    b = torch.frombuffer(memoryview(f), dtype=torch.uint8)
    assert a.data_ptr() == b.data_ptr()  # the same bytes: the C++ vector itself
    a[0] ^= 0xFF
    assert b[0] == a[0]
    exp_avg = _views(f)["state.0.exp_avg"]
    assert exp_avg.data_ptr() == a.data_ptr()
    del f, view
    gc.collect()  # the views keep the file object alive
    a[0] ^= 0xFF
    assert torch.equal(exp_avg, tensors["state.0.exp_avg"])


def test_damaged_files_raise_value_error(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    _C.write_checkpoint(str(path), "{}", _entries(_tensors()))
    good = path.read_bytes()

    bad = bytearray(good)
    bad[-1] ^= 1
    path.write_bytes(bytes(bad))
    with pytest.raises(ValueError, match=r"checksum mismatch: the file is corrupted \(stored [0-9a-f]{16}, computed"):
        _C.read_checkpoint(str(path))
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match="truncated"):
        _C.read_checkpoint(str(path))
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="empty or truncated"):
        _C.read_checkpoint(str(path))
    path.write_text("not a checkpoint\n")
    with pytest.raises(ValueError, match="not a safetensors file"):
        _C.read_checkpoint(str(path))
    path.write_bytes(good)
    header = int.from_bytes(good[:8], "little")
    with pytest.raises(ValueError, match=f"header of {header} bytes is over the limit of 64"):
        _C.read_checkpoint(str(path), max_header_bytes=64)
    assert _C.read_checkpoint(str(path), max_header_bytes=header).metadata == "{}"


def test_bad_arguments_raise_value_error(tmp_path):
    t = torch.ones(4)
    path = str(tmp_path / "ckpt.safetensors")
    with pytest.raises(ValueError, match="tensor 'w': dtype 'C64'"):
        _C.write_checkpoint(path, "{}", [("w", "C64", [4], t.data_ptr(), 16)])
    with pytest.raises(ValueError, match="tensor 'w': 12 bytes of data, its shape and dtype take 16"):
        _C.write_checkpoint(path, "{}", [("w", "F32", [4], t.data_ptr(), 12)])
    with pytest.raises(ValueError, match="occurs twice"):
        _C.write_checkpoint(path, "{}", [("w", "F32", [4], t.data_ptr(), 16)] * 2)
    assert os.listdir(tmp_path) == []


def test_write_into_a_missing_directory_raises_os_error(tmp_path):
    path = str(tmp_path / "missing" / "ckpt.safetensors")
    with pytest.raises(OSError) as e:
        _C.write_checkpoint(path, "{}", [])
    assert e.value.errno == errno.ENOENT and isinstance(e.value, FileNotFoundError)
    assert path in str(e.value) and "No such file or directory" in str(e.value)
    with pytest.raises(FileNotFoundError):
        _C.read_checkpoint(path)


def test_failed_write_keeps_the_old_file(tmp_path):
    """EFBIG from RLIMIT_FSIZE (as ENOSPC would be): OSError with the errno, the old file whole, no temporary."""
    path = tmp_path / "ckpt.safetensors"
    _C.write_checkpoint(str(path), "{}", _entries(_tensors()))
    old = path.read_bytes()
    big = torch.zeros(1 << 18, dtype=torch.uint8)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, hard))
        with pytest.raises(OSError) as e:
            _C.write_checkpoint(str(path), "{}", _entries({"big": big}))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert e.value.errno == errno.EFBIG and str(path) in str(e.value)
    assert path.read_bytes() == old
    assert sorted(os.listdir(tmp_path)) == ["ckpt.safetensors"]
