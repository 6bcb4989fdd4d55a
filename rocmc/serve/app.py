"""The HTTP layer: a Starlette application speaking the OpenAI API over one LanguageModel, whose requests the
engine's thread (worker.Worker) batches continuously. Routes: POST /v1/completions and /v1/chat/completions
(answers whole, or streamed as server-sent events ending in `data: [DONE]`), GET /v1/models, /health (200 once
the engine runs), /metrics (Prometheus text). Every refusal is a 4xx JSON error in the OpenAI shape."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import InputError
from ..llm.engine import Engine, QueueFull
from ..llm.tokenizer import StreamDecoder
from . import api
from .worker import Worker

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    def __init__(self):
        self.counts, self.sum, self.n = [0] * len(BUCKETS), 0.0, 0

    def observe(self, v: float) -> None:
        self.sum, self.n = self.sum + v, self.n + 1
        for i, b in enumerate(BUCKETS):
            if v <= b:
                self.counts[i] += 1

    def lines(self, name: str) -> list:
        out = [f'{name}_bucket{{le="{b}"}} {c}' for b, c in zip(BUCKETS, self.counts)]
        return out + [f'{name}_bucket{{le="+Inf"}} {self.n}', f"{name}_sum {self.sum}", f"{name}_count {self.n}"]


class Metrics:
    """Counters and histograms for /metrics (updated on the event loop's thread; the gauges read at scrape)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict = {}  # (endpoint, status) -> count
        self.prompt_tokens = self.generation_tokens = 0
        self.ttft, self.itl = Histogram(), Histogram()
        # Engine steps by what they ran: "decode" (no prefill: between admissions), "decode+prefill", "prefill";
        # each kind's count, seconds and decoding rows (rows / seconds of "decode": the decode throughput).
        self.steps = {kind: [0, 0.0, 0] for kind in ("decode", "decode+prefill", "prefill")}

    def request(self, endpoint: str, status: int) -> None:
        with self.lock:
            self.requests[endpoint, status] = self.requests.get((endpoint, status), 0) + 1

    def step(self, engine: Engine, seconds: float) -> None:
        """Count the engine's last step (the worker's on_step hook, on the engine's thread)."""
        rows, prefills = engine.last_rows, engine.last_prefills
        if not rows and not prefills:
            return
        kind = "prefill" if not rows else "decode+prefill" if prefills else "decode"
        with self.lock:
            entry = self.steps[kind]
            entry[0], entry[1], entry[2] = entry[0] + 1, entry[1] + seconds, entry[2] + rows

    def text(self, engine: Engine) -> str:
        with self.lock:
            lines = ["# TYPE rocmc_requests_total counter"]
            lines += [f'rocmc_requests_total{{endpoint="{e}",status="{s}"}} {n}' for (e, s), n in self.requests.items()]
            lines += ["# TYPE rocmc_prompt_tokens_total counter", f"rocmc_prompt_tokens_total {self.prompt_tokens}"]
            lines += [
                "# TYPE rocmc_generation_tokens_total counter",
                f"rocmc_generation_tokens_total {self.generation_tokens}",
            ]
            lines += ["# TYPE rocmc_running_requests gauge", f"rocmc_running_requests {len(engine.running)}"]
            lines += ["# TYPE rocmc_waiting_requests gauge", f"rocmc_waiting_requests {len(engine.waiting)}"]
            for name, i in (("steps", 0), ("step_seconds", 1), ("step_rows", 2)):
                lines += [f"# TYPE rocmc_{name}_total counter"]
                lines += [f'rocmc_{name}_total{{kind="{k}"}} {v[i]}' for k, v in self.steps.items()]
            lines += ["# TYPE rocmc_time_to_first_token_seconds histogram"]
            lines += self.ttft.lines("rocmc_time_to_first_token_seconds")
            lines += ["# TYPE rocmc_inter_token_latency_seconds histogram"]
            lines += self.itl.lines("rocmc_inter_token_latency_seconds")
        return "\n".join(lines) + "\n"


class _Pieces:
    """A choice's text, a token at a time (StreamDecoder); ids past the tokenizer's vocabulary (a model's embedding
    may have more rows than the tokenizer has tokens) have no text."""

    def __init__(self, tokenizer):
        self._dec, self._size = StreamDecoder(tokenizer), tokenizer.vocab_size

    def push(self, token: int) -> str:
        return self._dec.push(token) if token < self._size else ""

    def flush(self) -> str:
        return self._dec.flush()


async def _disconnected(request: Request) -> None:
    """Returns when the client closes its connection (the ASGI server's http.disconnect; the body is read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _error(e: api.ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


class Server:
    """The application's state: the model, its engine's thread, the metrics."""

    def __init__(self, lm, model_name: str, *, api_key: str | None = None, max_waiting: int = 256, prefill_chunk=None):
        if lm.tokenizer is None:
            raise InputError(f"checkpoint {str(lm.checkpoint)!r} has no tokenizer.json: the server speaks text")
        self.lm, self.model, self.api_key = lm, model_name, api_key
        self.engine = Engine(lm, max_waiting=max_waiting, prefill_chunk=prefill_chunk)
        self.worker = Worker(self.engine)
        self.metrics = Metrics()
        self.worker.on_step = lambda events, seconds: self.metrics.step(self.engine, seconds)
        self.created = int(time.time())

    # ---- helpers ---------------------------------------------------------------------------------------

    def _authorize(self, request: Request) -> None:
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            raise api.ApiError("a valid API key is needed (Authorization: Bearer KEY)", 401)

    async def _body(self, request: Request):
        try:
            return json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as e:
            raise api.ApiError(f"the request body is not valid JSON: {e}") from None

    def _encode(self, chat: bool):
        lm = self.lm

        def encode(prompt):
            try:
                return lm.encode_chat(prompt) if chat else lm.tokenizer.encode(prompt)
            except InputError as e:
                raise api.ApiError(str(e), param="messages" if chat else "prompt") from None

        return encode

    async def _submit(self, parsed: api.Parsed, ids: list, index: int):
        """Queue choice `index` (of prompt `ids`); returns (engine Request, asyncio queue of its events)."""
        events: asyncio.Queue = asyncio.Queue()
        settings = dict(parsed.settings)
        if settings["seed"] is not None:
            settings["seed"] += index  # n choices with one seed: each its own draws
        if settings["top_k"] is None and "top_k" not in self.lm.generation_defaults:
            settings["top_k"] = 0  # draws from the whole vocabulary, as OpenAI's API (greedy ignores it)
        try:
            cfg = self.lm.generation_config(**settings)
        except InputError as e:
            raise api.ApiError(str(e)) from None
        fut = self.worker.submit(ids, cfg, events.put_nowait, top_logprobs=parsed.top)  # called on this loop
        try:
            req = await asyncio.wrap_future(fut)
        except QueueFull as e:
            raise api.ApiError(str(e), 429) from None
        except InputError as e:
            raise api.ApiError(str(e)) from None
        return req, events

    async def _choices(self, parsed: api.Parsed):
        """Each prompt's n choices, queued in the answer's order (choice p * n + j is prompt p's j-th)."""
        subs = []
        try:
            for ids in parsed.prompts:
                for _ in range(parsed.n):
                    subs.append(await self._submit(parsed, ids, len(subs)))
        except api.ApiError:
            for req, _ in subs:
                self.worker.cancel(req)
            raise
        return subs

    # ---- routes ----------------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        if not self.worker.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        try:
            self._authorize(request)
        except api.ApiError as e:
            return _error(e)
        card = {"id": self.model, "object": "model", "created": self.created, "owned_by": "rocmc",
                "max_model_len": self.lm.sizes.max_seq_len}  # fmt: skip
        return JSONResponse({"object": "list", "data": [card]})

    async def metrics_text(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics.text(self.engine), media_type="text/plain; version=0.0.4")

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def _complete(self, request: Request, chat: bool) -> Response:
        endpoint, started = "chat" if chat else "completions", time.perf_counter()  # TTFT counts from here
        try:
            self._authorize(request)
            body = await self._body(request)
            parsed = api.parse(
                body,
                chat=chat,
                model=self.model,
                encode=self._encode(chat),
                vocab=self.lm.config.vocab_size,
                context=self.lm.sizes.max_seq_len,
            )
            if not self.worker.alive:
                raise api.ApiError("the engine has stopped", 503)
            subs = await self._choices(parsed)
        except api.ApiError as e:
            self.metrics.request(endpoint, e.status)
            return _error(e)
        self.metrics.request(endpoint, 200)
        with self.metrics.lock:
            self.metrics.prompt_tokens += parsed.prompt_tokens
        rid, created = api.new_id(chat), int(time.time())
        if parsed.stream:
            gen = self._stream(subs, parsed, chat, rid, created, started)
            return StreamingResponse(gen, media_type="text/event-stream")
        return await self._whole(request, subs, parsed, chat, rid, created, started)

    async def _events(self, req, events: asyncio.Queue, started: float):
        """A choice's events until it ends, timing them for the metrics."""
        last = None
        while True:
            ev = await events.get()
            now = time.perf_counter()
            if ev.token is not None:
                with self.metrics.lock:
                    self.metrics.generation_tokens += 1
                    if last is None:
                        self.metrics.ttft.observe(now - started)
                    else:
                        self.metrics.itl.observe(now - last)
                last = now
            yield ev
            if ev.finish_reason is not None:
                return

    def _text(self, parsed: api.Parsed):
        return _Pieces(self.lm.tokenizer), api.StopText(parsed.stops)

    def _alternatives(self, ev) -> list:
        """[(text, log-probability)] of the event's most likely tokens (empty when not asked for)."""
        return [(self._token(t), lp) for t, lp in ev.top or ()]

    def _token(self, t: int) -> str:
        tok = self.lm.tokenizer
        return tok.decode([t]) if t < tok.vocab_size else ""

    async def _merged(self, subs, started: float):
        """(choice index, event) of every choice as they come (each timed for the metrics as it arrives), until
        all have ended."""
        merged: asyncio.Queue = asyncio.Queue()
        tasks = [asyncio.ensure_future(self._forward(i, r, q, started, merged)) for i, (r, q) in enumerate(subs)]
        try:
            done = 0
            while done < len(subs):
                i, ev = await merged.get()
                done += ev.finish_reason is not None
                yield i, ev
        finally:
            for t in tasks:
                t.cancel()

    async def _forward(self, i, req, events, started, merged: asyncio.Queue):
        async for ev in self._events(req, events, started):
            merged.put_nowait((i, ev))

    async def _whole(self, request: Request, subs, parsed, chat, rid, created, started: float) -> Response:
        """The whole answer once every choice has ended; a client that disconnects before cancels its choices
        (their slots freed at the next step)."""
        states = [self._text(parsed) for _ in subs]
        finish, tops = [None] * len(subs), [[] for _ in subs]

        async def collect():
            async with contextlib.aclosing(self._merged(subs, started)) as events:
                async for i, ev in events:
                    dec, stop = states[i]
                    if ev.token is not None:
                        stop.push(dec.push(ev.token))
                        tops[i].append(self._alternatives(ev))
                    finish[i] = ev.finish_reason or finish[i]

        work, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not work.done():  # the client left (or the server stops): nobody reads the answer
                work.cancel()
                for req, _ in subs:
                    self.worker.cancel(req)
            gone.cancel()
        if not work.done() or work.cancelled():
            return Response(status_code=499)  # the client's connection is closed: this goes nowhere
        work.result()
        if "error" in finish:
            return _error(api.ApiError("the engine failed while generating", 500))
        choices, completion = [], 0
        for i, (req, _) in enumerate(subs):
            dec, stop = states[i]
            stop.push(dec.flush())
            completion += len(req.tokens)
            toks = [self._token(t) for t in req.tokens] if parsed.logprobs else []
            lps = list(req.logprobs) if parsed.logprobs else None
            choices.append(api.choice(i, chat, stop.final, finish[i], lps, toks, chunk=False, tops=tops[i]))
        out = api.envelope(rid, chat, self.model, False, created)
        out.update(choices=choices, usage=api.usage(parsed.prompt_tokens, completion))
        return JSONResponse(out)

    async def _stream(self, subs, parsed, chat, rid, created, started: float):
        """Server-sent events: the choices' text as it comes, then (with stream_options.include_usage) the usage,
        then [DONE]. A client that disconnects cancels its choices (their slots freed at the next step)."""

        def event(choices, **more) -> str:
            out = api.envelope(rid, chat, self.model, True, created)
            out.update(choices=choices, **more)
            return f"data: {json.dumps(out)}\n\n"

        states = [self._text(parsed) for _ in subs]
        first = [True] * len(subs)
        completion = 0
        try:
            async with contextlib.aclosing(self._merged(subs, started)) as events:
                async for i, ev in events:
                    dec, stop = states[i]
                    text = stop.push(dec.push(ev.token)) if ev.token is not None else ""
                    lps, toks, tops = None, [], []
                    if parsed.logprobs and ev.token is not None:
                        lps, toks, tops = [ev.logprob], [self._token(ev.token)], [self._alternatives(ev)]
                    if ev.finish_reason is not None:
                        text += stop.push(dec.flush()) + stop.finish()
                        completion += len(subs[i][0].tokens)
                    if text or first[i] or ev.finish_reason is not None or lps is not None:
                        finish = ev.finish_reason if ev.finish_reason in ("stop", "length") else None
                        choice = api.choice(i, chat, text, finish, lps, toks, chunk=True, first=first[i], tops=tops)
                        yield event([choice])
                        first[i] = False
            if parsed.include_usage:
                yield event([], usage=api.usage(parsed.prompt_tokens, completion))
            yield "data: [DONE]\n\n"
        finally:
            for req, _ in subs:
                self.worker.cancel(req)

    def app(self) -> Starlette:
        routes = [
            Route("/health", self.health),
            Route("/metrics", self.metrics_text),
            Route("/v1/models", self.models),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
        ]
        return Starlette(routes=routes, lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        self.worker.post = asyncio.get_running_loop().call_soon_threadsafe  # the sinks are this loop's queues
        self.worker.start()
        try:
            yield
        finally:
            self.worker.stop()
