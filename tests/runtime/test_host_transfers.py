"""Results read back through one kept buffer of host memory a device writes (rocmc.runtime.devices.read_back). On a
GPU it replaces IREE's DeviceArray.to_host, which pins new host memory for every read; here the same IREE calls run
on the CPU device, whose buffers the host also maps, so the kept-buffer path is driven directly."""

from __future__ import annotations

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.runtime import devices
from rocmc.runtime.module import host_copy
from rocmc.dtypes import ALL as DTYPES


def _device_array(values: np.ndarray):
    from iree import runtime as rt

    dev = rocmc.runtime.get_device("local-task")
    return rt.DeviceArray(dev, rt.asdevicearray(dev, values)._buffer_view)


@pytest.mark.parametrize(
    "dtype, shape",
    [("int64", (3,)), ("float32", (2, 1000)), ("float16", (5, 7, 3)), ("int8", (0,)), ("float32", (1,))],
)
def test_reader_reads_what_the_buffer_holds(rng, dtype, shape):
    values = (rng.standard_normal(shape) * 100).astype(dtype)
    arr = _device_array(values)
    reader = devices._Reader(arr._device)
    got = reader.read(arr._buffer_view)
    assert got.dtype == values.dtype and got.shape == values.shape
    np.testing.assert_array_equal(got, values)
    assert got.flags.owndata  # not a view of the kept buffer


def test_reader_grows_and_each_read_keeps_its_values(rng):
    """A larger read grows the kept buffer; an earlier result is not changed by later reads."""
    dev = rocmc.runtime.get_device("local-task")
    reader = devices._Reader(dev)
    small = rng.integers(-5, 5, 7).astype(np.int64)
    first = reader.read(_device_array(small)._buffer_view)
    for n in (5000, 3, 70001):
        big = rng.standard_normal(n).astype(np.float32)
        np.testing.assert_array_equal(reader.read(_device_array(big)._buffer_view), big)
    np.testing.assert_array_equal(first, small)
    assert reader.size >= 70001 * 4


def test_module_results_read_back_equal_the_reference(rng):
    """A module's results through host_copy, booleans and float16 included, at odd sizes."""
    g = rocmc.Graph("two")
    x = g.input("x", (3, "n"), "f16")
    g.output(ops.mul(x, x), ops.greater(x, np.float16(0)))
    mod = rocmc.load(rocmc.compile(g, "cpu"))
    a = rng.standard_normal((3, 17)).astype(np.float16)
    sq, pos = mod(a, output="device")
    np.testing.assert_array_equal(host_copy(sq, DTYPES["f16"]), a * a)
    np.testing.assert_array_equal(host_copy(pos, DTYPES["bool"]), a > 0)
