"""The engine's thread: it owns a rocmc.llm.engine.Engine, takes requests and cancellations from other threads,
steps the engine while anything runs or waits, and hands each request's events to the request's sink (a
callable the HTTP layer gives). With `post` (the event loop's call_soon_threadsafe) a step's events reach their
sinks in one call on the loop's thread: one wake-up of the loop a step, not one a token."""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable

from ..errors import InputError
from ..llm.engine import Engine, Event, Request

LOG = "rocmc.serve"


class Worker:
    """Runs `engine` on a thread of its own (start / stop). submit() and cancel() may be called from any thread."""

    def __init__(self, engine: Engine, post: Callable | None = None):
        self.engine = engine
        self.post = post  # post(fn, arg) runs fn(arg) where the sinks live; None: on the engine's thread
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[int, Callable[[Event], None]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rocmc-engine", daemon=True)
        self.error: BaseException | None = None
        self.on_step: Callable[[list, float], None] | None = None  # (events, seconds): the metrics' hook

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(None)
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def submit(self, ids: list, settings, sink: Callable[[Event], None], top_logprobs: int = 0) -> "Future[Request]":
        """Queue a prompt; the future gives its Request once the engine has taken it, or the engine's error
        (InputError, QueueFull). `sink(event)` is called on the engine's thread for each of its events."""
        fut: Future = Future()
        self._inbox.put(("submit", ids, settings, sink, fut, top_logprobs))
        return fut

    def cancel(self, req: Request) -> None:
        self._inbox.put(("cancel", req))

    def _take(self, block: bool) -> None:
        """Everything in the inbox (waiting for the first item when `block`)."""
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            if item[0] == "submit":
                _, ids, settings, sink, fut, top = item
                try:
                    req = self.engine.submit(ids, settings, top_logprobs=top)
                except InputError as e:
                    fut.set_exception(e)
                else:
                    self._sinks[req.id] = sink
                    fut.set_result(req)
                    if req.done:  # nothing to generate (a zero token limit)
                        self._deliver([(sink, Event(req, None, None, req.finish_reason))])
                        self._sinks.pop(req.id, None)
            else:
                self.engine.cancel(item[1])
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                item = None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._take(block=self.engine.idle)
                if self.engine.idle:
                    continue
                t = time.perf_counter()
                events = self.engine.step()
                if self.on_step is not None:
                    self.on_step(events, time.perf_counter() - t)
                calls = []
                for ev in events:
                    sink = self._sinks.get(ev.request.id)
                    if sink is not None:
                        calls.append((sink, ev))
                    if ev.finish_reason is not None:
                        self._sinks.pop(ev.request.id, None)
                self._deliver(calls)
        except BaseException as e:  # noqa: BLE001 - reported to every waiting request, then to /health
            self.error = e
            logging.getLogger(LOG).exception("the engine stopped")
            self._deliver(
                [(sink, Event(Request([], None, rid), None, None, "error")) for rid, sink in self._sinks.items()]
            )
            self._sinks.clear()

    def _deliver(self, calls: list) -> None:
        """Hand [(sink, event)] to their sinks (through `post` when given: one call for all)."""
        if not calls:
            return
        if self.post is None:
            _call_each(calls)
        else:
            self.post(_call_each, calls)


def _call_each(calls: list) -> None:
    for sink, ev in calls:
        sink(ev)
