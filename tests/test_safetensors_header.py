"""The host-side safetensors header check: damaged files fail with what/why/fix, before any worker."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.safetensors_header import read_header


def _write(path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_a_real_file_reads_back_its_header(tmp_path):
    path = tmp_path / "ok.safetensors"
    save_file({"a": torch.ones(2, 3), "s": torch.tensor(1.0), "e": torch.zeros(0, 4), "h": torch.ones(5).half()}, path)
    header = read_header(path)
    assert header["a"]["shape"] == [2, 3] and header["s"]["shape"] == [] and header["h"]["dtype"] == "F16"
    assert "__metadata__" not in header


def _damaged(tmp_path, name, header=None, data=b"", raw: bytes | None = None):
    path = tmp_path / name
    if raw is not None:
        path.write_bytes(raw)
    else:
        _write(path, header, data)
    with pytest.raises(ConfigError) as info:
        read_header(path)
    message = str(info.value)
    assert name in message and "why:" in message and "fix:" in message
    return message


def test_truncated_and_malformed_headers_are_named(tmp_path):
    assert "only 3 byte(s)" in _damaged(tmp_path, "short.safetensors", raw=b"abc")
    good = tmp_path / "good.safetensors"
    save_file({"w": torch.ones(64)}, good)
    cut = good.read_bytes()[:20]  # a download that stopped inside the header
    assert "the header says it is" in _damaged(tmp_path, "cut.safetensors", raw=cut)
    assert "implausible header size" in _damaged(tmp_path, "huge.safetensors", raw=struct.pack("<Q", 1 << 40))
    assert "not valid JSON" in _damaged(tmp_path, "json.safetensors", raw=struct.pack("<Q", 4) + b"{abc")
    assert "malformed entry" in _damaged(tmp_path, "entry.safetensors", {"w": {"dtype": "F32", "shape": "4"}})


def test_offsets_outside_the_file_wrong_sizes_and_overlaps(tmp_path):
    ends_late = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    assert "ends at byte 16" in _damaged(tmp_path, "late.safetensors", ends_late, b"\0" * 8)
    wrong_size = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}
    assert "needs 16 bytes but its offsets span 8" in _damaged(tmp_path, "size.safetensors", wrong_size, b"\0" * 16)
    overlap = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
    }
    assert "overlap" in _damaged(tmp_path, "overlap.safetensors", overlap, b"\0" * 12)
