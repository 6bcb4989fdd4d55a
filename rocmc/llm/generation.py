"""Generation settings and the host side of decoding: pure numpy, no device, no compiled module.

`GenerationConfig` holds the settings of one generation with the meaning transformers gives them;
`resolve(given, defaults)` fills the settings a caller did not give from the checkpoint's
generation_config.json (`checkpoint_defaults`), then from transformers' defaults. `HostSampler` chooses the
next token of each row from full logits (repetition penalty, temperature, top-k, top-p, then greedy argmax
or a seeded draw, in float64) and gives the chosen token's log-probability. `StopTracker` decides, row by
row, when a generation ends (stop tokens, stop strings, length) and why.

Which path a setting takes (`GenerationConfig.path`):

* "argmax": greedy decoding without a repetition penalty and without log-probabilities; the compiled
  module's own argmax picks the token and only the token crosses to the host.
* "sample": sampling whose top_k fits the module's `sample_k` (compile_hf(sample_k=)): the draw runs on the
  device among the sample_k most likely tokens (temperature, top_k, top_p, then a seeded Gumbel-max draw).
  top_k=0 (no top-k) takes this path only when sample_k covers the whole vocabulary.
* "host": everything that needs the full logits: repetition_penalty != 1, top_k beyond sample_k, top_k=0
  over a vocabulary larger than sample_k, and return_logprobs. The logits of each step come to the host and
  `HostSampler` processes them exactly (float64); a draw uses numpy's Generator seeded by (seed, row).

The same seed gives the same tokens on the same path; the device and host paths draw differently.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import InputError
from ..frontend.opdef import is_int

# rocmc's default number of new tokens when neither the caller nor the checkpoint gives a length
# (transformers' default is max_length=20, i.e. 20 new tokens in transformers 5).
DEFAULT_MAX_NEW_TOKENS = 32

# transformers' defaults of the sampling settings (GenerationConfig).
_HF_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0}

# The keys of generation_config.json that set a default here.
_CHECKPOINT_KEYS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "max_new_tokens", "max_length")

SEED_LIMIT = 1 << 62


@dataclass(frozen=True)
class GenerationConfig:
    """The settings of one generation, as transformers' GenerationConfig means them.

    max_new_tokens: new tokens per row at most; max_length: prompt + new tokens at most (the longest prompt
    of the call counts, as in a transformers batch); max_new_tokens wins when both are set.
    limit_given: whether the caller gave the length (else a length from the checkpoint or the default is
    capped at the KV cache instead of being an error).
    do_sample: False is greedy whatever the temperature. temperature > 0; top_k: 0 keeps every token;
    top_p in (0, 1]; repetition_penalty > 0 (1: none), over prompt + generated ids.
    num_return_sequences: generations per prompt (needs do_sample, as in transformers).
    stop_tokens: a row ends after one of these (None: the checkpoint's eos ids); stop_strings: a row ends
    once its generated text contains one of these. seed: in [0, 2**62), None for a fresh one.
    return_logprobs: give the log-probability of each chosen token."""

    max_new_tokens: int | None = None
    max_length: int | None = None
    limit_given: bool = False
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    num_return_sequences: int = 1
    stop_tokens: tuple[int, ...] | None = None
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None
    return_logprobs: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """InputError naming the first setting that is not what transformers accepts."""
        for name in ("max_new_tokens", "max_length"):
            v = getattr(self, name)
            if v is not None and not _is_int(v, 0 if name == "max_new_tokens" else 1):
                raise InputError(f"{name}={v!r}: expected an int >= {0 if name == 'max_new_tokens' else 1}")
        if not isinstance(self.do_sample, (bool, np.bool_)):
            raise InputError(f"do_sample={self.do_sample!r}: expected True or False")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise InputError(f"temperature={self.temperature!r}: expected a number > 0 (0 only for greedy)")
        if self.do_sample and self.temperature == 0:
            raise InputError(
                "temperature=0 with do_sample=True: sampling needs a temperature > 0 (do_sample=False is greedy)"
            )
        if not _is_int(self.top_k, 0):
            raise InputError(f"top_k={self.top_k!r}: expected an int >= 1, or 0 for no top-k")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise InputError(f"top_p={self.top_p!r}: expected a number in (0, 1]")
        if not _is_number(self.repetition_penalty) or not self.repetition_penalty > 0:
            raise InputError(f"repetition_penalty={self.repetition_penalty!r}: expected a number > 0 (1: none)")
        if not _is_int(self.num_return_sequences, 1):
            raise InputError(f"num_return_sequences={self.num_return_sequences!r}: expected an int >= 1")
        if self.num_return_sequences > 1 and not self.do_sample:
            raise InputError(
                f"num_return_sequences={self.num_return_sequences} needs do_sample=True: greedy "
                f"decoding gives the same sequence every time"
            )
        if self.stop_tokens is not None and not all(_is_int(t, 0) for t in self.stop_tokens):
            raise InputError(f"stop_tokens={list(self.stop_tokens)!r}: expected token ids (ints >= 0)")
        if not all(isinstance(s, str) and s for s in self.stop_strings):
            raise InputError(f"stop_strings={list(self.stop_strings)!r}: expected non-empty strings")
        if self.seed is not None and not (_is_int(self.seed, 0) and self.seed < SEED_LIMIT):
            raise InputError(f"seed={self.seed!r}: expected an int in [0, 2**62)")
        if not isinstance(self.return_logprobs, (bool, np.bool_)):
            raise InputError(f"return_logprobs={self.return_logprobs!r}: expected True or False")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_number(v) or not -2 <= v <= 2:
                raise InputError(f"{name}={v!r}: expected a number in [-2, 2] (0: none)")

    def new_tokens(self, prompt_len: int, cache: int) -> int:
        """New tokens per row for prompts of at most `prompt_len` tokens in a KV cache of `cache`
        positions. A length the caller gave must fit (InputError naming max_seq_len= and --max-seq-len);
        a default one is capped at the cache."""
        if self.max_new_tokens is not None:
            n, what = self.max_new_tokens, f"max_new_tokens={self.max_new_tokens}"
        elif self.max_length is not None:
            n, what = self.max_length - prompt_len, f"max_length={self.max_length}"
            if n < 1 and self.limit_given:
                raise InputError(
                    f"max_length={self.max_length} leaves no new token after a prompt of {prompt_len} "
                    f"tokens (max_length counts the prompt and the new tokens)"
                )
        else:
            n, what = DEFAULT_MAX_NEW_TOKENS, f"max_new_tokens={DEFAULT_MAX_NEW_TOKENS}"
        if prompt_len + n > cache:
            if not self.limit_given and prompt_len < cache:
                return cache - prompt_len
            raise InputError(
                f"prompt of {prompt_len} tokens + {what} exceeds the cache of {cache} positions: "
                f"compile with a larger max_seq_len= (--max-seq-len on the command line; "
                f"`rocmc generate --truncate` keeps the end of the prompt)"
            )
        return max(n, 0)

    def path(self, sample_k: int, vocab_size: int) -> str:
        """ "argmax", "sample" (on the device) or "host"; see the module docstring."""
        if self.repetition_penalty != 1 or self.return_logprobs or self.presence_penalty or self.frequency_penalty:
            return "host"
        if not self.do_sample:
            return "argmax"
        if self.top_k == 0:
            return "sample" if sample_k >= vocab_size else "host"
        return "sample" if min(self.top_k, vocab_size) <= sample_k else "host"


def checkpoint_defaults(directory) -> dict:
    """The settings generation_config.json in `directory` gives (only those it gives; a null top_k is 0,
    no top-k). An unreadable file is a ModelImportError naming it; a bad value an InputError naming it."""
    from .config import read_json

    path = Path(directory) / "generation_config.json"
    if not path.is_file():
        return {}
    raw = read_json(path)
    out = {k: raw[k] for k in _CHECKPOINT_KEYS if k in raw and (raw[k] is not None or k == "top_k")}
    if "top_k" in out and out["top_k"] is None:
        out["top_k"] = 0
    try:
        resolve({}, out)
    except InputError as e:
        raise InputError(f"{path}: {e}") from None
    return out


def resolve(given: dict, defaults: dict | None = None) -> GenerationConfig:
    """The settings of a call: the caller's (`given`, None meaning not given), then the checkpoint's
    (`defaults`, from checkpoint_defaults), then transformers' defaults. When the caller gives a temperature
    but not do_sample, a temperature > 0 means sampling and 0 greedy."""
    defaults = defaults or {}
    unknown = set(given) - {f.name for f in fields(GenerationConfig)} - {"limit_given"}
    if unknown:
        raise InputError(
            f"unknown generation setting {sorted(unknown)[0]!r}: expected one of "
            f"{', '.join(f.name for f in fields(GenerationConfig) if f.name != 'limit_given')}"
        )
    g = {k: v for k, v in given.items() if v is not None}

    def pick(name):
        return g[name] if name in g else defaults.get(name, _HF_DEFAULTS[name])

    if "do_sample" in g:
        do_sample = g["do_sample"]
    elif "temperature" in g and _is_number(g["temperature"]):
        do_sample = g["temperature"] > 0
    else:
        do_sample = pick("do_sample")
    temperature = pick("temperature")
    if not do_sample and _is_number(temperature) and temperature == 0:
        temperature = 1.0  # greedy: a temperature of 0 only says so
    limit_given = "max_new_tokens" in g or "max_length" in g
    source = g if limit_given else defaults
    lengths = {k: source[k] for k in ("max_new_tokens", "max_length") if k in source}
    if "max_new_tokens" in lengths:
        lengths.pop("max_length", None)
    stop_tokens = g.get("stop_tokens")
    stop_strings = g.get("stop_strings", ())
    return GenerationConfig(
        **lengths,
        limit_given=limit_given,
        do_sample=do_sample,
        temperature=temperature,
        top_k=pick("top_k"),
        top_p=pick("top_p"),
        repetition_penalty=pick("repetition_penalty"),
        num_return_sequences=g.get("num_return_sequences", 1),
        stop_tokens=None if stop_tokens is None else _int_tuple(stop_tokens, "stop_tokens"),
        stop_strings=(stop_strings,) if isinstance(stop_strings, str) else _tuple(stop_strings, "stop_strings"),
        seed=g.get("seed"),
        return_logprobs=g.get("return_logprobs", False),
        presence_penalty=g.get("presence_penalty", 0.0),
        frequency_penalty=g.get("frequency_penalty", 0.0),
    )


# ---- logits processors (numpy, float64) ------------------------------------------------------------


def apply_repetition_penalty(logits: np.ndarray, histories: Sequence[Sequence[int]], penalty: float) -> np.ndarray:
    """Each row's logits of the ids in its history (prompt + generated) divided by `penalty` where
    positive, multiplied where negative; each id once, whatever its count."""
    out = np.array(logits, dtype=np.float64)
    if penalty == 1:
        return out
    for r, ids in enumerate(histories):
        seen = np.unique(np.asarray(ids, dtype=np.int64))
        seen = seen[(seen >= 0) & (seen < out.shape[1])]
        s = out[r, seen]
        out[r, seen] = np.where(s < 0, s * penalty, s / penalty)
    return out


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    return np.asarray(logits, np.float64) / temperature if temperature != 1 else np.asarray(logits, np.float64)


def apply_top_k(logits: np.ndarray, top_k: int) -> np.ndarray:
    """-inf below each row's k-th largest logit (ties with it stay); top_k 0 or >= vocab keeps all."""
    x = np.array(logits, dtype=np.float64)
    v = x.shape[-1]
    if top_k == 0 or top_k >= v:
        return x
    kth = np.partition(x, v - top_k, axis=-1)[:, v - top_k : v - top_k + 1]
    x[x < kth] = -np.inf
    return x


def apply_top_p(logits: np.ndarray, top_p: float) -> np.ndarray:
    """-inf outside each row's smallest set of most likely tokens whose probability exceeds 1 - top_p
    from below: the tokens whose cumulative probability, counted from the least likely, is at most
    1 - top_p are dropped; the most likely token always stays."""
    x = np.array(logits, dtype=np.float64)
    if top_p >= 1:
        return x
    for r in range(x.shape[0]):
        order = np.argsort(x[r], kind="stable")  # least likely first
        cum = np.cumsum(softmax(x[r, order]))
        drop = cum <= 1 - top_p
        drop[-1] = False
        x[r, order[drop]] = -np.inf
    return x


def apply_count_penalties(logits: np.ndarray, generated: Sequence[Sequence[int]], presence: float, frequency: float):
    """OpenAI's presence and frequency penalties: each token's logit less `presence` if it was generated at all
    and `frequency` times the number of times it was (the generated tokens only, not the prompt's)."""
    x = np.array(logits, dtype=np.float64)
    if not presence and not frequency:
        return x
    for r, ids in enumerate(generated):
        toks, counts = np.unique(np.asarray(list(ids), np.int64), return_counts=True)
        x[r, toks] -= presence + frequency * counts
    return x


def process(
    logits: np.ndarray, histories: Sequence[Sequence[int]], cfg: GenerationConfig, generated=None
) -> np.ndarray:
    """The logits the next token is chosen from, as transformers processes them: the repetition penalty (over
    `histories`: prompt and generated ids), OpenAI's presence and frequency penalties (over `generated`, each
    row's generated ids; default: the histories), then (sampling only) temperature, top_k and top_p."""
    x = apply_repetition_penalty(logits, histories, cfg.repetition_penalty)
    if cfg.presence_penalty or cfg.frequency_penalty:
        counted = histories if generated is None else generated
        x = apply_count_penalties(x, counted, cfg.presence_penalty, cfg.frequency_penalty)
    if cfg.do_sample:
        x = apply_top_p(apply_top_k(apply_temperature(x, cfg.temperature), cfg.top_k), cfg.top_p)
    return x


def softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


class HostSampler:
    """Chooses each row's next token from full logits on the host: `process`, then the argmax (greedy) or a
    draw from the softmax with numpy's Generator seeded by (seed, row index), so a row's draws depend on its
    seed and its index in the call only. Also gives the chosen token's log-probability under the
    distribution it was chosen from (log_softmax of the processed logits)."""

    def __init__(self, cfg: GenerationConfig, rows: Sequence[int], seed: int | None):
        self.cfg = cfg
        if cfg.do_sample and seed is None:
            raise InputError("HostSampler: sampling needs a seed")
        self._rngs = [np.random.default_rng([seed, r]) for r in rows] if cfg.do_sample else None

    def choose(
        self, logits: np.ndarray, histories: Sequence[Sequence[int]], generated=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, log-probabilities), one per row of `logits` (rows, vocab); `generated`: each row's generated
        ids (for the presence and frequency penalties; default: the histories)."""
        x = process(np.asarray(logits)[: len(histories)], histories, self.cfg, generated)
        logp = log_softmax(x)
        self.last_logp = logp  # (rows, vocab): for the most likely alternatives (top_logprobs)
        if not self.cfg.do_sample:
            toks = np.argmax(x, axis=-1)
        else:
            toks = np.empty(len(x), np.int64)
            for r, rng in enumerate(self._rngs):
                p = np.exp(logp[r])
                cum = np.cumsum(p)
                i = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
                toks[r] = min(i, int(np.flatnonzero(p > 0)[-1]))
        return toks.astype(np.int64), logp[np.arange(len(x)), toks]


# ---- when a row ends ---------------------------------------------------------------------------------


@dataclass
class StopTracker:
    """Per row: the tokens kept, and whether (and why) the row has ended.

    A row ends after a token of `stop_tokens` (kept, as transformers keeps its eos), once its generated
    text (decoded incrementally by `decoder()`, a StreamDecoder-like object with push(id) -> new text)
    contains one of `stop_strings` (the token that completes it is kept), or after `max_new` tokens.
    finish_reason: "stop" or "length" (None while running)."""

    rows: int
    max_new: int
    stop_tokens: frozenset = frozenset()
    stop_strings: tuple[str, ...] = ()
    decoder: Callable | None = None
    tokens: list = field(init=False)
    finish_reason: list = field(init=False)

    def __post_init__(self):
        if self.stop_strings and self.decoder is None:
            raise InputError("stop_strings need the checkpoint's tokenizer (tokenizer.json) to decode the text")
        self.tokens = [[] for _ in range(self.rows)]
        self.finish_reason = [None] * self.rows if self.max_new > 0 else ["length"] * self.rows
        self._decoders = [self.decoder() for _ in range(self.rows)] if self.stop_strings else None
        self._text = [""] * self.rows

    @property
    def done(self) -> list[bool]:
        return [f is not None for f in self.finish_reason]

    @property
    def all_done(self) -> bool:
        return all(f is not None for f in self.finish_reason)

    def push(self, tokens) -> list:
        """Record one step's tokens (one per row; rows already ended are skipped). Returns the step's
        tokens with None for rows that had ended before it."""
        out = []
        for r, t in enumerate(tokens):
            if self.finish_reason[r] is not None:
                out.append(None)
                continue
            t = int(t)
            self.tokens[r].append(t)
            out.append(t)
            if t in self.stop_tokens or self._hits_stop_string(r, t):
                self.finish_reason[r] = "stop"
            elif len(self.tokens[r]) >= self.max_new:
                self.finish_reason[r] = "length"
        return out

    def _hits_stop_string(self, r: int, t: int) -> bool:
        if not self.stop_strings:
            return False
        before = len(self._text[r])
        self._text[r] += self._decoders[r].push(t)
        text = self._text[r]
        return any(s in text[max(0, before - len(s) + 1) :] for s in self.stop_strings)


@dataclass(frozen=True)
class GenerationResult:
    """One generated sequence: its new token ids (stop token included), their log-probabilities (when
    asked for, else None), the text of the new tokens (for a text prompt, else None) and why it ended
    ("stop": a stop token or string; "length": the length limit)."""

    tokens: list
    logprobs: list | None
    text: str | None
    finish_reason: str


# ---- helpers -----------------------------------------------------------------------------------------


def _is_int(v, minimum: int) -> bool:
    return is_int(v) and v >= minimum


def _is_number(v) -> bool:
    return (
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)) and np.isfinite(v)
    )


def _int_tuple(v, name: str) -> tuple:
    if _is_int(v, 0):
        return (int(v),)
    try:
        return tuple(int(t) if _is_int(t, 0) else t for t in v)
    except TypeError:
        raise InputError(f"{name}={v!r}: expected a token id or a list of them") from None


def _tuple(v, name: str) -> tuple:
    try:
        return tuple(v)
    except TypeError:
        raise InputError(f"{name}={v!r}: expected a string or a list of strings") from None


__all__ = [
    "GenerationConfig",
    "GenerationResult",
    "HostSampler",
    "StopTracker",
    "checkpoint_defaults",
    "resolve",
    "process",
    "DEFAULT_MAX_NEW_TOKENS",
]
