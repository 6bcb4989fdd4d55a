"""Every code block of README.md runs as written, in order, in one working directory and one Python
namespace (a reader's session): ```python blocks are executed, ```sh blocks (and bare blocks of rocmc
commands) run line by line in bash.

What the README takes as given is made here, small: `model`, `ids` and `mask` (a torch module and its
inputs), the model files the commands name (model.onnx, model.pt2, model.vmfb, x.npy) and the checkpoint
directories (TinyLlama-1.1B/, Llama-2-7b/, Llama-2-70b/, tiny-llama/: tiny Llama checkpoints). GPU targets are compiled,
not run (no GPU here): a Python statement that loads on a hip or cuda device, and a command that runs a
module compiled for a GPU, are left out, each with its reason. `pip install` lines are checked against
pyproject.toml's extras (installing needs the package index); `make test` is this suite, so it is not run.
"""

import ast
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")


@dataclass
class Block:
    lang: str  # "python" or "sh"
    text: str
    line: int  # of the block's first line in README.md


_FENCE = re.compile(r"^```(\w*)\s*$")


def readme_blocks(text: str) -> list[Block]:
    """The README's ```python and ```sh blocks, and its bare ``` blocks whose lines are rocmc commands."""
    out, lang, start, body = [], None, 0, []
    for n, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if lang is None and m:
            lang, start, body = m.group(1), n + 1, []
        elif lang is not None and line.strip() == "```":
            code = "\n".join(body)
            if lang == "" and code.strip() and all(l.startswith("rocmc ") for l in code.strip().splitlines()):
                lang = "sh"
            if lang in ("python", "sh"):
                out.append(Block(lang, code, start))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, "README.md: a code block is not closed"
    return out


def test_readme_blocks_are_found():
    blocks = readme_blocks(README.read_text())
    assert {b.lang for b in blocks} == {"python", "sh"}
    assert sum(b.lang == "python" for b in blocks) >= 4 and sum(b.lang == "sh" for b in blocks) >= 3
    parsed = readme_blocks("x\n```python\na = 1\n```\n```\nrocmc targets\n```\n```\nnot a command\n```\n")
    assert [(b.lang, b.text, b.line) for b in parsed] == [("python", "a = 1", 3), ("sh", "rocmc targets", 6)]


# ---- what the README takes as given -------------------------------------------------------------------


class TinyLM(torch.nn.Module):
    """ids, mask (batch, seq) -> logits f32[batch, seq, vocab]."""

    def __init__(self, vocab=64, hidden=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.norm = torch.nn.Parameter(torch.ones(hidden))
        self.out = torch.nn.Linear(hidden, vocab)

    def forward(self, ids, mask):
        h = self.embed(ids) * mask.unsqueeze(-1).to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * self.norm  # RMSNorm, as exporters write it
        return self.out(torch.nn.functional.silu(h))


def tiny_llama(directory: Path, *, tokenizer: bool) -> None:
    """A 2-layer Llama checkpoint whose vocabulary holds the README's token ids (up to 7483)."""
    import llm_models  # tests/llm_models.py: pytest puts tests/ on sys.path

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **{**llm_models._SIZES, "vocab_size": 8192, "num_key_value_heads": 4, "bos_token_id": 1, "eos_token_id": 2}
    )
    transformers.LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    if tokenizer:  # covering the model's vocabulary, as a checkpoint's tokenizer does
        tk = llm_models.train_tokenizer("byte_fallback", 300)
        tk.add_tokens([f"<t{i}>" for i in range(tk.get_vocab_size(), config.vocab_size)])
        llm_models.save_tokenizer(
            tk, directory, bos_template=True, config={"add_bos_token": True, "chat_template": CHAT_TEMPLATE}
        )


# A Llama 2 style chat template, as such checkpoints carry in tokenizer_config.json.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


def make_given(work: Path) -> dict:
    """Files the README's commands name and the Python names its blocks take as given."""
    import rocmc
    from rocmc import ops

    (work / "examples").symlink_to(ROOT / "examples")
    tiny_llama(work / "TinyLlama-1.1B", tokenizer=True)
    tiny_llama(work / "Llama-2-7b", tokenizer=False)
    tiny_llama(work / "Llama-2-70b", tokenizer=True)
    tiny_llama(work / "tiny-llama", tokenizer=False)
    model = TinyLM().eval()
    ids = torch.randint(0, 64, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    torch.onnx.export(
        model,
        (ids, mask),
        str(work / "model.onnx"),
        dynamo=False,
        input_names=["ids", "mask"],
        dynamic_axes={"ids": {1: "seq"}, "mask": {1: "seq"}},
    )
    torch.export.save(torch.export.export(model, (ids, mask)), str(work / "model.pt2"))
    g = rocmc.Graph("model")
    x = g.input("x", shape=(2, "n"), dtype="f32")
    g.output(ops.relu(x))
    rocmc.compile(g, "cpu").save(work / "model.vmfb")
    np.save(work / "x.npy", np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5))
    return {
        "torch": torch,
        "transformers": transformers,
        "model": model,
        "ids": ids,
        "mask": mask,
        "Dim": torch.export.Dim,
    }


# ---- running blocks -----------------------------------------------------------------------------------

_GPU_DEVICE = re.compile(r"""device\s*=\s*["'](hip|cuda)""")


def run_python(block: Block, ns: dict, left_out: list) -> None:
    tree = ast.parse(block.text, filename=f"README.md:{block.line}")
    lines = block.text.splitlines()
    for stmt in tree.body:
        src = "\n".join(lines[stmt.lineno - 1 : stmt.end_lineno])
        where = f"README.md:{block.line + stmt.lineno - 1}"
        if _GPU_DEVICE.search(src):
            left_out.append((where, src.strip(), "loads on a GPU device (none here); its artifact was compiled"))
            continue
        code = compile(ast.Module([stmt], type_ignores=[]), where, "exec")
        try:
            exec(code, ns)
        except Exception as e:
            raise AssertionError(f"{where}: {src.strip()!r} failed: {type(e).__name__}: {e}") from e


def commands(text: str) -> list[tuple[int, str]]:
    """(line offset, command) of an sh block, `\\` continuations joined, comment-only lines dropped."""
    out, pending, first = [], "", 0
    for i, line in enumerate(text.splitlines()):
        if not pending:
            first = i
            if not line.strip() or line.lstrip().startswith("#"):
                continue
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        out.append((first, pending))
        pending = ""
    return out


def _gpu_module(argv: list, work: Path) -> str | None:
    """The GPU target of the module a `rocmc run/generate/launch` command runs, if any."""
    from rocmc.artifact import Artifact

    names = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--module"]
    if len(argv) > 2 and argv[:2] == ["rocmc", "run"]:
        names.append(argv[2])
    for name in names:
        target = Artifact.load(work / name).target
        if not target.startswith("cpu"):
            return target
    return None


def _extras() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def check_pip(argv: list) -> None:
    """`pip install rocmc` / `pip install 'rocmc[extra]'`: the package and each extra exist (pyproject.toml)."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert argv[:2] == ["pip", "install"] and len(argv) == 3, argv
    m = re.fullmatch(r"([\w-]+)(?:\[([\w,-]+)\])?", argv[2])
    assert m and m.group(1) == meta["name"], f"{argv[2]}: not the package {meta['name']}"
    for extra in filter(None, (m.group(2) or "").split(",")):
        assert extra in meta["optional-dependencies"], f"pip install {argv[2]}: no extra {extra!r}"


def run_sh(block: Block, work: Path, env: dict, left_out: list) -> None:
    for offset, cmd in commands(block.text):
        where = f"README.md:{block.line + offset}"
        argv = shlex.split(cmd, comments=True)
        cwd = work
        if argv[:1] == ["pip"]:
            check_pip(argv)
            left_out.append((where, cmd, "installs from the package index; checked against pyproject.toml"))
            continue
        if argv == ["make", "test"]:
            left_out.append((where, cmd, "the test suite this test is part of"))
            continue
        if argv[:1] == ["make"]:
            # the installation steps are done (this suite runs in the environment they make)
            argv, cwd = ["make", "-o", ".venv/.installed", "-o", ".venv/.apt", *argv[1:]], ROOT
            cmd = shlex.join(argv)
        elif argv[:1] == ["rocmc"] and (target := _gpu_module(argv, work)):
            left_out.append((where, cmd, f"runs a module compiled for {target} (no GPU here); the module was compiled"))
            continue
        proc = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (
            f"{where}: `{cmd}` exited with {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )


def test_readme_runs_as_written(tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    ns = make_given(work)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["ROCMC_QUIET"] = "1"
    monkeypatch.chdir(work)
    left_out: list = []
    for block in readme_blocks(README.read_text()):
        if block.lang == "python":
            run_python(block, ns, left_out)
        else:
            run_sh(block, work, env, left_out)
    # every file the README saves was written
    for name in ("block.vmfb", "out.vmfb", "m.onnx", "llama7b.vmfb", "llama70b_tp2.vmfb", "y.npz"):
        assert (work / name).is_file(), name
    with capsys.disabled():
        print(f"\nREADME.md: left out (not run here) {len(left_out)}:")
        for where, what, why in left_out:
            print(f"  {where}: {what.splitlines()[0][:90]}  -- {why}")
    # only what needs a GPU, the package index or this suite is left out
    assert all(re.search(r"GPU|package index|test suite", why) for _, _, why in left_out)


def test_all_extra_is_the_union_of_the_others():
    extras = _extras()
    (spec,) = extras["all"]
    m = re.fullmatch(r"rocmc\[([\w,-]+)\]", spec)
    assert m, spec
    named = set(m.group(1).split(","))
    assert named == set(extras) - {"all", "test"}, named
