"""A checkpoint's tokenizer (tokenizer.json, through the optional `tokenizers` package), and streaming decode.

Whether encode() starts with BOS (or ends with EOS) follows transformers (5.x): the post-processor in
tokenizer.json decides, read by encoding a probe text with and without special tokens; without one nothing
is added. `add_bos_token`/`add_eos_token` in tokenizer_config.json are ignored beside a tokenizer.json, as
transformers ignores them (a tokenizer saved by transformers wrote them into the post-processor).

Decoding one token at a time cannot decode each token alone: a byte-fallback or byte-level token may hold
part of a UTF-8 character, and decoders strip or merge spaces across tokens. `StreamDecoder` decodes a
window of recent tokens and emits only the text that grew past the window's earlier text, holding it back
while it ends in an incomplete character (U+FFFD).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelImportError
from .config import read_json

_PROBE = "Hello world"
_REPLACEMENT = "\ufffd"


class Tokenizer:
    """Encode text to token ids and back, as transformers' tokenizer of the same checkpoint does."""

    def __init__(
        self,
        backend,
        *,
        bos_token_id: int | None,
        eos_token_id: int | None,
        add_bos: bool,
        add_eos: bool,
        source: str = "tokenizer",
        special_tokens: dict | None = None,
    ):
        self._backend = backend
        self.bos_token_id, self.eos_token_id = bos_token_id, eos_token_id
        self.add_bos, self.add_eos = add_bos and bos_token_id is not None, add_eos and eos_token_id is not None
        self.source = source
        # The named special tokens as text ({"bos_token": "<s>", ...}): what chat templates see.
        self.special_tokens = dict(special_tokens or {})

    @classmethod
    def from_dir(cls, directory) -> "Tokenizer":
        """Load tokenizer.json (and tokenizer_config.json / special_tokens_map.json when present)."""
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise ModelImportError(f"{directory}: no tokenizer.json (rocmc reads the tokenizers JSON format only)")
        try:
            from tokenizers import Tokenizer as Backend
        except ImportError:
            raise ModelImportError(
                f"{path}: reading it needs the 'tokenizers' package: pip install rocmc[llm]"
            ) from None
        try:
            backend = Backend.from_file(str(path))
        except Exception as e:  # noqa: BLE001 - the library raises its own Exception type for every malformed file
            raise ModelImportError(f"{path}: cannot load tokenizer: {e}") from None
        config = _special_tokens_config(directory)
        bos = _token_id(backend, config.get("bos_token"), "bos_token", path)
        eos = _token_id(backend, config.get("eos_token"), "eos_token", path)
        add_bos, add_eos = _added_specials(backend, bos, eos, path)
        return cls(
            backend,
            bos_token_id=bos,
            eos_token_id=eos,
            add_bos=add_bos,
            add_eos=add_eos,
            source=str(path),
            special_tokens=_special_token_texts(config),
        )

    @property
    def vocab_size(self) -> int:
        """Ids run from 0 to vocab_size - 1 (added tokens included)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None, add_eos: bool | None = None) -> list[int]:
        """Token ids of text; add_bos/add_eos default to what the checkpoint's tokenizer does."""
        if not isinstance(text, str):
            raise ModelImportError(f"Tokenizer.encode: text must be a str, got {type(text).__name__}")
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if self.add_bos if add_bos is None else add_bos:
            ids = [self._special("bos", self.bos_token_id)] + ids
        if self.add_eos if add_eos is None else add_eos:
            ids = ids + [self._special("eos", self.eos_token_id)]
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Text of token ids; special tokens (BOS, EOS, ...) are left out unless skip_special_tokens is False."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ModelImportError(
                f"Tokenizer.decode: token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})"
            )
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def stream(self, skip_special_tokens: bool = True) -> "StreamDecoder":
        return StreamDecoder(self, skip_special_tokens)

    def _special(self, name: str, token_id: int | None) -> int:
        if token_id is None:
            raise ModelImportError(f"{self.source}: add_{name}=True but the tokenizer defines no {name}_token")
        return token_id


class StreamDecoder:
    """Turns token ids arriving one at a time into text pieces; the pieces join to decode(all ids).

    `push(id)` returns the new complete text ('' while a character is incomplete), `flush()` what is left
    at the end (an incomplete character then shows as U+FFFD, as decode shows it)."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tok, self._skip = tokenizer, skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # ids before this are emitted

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        before = self._decode(self._prefix, self._read)
        text = self._decode(self._prefix, len(self._ids))
        if len(text) <= len(before) or text.endswith(_REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(before) :]

    def flush(self) -> str:
        before = self._decode(self._prefix, self._read)
        text = self._decode(self._prefix, len(self._ids))
        self._prefix = self._read = len(self._ids)
        return text[len(before) :]

    def _decode(self, start: int, stop: int) -> str:
        return self._tok.decode(self._ids[start:stop], skip_special_tokens=self._skip) if stop > start else ""


# ---- tokenizer_config.json -------------------------------------------------------------------------


def _special_tokens_config(directory: Path) -> dict:
    """Special token names: tokenizer_config.json over special_tokens_map.json."""
    merged: dict = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = directory / name
        if path.is_file():
            data = read_json(path)
            merged.update({k: v for k, v in data.items() if v is not None})
    return merged


_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _special_token_texts(config: dict) -> dict:
    """{"bos_token": "<s>", ...}: the named special tokens given as strings or AddedToken dicts."""
    out = {}
    for name in _SPECIAL_NAMES:
        token = config.get(name)
        content = token.get("content") if isinstance(token, dict) else token
        if isinstance(content, str):
            out[name] = content
    return out


def _token_id(backend, token, key: str, path: Path) -> int | None:
    """The id of a special token given as a string or as an AddedToken dict ({"content": ...})."""
    if token is None:
        return None
    content = token.get("content") if isinstance(token, dict) else token
    token_id = backend.token_to_id(content) if isinstance(content, str) else None
    if token_id is None:
        raise ModelImportError(f"{path.parent}: {key} {token!r} is not in the tokenizer's vocabulary")
    return token_id


def _added_specials(backend, bos: int | None, eos: int | None, path: Path) -> tuple[bool, bool]:
    """(add_bos, add_eos): what the post-processor puts around a text."""
    if backend.post_processor is None:
        return False, False
    plain = backend.encode(_PROBE, add_special_tokens=False).ids
    full = backend.encode(_PROBE, add_special_tokens=True).ids
    start = next((i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), None)
    prefix, suffix = (None, None) if start is None else (full[:start], full[start + len(plain) :])
    if prefix not in ([], [bos]) or suffix not in ([], [eos]):
        raise ModelImportError(
            f"{path}: the post-processor adds tokens other than BOS/EOS around the text "
            f"(ids {full} for {plain}); rocmc cannot reproduce it"
        )
    return bool(prefix), bool(suffix)
