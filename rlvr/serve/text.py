"""Generated token ids to text, incrementally, for one choice.

``TextStream.add`` takes each token and returns the text that is safe to send now: the decoded
text (special tokens skipped, so the EOS never shows) minus what was already sent, held back
where it could still change, namely an incomplete UTF-8 character at the end, anything from a stop
string on (and a tail that could be the start of one), and with tools, anything from
``<tool_call>`` on (the calls are sent whole at the end). ``finish`` returns the full text, cut
at the first stop string.
"""

from __future__ import annotations


def _cut(text: str, markers: tuple[str, ...]) -> int:
    """Where ``text`` stops being safe: the first marker, or a tail that may begin one."""
    end = len(text)
    for m in markers:
        i = text.find(m)
        if i >= 0:
            end = min(end, i)
            continue
        for k in range(min(len(m) - 1, len(text)), 0, -1):
            if text.endswith(m[:k]):
                end = min(end, len(text) - k)
                break
    return end


class TextStream:
    """One choice's text as its tokens arrive (see the module docstring)."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = (), hold: tuple[str, ...] = ()):
        self.tokenizer, self.stop, self.hold = tokenizer, stop, hold
        self.ids: list[int] = []
        self.sent = 0

    def text(self) -> str:
        """The text so far, cut at the first stop string."""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=len(text))
        return text[:cut]

    def add(self, token_id: int | None) -> str:
        """Take one token (None: none); the newly safe text."""
        if token_id is not None:
            self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete multi-byte character
            return ""
        end = _cut(text, self.stop + self.hold)
        if end <= self.sent:
            return ""
        delta, self.sent = text[self.sent:end], end
        return delta
