"""The shared-memory ring in one process: encoding, the plain fast path, segment release."""

from __future__ import annotations

import gc
import uuid

import pytest
import torch

from parallel_runtime.runtime import segments, shm


@pytest.fixture
def ring():
    name = f"dpar-test-{uuid.uuid4().hex[:8]}"
    writer = shm.ShmRing.create(name, n_readers=2, n_slots=4, slot_size=4096)
    readers = [shm.ShmRing.attach(name, i, "") for i in range(2)]
    yield writer, readers
    for r in readers:
        r.close()
    writer.close(unlink=True)
    assert not list(segments.SHM_DIR.glob(name + "*"))


def _receive_all(readers):
    out = []
    for r in readers:
        ok, obj = r.poll()
        assert ok
        out.append(obj)
    return out


def test_plain_message_uses_plain_pickle_and_round_trips(ring):
    writer, readers = ring
    msg = ("job", 7, "noop", (1, 2.5, None), {"k": ["v", b"x"]}, "all")
    writer.put(msg, timeout=1)
    base = writer._bases[0]
    assert writer.mm[base + shm._SLOT_HEADER] == shm._MODE_PLAIN
    assert _receive_all(readers) == [msg, msg]
    assert readers[0].poll() == (False, None)


@pytest.mark.parametrize("size", [16, 4096], ids=["inline", "segment"])
def test_tensors_keep_values_identity_and_subclass_data(ring, size):
    writer, readers = ring
    t = torch.arange(size, dtype=torch.float32)
    param = torch.nn.Parameter(torch.full((3,), 2.0))
    bf = torch.randn(4, 5).to(torch.bfloat16).t()  # non-contiguous bfloat16
    writer.put({"a": t, "again": t, "p": param, "bf": bf, "scalar": torch.tensor(3), "empty": t[:0]}, timeout=1)
    for got in _receive_all(readers):
        assert torch.equal(got["a"], t) and got["again"] is got["a"]
        assert torch.equal(got["p"], param.detach()) and type(got["p"]) is torch.Tensor
        assert got["bf"].dtype == torch.bfloat16 and torch.equal(got["bf"], bf)
        assert got["scalar"].dim() == 0 and got["scalar"].item() == 3
        assert got["empty"].shape == (0,)


def test_segment_released_by_refcount_alone_and_then_recycled(ring):
    writer, readers = ring
    big = torch.ones(8192)  # 32 KB: larger than a 4 KB slot
    gc.disable()
    try:
        writer.put(big, timeout=1)
        got = [r.poll()[1] for r in readers]
        assert len(writer._in_flight) == 1
        writer.collect()
        assert len(writer._in_flight) == 1  # still viewed by the readers
        del got
        writer.collect()  # no gc.collect(): dropping the last view must be enough
        assert writer._in_flight == {} and len(writer._free) == 1
        seg = writer._free[0][1]
        writer.put(big * 2, timeout=1)
        assert writer._in_flight[next(iter(writer._in_flight))] is seg  # the warm segment is reused
        assert all(torch.equal(r.poll()[1], big * 2) for r in readers)
    finally:
        gc.enable()


def test_ring_wraps_around_and_full_ring_times_out_naming_the_slow_reader(ring):
    writer, readers = ring
    for i in range(10):
        writer.put(i, timeout=1)
        assert _receive_all(readers) == [i, i]
    for i in range(4):
        writer.put(i, timeout=1)
        readers[0].poll()
    with pytest.raises(TimeoutError, match=r"reader\(s\) \[1\]"):
        writer.put("one too many", timeout=0.2)


def test_tensor_reference_outside_the_ring_is_refused():
    header, tensors = shm.encode({"t": torch.ones(2)})
    assert len(tensors) == 1
    import pickle

    with pytest.raises(RuntimeError, match="only be loaded by parallel_runtime.shm"):
        pickle.loads(header)
