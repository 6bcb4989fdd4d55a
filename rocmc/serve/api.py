"""The OpenAI API's request and response shapes (completions and chat completions), apart from HTTP: a request
body checked field by field into the prompt's token ids and its generation settings, and the JSON objects of the
answers and of their streamed chunks, as the official `openai` client reads them. Every check raises ApiError,
which the HTTP layer answers in the OpenAI error shape."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

SEED_LIMIT = 1 << 62
# Fields the server does not implement yet, with the values that ask for nothing (accepted).
NOT_YET = {
    "logit_bias": ({},),
    "best_of": (1,),
    "suffix": ("",),
    "tools": ([],),
    "response_format": ({"type": "text"},),
}


class ApiError(Exception):
    """A request the server refuses: HTTP `status`, OpenAI error `type`, the field at fault (`param`)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param
        self.kind = kind or {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                             429: "rate_limit_error"}.get(status, "server_error")  # fmt: skip

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": None}}


@dataclass
class Parsed:
    """A checked request: its prompts' ids, settings for LanguageModel.generation_config, choices per prompt,
    whether to stream, log-probabilities asked for, the stop strings (cut from the text)."""

    prompts: list  # each prompt's token ids (completions take several; chat one conversation)
    settings: dict
    n: int
    stream: bool
    logprobs: bool
    stops: tuple
    include_usage: bool = False
    top: int = 0  # the most likely alternatives to give with each token (completions' logprobs=N, chat's top_logprobs)

    @property
    def prompt_tokens(self) -> int:
        """The prompt tokens the request's usage counts: every prompt once for each of its choices."""
        return sum(len(p) for p in self.prompts) * self.n


def _number(body: dict, name: str, lo: float, hi: float, *, integer: bool = False, lo_open: bool = False):
    v = body.get(name)
    if v is None:
        return None
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or (not integer and not math.isfinite(v)):
        raise ApiError(f"'{name}' is {v!r}: expected {'an integer' if integer else 'a number'}", param=name)
    if v < lo or v > hi or (lo_open and v == lo):
        where = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise ApiError(f"'{name}' is {v!r}: expected a value in {where}", param=name)
    return v


def _stops(body: dict) -> tuple:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise ApiError(f"'stop' is {stop!r}: expected a non-empty string or a list of at most 4", param="stop")
    return tuple(stops)


MAX_PROMPTS = 256  # prompts one completions request may carry


def _prompts(prompt, encode) -> list:
    """A completions request's prompts as token-id lists: OpenAI's four forms (a string, a list of token ids,
    a list of strings, a list of token-id lists)."""

    def ids(p) -> bool:
        return isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)

    if isinstance(prompt, str):
        return [encode(prompt)]
    if isinstance(prompt, list) and prompt and ids(prompt):
        return [list(prompt)]
    if isinstance(prompt, list) and 0 < len(prompt) <= MAX_PROMPTS:
        if all(isinstance(p, str) for p in prompt):
            return [encode(p) for p in prompt]
        if all(ids(p) for p in prompt):
            return [list(p) for p in prompt]
    raise ApiError(
        f"'prompt' must be a string, a list of token ids, or a list of 1 to {MAX_PROMPTS} of either",
        param="prompt",
    )


def parse(body, *, chat: bool, model: str, encode, vocab: int, context: int) -> Parsed:
    """Check a /v1/completions (`chat` False) or /v1/chat/completions body. encode(prompt or messages) -> ids."""
    if not isinstance(body, dict):
        raise ApiError("the request body is not a JSON object")
    if body.get("model") != model:
        raise ApiError(f"model {body.get('model')!r} does not exist: this server serves {model!r}", 404, "model")
    unsupported = [k for k, neutral in NOT_YET.items() if body.get(k) is not None and body.get(k) not in neutral]
    if unsupported:
        raise ApiError(f"'{unsupported[0]}' is not supported by this server yet", param=unsupported[0])
    if chat:
        msgs = body.get("messages")
        ok = (
            isinstance(msgs, list)
            and msgs
            and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in msgs
            )
        )
        if not ok:
            raise ApiError("'messages' must be a non-empty list of {'role': str, 'content': str}", param="messages")
        prompts = [encode(msgs)]
    else:
        prompts = _prompts(body.get("prompt"), encode)
    for i, ids in enumerate(prompts):
        where = f"prompt {i}" if len(prompts) > 1 else "the prompt"
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ApiError(f"{where}: token {bad[0]} is outside the vocabulary [0, {vocab})", param="prompt")
        if not ids:
            raise ApiError(f"{where} is empty", param="prompt")
    limit_name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, limit_name, 1, 1 << 31, integer=True)
    longest = max(len(p) for p in prompts)
    if max_tokens is not None and longest + max_tokens > context:
        raise ApiError(
            f"the prompt's {longest} tokens and {limit_name}={max_tokens} exceed the model's context of "
            f"{context} tokens",
            param=limit_name,
        )
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0, lo_open=True)
    top_k = _number(body, "top_k", -1, vocab, integer=True)
    seed = _number(body, "seed", 0, SEED_LIMIT - 1, integer=True)
    presence = _number(body, "presence_penalty", -2.0, 2.0)
    frequency = _number(body, "frequency_penalty", -2.0, 2.0)
    n = _number(body, "n", 1, 16, integer=True) or 1
    logprobs = body.get("logprobs")
    if chat:
        if logprobs not in (None, True, False):
            raise ApiError(f"'logprobs' is {logprobs!r}: expected true or false", param="logprobs")
        want_logprobs = bool(logprobs)
        top = _number(body, "top_logprobs", 0, 20, integer=True) or 0
        if top and not want_logprobs:
            raise ApiError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    else:
        top = _number(body, "logprobs", 0, 5, integer=True)
        want_logprobs, top = top is not None, top or 0
    ignore_eos = body.get("ignore_eos", False)  # vLLM's extension: generate max_tokens whatever comes
    if not isinstance(ignore_eos, bool):
        raise ApiError(f"'ignore_eos' is {ignore_eos!r}: expected true or false", param="ignore_eos")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(f"'stream' is {stream!r}: expected true or false", param="stream")
    stops = _stops(body)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(f"'stream_options' is {options!r}: expected an object", param="stream_options")
    settings = {
        "max_new_tokens": max_tokens,
        "temperature": temperature if temperature else None,
        "do_sample": None if temperature is None else temperature > 0,
        "top_p": top_p,
        "top_k": None if top_k is None else max(top_k, 0),
        "seed": seed,
        "stop_strings": stops or None,
        "return_logprobs": want_logprobs,
        "presence_penalty": presence,
        "frequency_penalty": frequency,
    }
    if ignore_eos:
        settings["stop_tokens"] = ()
    if n > 1 and settings["do_sample"] is False:
        raise ApiError("'n' > 1 needs sampling (temperature > 0): greedy choices would all be the same", param="n")
    return Parsed(prompts, settings, n, stream, want_logprobs, stops, bool(options.get("include_usage")), top)


class StopText:
    """A choice's text as it streams, without the stop string that ends it (OpenAI leaves it out): text that
    could still become a stop string is held back until it cannot, or until the end."""

    def __init__(self, stops: tuple):
        self.stops, self.sent, self.text = stops, 0, ""

    def push(self, piece: str) -> str:
        self.text += piece
        if not self.stops:
            return self._emit(len(self.text))
        cut = self._cut()
        if cut is not None:
            return self._emit(cut)
        hold = max(len(s) for s in self.stops) - 1
        return self._emit(max(self.sent, len(self.text) - hold))

    def finish(self) -> str:
        cut = self._cut()
        return self._emit(len(self.text) if cut is None else cut)

    @property
    def final(self) -> str:
        cut = self._cut()
        return self.text if cut is None else self.text[:cut]

    def _cut(self):
        found = [i for i in (self.text.find(s) for s in self.stops) if i >= 0]
        return min(found) if found else None

    def _emit(self, upto: int) -> str:
        upto = max(upto, self.sent)
        out, self.sent = self.text[self.sent : upto], upto
        return out


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def envelope(rid: str, chat: bool, model: str, chunk: bool, created: int | None = None) -> dict:
    obj = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {"id": rid, "object": obj, "created": created or int(time.time()), "model": model}


def choice(index: int, chat: bool, text: str, finish, logprobs, tokens: list, chunk: bool, first=False, tops=None):
    """One choice of an answer (or of a streamed chunk: its new text). logprobs: the chosen tokens' (None: not
    asked for), tokens: their texts, tops: for each, [(text, log-probability)] of the most likely tokens."""
    tops = tops if tops is not None else [[] for _ in tokens]
    if chat:
        lp = None if logprobs is None else {
            "content": [{"token": t, "logprob": p, "bytes": list(t.encode()),
                         "top_logprobs": [{"token": a, "logprob": q, "bytes": list(a.encode())} for a, q in alts]}
                        for t, p, alts in zip(tokens, logprobs, tops)]}  # fmt: skip
        if chunk:
            delta = ({"role": "assistant", "content": text} if first else {"content": text}) if text or first else {}
            return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        return {
            "index": index,
            "message": {"role": "assistant", "content": text},
            "logprobs": lp,
            "finish_reason": finish,
        }
    lp = None if logprobs is None else {"tokens": tokens, "token_logprobs": logprobs,
                                        "top_logprobs": [dict(alts) for alts in tops], "text_offset": None}  # fmt: skip
    return {"index": index, "text": text, "logprobs": lp, "finish_reason": finish}


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
