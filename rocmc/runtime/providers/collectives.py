"""The CPU's collectives: a tensor-parallel module's `collectives.*` calls served by the process group.

The host has no collective library; the ranks' tensors go through the group's rendezvous connection
(rocmc.runtime.distributed), summed or concatenated in rank order. f16 and bf16 are summed in f32 and
rounded once. This is the path CI runs; GPUs use NCCL/RCCL through IREE.
"""

from __future__ import annotations

import numpy as np

from ..devices import upload
from .base import Provider, dtype_of


class HostCollectivesProvider(Provider):
    library = "rocmc's process group"

    def run(self, op, tensors, attrs):
        from iree import runtime as rt
        from .. import distributed

        x = tensors[0]
        dtype = dtype_of(x.element_type)
        host = rt.DeviceArray(self.device, x).to_host()
        group = distributed.current()
        if op == "all_reduce":
            acc = np.float32 if dtype.name in ("f16", "bf16") else dtype.np
            y = group.all_reduce(np.asarray(host).astype(acc)).astype(dtype.np)
        else:
            y = group.all_gather(np.asarray(host).astype(dtype.np)).reshape(-1)
        return upload(self.device, y, dtype, x.element_type)
