"""The default tokenizer: byte-level BPE trained on rlvr's own corpus, plus the chat template.

What it does: ``train_tokenizer`` builds a small BPE vocabulary (arithmetic and short English word
problems) that any ``AutoTokenizer.from_pretrained`` can load back, with the chat template saved
alongside. ``encode_chat_prompt`` and ``encode_completion`` are the one place where rlvr turns
messages into token ids, so a training example (prompt ids + completion ids) has exactly the form
a trained model generates after the prompt.

Choices:
- Digits are always single tokens (``Digits(individual_digits=True)`` before the byte-level split),
  so "123" is "1" "2" "3": a tiny model learns carrying digit by digit instead of memorising
  multi-digit merges.
- Byte-level pre-tokenizer and decoder: ``decode(encode(x)) == x`` for any text, spaces and
  newlines included, and there is no unknown token.
- ``tokenizer(text)`` adds no special tokens; the chat template writes ``<|bos|>`` itself.
- ``<|end|>`` closes every turn and is the EOS token: generation stops on it.

What it does not do: it is not a general-purpose tokenizer (the vocabulary is tiny and fitted to
the built-in domains); a user-provided Hugging Face model keeps its own tokenizer and template.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from rlvr.types import Message

BOS, END, PAD = "<|bos|>", "<|end|>", "<|pad|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
SPECIAL_TOKENS = (BOS, END, PAD, *ROLE_TOKENS)  # ids 0..6 in this order

# `{{ bos_token }}`, then, when tools are offered, a system turn listing them (one line each:
# `- name(arg, ...): description`) and the call format; then `<|role|>\n{content}<|end|>\n` per
# message, then `<|assistant|>\n` when a reply is wanted. Roles are system | user | assistant |
# tool (tool results). Tool calls are plain text in assistant turns: <tool_call>{json}</tool_call>.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>\nTools:\n"
    "{% for tool in tools %}{% set f = tool.function if tool.function is defined else tool %}"
    "- {{ f.name }}({% for p in f.parameters.properties %}{{ p }}{% if not loop.last %}, {% endif %}"
    "{% endfor %}): {{ f.description }}\n"
    "{% endfor %}"
    "Call one tool per turn: <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call><|end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # every byte plus the special tokens


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it for ``transformers``.

    The result has bos/eos/pad set, the chat template attached (saved by ``save_pretrained``),
    and adds no special tokens on ``tokenizer(text)``. Training is deterministic for a given
    ``texts`` sequence.
    """
    if vocab_size < _MIN_VOCAB:
        raise ValueError(f"vocab_size must be at least {_MIN_VOCAB} (256 bytes + specials), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=END,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,  # keep decode(encode(x)) == x
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _as_ids(encoded: object) -> list[int]:
    """Normalise what ``apply_chat_template(tokenize=True)`` returns across transformers versions
    (a list, a ``BatchEncoding``/dict with ``input_ids``, or a tensor) into a flat list of ints."""
    if isinstance(encoded, Mapping):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    ids = list(encoded)  # type: ignore[call-overload]
    if ids and isinstance(ids[0], (list, tuple)):  # a batch of one
        if len(ids) != 1:
            raise ValueError(f"expected one sequence, got a batch of {len(ids)}")
        ids = list(ids[0])
    return [int(i) for i in ids]


def encode_chat_prompt(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message],
                       tools: Sequence[dict] | None = None) -> list[int]:
    """Token ids of ``messages`` (and the ``tools`` schemas, if any) rendered with the chat
    template, ending with the generation prompt (``<|assistant|>\\n`` for the default template)."""
    encoded = tokenizer.apply_chat_template(list(messages), tools=list(tools) if tools else None,
                                            add_generation_prompt=True, tokenize=True)
    return _as_ids(encoded)


def encode_completion(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of an assistant reply as the model should generate it: the text, then EOS."""
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has no eos token; cannot mark the end of a completion")
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
