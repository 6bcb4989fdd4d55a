"""Hand-written kernels (custom_kernels/*.hip): builds for every GPU arch, checks on the code objects, their
embedding as custom dispatches, the choice between them and generated code, and the build's errors.

No GPU here: these are compile-only. tests/gpu/test_gpu_kernels.py runs every kernel through its .vmfb on a GPU.
"""

import re
import shutil
import subprocess
from dataclasses import replace

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.lowering import kernels
from rocmc.lowering.kernel import norm as kernel_norm
from rocmc.lowering.kernel import rope as kernel_rope

# Every CUDA target builds its kernels for sm_80 (Target.code_arch: IREE 3.13 has no tables past sm_80; the driver
# compiles the PTX for the GPU), so sm_80 is the one NVIDIA arch built here.
ARCHS = ("gfx90a", "gfx942", "gfx1100", "sm_80")
GPU_TARGETS = ("gfx90a", "gfx942", "gfx1100", "cuda:sm_80")
# EF_AMDGPU_MACH_* (low byte of e_flags) and the wave size each arch builds with.
AMDGPU_MACH = {"gfx90a": (0x3F, 64), "gfx942": (0x4C, 64), "gfx1100": (0x41, 32)}
READELF = shutil.which("llvm-readelf-19") or shutil.which("llvm-readelf")


@pytest.fixture(scope="module", params=ARCHS)
def built(request):
    arch = request.param
    return arch, {src: kernels.build(src, arch) for src in kernels.SOURCES}


def _amdgpu_notes(path) -> dict:
    """Per-kernel code-object metadata (name -> fields, plus the kinds of its arguments), from llvm-readelf."""
    text = subprocess.run([READELF, "--notes", str(path)], capture_output=True, text=True, check=True).stdout
    kernels_, cur = [], None
    for line in text.splitlines():
        if re.match(r"^  - \.", line):  # a new entry of amdhsa.kernels
            cur = {"args": []}
            kernels_.append(cur)
        if cur is None:
            continue
        m = re.match(r"^(?:  - |    )\.(\w+):\s+(\S+)", line)
        if m:
            cur[m.group(1)] = m.group(2)
        m = re.match(r"^\s+\.value_kind:\s+(\w+)", line)
        if m:
            cur["args"].append(m.group(1))
    return {k["name"]: k for k in kernels_ if "name" in k}


def test_every_kernel_symbol_is_built(built):
    arch, objs = built
    for spec in kernels.KERNELS.values():
        assert spec.symbol in objs[spec.source].symbols, f"{spec.symbol} missing from the {arch} object"


def test_code_object_matches_arch(built):
    arch, objs = built
    for obj in objs.values():
        if arch.startswith("gfx"):
            machine, flags = kernels.elf_machine(obj.data)
            assert machine == 224, "not an AMDGPU ELF"
            assert flags & 0xFF == AMDGPU_MACH[arch][0], f"e_flags {flags:#x} is not {arch}"
        else:
            text = obj.data.decode()
            assert re.search(rf"^\.target {arch}\b", text, re.M)
            assert re.search(r"^\.version 7\.8$", text, re.M)


def test_workgroup_size_and_no_spills(built):
    """The launch's workgroup size is what every kernel was built for, and nothing spills to scratch."""
    arch, objs = built
    for spec in kernels.KERNELS.values():
        obj = objs[spec.source]
        if arch.startswith("gfx"):
            res = obj.resources[spec.symbol]
            assert res["ScratchSize"] == 0 and res["VGPRs Spill"] == 0 and res["SGPRs Spill"] == 0, res
            if READELF is None:
                pytest.skip("llvm-readelf not installed (make toolchain)")
            meta = _amdgpu_notes(obj.path)[spec.symbol]
            assert int(meta["max_flat_workgroup_size"]) == spec.workgroup[0]
            assert int(meta["wavefront_size"]) == AMDGPU_MACH[arch][1]
            assert int(meta["private_segment_fixed_size"]) == 0
            # The kernel's arguments are the dispatch's bindings (pointers), then its i32 push constants.
            assert meta["args"] == ["global_buffer"] * (spec.inputs + spec.outputs) + ["by_value"] * spec.constants
        else:
            text = obj.data.decode()
            body = text[text.index(f".entry {spec.symbol}(") :]
            body = body[: body.index("\n}")]
            assert re.search(r"\.maxntid (\d+), 1, 1", body).group(1) == str(spec.workgroup[0])
            assert ".local" not in body, f"{spec.symbol} uses local memory (a stack or spills)"


def test_hopper_kernel_builds_for_sm90a_only():
    """linear_wgmma is sm_90a PTX (8.0: the warpgroup instructions), its tiles dynamic shared memory, no stack or
    spills in the PTX; built for any other arch its entry points only trap (never dispatched there)."""
    fam = kernels.FAMILIES["linear_wgmma"]
    text = kernels.build(fam.source, fam.arch).data.decode()
    assert re.search(r"^\.target sm_90a\b", text, re.M) and re.search(r"^\.version 8\.0$", text, re.M)
    assert ".extern .shared .align 1024 .b8 wg_tiles[]" in text and "wgmma.mma_async" in text
    for symbol in fam.symbols:
        body = text[text.index(f".entry {symbol}(") :]
        body = body[: body.index("\n}")]
        assert re.search(r"\.maxntid (\d+), 1, 1", body).group(1) == str(fam.block) and ".local" not in body
    assert "wgmma.mma_async" not in kernels.build(fam.source, "sm_80").data.decode()


def test_tiles_past_the_dynamic_shared_memory_given_do_not_build(monkeypatch):
    """The tiles' size and the export's workgroup_local_memory are checked against each other when the kernel
    builds (the ABI header's LOCAL_MEMORY): a family that gives less than its tiles take fails to build."""
    fam = kernels.FAMILIES["linear_wgmma"]
    monkeypatch.setitem(kernels.FAMILIES, "linear_wgmma", replace(fam, local_memory=fam.local_memory // 2))
    with pytest.raises(rocmc.CompileError, match="the tiles fit the dynamic shared memory"):
        kernels.build(fam.source, fam.arch)


def test_nvptx_rounds_bf16_in_hardware():
    """sm_80+ rounds f32 to bf16 with cvt (two at a time in the norms' vector stores), not integer arithmetic."""
    norms = kernels.build("rms_norm.hip", "sm_80").data + kernels.build("layer_norm.hip", "sm_80").data
    assert b"cvt.rn.bf16x2.f32" in norms
    assert b"cvt.rn.bf16.f32" in kernels.build("rope.hip", "sm_80").data


# Non-default values of every tuning switch (custom_kernels/rows.h, rocmc_gpu.h) that bench/kernel_sweep.py
# builds: they must keep building, with no spills, wherever the defaults do.
SWITCHES = (
    (
        "ROCMC_STREAM=2",
        "ROCMC_SYNC1=0",
        "ROCMC_PREFETCH=1",
        "ROCMC_LN_ONEPASS=2",
        "ROCMC_HW_BF16=0",
        "ROCMC_SHORT_MIN_BLOCKS=4",
    ),
    ("ROCMC_STREAM=1", "ROCMC_LN_ONEPASS=0", "ROCMC_HW_BF16=1", "ROCMC_LOAD_NC=1"),
)


@pytest.mark.parametrize("arch", ["gfx942", "sm_80"])  # an AMD and the NVIDIA arch (gfx1100 builds the defaults)
@pytest.mark.parametrize("switches", SWITCHES, ids=["stream-prefetch", "two-pass-nc"])
def test_tuning_switches_build(arch, switches):
    flags = [f"-D{s}" for s in switches]
    for source in ("rms_norm.hip", "layer_norm.hip"):
        obj = kernels.build(source, arch, flags)
        want = {s.symbol for s in kernels.KERNELS.values() if s.source == source}
        assert want <= set(obj.symbols)
        if arch.startswith("gfx"):
            assert all(r["ScratchSize"] == 0 and r["VGPRs Spill"] == 0 for r in obj.resources.values())
            continue
        text = obj.data.decode()
        assert ".local" not in text
        assert "st.global.cs.v4.u32" in text  # streaming stores: both sets
        streamed_loads = "ld.global.cs" in text or "L1::no_allocate" in text
        assert streamed_loads == ("ROCMC_STREAM=2" in switches)
        assert ("cvt.rn.bf16" in text) == ("ROCMC_HW_BF16=0" not in switches)


# ---- the ABI: one KernelFamily per source, the kernels' parameters and block generated from it ------------------


def _with_headers(path) -> str:
    """A source's text and that of the kernel headers of custom_kernels/ it includes (their includes too; the
    generated kernel_abi.h is not a file there; rocmc_gpu.h, the platform's, is checked on its own)."""
    text, seen, todo = "", set(), [path]
    while todo:
        p = todo.pop()
        if p.name in seen or p.name == "rocmc_gpu.h" or not p.is_file():
            continue
        seen.add(p.name)
        t = p.read_text()
        text += t
        todo += [p.parent / h for h in re.findall(r'#include "([^"]+)"', t)]
    return text


def test_entry_points_take_their_parameters_from_the_family():
    """No source spells its own parameter list, block size or flag masks: all come from kernel_abi.h."""
    for source in kernels.SOURCES:
        text = _with_headers(kernels.KERNEL_DIR / source)
        entries = re.findall(r"KERNEL(?:_OCC)?\([^)]*\)\)? void name\(([^)]*)\)", text)
        assert entries == ["KERNEL_PARAMS(T"], (source, entries)
        assert not re.search(r"#define BLOCK|flags & \d", text), source
    for header in ("rows.h", "rocmc_gpu.h", "linear.h", "quant.h"):
        assert "#define BLOCK" not in (kernels.KERNEL_DIR / header).read_text()


def test_family_block_reaches_the_code_object(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCMC_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(kernels.FAMILIES, "rope", replace(kernels.FAMILIES["rope"], block=128))
    text = kernels.build("rope.hip", "sm_80").data.decode()
    assert set(re.findall(r"\.maxntid (\d+), 1, 1", text)) == {"128"}


def test_a_constant_the_source_does_not_read_by_that_name_fails_the_build(tmp_path, monkeypatch):
    """The kernels read push constants by their names in the family: renaming one breaks the build."""

    monkeypatch.setenv("ROCMC_CACHE_DIR", str(tmp_path))
    fam = kernels.FAMILIES["rope"]
    renamed = tuple(("grid", doc) if n == "nblocks" else (n, doc) for n, doc in fam.constants)
    monkeypatch.setitem(kernels.FAMILIES, "rope", replace(fam, constants=renamed))
    with pytest.raises(rocmc.CompileError) as e:
        kernels.build("rope.hip", "gfx942")
    assert "nblocks" in e.value.diagnostics


def test_flag_bits_name_every_bit():
    fam = kernels.FAMILIES["rope"]
    assert fam.flag_bits(bshd=True, pos=False, pos_i64=True) == 0b101
    with pytest.raises(AssertionError):
        fam.flag_bits(bshd=True)


def test_build_is_cached(monkeypatch):
    first = kernels.build("rope.hip", "gfx942")
    monkeypatch.setattr(kernels, "_run_clang", lambda *a: pytest.fail("rebuilt a cached kernel"))
    again = kernels.build("rope.hip", "gfx942")
    assert again.data == first.data and again.path == first.path


def test_a_cached_kernel_others_can_write_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCMC_CACHE_DIR", str(tmp_path / "cache"))
    first = kernels.build("rope.hip", "gfx942")
    assert first.path.stat().st_mode & 0o077 == 0  # private: written through mkstemp
    first.path.chmod(0o666)  # planted or loosened: not used
    rebuilt = []
    real = kernels._run_clang
    monkeypatch.setattr(kernels, "_run_clang", lambda *a: rebuilt.append(1) or real(*a))
    again = kernels.build("rope.hip", "gfx942")
    assert rebuilt and again.data == first.data
    assert first.path.stat().st_mode & 0o077 == 0  # and replaced by a private copy


def test_build_all_lists_every_kernel():
    rows = kernels.build_all("gfx1100")
    assert {r["symbol"] for r in rows} == set(kernels.KERNELS)
    assert all(r["present"] and r["spills"] == 0 and r["scratch"] == 0 for r in rows)
    # For sm_90 each source builds as a cuda:sm_90 module embeds it: the Hopper families as sm_90a.
    assert kernels.source_arch("linear_wgmma.hip", "sm_90") == kernels.source_arch("linear_qwgmma.hip", "sm_90a")
    assert kernels.source_arch("linear_wgmma.hip", "sm_90") == "sm_90a"
    assert kernels.source_arch("rms_norm.hip", "sm_90") == "sm_90"
    assert kernels.source_arch("linear_wgmma.hip", "sm_80") == "sm_80"


# ---- graphs with the three ops -------------------------------------------------------------------------------


def _three_ops_graph(dtype="f16"):
    g = rocmc.Graph("blk")
    x = g.input("x", ("n", 4096), dtype)
    w = g.input("w", (4096,), dtype)
    q = g.input("q", (2, 8, "t", 64), dtype)
    c, s = g.input("cos", (128, 32), dtype), g.input("sin", (128, 32), dtype)
    g.output(ops.rms_norm(x, w), ops.layer_norm(x, w, w), ops.rope(q, c, s))
    return g


@pytest.mark.parametrize("target", GPU_TARGETS)
def test_graph_dispatches_use_kernels(target):
    art = rocmc.compile(_three_ops_graph(), target)
    arch = target.split(":")[-1]
    assert [c["impl"] for c in art.implementations] == ["kernel", "kernel", "kernel"]
    hand = [d for d in art.dispatches() if d["kind"] == "hand-written"]
    assert sorted(d["name"] for d in hand) == ["layer_norm_f16_short", "rms_norm_f16_short", "rope_half_f16"]
    assert all(d["arch"] == arch for d in hand)
    # Hermetic: every embedded code object is inside the .vmfb, byte for byte: an AMDGPU source's whole, a PTX
    # source's one entry a dispatched kernel (the driver compiles every entry of a PTX module when it loads).
    for d in hand:
        obj = kernels.build(kernels.KERNELS[d["name"]].source, arch)
        assert obj.only(d["name"]).data in art.vmfb
        if obj.kind == "cuda":
            assert obj.only(d["name"]).symbols == [d["name"]] and obj.data not in art.vmfb
    # The module declares the workgroup size the kernels were built for.
    sizes = set(re.findall(r"<\{workgroup_size = \[(\d+) : index", art.ir("input")))
    assert sizes == {str(s.workgroup[0]) for s in kernels.KERNELS.values() if s.source in ("rms_norm.hip", "rope.hip")}


def test_saved_artifact_knows_its_kernels(tmp_path):
    art = rocmc.compile(_three_ops_graph("bf16"), "gfx942")
    loaded = rocmc.Artifact.load(art.save(tmp_path / "m.vmfb"))
    assert {k["symbol"] for k in loaded.metadata["kernels"]} == {
        "rms_norm_bf16_short",
        "layer_norm_bf16_short",
        "rope_half_bf16",
    }


def test_cpu_and_generated_switch_use_no_kernels():
    g = _three_ops_graph()
    for target, impl in (("cpu", None), ("gfx942", "generated"), ("cuda:sm_80", {"rms_norm": "generated"})):
        art = rocmc.compile(g, target, impl=impl)
        chosen = {c["op"]: c["impl"] for c in art.implementations}
        want_rms = "generated"
        assert chosen["rms_norm"] == want_rms
        expect_kernel = target != "cpu" and impl != "generated"
        assert (chosen["rope"] == "kernel") == expect_kernel
        assert bool(art.metadata["kernels"]) == expect_kernel


def test_cpu_results_match_reference_for_the_graph(rng):
    """The same graph on the CPU (generated code) is right: the GPU run compares with the same reference."""
    g = _three_ops_graph("f32")
    ins = [rng.uniform(-2, 2, s).astype(np.float32) for s in ((3, 4096), (4096,), (2, 8, 5, 64), (128, 32), (128, 32))]
    got, want = rocmc.load(rocmc.compile(g, "cpu"))(*ins), rocmc.evaluate(g, *ins)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-4)


# ---- falling back, and errors ----------------------------------------------------------------------------------


def test_mixed_dtypes_fall_back_with_reason():
    g = rocmc.Graph("t")
    x = g.input("x", (4, 64), "bf16")
    w = g.input("w", (64,), "f32")
    q = g.input("q", (1, 2, 3, 8), "f16")
    c, s = g.input("c", (3, 4), "f32"), g.input("s", (3, 4), "f32")
    g.output(ops.rms_norm(x, w), ops.rope(q, c, s))
    art = rocmc.compile(g, "gfx942")
    for rec in art.implementations:
        assert rec["impl"] == "generated"
        assert any(r.startswith("kernel: ") and "kernel reads one element type" in r for r in rec["skipped"]), rec


def test_arch_clang_cannot_build_falls_back():
    problem = kernels.arch_problem("gfx950")
    if problem is None:
        pytest.skip("this clang builds gfx950")
    g = rocmc.Graph("t")
    g.output(ops.rms_norm(g.input("x", (4, 64), "f32")))
    rec = rocmc.compile(g, "gfx950").implementations[0]
    assert rec["impl"] == "generated" and "gfx950" in rec["skipped"][0]


def test_kernel_sources_come_from_the_wheel_then_the_checkout_and_the_env_overrides_both(tmp_path, monkeypatch):
    monkeypatch.delenv("ROCMC_KERNEL_DIR", raising=False)
    package = tmp_path / "rocmc"
    package.mkdir()
    (tmp_path / "custom_kernels").mkdir()
    assert kernels._kernel_dir(package) == tmp_path / "custom_kernels"
    (package / "kernels").mkdir()
    assert kernels._kernel_dir(package) == package / "kernels"
    monkeypatch.setenv("ROCMC_KERNEL_DIR", str(tmp_path / "own"))
    assert kernels._kernel_dir(package) == tmp_path / "own"


def test_broken_kernel_gives_clang_diagnostics(tmp_path, monkeypatch):
    for p in kernels.KERNEL_DIR.glob("*.h"):
        (tmp_path / p.name).write_text(p.read_text())
    (tmp_path / "rms_norm.hip").write_text('#include "rows.h"\nKERNEL(256) void rms_norm_f32() { undefined_fn(); }\n')
    monkeypatch.setattr(kernels, "KERNEL_DIR", tmp_path)
    with pytest.raises(rocmc.CompileError) as e:
        kernels.build("rms_norm.hip", "gfx942")
    assert e.value.stage == "kernel-build"
    assert "undefined_fn" in e.value.diagnostics and "error" in e.value.diagnostics


def test_missing_clang_names_what_to_install(monkeypatch):
    monkeypatch.setenv("ROCMC_CLANG", "/nonexistent/clang")
    with pytest.raises(rocmc.CompileError, match=r"clang-19 lld-19"):
        kernels.build("rope.hip", "sm_80")


def test_unknown_arch_is_an_error():
    with pytest.raises(rocmc.CompileError, match="gfxNNN"):
        kernels.build("rope.hip", "ampere")


@pytest.mark.parametrize("kwargs, match", [({"rotary_dim": 10}, "rotary_dim"), ({"rotary_dim": 3}, "rotary_dim")])
def test_rope_bad_rotary_dim_is_a_graph_error(kwargs, match):
    g = rocmc.Graph("t")
    q = g.input("q", (1, 2, 3, 8), "f32")
    c = g.input("c", (3, 4), "f32")
    with pytest.raises(rocmc.GraphError, match=match):
        ops.rope(q, c, c, **kwargs)


def test_rope_odd_head_dim_is_a_graph_error():
    g = rocmc.Graph("t")
    q = g.input("q", (1, 2, 3, 7), "f32")
    c = g.input("c", (3, 3), "f32")
    with pytest.raises(rocmc.GraphError, match="head dim"):
        ops.rope(q, c, c)


# ---- launch geometry ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_group_size_fits_the_register_cache(dtype):
    for cols in (1, 7, 24, 1001, 4096, 8192, 20000, 100000):
        suffix, cache = kernel_norm.variant(cols, dtype)
        g = kernel_norm.group_size(cols, dtype, cache)
        assert g & (g - 1) == 0 and 1 <= g <= kernel_norm.BLOCK
        vec = kernel_norm.WIDE[dtype] if cols % kernel_norm.WIDE[dtype] == 0 else 1
        assert g == kernel_norm.BLOCK or g * vec * cache >= cols  # the row fits, or all threads help
        assert g == 1 or (g // 2) * vec * cache < cols  # and no more threads than needed
        assert (suffix == "_short") == (cols <= kernel_norm.BLOCK * kernel_norm.SHORT_CACHE * vec)


def test_long_and_symbolic_rows_use_the_general_kernel():
    g = rocmc.Graph("t")
    a, b = g.input("a", (2, 8192), "f32"), g.input("b", (2, "m"), "bf16")
    g.output(ops.rms_norm(a), ops.layer_norm(b))
    art = rocmc.compile(g, "gfx1100")
    assert [k["symbol"] for k in art.metadata["kernels"]] == ["rms_norm_f32", "layer_norm_bf16"]


def test_dynamic_group_size_matches_static():
    """The group size computed in the module for symbolic row lengths equals the static choice."""
    from iree import runtime as rt
    from rocmc.lowering.emitter import Emitter
    from rocmc.lowering.compiler import compile_bytecode
    from rocmc.lowering.module import _to_bytecode
    from rocmc.lowering.target import Target

    E = Emitter()
    E.lines.append("  %cols = arith.index_cast %arg0 : i32 to index")
    g = kernel_norm._group(E, "%cols", "bf16")
    body = "\n".join(E.lines)
    text = (
        f"module {{ func.func @main(%arg0: i32) -> i32 {{\n{body}\n"
        f"  %r = arith.index_cast {g} : index to i32\n  return %r : i32\n}} }}"
    )
    vmfb = compile_bytecode(_to_bytecode(text, {}), Target.parse("cpu"))
    ctx = rt.SystemContext(config=rt.Config("local-sync"))
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
    for cols in (1, 5, 64, 65, 1001, 4096, 4104, 20000):
        assert int(ctx.modules.module["main"](cols)) == kernel_norm.group_size(cols, "bf16"), cols
    del ctx


def test_rope_items_cover_the_row():
    for d, r, inter in ((128, 64, False), (128, 16, True), (6, 3, False), (20, 3, True), (2, 1, False)):
        n = kernel_rope.items_per_row(d, r, inter, "f16")
        u = 8 if d % 8 == 0 and r % 8 == 0 else (2 if inter else 1)
        covered = n * u + (r if not inter and n * u < d else 0)
        assert covered == d, (d, r, inter)


def test_kernel_change_invalidates_compiled_artifacts(monkeypatch):
    g = rocmc.Graph("t")
    g.output(ops.rms_norm(g.input("x", (4, 96), "f16")))
    rocmc.compile(g, "gfx942")
    assert rocmc.compile(g, "gfx942").cached
    monkeypatch.setattr(kernels, "sources_digest", lambda: "edited kernel sources")
    assert not rocmc.compile(g, "gfx942").cached
