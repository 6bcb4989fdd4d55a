"""What a long step is doing: log records under the `rocmc` logger, and a live line on a terminal.

A ground-floor module (it imports nothing of rocmc): every stage may use it.

- `step("compiling for gfx942", logger="rocmc.lowering")`: a context manager (or a decorator) that logs
  the step's start and its end with the elapsed seconds (`record.elapsed`), and, while it runs, shows a
  spinner with the elapsed time on stderr when stderr is a terminal.
- `byte_progress("reading weights", total)`: the same for work measured in bytes, `.update(n)` as bytes
  are done; the display is a bar with bytes and rate.

Log records go to the `rocmc` logger hierarchy (`rocmc.lowering`, `rocmc.parameters`, ...), which has a
NullHandler: a library user sees nothing unless they configure logging (`logging.basicConfig(level=
logging.INFO)` shows every step). The terminal display is off when stderr is not a terminal, after
`set_quiet(True)`, or with `ROCMC_QUIET=1` in the environment (`rocmc -q ...`).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time

ROOT = logging.getLogger("rocmc")
ROOT.addHandler(logging.NullHandler())

_quiet: bool | None = None  # set_quiet's choice; None: the environment decides


def set_quiet(quiet: bool | None = True) -> None:
    """Turn the terminal display off (True) or on (False) for the whole process; None: as ROCMC_QUIET
    says. Logging is not affected: it follows the logging configuration."""
    global _quiet
    if quiet is not None and not isinstance(quiet, bool):
        raise TypeError(f"set_quiet({quiet!r}): expected True, False or None")
    _quiet = quiet


def is_quiet() -> bool:
    if _quiet is not None:
        return _quiet
    return os.environ.get("ROCMC_QUIET", "").strip().lower() in ("1", "true", "yes", "on")


def _terminal():
    """stderr, when the display is on (not quiet, stderr a terminal); else None."""
    if is_quiet():
        return None
    err = sys.stderr
    try:
        return err if err is not None and err.isatty() else None
    except (AttributeError, ValueError, OSError):  # replaced by an object without isatty, or closed
        return None


def _logger(logger) -> logging.Logger:
    if isinstance(logger, logging.Logger):
        return logger
    return logging.getLogger(logger or "rocmc")


def format_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{int(n)} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# ---- the terminal display ------------------------------------------------------------------------------

_SPINNER = "|/-\\"
_TICK = 0.2  # seconds between redraws of the spinners


class _Display:
    """The live lines of the steps running now, one per nested step (tqdm bars, cleared when done). A
    thread redraws the spinners while any step runs."""

    def __init__(self):
        self.lock = threading.Lock()
        self.active: list = []  # [(bar, description)] of the running steps, outermost first
        self.ticker: threading.Thread | None = None

    def open(self, description: str, stream, total: int | None = None):
        from tqdm import tqdm

        with self.lock:
            # A step shows its elapsed time; a byte count its progress in B/KiB/MiB.
            shown = (
                {"bar_format": "{desc} {elapsed}"}
                if total is None
                else {"unit": "B", "unit_scale": True, "unit_divisor": 1024}
            )
            bar = tqdm(
                total=total,
                desc=description,
                file=stream,
                position=len(self.active),
                leave=False,
                mininterval=_TICK,
                **shown,
            )
            self.active.append((bar, description, total is None))
            if self.ticker is None:
                self.ticker = threading.Thread(target=self._tick, name="rocmc-progress", daemon=True)
                self.ticker.start()
        return bar

    def close(self, bar) -> None:
        with self.lock:
            self.active = [a for a in self.active if a[0] is not bar]
        bar.close()

    def _tick(self) -> None:
        turn = 0
        while True:
            time.sleep(_TICK)
            with self.lock:
                if not self.active:
                    self.ticker = None
                    return
                turn += 1
                for bar, description, spins in self.active:
                    if spins:
                        bar.set_description_str(f"{_SPINNER[turn % len(_SPINNER)]} {description}", refresh=False)
                    bar.refresh()


_display = _Display()


# ---- steps ---------------------------------------------------------------------------------------------


class step:
    """`with step("compiling for gfx942", logger="rocmc.lowering"):` logs "compiling for gfx942 ..." at
    the start and "compiling for gfx942: done in 1.23 s" at the end (INFO; a failure is logged with the
    exception's type), with `record.elapsed` (seconds) and `record.step` (the description) on the end
    record; on a terminal a spinner with the elapsed time runs meanwhile. Used as a decorator, each call
    of the function is one step. `elapsed` holds the seconds once the step ended."""

    def __init__(self, description: str, *, logger: str | logging.Logger = "rocmc", level: int = logging.INFO):
        self.description, self.logger, self.level = description, _logger(logger), level
        self.elapsed: float | None = None
        self._start = 0.0
        self._bar = None

    def __enter__(self) -> "step":
        self.logger.log(self.level, "%s ...", self.description, extra={"step": self.description})
        self._start = time.perf_counter()
        stream = _terminal()
        if stream is not None:
            self._bar = _display.open(self.description, stream)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.elapsed = time.perf_counter() - self._start
        if self._bar is not None:
            _display.close(self._bar)
            self._bar = None
        extra = {"step": self.description, "elapsed": self.elapsed}
        if exc_type is None:
            self.logger.log(self.level, "%s: done in %.2f s", self.description, self.elapsed, extra=extra)
        else:
            self.logger.log(
                self.level,
                "%s: failed after %.2f s (%s)",
                self.description,
                self.elapsed,
                exc_type.__name__,
                extra=extra,
            )

    def __call__(self, fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with step(self.description, logger=self.logger, level=self.level):
                return fn(*args, **kwargs)

        return run


class byte_progress:
    """`with byte_progress("uploading weights", total_bytes, logger=...) as p: ... p.update(n)`: a step
    measured in bytes. Logs the start with the total and the end with bytes, seconds and rate
    (`record.elapsed`, `record.bytes`); on a terminal a bar of bytes done, with the rate."""

    def __init__(
        self, description: str, total: int, *, logger: str | logging.Logger = "rocmc", level: int = logging.INFO
    ):
        self.description, self.total = description, int(total)
        self.logger, self.level = _logger(logger), level
        self.done = 0
        self.elapsed: float | None = None
        self._start = 0.0
        self._bar = None

    def __enter__(self) -> "byte_progress":
        self.logger.log(
            self.level,
            "%s (%s) ...",
            self.description,
            format_bytes(self.total),
            extra={"step": self.description, "bytes": self.total},
        )
        self._start = time.perf_counter()
        stream = _terminal()
        if stream is not None:
            self._bar = _display.open(self.description, stream, total=self.total)
        return self

    def update(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)

    def __exit__(self, exc_type, exc, tb) -> None:
        self.elapsed = time.perf_counter() - self._start
        if self._bar is not None:
            _display.close(self._bar)
            self._bar = None
        extra = {"step": self.description, "elapsed": self.elapsed, "bytes": self.done}
        rate = f", {format_bytes(self.done / self.elapsed)}/s" if self.elapsed > 0 and self.done else ""
        if exc_type is None:
            self.logger.log(
                self.level,
                "%s: %s in %.2f s%s",
                self.description,
                format_bytes(self.done),
                self.elapsed,
                rate,
                extra=extra,
            )
        else:
            self.logger.log(
                self.level,
                "%s: failed after %s, %.2f s (%s)",
                self.description,
                format_bytes(self.done),
                self.elapsed,
                exc_type.__name__,
                extra=extra,
            )


# ---- showing the log on a terminal -----------------------------------------------------------------------


class _TerminalHandler(logging.Handler):
    """Writes records to stderr through tqdm, so they print above the live lines instead of through them."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging must not raise (logging.Handler's own contract)
            self.handleError(record)


def log_to_stderr(level: int = logging.INFO) -> logging.Handler:
    """Show rocmc's log records of `level` and above on stderr (`rocmc -v`); returns the handler added."""
    handler = _TerminalHandler(level)
    handler.setFormatter(logging.Formatter("rocmc: %(message)s"))
    ROOT.addHandler(handler)
    if ROOT.level == logging.NOTSET or ROOT.level > level:
        ROOT.setLevel(level)
    return handler
