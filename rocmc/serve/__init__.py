"""`rocmc serve`: an OpenAI-compatible HTTP server over a LanguageModel, batching its requests continuously
(rocmc.llm.engine). Needs the `serve` extra (Starlette, uvicorn): `pip install rocmc[serve]`."""

from __future__ import annotations


def create_app(
    lm, model_name: str, *, api_key: str | None = None, max_waiting: int = 256, prefill_chunk: int | None = None
):
    """The Starlette application serving `lm` as `model_name` (see rocmc.serve.app); max_waiting and
    prefill_chunk as for rocmc.llm.engine.Engine."""
    from .app import Server

    return Server(lm, model_name, api_key=api_key, max_waiting=max_waiting, prefill_chunk=prefill_chunk).app()


__all__ = ["create_app"]
