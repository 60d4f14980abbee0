"""Growing concat chains written in place (rpcsrv.executor.examplejson.concat_chain): the same values as plain
concatenation for every intermediate (also when read after later layers wrote the buffer), one buffer
per chain and per call, and no chain where a prefix would not be one contiguous block or would fork."""

from __future__ import annotations

import threading

import numpy as np

from rpcsrv.executor import ExampleJSONRuntime
from rpcsrv.executor.examplejson.concat_chain import chains

RNG = np.random.default_rng(5)


def dense_block(layers: int = 4, c0: int = 3, growth: int = 2, n: int = 1, hw: int = 4,
                fork: bool = False) -> str:
    """input 0 (n, c0, hw, hw) -> each layer: f = relu(cat) * 2 (sliced to ``growth`` channels by a
    slice op), cat' = concat(cat, f).  Outputs: every concat (intermediates too) and the last one.
    With ``fork``, the second concat is also the first input of another concat (with the input)."""
    lines = ["block", f"  input 0 {n} {c0} {hw} {hw}"]
    const = 1
    lines.append(f"  const {const} 1 dtype: int64 name: zero")
    lines.append(f"  const {const + 1} 1 dtype: int64 name: g")
    lines.append(f"  const {const + 2} 1 dtype: int64 name: ax")
    nid, cat, c = 4, 0, c0
    cats = []
    for _ in range(layers):
        lines.append(f"  relu {nid} inputs: {cat} shape: {n} {c} {hw} {hw}")
        lines.append(f"  slice {nid + 1} inputs: {nid} 1 2 3 shape: {n} {growth} {hw} {hw}")
        lines.append(f"  concat {nid + 2} inputs: {cat} {nid + 1} shape: {n} {c + growth} {hw} {hw} "
                     f'attrs: {{"axis": {1 if n == 1 else -3}}}')
        cat, c = nid + 2, c + growth
        cats.append(cat)
        nid += 3
    if fork:
        lines.append(f"  concat {nid} inputs: {cats[1]} 0 shape: {n} {2 * c0 + 2 * growth} {hw} {hw} "
                     'attrs: {"axis": 1}')
        cats.append(nid)
    lines.append("  output " + " ".join(map(str, cats)))
    return "\n".join(lines) + "\n"


def reference(x: np.ndarray, layers: int, growth: int, fork: bool = False) -> list[np.ndarray]:
    cat, outs = x, []
    for _ in range(layers):
        cat = np.concatenate([cat, np.maximum(cat, 0)[:, :growth]], axis=1)
        outs.append(cat)
    if fork:
        outs.append(np.concatenate([outs[1], x], axis=1))
    return outs


def run(text: str, x: np.ndarray, shapes: list[tuple]) -> list[np.ndarray]:
    mod = ExampleJSONRuntime(text)
    mod.bind("block", {"zero": np.array([0]), "g": np.array([2]), "ax": np.array([1])}, "test")
    outs = [np.full(s, np.nan, np.float32) for s in shapes]
    mod.get_function("block")(x, *outs)
    return outs


def test_every_intermediate_keeps_its_value():
    x = RNG.standard_normal((1, 3, 4, 4)).astype("float32")
    want = reference(x, 4, 2)
    text = dense_block()
    mod = ExampleJSONRuntime(text)
    assert [[n.id for n in c] for c in chains(mod.graphs["block"])] == [[6, 9, 12, 15]]
    got = run(text, x, [w.shape for w in want])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_the_chain_writes_one_buffer_and_views_of_it():
    from rpcsrv.executor.module import STEP_HOOK

    x = RNG.standard_normal((1, 3, 4, 4)).astype("float32")
    seen = {}
    token = STEP_HOOK.set(lambda g, node, value, s: seen.__setitem__(node.id, value) if node.op == "concat" else None)
    try:
        run(dense_block(), x, [w.shape for w in reference(x, 4, 2)])
    finally:
        STEP_HOOK.reset(token)
    last = seen[15]
    assert all(seen[k].base is last for k in (6, 9, 12))
    assert all(np.shares_memory(seen[k], last) for k in (6, 9, 12))


def test_a_fork_and_a_batch_axis_are_not_chained_and_still_right():
    x = RNG.standard_normal((1, 3, 4, 4)).astype("float32")
    want = reference(x, 4, 2, fork=True)
    text = dense_block(fork=True)
    # the second concat is extended twice: the chain stops there
    assert [[n.id for n in c] for c in chains(ExampleJSONRuntime(text).graphs["block"])] == [[6, 9], [12, 15]]
    for g, w in zip(run(text, x, [w.shape for w in want]), want):
        np.testing.assert_array_equal(g, w)
    x2 = RNG.standard_normal((2, 3, 4, 4)).astype("float32")  # N=2: a channel prefix is not contiguous
    text = dense_block(n=2)
    assert chains(ExampleJSONRuntime(text).graphs["block"]) == []
    want = reference(x2, 4, 2)
    for g, w in zip(run(text, x2, [w.shape for w in want]), want):
        np.testing.assert_array_equal(g, w)


def test_concurrent_calls_get_their_own_buffers():
    text = dense_block(layers=6, hw=16)
    mod = ExampleJSONRuntime(text)
    mod.bind("block", {"zero": np.array([0]), "g": np.array([2]), "ax": np.array([1])}, "test")
    fn = mod.get_function("block")
    errors = []

    def worker(seed):
        x = np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype("float32")
        want = reference(x, 6, 2)
        for _ in range(30):
            outs = [np.empty(w.shape, np.float32) for w in want]
            fn(x, *outs)
            if not all(np.array_equal(o, w) for o, w in zip(outs, want)):
                errors.append(seed)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
