"""Generated token ids to text, incrementally, for one choice.

``TextStream.add`` takes each token and returns the text that is safe to send now: the decoded
text (special tokens skipped, so the EOS never shows; decoded incrementally, so a long completion
costs linear time) minus what was already sent, held back
where it could still change, namely an incomplete UTF-8 character at the end, anything from a stop
string on (and a tail that could be the start of one), and with tools, anything from
``<tool_call>`` on (the calls are sent whole at the end). ``finish`` returns the full text, cut
at the first stop string. With a content filter (``rlvr serve --filter``), what is sent is the
filter's view of that text: matches redacted, the text cut before a blocked match, and a tail
kept back until the end so that a match arriving across tokens is never sent in part.
"""

from __future__ import annotations

from rlvr.content_filter import HOLD, scan

HOLD_STEP = 16
"""A stream's filter looks again once this many more characters could be shown."""


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
    """One choice's text as its tokens arrive (see the module docstring).

    Decoding is incremental, as Hugging Face TGI does it: each token decodes a short window of
    ids (from ``prefix`` on) instead of the whole sequence, and the text grows by what the window
    adds once it ends on a complete character. A window rather than the new token alone, because
    tokenizers such as SentencePiece's drop a token's leading space when it starts the text.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = (), hold: tuple[str, ...] = (), content=None):
        """``content``: an ``rlvr.content_filter.ContentFilter`` the text goes through (redacted
        matches, cut before a blocked one, a tail kept back); ``sent`` then counts shown characters."""
        self.tokenizer, self.stop, self.hold, self.content = tokenizer, stop, hold, content
        self.ids: list[int] = []
        self.decoded = ""  # the text of ids[:read], complete characters only
        self.prefix = self.read = 0
        self.sent = 0
        self.blocked: str | None = None  # the block rule that cut the text
        self.redacted: list[str] = []  # the rules whose matches were redacted
        self._raw_done, self._shown_done = 0, ""  # how far the filter's view is final, in raw and shown text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _window(self) -> tuple[str, str]:
        """(text of ids[prefix:read], text of ids[prefix:])."""
        return self._decode(self.ids[self.prefix:self.read]), self._decode(self.ids[self.prefix:])

    def text(self) -> str:
        """The whole text so far (an incomplete last character included), cut at the first stop
        string."""
        before, now = self._window()
        text = self.decoded + now[len(before):]
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=len(text))
        return text[:cut] if self.content is None else self._show(text[:cut], final=True)

    def _show(self, raw: str, final: bool) -> str:
        """The filter's view of ``raw``, scanned from where the last (non-final) view ended; not
        scanned at all before the end while the kept-back tail covers everything new."""
        if not final and len(raw) - HOLD < self._raw_done + HOLD_STEP:
            if self.content.blocks and not self.blocked:  # a block rule still stops generating at once
                hit = next(iter(scan(raw, self.content.blocks, self._raw_done)), None)
                self.blocked = hit.rule if hit is not None else None
            return self._shown_done
        tail, hits, blocked, end = self.content.view(raw, final, self._raw_done)
        shown = self._shown_done + tail
        self.blocked = self.blocked or blocked
        self.redacted += [h.rule for h in hits if h.rule not in self.redacted]
        if not final:
            self._raw_done, self._shown_done = end, shown
        return shown

    def add(self, token_id: int | None) -> str:
        """Take one token (None: none); the newly safe text."""
        if token_id is not None:
            self.ids.append(token_id)
            before, now = self._window()
            if len(now) > len(before) and not now.endswith("\ufffd"):  # (else: an incomplete character)
                self.decoded += now[len(before):]
                self.prefix, self.read = self.read, len(self.ids)
        end = _cut(self.decoded, self.stop + self.hold)
        if self.content is not None:
            shown = self._show(self.decoded[:end], final=False)
            delta, self.sent = shown[self.sent:], max(self.sent, len(shown))
            return delta
        if end <= self.sent:
            return ""
        delta, self.sent = self.decoded[self.sent:end], end
        return delta
