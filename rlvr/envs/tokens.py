"""Token-faithful episodes: the one place multi-turn conversations become token ids.

A multi-turn trajectory is built by appending, never by re-tokenising: the prompt ids, then for
each turn the exact ids the policy generated (ending with EOS), then the ids of what the
environment said (``observation_ids``: the template's text between the policy's EOS and the next
generation prompt). The ids the policy was conditioned on in turn k are exactly the prefix of the
trajectory it is trained on. SFT demonstrations go through the same functions
(``conversation_ids``), so a demonstration has the form the policy produces.

Works with any chat template that renders a message as ``...content<eos>...`` (Hugging Face
templates do); a template for which history re-rendering does not extend the earlier text is
refused with an error naming it.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from rlvr.model.tokenizer import encode_chat_prompt, encode_completion
from rlvr.types import Message


def _render(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message], tools, generation: bool) -> str:
    return tokenizer.apply_chat_template(list(messages), tools=list(tools) if tools else None,
                                         add_generation_prompt=generation, tokenize=False)


def observation_text(tokenizer: PreTrainedTokenizerBase, history: Sequence[Message],
                     observation: Sequence[Message], tools: Sequence[dict] | None = None) -> str:
    """Template text that follows the policy's EOS once ``observation`` messages are appended
    to ``history`` (which ends with the assistant turn), up to the next generation prompt."""
    before = _render(tokenizer, history, tools, generation=False)
    after = _render(tokenizer, [*history, *observation], tools, generation=True)
    if not after.startswith(before):
        raise ValueError("the chat template re-renders earlier turns differently once a message is "
                         "appended; multi-turn episodes need a template that only appends")
    eos = tokenizer.eos_token
    cut = before.rfind(eos)
    if not eos or cut < 0:
        raise ValueError(f"the chat template does not end assistant turns with the eos token {eos!r}")
    return before[cut + len(eos):] + after[len(before):]


def observation_ids(tokenizer: PreTrainedTokenizerBase, history: Sequence[Message],
                    observation: Sequence[Message], tools: Sequence[dict] | None = None) -> list[int]:
    text = observation_text(tokenizer, history, observation, tools)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def conversation_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message],
                     tools: Sequence[dict] | None = None) -> tuple[list[int], list[int]]:
    """(ids, loss_mask) of a whole conversation as the policy would have produced it: the prompt
    (messages before the first assistant turn), each assistant turn as its text + EOS (mask 1),
    each run of other messages as ``observation_ids`` (mask 0). Ends after the last message."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None:
        raise ValueError("a conversation to train on needs at least one assistant message")
    ids = encode_chat_prompt(tokenizer, messages[:first], tools)
    mask = [0] * len(ids)
    i = first
    while i < len(messages):
        turn = encode_completion(tokenizer, messages[i]["content"])
        ids += turn
        mask += [1] * len(turn)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j > i + 1 and j < len(messages):
            obs = observation_ids(tokenizer, messages[: i + 1], messages[i + 1: j], tools)
            ids += obs
            mask += [0] * len(obs)
        elif j > i + 1:
            raise ValueError("a conversation to train on must end with an assistant message")
        i = j
    return ids, mask
