"""Plots and Markdown tables from the benchmark results.

    python -m bench.plots [--out out/bench] [--img docs/img]

Reads <out>/cpu.json, <out>/gpu/gpu.json and <out>/compile_time.json (whichever exist) and the
hand-written kernel table of BENCHMARKS.md; writes PNG plots under --img and the Markdown tables the
"Models", "Compile time" and "Memory" sections of BENCHMARKS.md are made from to <out>/tables.md.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CPU_SYSTEMS = ("rocmc", "rocmc_tuned", "onnxruntime", "torch")
LABEL = {
    "rocmc": "rocmc",
    "rocmc_tuned": "rocmc + IREE flags",
    "onnxruntime": "ONNX Runtime",
    "torch": "PyTorch eager",
    "rocmc:kernels": "rocmc (hand-written kernels)",
    "rocmc:generated": "rocmc (generated only)",
    "rocmc:cudnn": "rocmc (cuDNN: conv, BN, pool, ReLU)",
    "rocmc:cudnn_conv": "rocmc (cuDNN conv)",
    "torch:eager": "PyTorch eager",
    "torch:compile": "torch.compile",
    "rocmc:kernels+static": "rocmc (kernels, static seq)",
    "rocmc:generated+static": "rocmc (generated, static seq)",
}


def _load(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def _bars(ax, cases, systems, value, ylabel, title):
    """Grouped bars: one group per case, one bar per system (missing results leave a gap)."""
    width = 0.8 / len(systems)
    for i, s in enumerate(systems):
        ys = [value(c, s) for c in cases]
        xs = np.arange(len(cases)) + (i - (len(systems) - 1) / 2) * width
        ax.bar(xs, [y if y is not None else 0 for y in ys], width, label=LABEL.get(s, s))
    ax.set_xticks(np.arange(len(cases)), cases, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _ms(row, s):
    r = row.get(s) or {}
    return r.get("median_ms")


def plot_latency(results, systems, title, path: Path) -> None:
    cases = list(results["cases"])
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cases)), 4.2))
    base = systems[-2] if "onnxruntime" in systems else "torch:eager"

    def rel(c, s):  # latency relative to the baseline system: bars of very different sizes stay readable
        row = results["cases"][c]
        a, b = _ms(row, s), (row.get(s) or {}).get("eager_same_run_ms") or _ms(row, base)
        return a / b if a and b else None

    _bars(
        ax,
        cases,
        [s for s in systems if any(_ms(results["cases"][c], s) for c in cases)],
        rel,
        f"latency / {LABEL[base]} (lower is faster)",
        title,
    )
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_compile(results, path: Path) -> None:
    rows = [r for r in results["rows"] if "seconds" in r.get("cold", {})]
    labels = [f"{r['model']}\n{r['target']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows)), 4.2))
    ax.bar(range(len(rows)), [r["cold"]["seconds"] for r in rows], label="cold")
    ax.bar(range(len(rows)), [r["cached"]["seconds"] for r in rows], label="cached")
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("seconds")
    ax.set_title("rocmc compile time (cold cache vs cached)")
    ax.axhline(10, color="r", lw=0.8, ls="--", label="goal (llama, gfx942): 10 s cold")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


_KROW = re.compile(
    r"^\| ((?:rms_norm|layer_norm|rope)[^|]*?) \| [^|]+ \| ([\d.]+) \| \**([\d.]+)\** \| ([\d.]+) \| ([\d.]+) \|"
)


def plot_kernels(md: str, path: Path) -> bool:
    """Hand-written kernels vs torch as a fraction of copy bandwidth (from BENCHMARKS.md's kernel table)."""
    rows = [m.groups() for m in map(_KROW.match, md.splitlines()) if m]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(10, 4.2))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [float(r[2]) for r in rows], 0.4, label="rocmc hand-written kernel")
    ax.bar(x + 0.2, [float(r[4]) for r in rows], 0.4, label="PyTorch")
    ax.set_xticks(x, [r[0] for r in rows], rotation=35, ha="right", fontsize=7)
    ax.set_ylabel("% of device-to-device copy bandwidth")
    ax.set_title("Memory-bound kernels on H100 (sm_80 PTX), fraction of measured copy bandwidth")
    ax.axhline(100, color="k", lw=0.8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ---- tables --------------------------------------------------------------------------------------


def _f(v, fmt="{:.2f}"):
    return fmt.format(v) if isinstance(v, (int, float)) else "-"


def _error(r: dict) -> str:
    err = r.get("error", "-")
    return "compile fails" if err.startswith("compile failed") else err[:40]


def cpu_table(res) -> str:
    systems = [s for s in CPU_SYSTEMS if any(s in r for r in res["cases"].values())]
    head = (
        "| case | " + " | ".join(f"{LABEL[s]} ms" for s in systems) + " | rocmc / ORT | tuned / ORT | rocmc / torch |"
    )
    lines = [head, "|" + "---|" * (len(systems) + 4)]
    for name, row in res["cases"].items():
        cells = [_f(_ms(row, s)) if _ms(row, s) else _error(row.get(s, {})) for s in systems]
        lines.append(
            f"| {name} | " + " | ".join(cells) + f" | {_f(row.get('rocmc_over_ort'))} | "
            f"{_f(row.get('rocmc_tuned_over_ort'))} | "
            f"{_f(row.get('rocmc_over_torch'))} |"
        )
    return "\n".join(lines)


def cpu_detail(res) -> str:
    lines = [
        "| case | system | median ms | min ms | p90 ms | GFLOP/s | peak RSS MB | max rel. error vs torch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in res["cases"].items():
        for s in CPU_SYSTEMS:
            r = row.get(s)
            if not r or "median_ms" not in r:
                continue
            gf = row["flops"] / r["median_ms"] / 1e6
            lines.append(
                f"| {name} | {LABEL[s]} | {_f(r['median_ms'])} | {_f(r['min_ms'])} | {_f(r['p90_ms'])} | "
                f"{gf:.1f} | {r['peak_rss_mb']:.0f} | {_f(r.get('rel_err_vs_torch'), '{:.1e}')} |"
            )
    return "\n".join(lines)


def merge_gpu(res, extra) -> None:
    """Add a later run's systems to `res`; ratios use that run's own torch eager time."""
    for name, row in extra["cases"].items():
        eager = _ms(row, "torch:eager")
        for s, r in row.items():
            if isinstance(r, dict) and s != "torch:eager":
                res["cases"].setdefault(name, {"flops": row["flops"]})[s] = dict(r, eager_same_run_ms=eager)


def cpu_runs_table(runs) -> str:
    """Several runs of run_cpu.py on a shared machine: each system's least-disturbed (lowest) median,
    the range of its medians, and the goal ratio from the lowest medians."""
    names = list(dict.fromkeys(c for r in runs for c in r["cases"]))
    alias = {"rocmc_dt": "rocmc_tuned"}  # earlier runs named the data-tiling variant so
    lines = [
        "| case | "
        + " | ".join(f"{LABEL[s]} ms (lowest; range)" for s in CPU_SYSTEMS)
        + " | rocmc / ORT | tuned / ORT |",
        "|" + "---|" * (len(CPU_SYSTEMS) + 3),
    ]
    for name in names:
        meds = {s: [] for s in CPU_SYSTEMS}
        for r in runs:
            for s, v in r["cases"].get(name, {}).items():
                if isinstance(v, dict) and "median_ms" in v:
                    meds[alias.get(s, s)].append(v["median_ms"])
        best = {s: min(m) if m else None for s, m in meds.items()}
        cells = [f"{best[s]:.1f} ({min(m):.1f}-{max(m):.1f}, {len(m)} runs)" if m else "-" for s, m in meds.items()]
        ort = best["onnxruntime"]
        ratio = lambda s: f"{best[s] / ort:.2f}" if best[s] and ort else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratio('rocmc')} | {ratio('rocmc_tuned')} |")
    return "\n".join(lines)


def gpu_table(res) -> str:
    lines = [
        "| case | system | median ms | min ms | TFLOP/s | vs torch eager | device MB | first call s | rel. error vs eager |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in res["cases"].items():
        for s, r in row.items():
            if not isinstance(r, dict):
                continue
            eager = r.get("eager_same_run_ms") or _ms(row, "torch:eager")
            if "median_ms" not in r:
                lines.append(f"| {name} | {LABEL.get(s, s)} | failed: {r.get('error', '')[:60]} | | | | | | |")
                continue
            ratio = f"{r['median_ms'] / eager:.2f}x" if eager else "-"
            lines.append(
                f"| {name} | {LABEL.get(s, s)} | {r['median_ms']:.3f} | {r['min_ms']:.3f} | "
                f"{row['flops'] / r['median_ms'] / 1e9:.1f} | {ratio} | {r['device_mb']:.0f} | "
                f"{r['first_call_s']:.2f} | {_f(r.get('rel_err_vs_eager'), '{:.1e}')} |"
            )
    return "\n".join(lines)


def compile_table(res) -> str:
    lines = [
        "| model | target | cold s | cached ms | graph build s | peak RSS MB (python) | peak RSS MB (iree-compile) | .vmfb MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        c, w = r.get("cold", {}), r.get("cached", {})
        if "seconds" not in c:
            lines.append(f"| {r['model']} | {r['target']} | failed: {c.get('error', '')[:60]} | | | | | |")
            continue
        lines.append(
            f"| {r['model']} | {r['target']} | {c['seconds']:.2f} | {_f(w.get('seconds', 0) * 1e3, '{:.1f}')} | "
            f"{c['graph_build_s']:.2f} | {c['peak_rss_mb']:.0f} | {c['iree_compile_peak_rss_mb']:.0f} | "
            f"{c['vmfb_mb']:.1f} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--img", default="docs/img")
    a = ap.parse_args()
    out, img = Path(a.out), Path(a.img)
    img.mkdir(parents=True, exist_ok=True)
    tables = []
    cpu = _load(out / "cpu.json")
    if cpu:
        plot_latency(
            cpu,
            list(CPU_SYSTEMS),
            f"CPU ({cpu['threads']} threads): latency relative to ONNX Runtime",
            img / "bench_cpu.png",
        )
        tables += ["## CPU", cpu_table(cpu), "", cpu_detail(cpu)]
        runs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("cpu_run*.json"))]
        if len(runs) > 1:
            tables += ["## CPU, all runs", cpu_runs_table(runs)]
    gpu = _load(out / "gpu" / "gpu.json")
    if gpu:
        for extra in sorted((out / "gpu").glob("gpu_*.json")):
            merge_gpu(gpu, json.loads(extra.read_text()))
        systems = [
            "rocmc:kernels",
            "rocmc:generated",
            "rocmc:kernels+static",
            "rocmc:generated+static",
            "rocmc:cudnn_conv",
            "rocmc:cudnn",
            "torch:eager",
            "torch:compile",
        ]
        plot_latency(gpu, systems, f"{gpu['device']}: latency relative to PyTorch eager", img / "bench_gpu.png")
        tables += ["## GPU", gpu_table(gpu)]
    ct = _load(out / "compile_time.json")
    if ct:
        plot_compile(ct, img / "bench_compile.png")
        tables += ["## Compile", compile_table(ct)]
    md = (ROOT / "BENCHMARKS.md").read_text()
    plot_kernels(md, img / "bench_kernels.png")
    (out / "tables.md").write_text("\n\n".join(tables) + "\n")
    print(f"wrote {out / 'tables.md'} and plots under {img}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
