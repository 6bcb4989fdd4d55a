"""Running a compiled causal LM: prompts in, tokens (or text) out.

The host keeps only token ids and each row's length; the weights and the KV cache stay on the device.
Every row of a batch lives in its own cache slot (rocmc.llm.model._Slots): the prompts are prefilled several
rows a call (rows of similar lengths together, each padded to its call's longest by repeating its last token,
at most PREFILL_CHUNK tokens a call, a longer prompt in chunks), then each decode step runs every row at its own
position, so rows of different lengths never wait on or disturb one another.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Iterator

import numpy as np

from ..artifact import Artifact
from ..arrays import as_numpy
from ..errors import InputError, ModelImportError
from ..dtypes import f32, i64
from ..lowering import compile as _compile
from ..runtime.module import host_copy, load as _load, reshaped
from . import chat, generation, sharding
from .config import LlmConfig, default_max_seq_len, kv_cache_bytes, load_config, param_dtypes, param_names
from .generation import GenerationConfig, GenerationResult, HostSampler, StopTracker
from .model import CACHE, FUNCTIONS, Shape, build, cache_shape

# The compute dtype of each target kind when the caller names none: the CPU runs f32 (fast and exact
# there), a GPU the checkpoint's own dtype.
_CHECKPOINT_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def compile_hf(
    config,
    target: str = "cpu",
    *,
    dtype: str | None = None,
    max_seq_len: int | None = None,
    max_batch: int = 1,
    sample_k: int = 64,
    functions=FUNCTIONS,
    tensor_parallel: int = 1,
    **compile_kwargs,
) -> Artifact:
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
    info = {
        "llm": {
            "max_seq_len": shape.max_seq_len,
            "max_batch": shape.max_batch,
            "dtype": shape.dtype,
            "sample_k": shape.sample_k,
            "family": cfg.family,
        }
    }
    if plan.degree > 1:
        info["llm"]["tensor_parallel"] = plan.to_json()
    if plan.degree == 1:  # decode steps issued ahead (LanguageModel._steps_ahead); a rank's steps are not
        compile_kwargs.setdefault("asynchronous", [f for f in ("decode", "sample") if f in functions])
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
        raise InputError(
            f"max_seq_len={max_seq_len} exceeds the model's max_position_embeddings ({cfg.max_position_embeddings})"
        )
    if isinstance(sample_k, bool) or not isinstance(sample_k, int) or sample_k < 1:
        raise InputError(f"sample_k={sample_k!r}: expected an int >= 1")
    return Shape(max_seq_len=max_seq_len, max_batch=max_batch, dtype=dtype, sample_k=min(sample_k, cfg.vocab_size))


def load_hf(
    directory, target: str = "cpu", *, device: str | None = None, tensor_parallel: int = 1, **compile_kwargs
) -> "LanguageModel":
    """Compile the checkpoint in `directory` (config.json + *.safetensors [+ tokenizer.json]) and load it;
    compile_kwargs as for `compile_hf` (dtype, max_seq_len, max_batch, sample_k, ...)."""
    checkpoint = _Checkpoint(_checkpoint_dir(directory))
    art = compile_hf(checkpoint.config, target, tensor_parallel=tensor_parallel, **compile_kwargs)
    return LanguageModel(art, checkpoint, device=device, tensor_parallel=tensor_parallel)


def load(
    artifact, checkpoint, *, device: str | None = None, tensor_parallel: int = 1, parameters=None
) -> "LanguageModel":
    """A saved artifact (from compile_hf) with a checkpoint directory: needs no compiler.

    tensor_parallel=N: this process is one of N ranks started by `rocmc launch -n N` (or torchrun): each
    loads the same artifact (compiled with tensor_parallel=N), reads only its slices of the checkpoint and
    runs on its own GPU (cuda:LOCAL_RANK); every rank runs the same calls and gets the same tokens.
    parameters: the checkpoint's tensors from elsewhere than its directory (a dict of arrays, an .irpa, or
    a Parameters; with tensor_parallel, this rank's own slices named as the artifact's parameters)."""
    art = artifact if isinstance(artifact, Artifact) else Artifact.load(artifact)
    return LanguageModel(
        art,
        _Checkpoint(_checkpoint_dir(checkpoint)),
        device=device,
        tensor_parallel=tensor_parallel,
        parameters=parameters,
    )


def _checkpoint_dir(directory) -> Path:
    d = Path(directory)
    if not d.is_dir():
        raise InputError(f"checkpoint {str(d)!r} is not a directory (expected config.json and *.safetensors)")
    return d


class _Checkpoint:
    """A checkpoint directory as one load reads it: config.json once, parsed (with generation_config.json's
    token ids) and as bytes (which the ranks of a tensor-parallel run compare)."""

    def __init__(self, directory):
        from .config import read_config

        self.directory = directory
        self.config, self.config_bytes = read_config(directory)


class LanguageModel:
    """A compiled causal LM loaded with its weights on a device."""

    def __init__(
        self, artifact: Artifact, checkpoint: Path, device: str | None = None, tensor_parallel: int = 1, parameters=None
    ):
        source = checkpoint if isinstance(checkpoint, _Checkpoint) else _Checkpoint(checkpoint)
        checkpoint = source.directory
        self.config = source.config
        self.artifact = artifact
        self.plan = _plan_of(artifact, self.config, tensor_parallel)
        self.sizes = artifact_sizes(artifact, self.config, self.plan.degree)
        _check_artifact(artifact, self.config, self.plan)
        self.group, self.rank = None, 0
        if self.plan.degree > 1:
            self.group, params = _rank_setup(artifact, source, self.plan, parameters)
            self.rank = self.group.rank
        else:
            params = self.plan.parameters(checkpoint if parameters is None else parameters)
        self.module = _load(artifact, device, parameters=params)
        # Decode steps issued one ahead of the tokens read (LanguageModel._steps_ahead) where the module
        # has the stream-ordered functions; False: each step's tokens are read before the next is issued.
        self.pipeline = True
        self.checkpoint = checkpoint
        self.tokenizer = _tokenizer(checkpoint)

    # ---- public API -----------------------------------------------------------------------
    def summary(self) -> str:
        """The artifact's summary, and the conversions made when the checkpoint was loaded (a checkpoint
        whose dtype is the compute dtype is used as it is: mapped on the CPU, uploaded once to a GPU)."""
        notes = self.module.parameter_notes
        head = (
            f"{self.config.family} model, {self.sizes.max_batch} x {self.sizes.max_seq_len} positions of KV "
            f"cache, checkpoint tensors " + (f"converted at load ({len(notes)}):" if notes else "used as stored")
        )
        if self.config.quant is not None:
            packed = sum(s.name.endswith(".weight_q") for s in self.plan.shards.values())
            head += (
                f"\n  quantized: {self.config.quant.describe()}; {packed} projections converted at load to "
                "quantized_linear's packed layout (their values stay packed on the device)"
            )
        joined = sum(len(s.sources) > 1 for s in self.plan.shards.values() if s.name.endswith(".weight"))
        if joined:
            head += (
                f"\n  joined at load: {joined} projections (q/k/v, gate/up: one tensor each on the device, "
                "made in host memory from the checkpoint's)"
            )
        plan = self.plan.describe() if self.plan.degree > 1 else []
        if plan:
            plan[0] += f" this is rank {self.rank}"
        return "\n".join(
            [
                head,
                *[f"  {n}" for n in notes[:8]],
                *(["  ..."] if len(notes) > 8 else []),
                *plan,
                *self._step_lines(),
                self.artifact.summary(),
            ]
        )

    def _step_lines(self) -> list[str]:
        """What one prefill and one decode call issue (from the HAL program), for an artifact compiled here
        (a loaded one has no stages to read)."""
        if not self.artifact.can_produce_stages:
            return []
        calls = self.artifact.call_structure()
        return [f"per {name} call: {calls[name].describe()}" for name in ("prefill", "decode") if name in calls]

    def logits(self, ids) -> np.ndarray:
        """The prompt's logits, (1, len, vocab) f32 (one prompt) or (rows, max_len, vocab) for a list of
        prompts, each row's own logits first (the positions past a shorter prompt hold zeros)."""
        prompts, _ = _prompts(ids)
        rows = self._rows(prompts, 0)
        out = np.zeros((len(rows), max(len(r) for r in rows), self.config.vocab_size), np.float32)
        slots = _SlotTable(self.sizes, self.config)
        for call, feeds in slots.prefill_rows(list(enumerate(rows))):
            every = host_copy(self.module.prefill(**feeds, output="device")[2], f32)
            for j, slot in enumerate(call):  # a row's positions, its pads repeating the last
                begin, end = (int(p) for p in feeds["positions"][j, [0, -1]])
                out[slot, begin : end + 1] = every[j, : end + 1 - begin]
        return out

    def generation_config(self, **settings) -> GenerationConfig:
        """The settings of a generation (rocmc.llm.generation.GenerationConfig): those given (None: not
        given), then the checkpoint's generation_config.json, then transformers' defaults."""
        return generation.resolve(settings, self.generation_defaults)

    @functools.cached_property
    def generation_defaults(self) -> dict:
        """The settings the checkpoint's generation_config.json gives (do_sample, temperature, top_k, top_p,
        repetition_penalty, max_new_tokens/max_length)."""
        return generation.checkpoint_defaults(self.checkpoint)

    @functools.cached_property
    def chat_templates(self) -> dict:
        """{name: Jinja source} of the checkpoint's chat templates (rocmc.llm.chat)."""
        return chat.load_templates(self.checkpoint)

    def generate(
        self,
        prompt,
        max_new_tokens: int | None = None,
        *,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        max_length: int | None = None,
        repetition_penalty: float | None = None,
        num_return_sequences: int = 1,
        stop_strings=None,
        stop_tokens=None,
        seed: int | None = None,
        return_logprobs: bool = False,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
    ):
        """Continue `prompt`, with transformers' meaning of each setting.

        prompt: a str (needs tokenizer.json; gives the new text), a list of token ids (gives the new ids), a
        list of prompts, a 2-D numpy int array or a torch CPU int tensor (1-D: one prompt, 2-D: a row per
        prompt); several prompts give a list. num_return_sequences=n repeats each prompt n times (a list of
        len(prompts) * n results, each prompt's n together, as transformers orders them). More rows than the
        module's max_batch run in chunks of max_batch, one after the other.

        Settings left None come from the checkpoint's generation_config.json, then transformers' defaults
        (greedy, temperature 1, top_k 50, top_p 1, no repetition penalty), except the length: without
        max_new_tokens or max_length from the caller or the checkpoint, rocmc makes 32 new tokens
        (transformers: 20), and a length the caller did not give is capped at the KV cache.
        do_sample=False is greedy whatever the temperature; when do_sample is not given, a temperature > 0
        from the caller means sampling (0: greedy). max_length counts the longest prompt + new tokens.
        top_k=0 samples from the whole vocabulary. repetition_penalty applies to the ids of the prompt and
        the tokens generated so far. stop_tokens: a row ends after one of these (default: the eos ids; the
        stop token is kept, as transformers keeps it); stop_strings: a row ends once its generated text
        contains one of these (the tokens up to and including the one that completes it are kept; needs
        the tokenizer). seed: the same seed gives the same tokens. presence_penalty and frequency_penalty
        (OpenAI's, in [-2, 2]): each token's logit less presence_penalty if it was generated so far and
        frequency_penalty times the number of times it was (the generated tokens only).

        Where it runs (rocmc.llm.generation): greedy without a repetition penalty or log-probabilities uses
        the module's argmax; sampling whose top_k fits the compiled sample_k draws on the device; a
        penalty, a top_k beyond sample_k (or 0 over a larger vocabulary) and return_logprobs
        bring each step's logits to the host and choose there in float64 (draws from numpy's Generator).

        return_logprobs=True: GenerationResult objects (tokens, logprobs, text, finish_reason) instead of
        text or ids; logprobs are the log-probabilities of the chosen tokens under the distribution they
        were chosen from (log_softmax of the processed logits: after the penalty, temperature, top_k and
        top_p), as transformers' compute_transition_scores(..., normalize_logits=True) gives them."""
        cfg = self.generation_config(
            max_new_tokens=max_new_tokens,
            max_length=max_length,
            do_sample=do_sample,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=repetition_penalty,
            num_return_sequences=num_return_sequences,
            stop_strings=stop_strings,
            stop_tokens=stop_tokens,
            seed=seed,
            return_logprobs=return_logprobs,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
        )
        prompts, many = _prompts(prompt)
        rows = [self._ids(p, i) for i, p in enumerate(prompts)]
        results = self._generate(rows, [isinstance(p, str) for p in prompts], cfg)
        out = results if cfg.return_logprobs else [r.tokens if r.text is None else r.text for r in results]
        return out if many or cfg.num_return_sequences > 1 else out[0]

    def stream(self, prompt, max_new_tokens: int | None = None, **settings) -> Iterator:
        """Yield new tokens as they are made: an id per step (a list of ids or None per row for several
        prompts or num_return_sequences > 1; None once a row has ended); with return_logprobs=True,
        (id, logprob) pairs. Settings as in `generate`. The rows must fit one call (max_batch): unlike
        generate, stream does not run chunks."""
        cfg = self.generation_config(max_new_tokens=max_new_tokens, **settings)
        prompts, many = _prompts(prompt)
        rows = self._expand([self._ids(p, i) for i, p in enumerate(prompts)], cfg)
        if len(rows) > self.sizes.max_batch:
            raise InputError(
                f"stream: {len(rows)} rows but the model was compiled for max_batch="
                f"{self.sizes.max_batch} (generate() runs more prompts in chunks of max_batch)"
            )
        n_new = cfg.new_tokens(max(len(r) for r in rows), self.sizes.max_seq_len)
        tracker = self._tracker(len(rows), n_new, cfg)
        several = many or cfg.num_return_sequences > 1
        for toks, lps in self._steps(rows, cfg, n_new, self._seed(cfg), 0, tracker):
            item = list(zip(toks, lps)) if cfg.return_logprobs else toks
            yield item if several else item[0]

    def text_stream(self, prompt, max_new_tokens: int | None = None, **settings) -> Iterator[str]:
        """Yield the new text as it is made (whole characters only). prompt: a str, or the token ids of one
        prompt (chat ids from `encode_chat`, say); settings as for `generate`."""
        from .tokenizer import StreamDecoder

        if not isinstance(prompt, str) and (_prompts(prompt)[1] or settings.get("num_return_sequences", 1) != 1):
            raise InputError("text_stream: expected one prompt (a str or a list of token ids) and one sequence")
        if settings.get("return_logprobs"):
            raise InputError("text_stream: return_logprobs is for generate() and stream()")
        dec = StreamDecoder(self._need_tokenizer())
        for tok in self.stream(prompt, max_new_tokens, **settings):
            if tok is not None:
                piece = dec.push(tok)
                if piece:
                    yield piece
        rest = dec.flush()
        if rest:
            yield rest

    def encode_chat(
        self, messages, *, add_generation_prompt: bool = True, template: str | None = None, **variables
    ) -> list:
        """The token ids of `messages` ([{"role": "user", "content": "..."}, ...]) by the checkpoint's chat
        template (`template`: its name; default "default"), as transformers' apply_chat_template(...,
        tokenize=True) gives them: the template writes the special tokens it wants (a BOS, say), so the
        text is encoded without adding any. variables: more names the template reads."""
        tok = self._need_tokenizer()
        source = chat.select(self.chat_templates, template, f"checkpoint {str(self.checkpoint)!r}")
        text = chat.render(
            source,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=tok.special_tokens,
            **variables,
        )
        ids = tok.encode(text, add_bos=False, add_eos=False)
        if not ids:
            raise InputError("messages: the chat template rendered no text")
        return ids

    def chat(self, messages, max_new_tokens: int | None = None, *, template: str | None = None, **settings):
        """The reply to `messages` (a list of {"role", "content"} dicts, rendered by the checkpoint's chat
        template, see `encode_chat`): its text; a list of texts with num_return_sequences > 1;
        GenerationResult objects with return_logprobs=True. Settings as for `generate`."""
        cfg = self.generation_config(max_new_tokens=max_new_tokens, **settings)
        results = self._generate([self.encode_chat(messages, template=template)], [True], cfg)
        out = results if cfg.return_logprobs else [r.text for r in results]
        return out if cfg.num_return_sequences > 1 else out[0]

    # ---- internals --------------------------------------------------------------------------
    def _generate(self, rows: list, as_text: list, cfg: GenerationConfig) -> list:
        """GenerationResult per row (each prompt repeated num_return_sequences times), run in chunks of
        max_batch rows."""
        rows = self._expand(rows, cfg)
        as_text = [t for t in as_text for _ in range(cfg.num_return_sequences)]
        n_new = cfg.new_tokens(max(len(r) for r in rows), self.sizes.max_seq_len)
        seed = self._seed(cfg)
        if any(as_text):
            self._need_tokenizer()
        results = []
        b = self.sizes.max_batch
        for start in range(0, len(rows), b):
            chunk = rows[start : start + b]
            tracker = self._tracker(len(chunk), n_new, cfg)
            logprobs = [[] for _ in chunk]
            for _, lps in self._steps(chunk, cfg, n_new, seed, start, tracker):
                for r, lp in enumerate(lps):
                    if lp is not None:
                        logprobs[r].append(lp)
            for r, toks in enumerate(tracker.tokens):
                text = self.tokenizer.decode(toks) if as_text[start + r] else None
                results.append(
                    GenerationResult(toks, logprobs[r] if cfg.return_logprobs else None, text, tracker.finish_reason[r])
                )
        return results

    @staticmethod
    def _expand(rows: list, cfg: GenerationConfig) -> list:
        return [list(r) for r in rows for _ in range(cfg.num_return_sequences)]

    def _tracker(self, rows: int, n_new: int, cfg: GenerationConfig) -> StopTracker:
        stop = self.config.eos_token_ids if cfg.stop_tokens is None else cfg.stop_tokens
        decoder = None
        if cfg.stop_strings:
            from .tokenizer import StreamDecoder

            tok = self._need_tokenizer()
            decoder = lambda: StreamDecoder(tok)  # noqa: E731
        return StopTracker(rows, n_new, frozenset(stop), cfg.stop_strings, decoder)

    def _seed(self, cfg: GenerationConfig) -> int | None:
        """The call's seed: the caller's, or a fresh one for sampling (rank 0's on every rank)."""
        if cfg.seed is not None or not cfg.do_sample:
            return cfg.seed
        seed = int(np.random.SeedSequence().entropy % generation.SEED_LIMIT)
        if self.group is not None:  # every rank draws with rank 0's seed: the same tokens
            seed = int(self.group.broadcast(str(seed).encode()).decode())
        return seed

    def _steps(self, rows: list, cfg: GenerationConfig, n_new: int, seed, first_row: int, tracker: StopTracker):
        """Generate for one batch of rows (token id lists, at most max_batch): yield (tokens, logprobs) per
        step, None for rows that have ended (logprobs None unless cfg.return_logprobs). first_row: the
        index of rows[0] in the call, which seeds its draws (chunks draw as one batch would)."""
        if n_new == 0:
            return
        self._rows(rows, n_new)
        slots = _SlotTable(self.sizes, self.config)
        choose = self._sampler(cfg, len(rows), seed, first_row)
        histories = [list(r) for r in rows]
        nxt, lps = choose(self._prefill_rows(slots, rows), 0, histories)
        issue = self._issuer(cfg, seed, first_row) if self.pipeline and self.group is None else None
        ahead = self._steps_ahead(slots, nxt, n_new, issue) if issue is not None else None
        for step in range(n_new):
            toks = tracker.push(nxt[: len(rows)])
            for h, t in zip(histories, toks):
                if t is not None:
                    h.append(t)
            yield (
                toks,
                [
                    None if t is None or lps is None else float(lp)
                    for t, lp in zip(toks, lps if lps is not None else toks)
                ],
            )
            if tracker.all_done or step == n_new - 1:
                return
            if ahead is not None:
                nxt = next(ahead)
            else:
                nxt, lps = choose(self.module.decode(**slots.decode(nxt), output="device"), step + 1, histories)

    def _steps_ahead(self, slots: "_SlotTable", nxt, n_new: int, issue) -> Iterator[np.ndarray]:
        """The tokens of steps 1 .. n_new - 1 (step 0's come from the prefill), each decode step issued before
        the tokens of the one before are read: the device runs step n + 1 while the host reads step n's tokens
        and the caller uses them, so the host's time a step (issuing, Python) hides behind the device's. The
        step issued last when the caller stops early runs on unread (its row lengths are this table's own)."""
        b = self.sizes.max_batch
        chosen = issue(self.module.submit("decode", **slots.decode(nxt)), 1)
        for n in range(1, n_new):
            after = None
            if n + 1 < n_new:
                tokens = reshaped(chosen.outputs[0], (b, 1))
                after = issue(self.module.submit("decode", tokens=tokens, positions=slots.decode_positions()), n + 1)
            yield chosen.output(0)
            chosen = after

    def _issuer(self, cfg: GenerationConfig, seed, first_row: int):
        """For a path that chooses on the device (greedy argmax, or `sample`), issue(decode submission, step)
        -> the submission whose first output is the step's tokens (max_batch,), left on the device; None
        where the module lacks the stream-ordered functions or the host chooses."""
        path = cfg.path(self.sizes.sample_k, self.config.vocab_size)
        if path == "host" or not self.module.can_submit("decode"):
            return None
        if path == "argmax":
            return lambda sub, n: sub
        if not self.module.can_submit("sample"):
            return None
        fixed = self._sample_settings(cfg)

        def issue(sub, n):
            return self.module.submit("sample", sub.outputs[1], key=self._sample_key(seed, n, first_row), **fixed)

        return issue

    def _sample_settings(self, cfg: GenerationConfig) -> dict:
        """The `sample` function's inputs that stay the same every step, on the device (uploaded once a
        generation, not at every step)."""
        b, k = self.sizes.max_batch, self.sizes.sample_k
        top_k = k if cfg.top_k == 0 else min(cfg.top_k, k)
        return self.module.on_device(
            "sample",
            temperature=np.full(b, cfg.temperature, np.float32),
            top_k=np.full(b, top_k, np.int64),
            top_p=np.full(b, cfg.top_p, np.float32),
        )

    def _sample_key(self, seed, n: int, first_row: int) -> np.ndarray:
        """The `sample` function's key of each row of a call whose row 0 is the call's row `first_row`."""
        return np.array([sample_key(seed, n, first_row + r) for r in range(self.sizes.max_batch)], np.int64)

    def _prefill_rows(self, slots: "_SlotTable", rows: list) -> tuple:
        """Prefill each row into its slot: (greedy next tokens (max_batch,), last logits (max_batch, vocab)),
        on the host (rows past the prompts: zeros)."""
        b = self.sizes.max_batch
        tokens, logits = np.zeros(b, np.int64), np.zeros((b, self.config.vocab_size), np.float32)
        for call, feeds in slots.prefill_rows(list(enumerate(rows))):
            out = self.module.prefill(**feeds, output="device")
            # A row's last call sets its first token (an earlier chunk's is overwritten by the next).
            tokens[call] = host_copy(out[0], i64)
            logits[call] = host_copy(out[1], f32)
        return tokens, logits

    def _sampler(self, cfg: GenerationConfig, n_rows: int, seed, first_row: int = 0):
        """step(outputs, step number, histories) -> (the next token of each of the module's max_batch rows,
        numpy; their log-probabilities or None), from a call's (argmax tokens, logits), on the device or
        the host: greedy from the call's own argmax, drawn on the device by `sample` from logits that stay
        there, or chosen on the host from the logits (GenerationConfig.path says which)."""
        b, k = self.sizes.max_batch, self.sizes.sample_k
        path = cfg.path(k, self.config.vocab_size)
        if path == "argmax":  # the function's own argmax; only the tokens cross to the host
            return lambda out, n, hist: (host_copy(out[0], i64), None)
        if path == "host":
            sampler = HostSampler(cfg, range(first_row, first_row + n_rows), seed)
            starts: list = []  # each row's prompt length: the histories at the first step

            def host_step(out, n, hist):
                if not starts:
                    starts.extend(len(h) for h in hist)
                generated = [h[s:] for h, s in zip(hist, starts)]
                toks, lps = sampler.choose(host_copy(out[1], f32)[:n_rows], hist, generated)
                full = np.zeros(b, np.int64)
                full[:n_rows] = toks
                return full, lps

            return host_step
        if "sample" not in self.module.functions:
            raise InputError(
                "this artifact was compiled without the 'sample' function (needed to sample on the "
                "device; repetition_penalty or return_logprobs sample on the host)"
            )
        fixed = self._sample_settings(cfg)

        def device_step(out, n, hist):
            return np.array(self.module.sample(out[1], key=self._sample_key(seed, n, first_row), **fixed)), None

        return device_step

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise InputError(
                f"checkpoint {str(self.checkpoint)!r} has no tokenizer.json: pass token ids instead of text"
            )
        return self.tokenizer

    def _rows(self, prompts, max_new_tokens: int) -> list:
        """The prompts' token ids, checked to fit the module's batch and cache."""
        rows = [self._ids(p, i) for i, p in enumerate(prompts)]
        if len(rows) > self.sizes.max_batch:
            raise InputError(f"{len(rows)} prompts but the model was compiled for max_batch={self.sizes.max_batch}")
        longest = max(len(r) for r in rows)
        if longest + max_new_tokens > self.sizes.max_seq_len:
            raise InputError(
                f"prompt of {longest} tokens + max_new_tokens={max_new_tokens} exceeds the cache of "
                f"{self.sizes.max_seq_len} positions: compile with a larger max_seq_len= "
                f"(--max-seq-len on the command line; `rocmc generate --truncate` keeps the end of "
                f"the prompt)"
            )
        return rows

    def _ids(self, prompt, i: int) -> list:
        if isinstance(prompt, str):
            ids = self._need_tokenizer().encode(prompt)
        elif isinstance(prompt, (list, tuple, np.ndarray)):
            if isinstance(prompt, np.ndarray) and prompt.ndim != 1:
                raise InputError(f"prompt {i}: expected a 1-D array of token ids, got shape {prompt.shape}")
            if not all(isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_)) for t in prompt):
                raise InputError(f"prompt {i}: expected token ids (ints), got {list(prompt)[:4]!r}")
            ids = [int(t) for t in prompt]
        else:
            raise InputError(
                f"prompt {i}: expected a str, a list of token ids, a numpy array or a torch tensor, "
                f"got {type(prompt).__name__}"
            )
        if not ids:
            raise InputError(f"prompt {i} is empty; give at least one token")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise InputError(f"prompt {i}: token id {bad[0]} is outside the vocabulary [0, {self.config.vocab_size})")
        return ids


def sample_key(seed: int, n: int, row: int) -> int:
    """The `sample` function's key for token `n` of row `row` of a generation seeded `seed` (random_uniform mixes
    it, splitmix64, with each candidate): a row's draws depend on these three alone."""
    return (((seed << 20) | n) << 16 | row) % (1 << 63)


def _prompts(prompt) -> tuple[list, bool]:
    """(the prompts, whether several were given): a str, a list of ids or a 1-D array/tensor is one
    prompt; a list of those or a 2-D array/tensor (a row per prompt) is several. Torch tensors (CPU) are
    read with .numpy(), without importing torch."""
    prompt = as_numpy(prompt, "prompt")
    if isinstance(prompt, np.ndarray):
        if prompt.ndim == 2:
            return list(prompt), True
        if prompt.ndim != 1:
            raise InputError(
                f"prompt: expected a 1-D (one prompt) or 2-D (a row per prompt) array of token ids, "
                f"got shape {prompt.shape}"
            )
        return [prompt], False
    if isinstance(prompt, (list, tuple)) and len(prompt) > 0:
        items = [as_numpy(p, f"prompt {i}") for i, p in enumerate(prompt)]
        if isinstance(items[0], (str, list, tuple, np.ndarray)):
            return items, True
    return [prompt], False


def check_checkpoint(directory, *, tokenizer: bool = False, chat_template: bool = False) -> LlmConfig:
    """Check a checkpoint directory before compiling anything: config.json parses (ModelImportError naming
    it), the safetensors headers hold every parameter of the config with its shape (InputError naming the
    tensor and the file; only headers are read), and with `tokenizer` a loadable tokenizer.json (with
    `chat_template` a chat template too). Returns the config."""
    directory = _checkpoint_dir(directory)
    cfg = load_config(directory)
    from ..parameters import Parameters

    params = Parameters.open(directory)
    dtype = _CHECKPOINT_DTYPES[cfg.dtype]
    dtypes = param_dtypes(cfg)
    params.check([(name, shape, dtypes.get(name, dtype)) for name, shape in param_names(cfg)])
    if tokenizer or chat_template:
        if not (directory / "tokenizer.json").is_file():
            raise InputError(
                f"{directory / 'tokenizer.json'} does not exist: a text prompt needs the checkpoint's "
                f"tokenizer (or pass token ids with --ids)"
            )
        _tokenizer(directory)
    if chat_template:
        chat.select(chat.load_templates(directory), None, f"checkpoint {str(directory)!r}")
    generation.checkpoint_defaults(directory)
    return cfg


# The most prompt tokens one prefill call takes: a longer prompt is prefilled in chunks, each attending to the
# slot's earlier positions (what a server interleaves with decode steps; bounds the (s, kv) scores of a call).
PREFILL_CHUNK = 2048


class _SlotTable:
    """The host's side of the KV cache's slots (rocmc.llm.model._Slots): each slot's length, and the inputs of
    the calls that fill them. Row r of a decode step is slot r."""

    def __init__(self, sizes: Shape, cfg: LlmConfig, chunk: int = PREFILL_CHUNK):
        max_batch, self.max_seq_len = sizes.max_batch, sizes.max_seq_len
        self.lengths = np.zeros(max_batch, np.int64)
        self.active = np.zeros(max_batch, bool)
        # The window of sliding-window layers, which take a mask of their own (None: no such layer).
        self.window = cfg.sliding_window if "sliding_attention" in cfg.layer_types else None
        self.pad = cfg.pad_token_id or 0
        self.chunk = chunk

    @property
    def budget(self) -> int:
        """The most tokens a prefill call takes in all, its rows padded to the longest (a tensor-parallel
        module's collectives are sized for max_seq_len tokens)."""
        return min(self.chunk, self.max_seq_len)

    def prefill(self, slot: int, ids: list) -> Iterator[dict]:
        """The inputs of each prefill call that appends `ids` to `slot` (a chunk of at most `chunk` tokens at
        a time: call them in order)."""
        for _, feeds in self.prefill_rows([(slot, ids)]):
            yield feeds

    def prefill_rows(self, rows: list) -> Iterator[tuple[list, dict]]:
        """(the call's slots, its inputs) of each prefill call that appends every (slot, ids) of `rows` to its
        slot: several rows a call (rows of similar lengths together), at most `budget` tokens a call; a row
        longer than `chunk` goes in chunks, its later chunks in later calls. Call them in order."""
        for slot, ids in rows:
            self._check(slot)
            self._fits(slot, len(ids))
        if len({slot for slot, _ in rows}) < len(rows):
            raise InputError(f"prefill: slots {[slot for slot, _ in rows]} name a slot twice")
        for c in range(0, max((len(ids) for _, ids in rows), default=0), self.chunk):
            parts = sorted(
                ((slot, ids[c : c + self.chunk]) for slot, ids in rows if len(ids) > c), key=lambda p: -len(p[1])
            )
            for group in self.calls(parts):
                yield [slot for slot, _ in group], self.prefill_call(group)

    def calls(self, parts: list) -> list:
        """`parts` (slot, ids) grouped into calls, each part into the first call it fits (a call takes at most
        `budget` tokens once its rows are padded to its longest): the first call holds the first part."""
        groups: list = []
        for part in parts:
            for group in groups:
                if (len(group) + 1) * max(len(ids) for _, ids in group + [part]) <= self.budget:
                    group.append(part)
                    break
            else:
                groups.append([part])
        return groups

    def prefill_call(self, parts: list) -> dict:
        """The inputs of one prefill call appending each part (slot, ids) of `parts` (distinct slots, each part
        non-empty) at its slot's length. A row shorter than the call's longest is padded by repeating its last
        token at its last position: the pad computes and stores what that token does (the same keys and values
        at the same place), so the row's last logits are the call's last position's, and nothing past the row's
        length is written."""
        s = max(len(ids) for _, ids in parts)
        begins = [int(self.lengths[slot]) for slot, _ in parts]
        kv = max(b + len(ids) for b, (_, ids) in zip(begins, parts))
        tokens = np.empty((len(parts), s), np.int64)
        positions = np.empty((len(parts), s), np.int64)
        for r, ((slot, ids), begin) in enumerate(zip(parts, begins)):
            n = len(ids)
            tokens[r, :n], tokens[r, n:] = ids, ids[-1]
            positions[r] = begin + np.minimum(np.arange(s), n - 1)
            self.lengths[slot] = begin + n
            self.active[slot] = True
        j = np.arange(kv)[None, None, None, :]
        keep = j <= positions[:, None, :, None]  # (rows, 1, s, kv)
        feeds = {
            "tokens": tokens,
            "positions": positions,
            "slot": np.array([slot for slot, _ in parts], np.int64),
            "mask": keep,
        }
        if self.window:
            feeds["window_mask"] = keep & (positions[:, None, :, None] - j < self.window)
        return feeds

    def decode(self, tokens, rows=None) -> dict:
        """The inputs of a decode step appending `tokens` (one per slot) to the slots of `rows` (a mask; default:
        the active slots). Any other slot's row computes and is not kept: an empty slot's at its position 0, a
        slot still being prefilled at its next position, which its next prefill chunk writes again."""
        rows = self.active if rows is None else np.asarray(rows, bool) & self.active
        toks = np.where(rows, np.asarray(tokens, np.int64), self.pad)
        return {"tokens": toks.reshape(-1, 1), "positions": self.decode_positions(rows)}

    def decode_positions(self, rows=None) -> np.ndarray:
        """The positions input of a decode step appending a token to the slots of `rows` (default: the active
        slots), whose tokens come from elsewhere (a decode step's own output, on the device)."""
        rows = self.active if rows is None else np.asarray(rows, bool) & self.active
        for slot in np.flatnonzero(rows):
            self._fits(int(slot), 1)
        positions = np.where(self.active, self.lengths, 0).astype(np.int64)
        self.lengths += rows
        return positions.reshape(-1, 1)

    def release(self, slot: int) -> None:
        """Empty `slot` (its row has ended): it computes at position 0 unkept until a prefill fills it again."""
        self.lengths[slot], self.active[slot] = 0, False

    def _check(self, slot: int) -> None:
        if not 0 <= slot < len(self.lengths):
            raise InputError(f"slot {slot} is outside the module's {len(self.lengths)} slots (max_batch)")

    def _fits(self, slot: int, more: int) -> None:
        if self.lengths[slot] + more > self.max_seq_len:
            raise InputError(
                f"slot {slot} holds {self.lengths[slot]} positions; {more} more exceed the KV cache's "
                f"{self.max_seq_len} positions (max_seq_len)"
            )


def _plan_of(art: Artifact, cfg: LlmConfig, tensor_parallel: int) -> "sharding.Plan":
    """The artifact's tensor-parallel plan (degree 1 when it has none), which must be what the caller asked."""
    meta = art.metadata.get("info", {}).get("llm", {}).get("tensor_parallel")
    plan = sharding.from_json(meta, cfg) if meta is not None else sharding.plan(cfg, 1)
    if isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int) or tensor_parallel < 1:
        raise InputError(f"tensor_parallel={tensor_parallel!r}: expected a number of GPUs >= 1")
    if plan.degree != tensor_parallel:
        raise InputError(
            f"the artifact was compiled for tensor_parallel={plan.degree}, not {tensor_parallel}: "
            f"recompile with compile_hf(..., tensor_parallel={tensor_parallel}) or load it with "
            f"tensor_parallel={plan.degree}"
        )
    return plan


def _rank_setup(art: Artifact, checkpoint: _Checkpoint, plan, given):
    """This rank's group (every rank checked to run the same artifact on the same checkpoint) and its
    slices of the checkpoint. The rest of the rank's setup (the collective channel, its own GPU) is the
    module's, when it loads (distributed.prepare)."""
    from ..parameters import Parameters
    from ..runtime import distributed

    group = distributed.init(plan.degree)
    group.agree("artifacts", art.metadata.get("graph_hash", "") + art.metadata.get("target", ""))
    if given is not None:
        return group, plan.parameters(given, group.rank)
    source = Parameters.open(checkpoint.directory)
    group.agree("checkpoints", source.fingerprint(checkpoint.config_bytes))
    return group, plan.parameters(source, group.rank)


def artifact_sizes(art: Artifact, cfg: LlmConfig, degree: int = 1) -> Shape:
    """What the artifact was compiled for (compile_hf records it: max_seq_len, max_batch, dtype), checked against
    its KV cache; ModelImportError for an artifact that is not such a model."""
    info = art.metadata.get("info", {}).get("llm")
    states = {s["name"]: s for s in art.metadata.get("states", [])}
    ok = (
        isinstance(info, dict)
        and all(isinstance(info.get(k), int) and info[k] >= 1 for k in ("max_seq_len", "max_batch", "sample_k"))
        and info.get("dtype") in _CHECKPOINT_DTYPES.values()
    )
    if not ok or CACHE not in states:
        raise ModelImportError("the artifact is not a causal LM compiled by rocmc.llm.compile_hf")
    sizes = Shape(info["max_seq_len"], info["max_batch"], info["dtype"], info["sample_k"])
    shape = cache_shape(cfg, sizes, degree)
    if tuple(states[CACHE]["shape"]) != shape:
        raise ModelImportError(
            f"the artifact's KV cache is {states[CACHE]['shape']}, not the {list(shape)} of this "
            f"config with max_seq_len={sizes.max_seq_len}, max_batch={sizes.max_batch}"
        )
    return sizes


def _check_artifact(art: Artifact, cfg: LlmConfig, plan=None) -> None:
    """The artifact must be the model of this config: the same parameter names and shapes (a rank's
    slices of them under a tensor-parallel plan)."""
    plan = plan or sharding.plan(cfg, 1)
    want = {n: list(s.local(plan.degree)) for n, s in plan.shards.items()}
    got = {p["name"]: p["shape"] for p in art.parameters}
    joined = [m for members in sharding.JOINED.values() for m in members]
    if any(n.rsplit(".", 1)[0].endswith(tuple("." + m for m in joined)) for n in got):
        raise ModelImportError(
            "the artifact was compiled by an earlier rocmc, whose q/k/v and gate/up projections were separate "
            "parameters (they are joined at load now): compile it again with rocmc.llm.compile_hf"
        )
    if got != {k: v for k, v in want.items() if k in got} or not set(got) <= set(want):
        diff = sorted(set(got) ^ set(want) | {k for k in set(got) & set(want) if got[k] != want[k]})
        raise ModelImportError(
            f"the artifact was compiled for another model than this checkpoint's config.json "
            f"(parameter {diff[0]!r} differs)"
        )


def _tokenizer(directory: Path):
    if not (directory / "tokenizer.json").is_file():
        return None
    from .tokenizer import Tokenizer

    return Tokenizer.from_dir(directory)


def weight_bytes(cfg: LlmConfig, dtype: str) -> int:
    """Device bytes of the model's weights with `dtype` the compute dtype (a quantized projection: its packed
    weight, scales, zeros and act-order permutation, as quantized_linear holds them)."""
    from ..dtypes import dtype as rocmc_dtype

    total = 0
    for shard in sharding.plan(cfg, 1).shards.values():
        total += int(np.prod(shard.shape)) * rocmc_dtype(shard.dtype or dtype).bits // 8
    return total


# Device memory a server keeps free beyond the weights and the KV cache: a step's activations and IREE's pools.
SERVING_WORKSPACE = 512 << 20


def serving_memory(cfg: LlmConfig, sizes: Shape, device: str, degree: int = 1) -> str:
    """What serving `sizes` (max_batch slots x max_seq_len positions) takes of `device`'s memory: the KV cache,
    the weights at the compute dtype (a rank's share of both under tensor parallelism) and SERVING_WORKSPACE,
    checked against the memory the device has free now (rocmc.runtime.devices.memory; unchecked where its driver
    can't say). Returns a line saying so; InputError with the numbers, and the slots or positions that would
    fit, when they do not fit."""
    from ..runtime.devices import memory

    mib = 1 << 20
    cache = kv_cache_bytes(cfg, sizes.max_seq_len, sizes.max_batch, sizes.dtype) // degree
    weights = weight_bytes(cfg, sizes.dtype) // degree
    line = (
        f"KV cache of {sizes.max_batch} slots x {sizes.max_seq_len} positions {cache / mib:.1f} MiB, "
        f"weights {weights / mib:.1f} MiB"
    )
    info = memory(device)
    if info is None:
        return line + f" ({device} does not report its free memory: not checked)"
    free, total = info
    room = free - weights - SERVING_WORKSPACE
    if cache > room:
        slot = kv_cache_bytes(cfg, sizes.max_seq_len, 1, sizes.dtype) // degree
        position = kv_cache_bytes(cfg, 1, sizes.max_batch, sizes.dtype) // degree
        fit = (
            f"at most {room // slot} slots of {sizes.max_seq_len} positions fit (--max-batch), or "
            f"{room // position} positions of {sizes.max_batch} slots (--max-seq-len)"
            if room > 0
            else "the weights alone do not fit"
        )
        need = (cache + weights + SERVING_WORKSPACE) / mib
        raise InputError(
            f"{line} and {SERVING_WORKSPACE // mib} MiB of workspace need {need:.1f} MiB, more than the "
            f"{free / mib:.1f} MiB free of {total / mib:.1f} MiB on {device}: {fit}"
        )
    return line + f" of the {free / mib:.1f} MiB free on {device}"
