"""`--chat-template`: one of upstream SGLang's built-in template names, a Jinja file, or inline
Jinja text; anything else is refused at start-up (ValueError naming the flag).

The built-in templates are our own Jinja renderings of the conversation formats upstream names
(`chatml`, `llama-2`, `llama-3-instruct`, `qwen`, `deepseek-v3`, `mistral`): HF's
`apply_chat_template` renders them with `messages`, `add_generation_prompt`, `bos_token` and
`eos_token`, like a tokenizer's own template.
"""

from __future__ import annotations

import os
from typing import Any, Optional

_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen's chat format is ChatML with a default system prompt when the conversation has none.
_QWEN = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}" + _CHATML
)
# [INST] blocks; a system message goes inside the first user turn between <<SYS>> markers.
_LLAMA_2 = (
    "{% set ns = namespace(sys='') %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.sys = '<<SYS>>\\n' + m['content'] + '\\n<</SYS>>\\n\\n' %}"
    "{% elif m['role'] == 'user' %}{{ bos_token }}[INST] {{ ns.sys }}{{ m['content'] }} [/INST]"
    "{% set ns.sys = '' %}"
    "{% else %} {{ m['content'] }} {{ eos_token }}{% endif %}"
    "{% endfor %}"
)
_LLAMA_3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# Mistral instruct: [INST] ... [/INST] turns, the system prompt before the first user message.
_MISTRAL = (
    "{{ bos_token }}{% set ns = namespace(sys='') %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.sys = m['content'] + '\\n\\n' %}"
    "{% elif m['role'] == 'user' %}[INST] {{ ns.sys }}{{ m['content'] }}[/INST]{% set ns.sys = '' %}"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)
# DeepSeek-V3: system prompt first, then <｜User｜> / <｜Assistant｜> turns.
_DEEPSEEK_V3 = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}{% endif %}"
    "{% endfor %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<｜Assistant｜>{{ m['content'] }}<｜end▁of▁sentence｜>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)

BUILTIN_CHAT_TEMPLATES = {
    "chatml": _CHATML,
    "qwen": _QWEN,
    "llama-2": _LLAMA_2,
    "llama-2-chat": _LLAMA_2,
    "llama-3-instruct": _LLAMA_3,
    "mistral": _MISTRAL,
    "deepseek-v3": _DEEPSEEK_V3,
}


def is_inline_template(value: str) -> bool:
    return "{%" in value or "{{" in value


def resolve_chat_template(value: Optional[str]) -> Optional[str]:
    """The Jinja text of `--chat-template`: a built-in name, a file's contents, or the inline
    template itself; None when not given. ValueError for anything else."""
    if value is None:
        return None
    if value in BUILTIN_CHAT_TEMPLATES:
        return BUILTIN_CHAT_TEMPLATES[value]
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if is_inline_template(value):
        return value
    raise ValueError(
        f"--chat-template {value!r} is neither a built-in template name ({', '.join(BUILTIN_CHAT_TEMPLATES)}), "
        "an existing file, nor a Jinja template"
    )


def named_tokenizer_template(tokenizer: Any, name: str) -> str:
    """`--hf-chat-template-name`: one of the tokenizer's named chat templates (ValueError if absent)."""
    templates = getattr(tokenizer, "chat_template", None)
    if not isinstance(templates, dict) or name not in templates:
        have = sorted(templates) if isinstance(templates, dict) else []
        raise ValueError(
            f"--hf-chat-template-name {name!r}: the tokenizer has no chat template of that name "
            f"(it has: {', '.join(have) or 'no named templates'})"
        )
    return templates[name]
