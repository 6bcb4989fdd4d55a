"""Chat templates: a checkpoint's Jinja template rendered as transformers renders it.

Where the template comes from (as transformers 5 reads a checkpoint directory): `chat_template.jinja`
(the template named "default") and `additional_chat_templates/NAME.jinja` files; without those, the
`chat_template` of tokenizer_config.json, a string (named "default") or a list of {"name", "template"}.
Without a name, "default" is used.

The template runs in Jinja2's ImmutableSandboxedEnvironment (templates from a checkpoint are untrusted
input) with trim_blocks and lstrip_blocks, the `loopcontrols` extension and a `{% generation %}` block
that renders its body; it sees `messages`, `add_generation_prompt`, `tools` and `documents` (None unless
given), the special tokens by name (`bos_token`, `eos_token`, ...), a `raise_exception(message)` global,
`strftime_now(format)`, and a `tojson` filter that does not escape HTML (json.dumps with
ensure_ascii=False, indent, separators and sort_keys). The rendered text already holds the tokens the
template writes (a BOS, say), so it is encoded without adding special tokens.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from ..errors import InputError, ModelImportError

TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
DEFAULT = "default"


def load_templates(directory) -> dict[str, str]:
    """{name: template source} of the checkpoint in `directory` ({} when it has none)."""
    from .config import read_json

    directory = Path(directory)
    found: dict[str, str] = {}
    if (directory / TEMPLATE_FILE).is_file():
        found[DEFAULT] = _read(directory / TEMPLATE_FILE)
    if (directory / TEMPLATE_DIR).is_dir():
        for path in sorted((directory / TEMPLATE_DIR).glob("*.jinja")):
            found[path.name[: -len(".jinja")]] = _read(path)
    if found:
        return found
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return {}
    raw = read_json(config).get("chat_template")
    if raw is None:
        return {}
    if isinstance(raw, str):
        return {DEFAULT: raw}
    if isinstance(raw, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str) for t in raw
    ):
        return {t["name"]: t["template"] for t in raw}
    raise ModelImportError(
        f'{config}: chat_template must be a string or a list of {{"name", "template"}} '
        f"objects, got {type(raw).__name__}"
    )


def select(templates: dict[str, str], name: str | None = None, where: str = "the checkpoint") -> str:
    """The source of the template `name` (None: "default")."""
    if not templates:
        raise InputError(
            f"{where} has no chat template (no chat_template in tokenizer_config.json, no {TEMPLATE_FILE})"
        )
    if name is None:
        if DEFAULT not in templates:
            raise InputError(
                f"{where} has several chat templates and none named {DEFAULT!r}: pass "
                f"template= one of {sorted(templates)}"
            )
        return templates[DEFAULT]
    if name not in templates:
        raise InputError(f"template={name!r}: {where} has the chat templates {sorted(templates)}")
    return templates[name]


def render(
    source: str,
    messages,
    *,
    add_generation_prompt: bool = True,
    special_tokens: dict | None = None,
    tools=None,
    documents=None,
    **variables,
) -> str:
    """The text of `messages` (a list of {"role", "content", ...} dicts) by the template `source`.
    special_tokens: {"bos_token": "<s>", ...}; variables: more names the template reads (they win over
    special tokens of the same name). A template's raise_exception() is an InputError."""
    import jinja2

    messages = normalize_messages(messages)
    template = _compile(source)
    context = {**(special_tokens or {}), **variables}
    try:
        return template.render(
            messages=messages,
            add_generation_prompt=bool(add_generation_prompt),
            tools=tools,
            documents=documents,
            **context,
        )
    except jinja2.exceptions.TemplateError as e:
        raise InputError(f"chat template: {e}") from None


def normalize_messages(messages) -> list[dict]:
    """Messages as plain dicts, keys whose value is None dropped (as transformers does)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InputError(
            f"messages: expected a non-empty list of {{'role': ..., 'content': ...}} dicts, got "
            f"{type(messages).__name__ if not isinstance(messages, (list, tuple)) else 'an empty list'}"
        )
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InputError(f"messages[{i}]: expected a dict with a 'role' string (and 'content'), got {m!r}")
        out.append({k: v for k, v in m.items() if v is not None})
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ModelImportError(f"{path}: cannot read the chat template: {e}") from None


@lru_cache(maxsize=16)
def _compile(source: str):
    try:
        import jinja2
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ModelImportError("chat templates need the 'Jinja2' package: pip install rocmc[llm]") from None

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}`: marks the assistant's part; renders the body as it is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """namespace() that refuses names starting with "_" (no path to Python internals)."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for key in attrs:
                Namespace._check(key)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, key, value):
            Namespace._check(key)
            jinja2.utils.Namespace.__setitem__(self, key, value)

        @staticmethod
        def _check(key):
            if isinstance(key, str) and key.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat template: namespace attribute {key!r} starts with '_'")

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, namespace=Namespace)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ModelImportError(f"chat template: line {e.lineno}: {e.message}") from None
