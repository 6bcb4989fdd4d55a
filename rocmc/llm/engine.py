"""Continuous batching: requests join the running decode batch at the next step and leave it when they end.

The engine schedules requests onto the KV cache's slots (rocmc.llm.runtime._SlotTable; a slot is a row of the
decode step). A request waits until a slot is free; then its prompt is prefilled into that slot, several
prefilling rows a call (each row its prompt's next chunk, padded to the call's longest; at most `prefill_chunk`
tokens a call, one call a step while other rows decode), so a long prompt stalls the running rows by one call's
time at a time, never by the whole prompt; its first token comes from the prefill's last logits; after
that every decode step runs each decoding row at its own position. A row that ends (a stop token or string, its
token limit) or is cancelled frees its slot at once, for the next waiting request.

Each request carries its own settings (a GenerationConfig: greedy or sampled, seed, stop tokens and strings,
log-probabilities): greedy rows take the decode function's own argmax; sampled rows are drawn on the device by the
`sample` function, each row with its own temperature, top-k, top-p and key (the request's seed and the token's
index, as `generate` keys a request alone); rows whose settings need the host (log-probabilities, penalties, a
top-k past the module's sample_k) are chosen there from the step's logits by their own HostSampler, seeded by the
request. So a request's tokens do not depend on what else runs beside it: they are the tokens it gets alone
(with `generate`, too, except the host-chosen ones, whose draws are the engine's own).

The engine is not thread-safe: one thread drives it (`step`, or `run`); a server hands requests to that thread.
Tensor-parallel models are not served (the ranks would have to follow rank 0's schedule).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..dtypes import f32, i64
from ..errors import InputError
from ..runtime.module import host_copy, reshaped
from .generation import GenerationConfig, HostSampler, StopTracker
from .runtime import sample_key

__all__ = ["Engine", "Request", "Event", "QueueFull"]


# Prompt tokens prefilled a step while other rows decode: each such step stalls the decoding rows for a chunk's
# prefill, so smaller chunks lower the inter-token latency under load and larger ones the time to first token
# (BENCHMARKS.md, "rocmc serve on an NVIDIA H100").
DEFAULT_PREFILL_CHUNK = 512


class QueueFull(InputError):
    """The engine's waiting queue holds `max_waiting` requests already (a server answers 429)."""


@dataclass
class Event:
    """One token of a request (`token` None: the request ended without a new token, e.g. cancelled), its
    log-probability (when asked for), the request's `top_logprobs` most likely tokens at that step as
    [(token, log-probability)] (when asked for), and why the request ended (None while it runs)."""

    request: "Request"
    token: int | None
    logprob: float | None
    finish_reason: str | None
    top: list | None = None


@dataclass(eq=False)
class Request:
    """A prompt (token ids) and how to continue it; `max_new_tokens` is set by the engine from the settings and
    the cache. State: "waiting", "prefill", "decode", "done"."""

    ids: list
    settings: GenerationConfig
    id: int = 0
    state: str = "waiting"
    slot: int | None = None
    tokens: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    cancelled: bool = False
    top_logprobs: int = 0  # the most likely tokens to give with each chosen one (with their log-probabilities)
    _sampler: HostSampler | None = None
    _tracker: StopTracker | None = None
    _next: int | None = None
    _path: str = "argmax"  # how its tokens are chosen: "argmax", "sample" (drawn on the device) or "host"
    _seed: int | None = None

    @property
    def done(self) -> bool:
        return self.state == "done"

    @property
    def on_host(self) -> bool:
        """Chosen on the host from the logits (log-probabilities, penalties, a top-k past the device's
        candidates), else on the device (its argmax, or drawn by the `sample` function)."""
        return self._path == "host"


class Engine:
    """Continuous batching over a LanguageModel's slots (see the module docstring).

    max_waiting: requests that may wait for a slot (submit raises QueueFull beyond it);
    prefill_chunk: prompt tokens a prefill call takes at most (default DEFAULT_PREFILL_CHUNK);
    issue_ahead: issue each decode step before the tokens of the one before are read, where every decoding row
    has its token chosen on the device (the default; False: every step called and read in turn; the tokens are the
    same)."""

    def __init__(self, lm, *, max_waiting: int = 256, prefill_chunk: int | None = None, issue_ahead: bool = True):
        from .runtime import _SlotTable

        chunk = DEFAULT_PREFILL_CHUNK if prefill_chunk is None else prefill_chunk
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise InputError(f"Engine: prefill_chunk={prefill_chunk!r}: expected an int >= 1")
        if lm.group is not None:
            raise InputError("Engine: a tensor-parallel model is not served (one process per GPU would have to follow)")
        self.lm = lm
        self.max_batch = lm.sizes.max_batch
        self.slots = _SlotTable(lm.sizes, lm.config, chunk=chunk)
        self.max_waiting = max_waiting
        self.waiting: deque = deque()
        self.rows: list = [None] * self.max_batch  # the request in each slot
        self._ids = itertools.count()
        self.steps = 0  # decode steps run
        # What the last step() ran: its decode step's rows (0: none) and its prefill calls (a server's metrics).
        self.last_rows = self.last_prefills = 0
        self.issue_ahead = bool(issue_ahead)
        self._ahead = None  # (the decode step issued ahead: its Submission, its rows), read at the next round

    # ---- requests --------------------------------------------------------------------------------------

    def submit(self, ids, settings: GenerationConfig | None = None, *, top_logprobs: int = 0, **given) -> Request:
        """Queue a prompt (token ids) with its settings (a GenerationConfig, or keywords as `generate` takes them,
        the checkpoint's generation_config.json filling the rest); top_logprobs: give each step's that many most
        likely tokens (needs return_logprobs). Checked here: a prompt that is empty, a token
        outside the vocabulary, a prompt and token limit past the cache (InputError naming both); a limit not
        given is capped at the cache."""
        cfg = settings if settings is not None else self.lm.generation_config(**given)
        ids = [int(t) for t in ids]
        vocab = self.lm.config.vocab_size
        if not ids:
            raise InputError("the prompt is empty: at least one token is needed")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InputError(f"prompt token {bad[0]} is outside the vocabulary [0, {vocab})")
        n_new = cfg.new_tokens(len(ids), self.lm.sizes.max_seq_len)  # a limit past the cache: InputError
        if cfg.num_return_sequences != 1:
            raise InputError("Engine: one sequence a request (submit a request for each)")
        if (
            not isinstance(top_logprobs, int)
            or not 0 <= top_logprobs <= 20
            or (top_logprobs and not cfg.return_logprobs)
        ):
            raise InputError(f"top_logprobs={top_logprobs!r}: expected an int in [0, 20], with return_logprobs")
        if len(self.waiting) >= self.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests are waiting already (the engine's max_waiting)")
        req = Request(ids, cfg, next(self._ids), top_logprobs=top_logprobs)
        req._tracker = self.lm._tracker(1, n_new, cfg)
        req._path = cfg.path(self.lm.sizes.sample_k, self.lm.config.vocab_size)
        if req._path == "sample" and "sample" not in self.lm.module.functions:
            req._path = "host"  # an artifact compiled without `sample`: drawn on the host instead
        if req._path != "argmax":
            req._seed = self.lm._seed(cfg)
        if req._path == "host":
            req._sampler = HostSampler(cfg, [0], req._seed)
        if n_new == 0:
            req.state, req.finish_reason = "done", "length"
            return req
        self.waiting.append(req)
        return req

    def cancel(self, req: Request) -> None:
        """End `req` at the next step (its slot freed then); nothing if it has ended."""
        if not req.done:
            req.cancelled = True

    @property
    def running(self) -> list:
        return [r for r in self.rows if r is not None]

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    # ---- steps -----------------------------------------------------------------------------------------

    def step(self) -> list:
        """One round: cancellations, admissions to free slots, one prefill call (every prompt when no row
        decodes), then one decode step of the decoding rows. Returns the round's Events in order."""
        events: list = []
        self.last_rows = self.last_prefills = 0
        self._drop_cancelled(events)
        self._admit()
        self._prefill(events)
        self._decode(events)
        return events

    def run(self) -> Iterator:
        """Events until every submitted request has ended."""
        while not self.idle:
            yield from self.step()

    def _drop_cancelled(self, events: list) -> None:
        for req in [r for r in self.waiting if r.cancelled]:
            self.waiting.remove(req)
            self._finish(req, "cancelled", events)
        for req in self.running:
            if req.cancelled:
                self._finish(req, "cancelled", events)

    def _admit(self) -> None:
        for slot in range(self.max_batch):
            if self.rows[slot] is None and self.waiting:
                req = self.waiting.popleft()
                req.slot, req.state = slot, "prefill"
                self.rows[slot] = req

    def _prefill(self, events: list) -> None:
        """Prefill calls of the prefilling requests, several rows a call (each row its prompt's next chunk, the
        oldest request's in the first call, at most prefill_chunk tokens a call): one call while other rows
        decode (nothing stalls them longer), else calls until every prompt is in."""
        decoding = any(r.state == "decode" for r in self.running)
        while True:
            pending = sorted((r for r in self.running if r.state == "prefill"), key=lambda r: r.id)
            if not pending:
                return
            by_slot = {r.slot: r for r in pending}
            chunk = self.slots.chunk
            parts = [(r.slot, r.ids[self.slots.lengths[r.slot] :][:chunk]) for r in pending]
            call = self.slots.calls(parts)[0]
            out = self.lm.module.prefill(**self.slots.prefill_call(call), output="device")
            self.last_prefills += 1
            done = [(j, by_slot[slot]) for j, (slot, _) in enumerate(call)]
            done = [(j, r) for j, r in done if self.slots.lengths[r.slot] >= len(r.ids)]
            if done:
                argmax = host_copy(out[0], i64)
                logits = host_copy(out[1], f32) if any(r._path != "argmax" for _, r in done) else None
                drawn = self._draw_first(done, logits)
            for j, req in done:
                if req.on_host:
                    token, logprob, top = self._sample(req, logits[j])
                elif req._path == "sample":
                    token, logprob, top = int(drawn[req.slot]), None, None
                else:
                    token, logprob, top = int(argmax[j]), None, None
                self._push(req, token, logprob, events, top)
                if not req.done:
                    req.state = "decode"
            if decoding:
                return

    def _decode(self, events: list) -> None:
        """One decode step's tokens for the decoding rows. Where every decoding row's token is chosen on the
        device (its argmax, or drawn by `sample` issued after the step) and the module has the functions'
        stream-ordered forms, the next step is issued before this one's tokens are read, its tokens this step's
        own on the device: the device runs it while the host reads the tokens and schedules the next round (the
        host's time a step hides behind the device's). A row that has left since a step was issued is skipped
        when it is read; a row that joins (its first token is on the host) stops the run ahead for a round: the
        step in flight is read, and the next is issued with every row's token from the host."""
        ahead, self._ahead = self._ahead, None
        rows = [r for r in self.running if r.state == "decode"]
        if ahead is None:
            if not rows:
                return
            if not self._issues_ahead(rows):
                self._decode_now(rows, events)
                return
            step = self.lm.module.submit("decode", **self.slots.decode(self._tokens(rows), rows=self._mask(rows)))
            ahead = (self._chosen(step, rows, 0), rows)
        sub, batch = ahead
        # The next step ahead, its tokens this one's on the device: for the rows of this one still decoding (a
        # row that joined since needs its token from the host: it waits a round), unless none goes on after it.
        joined = {r.id for r in rows} - {r.id for r in batch}
        if rows and not joined and self._issues_ahead(rows) and self._continues(rows):
            if all(self.slots.lengths[r.slot] < self.slots.max_seq_len for r in rows):
                tokens = reshaped(sub.outputs[0], (self.max_batch, 1))
                positions = self.slots.decode_positions(self._mask(rows))
                step = self.lm.module.submit("decode", tokens=tokens, positions=positions)
                self._ahead = (self._chosen(step, rows, 1), rows)
        live = [r for r in batch if self.rows[r.slot] is r and r.state == "decode"]  # not ended nor cancelled since
        if not live:  # every row of the step in flight has ended: nothing to read from it
            return
        self.steps, self.last_rows = self.steps + 1, len(live)
        argmax = sub.output(0)
        for r in live:
            self._push(r, int(argmax[r.slot]), None, events)

    def _decode_now(self, rows: list, events: list) -> None:
        """A decode step called and read before the next is issued (rows chosen on the host, or a module
        without decode's stream-ordered form)."""
        out = self.lm.module.decode(**self.slots.decode(self._tokens(rows), rows=self._mask(rows)), output="device")
        self.steps, self.last_rows = self.steps + 1, len(rows)
        draws = self._draws(rows, 0)
        argmax = host_copy(out[0], i64) if draws is None else np.asarray(self.lm.module.sample(out[1], **draws))
        logits = host_copy(out[1], f32) if any(r.on_host for r in rows) else None
        for r in rows:
            if r.on_host:
                token, logprob, top = self._sample(r, logits[r.slot])
            else:
                token, logprob, top = int(argmax[r.slot]), None, None
            self._push(r, token, logprob, events, top)

    def _issues_ahead(self, rows: list) -> bool:
        """Whether the decode steps of `rows` may be issued one ahead of the tokens read: every row's token is
        chosen on the device (a row chosen on the host needs the step's logits first)."""
        m = self.lm.module
        drawing = any(r._path == "sample" for r in rows)
        return (
            self.issue_ahead
            and m.can_submit("decode")
            and (not drawing or m.can_submit("sample"))
            and not any(r.on_host for r in rows)
        )

    def _chosen(self, step, rows: list, ahead: int):
        """The submission whose first output is a decode step's tokens: the step's argmax, or `sample` issued
        after it where a row draws (its rows' tokens `ahead` further than their tokens so far)."""
        draws = self._draws(rows, ahead)
        return step if draws is None else self.lm.module.submit("sample", step.outputs[1], **draws)

    def _draws(self, rows: list, ahead: int) -> dict | None:
        """The `sample` function's inputs for a step of `rows` (None where no row draws): a drawing row's own
        temperature, top-k, top-p and key (its seed and the index of the token drawn: len(tokens) + ahead, as
        `generate` keys a request alone); temperature 0, decode's argmax, for every other row."""
        drawing = [r for r in rows if r._path == "sample"]
        if not drawing:
            return None
        b, k = self.max_batch, self.lm.sizes.sample_k
        feeds = {
            "temperature": np.zeros(b, np.float32),
            "top_k": np.full(b, k, np.int64),
            "top_p": np.ones(b, np.float32),
            "key": np.zeros(b, np.int64),
        }
        for r in drawing:
            c = r.settings
            feeds["temperature"][r.slot] = c.temperature
            feeds["top_k"][r.slot] = k if c.top_k == 0 else min(c.top_k, k)
            feeds["top_p"][r.slot] = c.top_p
            feeds["key"][r.slot] = sample_key(r._seed, len(r.tokens) + ahead, 0)
        return feeds

    def _draw_first(self, done: list, logits) -> np.ndarray | None:
        """The first tokens of the drawing rows among `done` ((call row, request) of a prefill call whose
        prompts it ended), from the call's last logits (on the host), at their slots; None if none draws."""
        drawing = [(j, r) for j, r in done if r._path == "sample"]
        if not drawing:
            return None
        full = np.zeros((self.max_batch, logits.shape[-1]), np.float32)
        for j, r in drawing:
            full[r.slot] = logits[j]
        return np.asarray(self.lm.module.sample(full, **self._draws([r for _, r in drawing], 0)))

    @staticmethod
    def _continues(rows: list) -> bool:
        """Whether a row may go on after the step in flight (one not at its token limit): else the step ahead
        would run for nothing."""
        return any(len(r.tokens) + 1 < r._tracker.max_new for r in rows)

    def _tokens(self, rows: list) -> np.ndarray:
        """Each row's next token (from the host) at its slot, for a decode step of `rows`."""
        tokens = np.zeros(self.max_batch, np.int64)
        for r in rows:
            tokens[r.slot] = r._next
        return tokens

    def _mask(self, rows: list) -> np.ndarray:
        mask = np.zeros(self.max_batch, bool)
        mask[[r.slot for r in rows]] = True
        return mask

    @staticmethod
    def _sample(req: Request, logits: np.ndarray) -> tuple:
        """(token, its log-probability or None, the top_logprobs most likely [(token, log-probability)] or None)."""
        toks, lps = req._sampler.choose(logits[None], [req.ids + req.tokens], [req.tokens])
        top = None
        if req.top_logprobs:
            logp = req._sampler.last_logp[0]
            best = np.argsort(-logp, kind="stable")[: req.top_logprobs]
            top = [(int(t), float(logp[t])) for t in best]
        return int(toks[0]), float(lps[0]) if req.settings.return_logprobs else None, top

    def _push(self, req: Request, token: int, logprob, events: list, top=None) -> None:
        tracker = req._tracker
        tracker.push([token])
        req.tokens.append(token)
        if logprob is not None:
            req.logprobs.append(logprob)
        req._next = token
        reason = tracker.finish_reason[0]
        events.append(Event(req, token, logprob, reason, top))
        if reason is not None:
            self._finish(req, reason, None)

    def _finish(self, req: Request, reason: str, events: list | None) -> None:
        """End `req`: its slot freed; an Event without a token when it ends other than on a token."""
        if req.slot is not None and self.rows[req.slot] is req:
            self.rows[req.slot] = None
            self.slots.release(req.slot)
        req.state, req.finish_reason = "done", reason
        if events is not None:
            events.append(Event(req, None, None, reason))
