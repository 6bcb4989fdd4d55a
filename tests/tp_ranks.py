"""Running a tensor-parallel LLM as processes under `rocmc launch`: a rank script that generates and writes what it
got (greedy, sampled and batched tokens, the summary) to <out>.<rank>.json, and the launcher."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from llm_models import PROMPT_IDS

RANK_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import rocmc
    art, ckpt, degree, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    lm = rocmc.llm.load(art, ckpt, tensor_parallel=degree)
    result = {"rank": lm.rank, "greedy": lm.generate(%s, 10, stop_tokens=()),
           "sampled": lm.generate(%s, 8, temperature=0.9, top_k=16, seed=11, stop_tokens=()),
           "batch": lm.generate([%s, %s], 6, stop_tokens=()), "summary": lm.summary()}
    with open(f"{out}.{os.environ.get('RANK', '0')}.json", "w") as f:
        json.dump(result, f)
""") % (list(PROMPT_IDS), list(PROMPT_IDS), list(PROMPT_IDS[:3]), list(PROMPT_IDS))


def launch(n, *args, timeout=240, env=None):
    return subprocess.run(
        [sys.executable, "-m", "rocmc.cli", "launch", "-n", str(n), sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def results(prefix) -> list:
    return [json.loads(p.read_text()) for p in sorted(prefix.parent.glob(prefix.name + ".*.json"))]
