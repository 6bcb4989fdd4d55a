"""Counter-based random numbers: the same bits from the float64 reference and from every target, so a
sampled generation is reproducible from its seed wherever it runs.

random_uniform(key, n)[..., j] mixes the i64 key with the counter j through splitmix64's finalizer (64-bit
wrapping arithmetic) and keeps the top 24 bits as (bits + 0.5) / 2**24: uniform in (0, 1), never 0 or 1.
"""

from __future__ import annotations

import numpy as np

from ...errors import GraphError
from ... import dtypes as dt
from ..graph import TensorType
from ..opdef import as_value, builder, defop, graph_of, reference

__all__ = ["random_uniform"]

# splitmix64 (Steele, Lea, Flood 2014): the increment (golden ratio) and the finalizer's constants.
GOLDEN = 0x9E3779B97F4A7C15
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
SHIFTS = (30, 27, 31)


@defop("random_uniform", attrs=("n",))
def _random_uniform(node, types, attrs):
    key = types[0]
    n = attrs["n"]
    if key.dtype.name not in ("i64", "i32"):
        raise GraphError(f"{node.describe()}: 'key' is {key}, expected an i64 or i32 tensor")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise GraphError(f"{node.describe()}: n={n!r}, expected an int >= 1")
    return TensorType(key.shape + (n,), dt.dtype("f32"))


def mix(key: np.ndarray, j: np.ndarray) -> np.ndarray:
    """splitmix64 of key * GOLDEN + (j + 1) * MIX1, as uint64."""
    with np.errstate(over="ignore"):
        z = key.astype(np.int64).view(np.uint64) * np.uint64(GOLDEN) + (j.astype(np.uint64) + np.uint64(1)) * np.uint64(
            MIX1
        )
        z = (z ^ (z >> np.uint64(SHIFTS[0]))) * np.uint64(MIX1)
        z = (z ^ (z >> np.uint64(SHIFTS[1]))) * np.uint64(MIX2)
        return z ^ (z >> np.uint64(SHIFTS[2]))


@reference("random_uniform")
def _random_uniform_ref(node, ins, attrs):
    key = np.asarray(ins[0])[..., None]
    bits = mix(key, np.arange(attrs["n"], dtype=np.uint64))
    return [((bits >> np.uint64(40)).astype(np.float64) + 0.5) / 2.0**24]


@builder
def random_uniform(key, n):
    """(key.shape..., n) f32 uniform in (0, 1), a pure function of each key and the position along the
    last axis (no state: pass a new key for new numbers)."""
    g = graph_of("random_uniform", key)
    k = as_value("random_uniform", "key", key, g)
    return g.apply("random_uniform", [k], {"n": n})[0]
