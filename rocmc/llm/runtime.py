"""Running a compiled causal LM: prompts in, tokens (or text) out.

The host keeps only token ids and the masks of a batch; the weights and the KV cache stay on the device.
A batch of prompts is left-padded to one length, so every row writes the same cache slot at each step;
a row's positions count from its first real token, and the masks hide the padding.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from .. import compile as _compile, load as _load
from ..artifact import Artifact
from ..errors import InputError, ModelImportError
from . import sharding
from .config import LlmConfig, default_max_seq_len, load_config, param_names
from .model import CACHE, FUNCTIONS, Shape, build, cache_shape

# The compute dtype of each target kind when the caller names none: the CPU runs f32 (fast and exact
# there), a GPU the checkpoint's own dtype.
_CHECKPOINT_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def compile_hf(config, target: str = "cpu", *, dtype: str | None = None, max_seq_len: int | None = None,
               max_batch: int = 1, sample_k: int = 64, functions=FUNCTIONS, tensor_parallel: int = 1,
               **compile_kwargs) -> Artifact:
    """Compile a causal LM from its config.json alone (a file, its directory, or an LlmConfig): no weight
    is read, and the module holds none (they are parameters named as in the checkpoint).

    max_seq_len: positions of the KV cache (default: the config's max_position_embeddings, capped so the
    cache fits KV_CACHE_BUDGET); max_batch: prompts per call; sample_k: sampling draws from this many most
    likely tokens. tensor_parallel=N: the program of one of N ranks, each on its own GPU holding 1/N of
    the weights and KV cache (rocmc.llm.sharding); run it with `load(..., tensor_parallel=N)` in N
    processes (`rocmc launch -n N`)."""
    cfg = config if isinstance(config, LlmConfig) else load_config(config)
    plan = sharding.plan(cfg, tensor_parallel)
    shape = model_shape(cfg, target, dtype, max_seq_len, max_batch, sample_k)
    info = {"llm": {"max_seq_len": shape.max_seq_len, "max_batch": shape.max_batch, "dtype": shape.dtype,
                    "sample_k": shape.sample_k, "family": cfg.family}}
    if plan.degree > 1:
        info["llm"]["tensor_parallel"] = plan.to_json()
    return _compile(build(cfg, shape, functions, plan), target, info=info, **compile_kwargs)


def model_shape(cfg: LlmConfig, target: str, dtype, max_seq_len, max_batch, sample_k: int = 64) -> Shape:
    from ..lowering.target import Target
    kind = Target.parse(target).kind
    if dtype is None:
        dtype = "f32" if kind == "cpu" else _CHECKPOINT_DTYPES[cfg.dtype]
    if dtype not in ("f32", "f16", "bf16"):
        raise InputError(f"dtype={dtype!r}: expected 'f32', 'f16' or 'bf16'")
    if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
        raise InputError(f"max_batch={max_batch!r}: expected an int >= 1")
    if max_seq_len is None:
        max_seq_len = default_max_seq_len(cfg, max_batch=max_batch, dtype=dtype)
    if not isinstance(max_seq_len, int) or isinstance(max_seq_len, bool) or not 1 <= max_seq_len:
        raise InputError(f"max_seq_len={max_seq_len!r}: expected an int >= 1")
    if max_seq_len > cfg.max_position_embeddings:
        raise InputError(f"max_seq_len={max_seq_len} exceeds the model's max_position_embeddings "
                         f"({cfg.max_position_embeddings})")
    if isinstance(sample_k, bool) or not isinstance(sample_k, int) or sample_k < 1:
        raise InputError(f"sample_k={sample_k!r}: expected an int >= 1")
    return Shape(max_seq_len=max_seq_len, max_batch=max_batch, dtype=dtype, sample_k=min(sample_k, cfg.vocab_size))


def load_hf(directory, target: str = "cpu", *, device: str | None = None, tensor_parallel: int = 1,
            **compile_kwargs) -> "LanguageModel":
    """Compile the checkpoint in `directory` (config.json + *.safetensors [+ tokenizer.json]) and load it;
    compile_kwargs as for `compile_hf` (dtype, max_seq_len, max_batch, sample_k, ...)."""
    directory = _checkpoint_dir(directory)
    art = compile_hf(directory, target, tensor_parallel=tensor_parallel, **compile_kwargs)
    return LanguageModel(art, directory, device=device, tensor_parallel=tensor_parallel)


def load(artifact, checkpoint, *, device: str | None = None, tensor_parallel: int = 1,
         parameters=None) -> "LanguageModel":
    """A saved artifact (from compile_hf) with a checkpoint directory: needs no compiler.

    tensor_parallel=N: this process is one of N ranks started by `rocmc launch -n N` (or torchrun): each
    loads the same artifact (compiled with tensor_parallel=N), reads only its slices of the checkpoint and
    runs on its own GPU (cuda:LOCAL_RANK); every rank runs the same calls and gets the same tokens.
    parameters: the checkpoint's tensors from elsewhere than its directory (a dict of arrays, an .irpa, or
    a Parameters; with tensor_parallel, this rank's own slices named as the artifact's parameters)."""
    art = artifact if isinstance(artifact, Artifact) else Artifact.load(artifact)
    return LanguageModel(art, _checkpoint_dir(checkpoint), device=device, tensor_parallel=tensor_parallel,
                         parameters=parameters)


def _checkpoint_dir(directory) -> Path:
    d = Path(directory)
    if not d.is_dir():
        raise InputError(f"checkpoint {str(d)!r} is not a directory (expected config.json and *.safetensors)")
    return d


class LanguageModel:
    """A compiled causal LM loaded with its weights on a device."""

    def __init__(self, artifact: Artifact, checkpoint: Path, device: str | None = None, tensor_parallel: int = 1,
                 parameters=None):
        self.config = load_config(checkpoint)
        self.artifact = artifact
        self.plan = _plan_of(artifact, self.config, tensor_parallel)
        self.sizes = _sizes_of(artifact, self.config, self.plan.degree)
        _check_artifact(artifact, self.config, self.plan)
        self.group, self.rank = None, 0
        if self.plan.degree > 1:
            self.group, params = _rank_parameters(artifact, checkpoint, self.plan, parameters)
            self.rank = self.group.rank
        else:
            params = checkpoint if parameters is None else parameters
        self.module = _load(artifact, device, parameters=params)
        self.tokenizer = _tokenizer(checkpoint)

    # ---- public API -----------------------------------------------------------------------
    def summary(self) -> str:
        """The artifact's summary, and the conversions made when the checkpoint was loaded (a checkpoint
        whose dtype is the compute dtype is used as it is: mapped on the CPU, uploaded once to a GPU)."""
        notes = self.module.parameter_notes
        head = (f"{self.config.family} model, {self.sizes.max_batch} x {self.sizes.max_seq_len} positions of KV "
                f"cache, checkpoint tensors " + (f"converted at load ({len(notes)}):" if notes else "used as stored"))
        plan = self.plan.describe() if self.plan.degree > 1 else []
        if plan:
            plan[0] += f" this is rank {self.rank}"
        return "\n".join([head, *[f"  {n}" for n in notes[:8]], *(["  ..."] if len(notes) > 8 else []), *plan,
                          self.artifact.summary()])

    def logits(self, ids) -> np.ndarray:
        """The prompt's logits, (1, len, vocab) f32 (one prompt) or (rows, max_len, vocab) for a list of
        prompts, left-padded (padded positions hold no meaningful values)."""
        prompts, _ = _prompts(ids)
        rows, batch = self._batch(prompts, 0)
        out = self.module.prefill(**batch.prefill_inputs(), output="device")
        return out[2].to_host()[:len(rows)]

    def generate(self, prompt, max_new_tokens: int = 32, *, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float = 1.0, seed: int | None = None, stop_tokens=None):
        """Continue `prompt`: a str (needs tokenizer.json) gives the new text; a list of token ids gives the
        new ids; a list of prompts gives a list of results. Greedy unless temperature > 0; then top_k (at
        most the sample_k the model was compiled with; None: all of those), top_p and seed (same seed,
        same tokens) shape the draw, which runs on the device. Stops at the config's eos tokens."""
        prompts, many = _prompts(prompt)
        outs = [[] for _ in prompts]
        for step in self.stream(prompts if many else prompt, max_new_tokens, temperature=temperature, top_k=top_k,
                                top_p=top_p, seed=seed, stop_tokens=stop_tokens):
            for i, tok in enumerate(step if many else [step]):
                if tok is not None:
                    outs[i].append(tok)
        texts = [isinstance(p, str) for p in prompts]
        res = [self.tokenizer.decode(o) if t else o for o, t in zip(outs, texts)]
        return res if many else res[0]

    def stream(self, prompt, max_new_tokens: int = 32, *, temperature: float = 0.0, top_k: int | None = None,
               top_p: float = 1.0, seed: int | None = None, stop_tokens=None) -> Iterator:
        """Yield new tokens as they are made: an id per step (a list of ids or None per row for a list of
        prompts; None once a row has stopped). Sampling arguments as in `generate`."""
        prompts, many = _prompts(prompt)
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise InputError(f"max_new_tokens={max_new_tokens!r}: expected an int >= 0")
        draw = self._sampler(temperature, top_k, top_p, seed)
        rows, batch = self._batch(prompts, max_new_tokens)
        stop = set(self.config.eos_token_ids if stop_tokens is None else stop_tokens)
        done = [False] * len(rows)
        if max_new_tokens == 0:
            return
        nxt = draw(self.module.prefill, batch.prefill_inputs(), 0)
        for step in range(max_new_tokens):
            toks = [int(t) for t in nxt[:len(rows)]]
            out = [None if d else t for t, d in zip(toks, done)]
            done = [d or t in stop for t, d in zip(toks, done)]
            yield out if many else out[0]
            if all(done) or step == max_new_tokens - 1:
                return
            nxt = draw(self.module.decode, batch.decode_inputs(nxt), step + 1)

    def text_stream(self, prompt: str, max_new_tokens: int = 32, **kwargs) -> Iterator[str]:
        """Yield the new text as it is made (whole characters only); arguments as for `generate`."""
        from .tokenizer import StreamDecoder
        if not isinstance(prompt, str):
            raise InputError(f"text_stream: prompt must be a str, got {type(prompt).__name__}")
        dec = StreamDecoder(self._need_tokenizer())
        for tok in self.stream(prompt, max_new_tokens, **kwargs):
            if tok is not None:
                piece = dec.push(tok)
                if piece:
                    yield piece
        rest = dec.flush()
        if rest:
            yield rest

    # ---- internals --------------------------------------------------------------------------
    def _sampler(self, temperature, top_k, top_p, seed):
        """step(function, inputs, step number) -> the next token of each row, as numpy: greedy from the
        function's own argmax, or drawn on the device by `sample` from logits that stay there."""
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
            raise InputError(f"temperature={temperature!r}: expected a number >= 0 (0: greedy)")
        if temperature == 0:      # the function's own argmax; only the tokens cross to the host
            return lambda fn, feeds, step: fn(**feeds, output="device")[0].to_host()
        k = self.sizes.sample_k
        if top_k is None:
            top_k = k
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= k:
            raise InputError(f"top_k={top_k!r}: expected an int in [1, {k}] (the model was compiled with "
                             f"sample_k={k}; compile_hf(..., sample_k=) for more)")
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
            raise InputError(f"top_p={top_p!r}: expected a number in (0, 1]")
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % (1 << 62))
            if self.group is not None:          # every rank draws with rank 0's seed: the same tokens
                seed = int(self.group.broadcast(str(seed).encode()).decode())
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 62:
            raise InputError(f"seed={seed!r}: expected an int in [0, 2**62)")
        if "sample" not in self.module.functions:
            raise InputError("this artifact was compiled without the 'sample' function")
        b = self.sizes.max_batch
        fixed = {"temperature": np.full(b, temperature, np.float32), "top_k": np.full(b, top_k, np.int64),
                 "top_p": np.full(b, top_p, np.float32)}

        def step(fn, feeds, n):
            logits = fn(**feeds, output="device")[1]
            # One key per (seed, step, row); random_uniform mixes it (splitmix64) with each candidate.
            key = np.array([(((seed << 20) | n) << 16 | r) % (1 << 63) for r in range(b)], np.int64)
            return self.module.sample(logits, key=key, **fixed)
        return step

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise InputError("this checkpoint has no tokenizer.json: pass token ids instead of text")
        return self.tokenizer

    def _batch(self, prompts, max_new_tokens: int):
        rows = [self._ids(p, i) for i, p in enumerate(prompts)]
        if len(rows) > self.sizes.max_batch:
            raise InputError(f"{len(rows)} prompts but the model was compiled for max_batch="
                             f"{self.sizes.max_batch}")
        longest = max(len(r) for r in rows)
        if longest + max_new_tokens > self.sizes.max_seq_len:
            raise InputError(f"prompt of {longest} tokens + max_new_tokens={max_new_tokens} exceeds the cache of "
                             f"{self.sizes.max_seq_len} positions (compile with a larger max_seq_len=)")
        return rows, _Batch(rows, self.sizes.max_batch, self.config)

    def _ids(self, prompt, i: int) -> list:
        if isinstance(prompt, str):
            ids = self._need_tokenizer().encode(prompt)
        elif isinstance(prompt, (list, tuple, np.ndarray)):
            if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompt):
                raise InputError(f"prompt {i}: expected token ids (ints), got {list(prompt)[:4]!r}")
            ids = [int(t) for t in prompt]
        else:
            raise InputError(f"prompt {i}: expected a str or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise InputError(f"prompt {i} is empty; give at least one token")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise InputError(f"prompt {i}: token id {bad[0]} is outside the vocabulary [0, {self.config.vocab_size})")
        return ids


def _prompts(prompt) -> tuple[list, bool]:
    """(the prompts, whether several were given): a str or a list of ids is one prompt; a list of those
    is several."""
    many = isinstance(prompt, (list, tuple)) and len(prompt) > 0 and isinstance(prompt[0], (str, list, tuple, np.ndarray))
    return (list(prompt) if many else [prompt]), many


class _Batch:
    """Left-padded prompts and what every call of a generation needs: positions and masks."""

    def __init__(self, rows: list, max_batch: int, cfg: LlmConfig):
        pad = cfg.pad_token_id or 0
        # The window of sliding-window layers, which take a mask of their own (None: no such layer).
        self.window = cfg.sliding_window if "sliding_attention" in cfg.layer_types else None
        self.s = max(len(r) for r in rows)
        # Rows past the prompts (the module's batch is fixed) hold one padding token attending to itself.
        rows = rows + [[pad]] * (max_batch - len(rows))
        self.pad_len = np.array([self.s - len(r) for r in rows])
        self.tokens = np.array([[pad] * (self.s - len(r)) + list(r) for r in rows], dtype=np.int64)
        j = np.arange(self.s)
        self.valid = j[None, :] >= self.pad_len[:, None]                      # (b, s): a real token
        self.positions = np.maximum(j[None, :] - self.pad_len[:, None], 0).astype(np.int64)
        self.next_pos = self.positions[:, -1] + 1
        self.kv = self.s                                                      # filled cache slots

    def prefill_inputs(self) -> dict:
        i, j = np.arange(self.s)[:, None], np.arange(self.s)[None, :]
        keep = ((j <= i)[None] & self.valid[:, None, :]) | (i == j)[None]     # a padded query sees itself
        feeds = {"tokens": self.tokens, "positions": self.positions, "mask": keep[:, None]}
        if self.window:
            feeds["window_mask"] = (keep & (i - j < self.window)[None])[:, None]
        return feeds

    def decode_inputs(self, nxt) -> dict:
        """Inputs of the decode step that writes slot `kv` (the step's token is `nxt`)."""
        slot = self.kv
        self.kv += 1
        j = np.arange(self.kv)[None, :]
        keep = np.concatenate([self.valid, np.ones((len(self.valid), self.kv - self.s), bool)], axis=1)
        feeds = {"tokens": np.asarray(nxt, dtype=np.int64).reshape(-1, 1),
                 "positions": self.next_pos.reshape(-1, 1).astype(np.int64), "mask": keep[:, None, None, :]}
        if self.window:
            feeds["window_mask"] = (keep & (slot - j < self.window))[:, None, None, :]
        self.next_pos = self.next_pos + 1
        return feeds


def _plan_of(art: Artifact, cfg: LlmConfig, tensor_parallel: int) -> "sharding.Plan":
    """The artifact's tensor-parallel plan (degree 1 when it has none), which must be what the caller asked."""
    meta = art.metadata.get("info", {}).get("llm", {}).get("tensor_parallel")
    plan = sharding.from_json(meta, cfg) if meta is not None else sharding.plan(cfg, 1)
    if isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int) or tensor_parallel < 1:
        raise InputError(f"tensor_parallel={tensor_parallel!r}: expected a number of GPUs >= 1")
    if plan.degree != tensor_parallel:
        raise InputError(f"the artifact was compiled for tensor_parallel={plan.degree}, not {tensor_parallel}: "
                         f"recompile with compile_hf(..., tensor_parallel={tensor_parallel}) or load it with "
                         f"tensor_parallel={plan.degree}")
    return plan


def _rank_parameters(art: Artifact, checkpoint: Path, plan, given):
    """This rank's group (every rank checked to run the same artifact on the same checkpoint) and its
    slices of the checkpoint."""
    from ..parameters import Parameters
    from ..runtime import distributed
    group = distributed.init(plan.degree)
    group.agree("artifacts", art.metadata.get("graph_hash", "") + art.metadata.get("target", ""))
    if given is not None:
        return group, given
    source = Parameters.open(checkpoint)
    group.agree("checkpoints", source.fingerprint((checkpoint / "config.json").read_bytes()))
    return group, source.shard({n: (s.source, s.axis) for n, s in plan.shards.items()}, group.rank, plan.degree)


def _sizes_of(art: Artifact, cfg: LlmConfig, degree: int = 1) -> Shape:
    """What the artifact was compiled for (compile_hf records it), checked against its KV cache."""
    info = art.metadata.get("info", {}).get("llm")
    states = {s["name"]: s for s in art.metadata.get("states", [])}
    ok = isinstance(info, dict) and all(isinstance(info.get(k), int) and info[k] >= 1
                                        for k in ("max_seq_len", "max_batch", "sample_k")) \
        and info.get("dtype") in _CHECKPOINT_DTYPES.values()
    if not ok or CACHE not in states:
        raise ModelImportError("the artifact is not a causal LM compiled by rocmc.llm.compile_hf")
    sizes = Shape(info["max_seq_len"], info["max_batch"], info["dtype"], info["sample_k"])
    shape = cache_shape(cfg, sizes, degree)
    if tuple(states[CACHE]["shape"]) != shape:
        raise ModelImportError(f"the artifact's KV cache is {states[CACHE]['shape']}, not the {list(shape)} of this "
                               f"config with max_seq_len={sizes.max_seq_len}, max_batch={sizes.max_batch}")
    return sizes


def _check_artifact(art: Artifact, cfg: LlmConfig, plan=None) -> None:
    """The artifact must be the model of this config: the same parameter names and shapes (a rank's
    slices of them under a tensor-parallel plan)."""
    if plan is not None and plan.degree > 1:
        want = {n: list(s.local(plan.degree)) for n, s in plan.shards.items()}
    else:
        want = {name: list(shape) for name, shape in param_names(cfg)}
    got = {p["name"]: p["shape"] for p in art.parameters}
    if got != {k: v for k, v in want.items() if k in got} or not set(got) <= set(want):
        diff = sorted(set(got) ^ set(want) | {k for k in set(got) & set(want) if got[k] != want[k]})
        raise ModelImportError(f"the artifact was compiled for another model than this checkpoint's config.json "
                               f"(parameter {diff[0]!r} differs)")


def _tokenizer(directory: Path):
    if not (directory / "tokenizer.json").is_file():
        return None
    from .tokenizer import Tokenizer
    return Tokenizer.from_dir(directory)
