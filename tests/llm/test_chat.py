"""Chat templates (rocmc.llm.chat) against transformers' apply_chat_template, LanguageModel.chat and
`rocmc generate --chat`."""

from __future__ import annotations

import json
import shutil

import pytest

import rocmc
from rocmc.llm import chat
from rocmc.llm.tokenizer import Tokenizer
from llm_models import llm_checkpoint, save_tokenizer  # noqa: F401
from test_generation import hf_generate, letter_tokenizer

transformers = pytest.importorskip("transformers")

# Llama 2's template: BOS written by the template, a system message folded into the first user turn,
# raise_exception on roles out of order; indented blocks (lstrip_blocks) and newlines after tags (trim_blocks).
LLAMA2 = """{% if messages[0]['role'] == 'system' %}
    {% set loop_messages = messages[1:] %}
    {% set system_message = messages[0]['content'] %}
{% else %}
    {% set loop_messages = messages %}
    {% set system_message = false %}
{% endif %}
{% for message in loop_messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if loop.index0 == 0 and system_message != false %}
        {% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}
    {% else %}
        {% set content = message['content'] %}
    {% endif %}
    {% if message['role'] == 'user' %}
{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}
    {% elif message['role'] == 'assistant' %}
{{ ' '  + content.strip() + ' ' + eos_token }}
    {% endif %}
{% endfor %}"""

# tojson (no HTML escaping, non-ASCII kept), namespace, loop controls, tools/documents, strftime_now,
# a {% generation %} block.
TOOLS = """{% set ns = namespace(turns=0) %}
{% for m in messages %}
  {% if m.role == 'system' %}{% continue %}{% endif %}
  {% set ns.turns = ns.turns + 1 %}
<|{{ m.role }}|>{{ m | tojson }}
{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% endif %}
{% endfor %}
{% if tools is none and documents is none %}no tools{% endif %} {{ ns.turns }} turns {{ strftime_now('%Y') }}
{% if add_generation_prompt %}<|assistant|>{% endif %}"""

CONVERSATIONS = [
    [{"role": "user", "content": "Hello there"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "  4  "},
        {"role": "user", "content": "And <b>3 & 3</b>, café?"},
    ],
    [
        {"role": "user", "content": "a", "name": None},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ],
]


def _checkpoint(src, directory, chat_template=None, jinja=None):
    d = directory
    shutil.copytree(src, d)
    config = {"add_bos_token": True}
    if chat_template is not None:
        config["chat_template"] = chat_template
    save_tokenizer(letter_tokenizer(384), d, bos_template=True, config=config)
    if jinja is not None:
        (d / chat.TEMPLATE_FILE).write_text(jinja)
    return d


@pytest.fixture(scope="module")
def ckpt(llm_checkpoint, tmp_path_factory):  # noqa: F811
    return _checkpoint(llm_checkpoint("llama"), tmp_path_factory.mktemp("chat") / "llama", LLAMA2)


@pytest.fixture(scope="module")
def lm(ckpt):
    return rocmc.llm.load_hf(ckpt, "cpu", max_seq_len=96, max_batch=1)


def _render(d, messages, name=None, add_generation_prompt=True):
    return chat.render(
        chat.select(chat.load_templates(d), name),
        messages,
        add_generation_prompt=add_generation_prompt,
        special_tokens=Tokenizer.from_dir(d).special_tokens,
    )


@pytest.mark.parametrize("template", ["llama2", "tools"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_rendering_equals_transformers(llm_checkpoint, tmp_path, template, add_generation_prompt):  # noqa: F811
    d = _checkpoint(llm_checkpoint("llama"), tmp_path / "ck", LLAMA2 if template == "llama2" else TOOLS)
    tok = transformers.AutoTokenizer.from_pretrained(d)
    for messages in CONVERSATIONS:
        want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        assert _render(d, messages, add_generation_prompt=add_generation_prompt) == want
    if template == "tools":
        assert '"content": "And <b>3 & 3</b>, café?"' in _render(d, CONVERSATIONS[1])


def test_ids_equal_transformers_with_one_bos(ckpt, lm):
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    for messages in CONVERSATIONS:
        want = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)
        ids = lm.encode_chat(messages)
        assert ids == want["input_ids"]
        # the template writes one BOS per user turn; encoding adds none (this tokenizer adds one to plain text)
        assert lm.tokenizer.add_bos and lm.tokenizer.encode("a")[0] == lm.tokenizer.bos_token_id
        assert ids.count(lm.tokenizer.bos_token_id) == sum(m["role"] == "user" for m in messages)


def test_template_errors_are_input_errors(ckpt, lm):
    with pytest.raises(rocmc.InputError, match="roles must alternate"):
        lm.encode_chat([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(rocmc.InputError, match="messages"):
        lm.encode_chat("hello")
    with pytest.raises(rocmc.InputError, match="template='nope'"):
        lm.encode_chat(CONVERSATIONS[0], template="nope")


def test_named_templates_and_template_files(llm_checkpoint, tmp_path):  # noqa: F811
    named = [{"name": "default", "template": LLAMA2}, {"name": "tool_use", "template": TOOLS}]
    d = _checkpoint(llm_checkpoint("llama"), tmp_path / "named", named)
    tok = transformers.AutoTokenizer.from_pretrained(d)
    assert set(chat.load_templates(d)) == {"default", "tool_use"}
    for name in (None, "tool_use"):
        want = tok.apply_chat_template(CONVERSATIONS[1], chat_template=name, tokenize=False, add_generation_prompt=True)
        assert _render(d, CONVERSATIONS[1], name) == want
    # no "default" among several: the names are listed
    d2 = _checkpoint(llm_checkpoint("llama"), tmp_path / "nodefault", named[1:] + [{"name": "x", "template": "x"}])
    with pytest.raises(rocmc.InputError, match="'tool_use', 'x'"):
        _render(d2, CONVERSATIONS[0])
    # chat_template.jinja wins over tokenizer_config.json's template
    d3 = _checkpoint(llm_checkpoint("llama"), tmp_path / "jinja", LLAMA2, jinja=TOOLS)
    tok3 = transformers.AutoTokenizer.from_pretrained(d3)
    want = tok3.apply_chat_template(CONVERSATIONS[1], tokenize=False, add_generation_prompt=True)
    assert want.startswith("<|user|>") and _render(d3, CONVERSATIONS[1]) == want
    # none at all
    d4 = _checkpoint(llm_checkpoint("llama"), tmp_path / "none")
    with pytest.raises(rocmc.InputError, match="no chat template"):
        _render(d4, CONVERSATIONS[0])
    bad = json.loads((d4 / "tokenizer_config.json").read_text())
    bad["chat_template"] = 7
    (d4 / "tokenizer_config.json").write_text(json.dumps(bad))
    with pytest.raises(rocmc.ModelImportError, match="chat_template"):
        chat.load_templates(d4)


def test_chat_reply_equals_transformers(ckpt, lm):
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    out, _ = hf_generate(ckpt, [ids], do_sample=False, max_new_tokens=8)
    want = tok.decode(out.sequences[0, len(ids) :], skip_special_tokens=True)
    assert lm.chat(messages, 8, stop_tokens=()) == want
    r = lm.chat(messages, 8, stop_tokens=(), return_logprobs=True)
    assert r.text == want and len(r.logprobs) == 8


def test_generate_command_chat(ckpt, lm, capsys):
    from rocmc.cli import main

    assert (
        main(
            [
                "generate",
                str(ckpt),
                "--chat",
                "-p",
                "What is 2+2?",
                "--system",
                "Be brief.",
                "-n",
                "6",
                "--max-seq-len",
                "96",
            ]
        )
        == 0
    )
    want = lm.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}], 6)
    assert capsys.readouterr().out == want + "\n"
    assert main(["generate", str(ckpt), "--chat", "--ids", "-p", "1, 2"]) == 2
    assert "--chat" in capsys.readouterr().err
    assert main(["generate", str(ckpt), "--system", "x", "-p", "hi"]) == 2
    assert "--system" in capsys.readouterr().err
