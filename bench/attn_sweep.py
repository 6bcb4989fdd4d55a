"""Side-by-side timing of versions of the decode attention kernel (custom_kernels/attention_decode.hip) on decode
steps' attention of 7B-class models (one layer), with torch's SDPA and the device copy in the same run.

    python -m bench.attn_sweep compile [--out out/attn_sweep]   # here: PTX per version (-D switches)
    python -m bench.attn_sweep run [--out out/attn_sweep]       # there: CuPy launches, triton do_bench

A case is one layer's attention of a decode step: `rows` batch rows, one new token each, against a KV cache of
`slot` positions a row (k and v as stored: (rows, kv heads, slot, head dim)), row i keeping its first L_i positions
(decode's bool mask). The bytes are the keys and values the rows keep; GB/s = bytes / time, beside the copy
bandwidth. Every version is checked against torch in f32 (relative L2 printed with the time).

ATTN_SWEEP_ONLY="label,case" runs that one case alone (for a profiler: `ncu --kernel-name regex:attention
--launch-count 1 ...` sees its first launch).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from bench.common import build_version, sweep_main, sweep_value

# (name, query heads, kv heads, head dim, rows, slot positions, longest row): rows keep longest - 13 * (i % 8).
CASES = (
    ("7B r1 L512", 32, 32, 128, 1, 1024, 512),
    ("7B r8 L512", 32, 32, 128, 8, 1024, 512),
    ("7B r32 L512", 32, 32, 128, 32, 1024, 512),
    ("7B r1 L4000", 32, 32, 128, 1, 4096, 4000),
    ("GQA4 r8 L512", 32, 8, 128, 8, 1024, 512),
    ("GQA4 r32 L512", 32, 8, 128, 32, 1024, 512),
    ("d256 r8 L512", 16, 16, 256, 8, 1024, 512),
)
# label -> -D switches of the kernel sources; "BLOCK=n": the families' workgroup size n for that build; "REV=<git
# revision>": that revision's attention_decode.hip (before d3b5d64: one entry a dtype, no split), a baseline
VERSIONS = {
    "one entry a dtype (ce6b15e)": ["REV=ce6b15e", "BLOCK=256"],
    "entries, 256 threads": ["BLOCK=256"],
    "entries (the default)": [],
    "entries, 128 regs (occ 4/2)": ["ROCMC_ATT_OCC=4", "ROCMC_ATT_ROWS_OCC=2"],
}
SPLITS = (1, 2, 4, 8, 16)  # each version without REV runs every case at each of these splits
FAMILIES = ("attention_decode", "attention_split", "attention_combine")


def compile_all(out: Path) -> None:
    from rocmc.lowering import kernels

    out.mkdir(parents=True, exist_ok=True)
    fams = {n: kernels.FAMILIES[n] for n in FAMILIES}
    plan = {}
    for i, (label, flags) in enumerate(VERSIONS.items()):
        block = sweep_value(flags, "BLOCK", fams[FAMILIES[0]].block)
        old = any(f.startswith("REV=") for f in flags)
        files = {}
        for n in FAMILIES[:1] if old else FAMILIES:
            obj = build_version(kernels, FAMILIES, fams[n].source, "sm_80", flags, block=block)
            files[n] = f"v{i}_{n}.ptx"
            (out / files[n]).write_bytes(obj.data)
        plan[label] = {"ptx": files, "block": block, "old": old}
        print(f"built {label}", flush=True)
    bits = {n: 1 << i for i, (n, _) in enumerate(fams[FAMILIES[0]].flags)}
    (out / "plan.json").write_text(json.dumps({"versions": plan, "flags": bits}, indent=1))


def _inputs(torch, g, hq, hkv, d, rows, slot, longest):
    lengths = [longest - 13 * (i % 8) for i in range(rows)]
    q = torch.randn((rows, hq, 1, d), device="cuda", generator=g).half()
    k = torch.randn((rows, hkv, slot, d), device="cuda", generator=g).half()
    v = torch.randn((rows, hkv, slot, d), device="cuda", generator=g).half()
    mask = torch.zeros((rows, 1, 1, slot), device="cuda", dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, ..., :n] = True
    nbytes = sum(lengths) * hkv * d * 2 * 2
    return q, k, v, mask, lengths, nbytes


def _reference(torch, q, k, v, mask, scale):
    g = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(g, dim=1)
    vf = v.float().repeat_interleave(g, dim=1)
    s = (q.float() @ kf.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ vf


def run_all(out: Path) -> None:
    import cupy
    import torch
    from triton.testing import do_bench

    plan = json.loads((out / "plan.json").read_text())
    bits = plan["flags"]
    g = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name(), flush=True)
    buf = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    copy = do_bench(lambda: buf[: 1 << 29].copy_(buf[1 << 29 :]), warmup=10, rep=100, return_mode="median")
    print(f"copy: {2 * (1 << 29) / copy / 1e6:.0f} GB/s", flush=True)
    only = os.environ.get("ATTN_SWEEP_ONLY")
    data = {}
    best = {}  # (label, case) -> (us, splits)
    for label, v in plan["versions"].items():
        mods = {n: cupy.RawModule(path=str(out / f)) for n, f in v["ptx"].items()}
        for name, hq, hkv, d, rows, slot, longest in CASES:
            if name not in data:
                q, k, vv, mask, lengths, nbytes = _inputs(torch, g, hq, hkv, d, rows, slot, longest)
                scale = d**-0.5
                data[name] = (q, k, vv, mask, nbytes, scale, _reference(torch, q, k, vv, mask, scale))
            q, k, vv, mask, nbytes, scale, want = data[name]
            rows_ = "" if hq // hkv <= 2 else "rows_"
            consts = (hq, hkv, 1, slot, d, 0, 0, slot, 0, 0, int(np.float32(scale).view(np.uint32)), bits["mask"])
            ins = tuple(cupy.asarray(t) for t in (q, k, vv, mask.view(torch.uint8)))
            for splits in (1,) if v["old"] else SPLITS:
                case = f"{name} s{splits}"
                if only and only != f"{label},{case}":
                    continue
                y = torch.full(q.shape, float("nan"), device="cuda", dtype=torch.float16)
                if splits == 1:
                    sym = "attention_decode_f16" if v["old"] else f"attention_decode_{rows_}f16_e{d // 32}"
                    kern = mods["attention_decode"].get_function(sym)
                    args = ins + (cupy.asarray(y),) + tuple(np.uint32(c) for c in consts)

                    def launch(kern=kern, args=args, grid=rows * hkv, block=v["block"]):
                        kern((grid,), (block,), args)

                else:
                    sym = f"attention_split_{rows_}f16_e{d // 32}"
                    kern = mods["attention_split"].get_function(sym)
                    comb = mods["attention_combine"].get_function("attention_combine_f16")
                    part = torch.empty(rows * hq * splits * (d + 2), device="cuda", dtype=torch.float32)
                    args = ins + (cupy.asarray(part),) + tuple(np.uint32(c) for c in (*consts, splits))
                    cargs = (cupy.asarray(part), cupy.asarray(y)) + tuple(np.uint32(c) for c in (rows * hq, d, splits))
                    cb = v["block"]

                    def launch(
                        kern=kern,
                        comb=comb,
                        args=args,
                        cargs=cargs,
                        grid=rows * hkv * splits,
                        block=v["block"],
                        cgrid=(rows * hq * d + cb - 1) // cb,
                        cb=cb,
                    ):
                        kern((grid,), (block,), args)
                        comb((cgrid,), (cb,), cargs)

                if name == CASES[0][0] or name == "GQA4 r8 L512":
                    print(f"  {sym}: {kern.num_regs} registers, {kern.local_size_bytes} bytes local", flush=True)
                launch()
                torch.cuda.synchronize()
                err = float((y.float() - want).norm() / want.norm())
                t = do_bench(launch, warmup=20, rep=100, return_mode="median")
                if (label, name) not in best or t < best[(label, name)][0]:
                    best[(label, name)] = (t, splits)
                print(
                    f"{label:28s} {case:18s} {t * 1e3:8.1f} us {nbytes / t / 1e6:7.0f} GB/s err {err:.1e}", flush=True
                )
    if only:
        return
    print("\nbest split a case (us, splits):")
    for name, *_ in CASES:
        print(
            f"  {name:14s} "
            + "  ".join(f"{lb}: {best[(lb, name)][0] * 1e3:.1f} ({best[(lb, name)][1]})" for lb in plan["versions"])
        )
    for name, hq, hkv, d, rows, slot, longest in CASES:
        q, k, vv, mask, nbytes, scale, want = data[name]
        kr = k.repeat_interleave(hq // hkv, dim=1) if hq != hkv else k
        vr = vv.repeat_interleave(hq // hkv, dim=1) if hq != hkv else vv
        fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, kr, vr, attn_mask=mask)  # noqa: E731
        t = do_bench(fn, warmup=20, rep=100, return_mode="median")
        print(f"{'torch sdpa':28s} {name:14s} {t * 1e3:8.1f} us (reads the whole slot)", flush=True)


def main(argv=None) -> int:
    return sweep_main(__doc__, "out/attn_sweep", compile_all, run_all, argv)


if __name__ == "__main__":
    sys.exit(main())
