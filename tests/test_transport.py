"""How an input worker's batches travel to the wafer: one reply for several batches, their
tensors stacked into one array per leaf where the batches share a structure, rebuilt on the
consumer side exactly as produced."""

import collections
import pickle

import pytest
import torch

from workers.positions import WorkerPosition
from workers.wire import Reply, chunk_reply, unpack_reply

Pair = collections.namedtuple("Pair", "x y")


def _items(batches, position=None):
    return [{"kind": "batch", "index": i, "batch": b, "nbytes": 0,
             "after": WorkerPosition(i + 1, 0, position)}
            for i, b in enumerate(batches)]


def _travel(reply: dict, copy: bool) -> list:
    """As through Ray: pickled (arrays out of band), unpickled, unpacked."""
    body = pickle.loads(pickle.dumps(Reply(reply), protocol=5)).body
    return unpack_reply(body, copy=copy)


def _same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


def _gen(n, make):
    g = torch.Generator().manual_seed(0)
    return [make(g, i) for i in range(n)]


CASES = {
    "tensor": lambda g, i: torch.randn(3, 4, generator=g),
    "tuple": lambda g, i: (torch.randn(2, 5, generator=g), torch.randint(0, 9, (2,), generator=g)),
    "list": lambda g, i: [torch.randn(2, generator=g), torch.ones(2, dtype=torch.bool)],
    "dict": lambda g, i: {"ids": torch.randint(0, 50, (2, 7), generator=g),
                          "mask": torch.ones(2, 7, dtype=torch.int64), "name": "lm"},
    "namedtuple": lambda g, i: Pair(torch.randn(4, generator=g), torch.tensor([i])),
    "nested": lambda g, i: (torch.randn(2, generator=g), {"a": [torch.arange(3) + i, 7]}),
    "bfloat16": lambda g, i: torch.randn(3, generator=g).to(torch.bfloat16),
    "float16 and complex": lambda g, i: (torch.randn(3, generator=g).half(),
                                         torch.randn(2, dtype=torch.complex64, generator=g)),
    "scalar tensors": lambda g, i: (torch.tensor(float(i)), torch.tensor(i)),
}


@pytest.mark.parametrize("copy", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_batches_of_one_structure_travel_as_columns_and_arrive_as_produced(case, copy):
    batches = _gen(5, CASES[case])
    reply = chunk_reply(0, _items(batches))
    assert "columns" in reply and all("batch" not in it for it in reply["items"])
    got = _travel(reply, copy)
    assert [it["index"] for it in got] == list(range(5))
    for want, it in zip(_gen(5, CASES[case]), got):
        _same(want, it["batch"])
    if copy:  # a private copy: writing one batch changes no other
        for leaf in torch.utils._pytree.tree_leaves(got[0]["batch"]):
            if isinstance(leaf, torch.Tensor):
                leaf.zero_()
        for want, it in zip(_gen(5, CASES[case])[1:], got[1:]):
            _same(want, it["batch"])


@pytest.mark.parametrize("why, batches", [
    ("shapes differ", [torch.zeros(2, 3), torch.zeros(1, 3)]),
    ("dtypes differ", [torch.zeros(2), torch.zeros(2, dtype=torch.float64)]),
    ("structures differ", [(torch.zeros(2), torch.zeros(2)), (torch.zeros(2),)]),
    ("plain values differ", [(torch.zeros(2), "a"), (torch.zeros(2), "b")]),
    ("a leaf is a tensor in one batch only", [(torch.zeros(2), 1), (torch.zeros(2),
                                                                   torch.zeros(1))]),
    ("a tensor is sparse", [torch.eye(2).to_sparse(), torch.eye(2).to_sparse()]),
])
def test_batches_that_differ_travel_one_by_one_unchanged(why, batches):
    reply = chunk_reply(3, _items(batches))
    assert "columns" not in reply, why
    got = _travel(reply, copy=True)
    for want, it in zip(batches, got):
        if isinstance(want, torch.Tensor) and want.layout != torch.strided:
            assert torch.equal(want.to_dense(), it["batch"].to_dense())
        else:
            _same(want, it["batch"])


def test_an_error_in_a_chunk_ends_it_and_the_batches_before_it_arrive():
    items = _items([torch.ones(2) * i for i in range(3)])
    items.append({"kind": "error", "index": 3, "exc_type": "ValueError", "exc_message": "bad"})
    got = _travel(chunk_reply(0, items), copy=True)
    assert [it["kind"] for it in got] == ["batch"] * 3 + ["error"]
    assert [float(it["batch"][0]) for it in got[:3]] == [0.0, 1.0, 2.0]


def test_a_value_every_position_shares_is_sent_once():
    shared_rng_state = {"global": "x" * 6000}  # a saved generator state: kilobytes
    reply = chunk_reply(0, _items([torch.zeros(4)] * 32, position={"rng": shared_rng_state}))
    assert len(pickle.dumps(Reply(reply), protocol=5)) < 6000 + 32 * 400
    got = _travel(reply, copy=True)
    assert all(it["after"].loader["rng"] == shared_rng_state for it in got)
