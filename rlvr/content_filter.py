"""Content rules over generated text: secrets and personal data a model must not emit.

``CONTENT_RULES`` is a registry of ``ContentRule``: a name, a regex, an optional check of each
match (the Luhn checksum of a card number) and the examples it must and must not match (the
conformance suite runs them). ``scan(text, rules)`` returns the ``Hit``s, leftmost first,
overlapping matches merged into one span; ``redact(text, hits)`` writes each as ``[redacted:<rule>]``.

Built in (``docs/content_filter.md``):

    private_key      a PEM private-key header (-----BEGIN ... PRIVATE KEY-----)
    aws_access_key   AKIA/ASIA + 16 upper-case letters or digits
    github_token     ghp_/gho_/ghu_/ghs_/ghr_ + 36 or more letters or digits
    api_key          sk- keys (OpenAI-style) and xox[abprs]- Slack tokens, 20+ characters
    jwt              three base64url parts, the first starting eyJ
    email            an e-mail address
    phone            a phone number: 10 digits in 3-3-4 groups (with separators), or + and 10-15 digits
    card_number      13-19 digits (spaces or dashes between groups allowed) passing the Luhn check

Used in training by the ``content`` reward term (``reward.content_penalty``) and the
``content_leak`` monitor detector; in ``rlvr serve --filter`` by ``ContentFilter`` (redact or block,
streaming-safe). A user's own patterns: ``ContentRule`` entries registered under new names
(``CONTENT_RULES.register``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rlvr.errors import ConfigError
from rlvr.registry import Registry


@dataclass(frozen=True)
class ContentRule:
    description: str
    pattern: re.Pattern
    matches: tuple[str, ...]
    """Texts the rule must flag (the conformance suite checks them)."""
    passes: tuple[str, ...]
    """Look-alikes it must not flag."""
    check: Callable[[str], bool] | None = None
    """A further test of each regex match (None: every match counts)."""


@dataclass(frozen=True)
class Hit:
    rule: str
    start: int
    end: int


CONTENT_RULES: Registry[ContentRule] = Registry("content rule")


def luhn(text: str) -> bool:
    """Whether the digits of ``text`` pass the Luhn checksum (card numbers)."""
    digits = [int(c) for c in text if c.isdigit()]
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2:
            d *= 2
            d -= 9 if d > 9 else 0
        total += d
    return len(digits) >= 13 and total % 10 == 0


def _rule(name: str, description: str, pattern: str, matches: tuple[str, ...], passes: tuple[str, ...],
          check: Callable[[str], bool] | None = None, flags: int = 0) -> None:
    CONTENT_RULES.register(name)(ContentRule(description, re.compile(pattern, flags), matches, passes, check))


_rule("private_key", "a PEM private-key header", r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----",
      ("-----BEGIN RSA PRIVATE KEY-----\nMIIE", "key: -----BEGIN PRIVATE KEY-----", "-----BEGIN OPENSSH PRIVATE KEY-----"),
      ("-----BEGIN PUBLIC KEY-----", "-----BEGIN CERTIFICATE-----", "a private key is secret"))
_rule("aws_access_key", "an AWS access key id", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
      ("AKIAIOSFODNN7EXAMPLE", "id=ASIAY34FZKBOKMUTVV7A;"), ("AKIA-not-a-key", "AKIAIOSFODNN7EXAMPL", "akiaiosfodnn7example"))
_rule("github_token", "a GitHub token", r"\bgh[pousr]_[A-Za-z0-9]{36,}\b",
      ("ghp_" + "a1B2" * 9, "token ghs_" + "Z9y8" * 10), ("ghp_short", "gh_" + "a" * 40, "ghx_" + "a" * 36))
_rule("api_key", "an sk- API key or a Slack token", r"\b(?:sk-(?:proj-)?[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{20,})",
      ("sk-" + "Ab3d" * 6, "OPENAI_API_KEY=sk-proj-" + "x1Y2" * 6, "xoxb-" + "1234-5678-abcd-efgh-ijkl"),
      ("sk-short", "task-list", "xoxb-12"))
_rule("jwt", "a JSON web token", r"\beyJ[A-Za-z0-9_-]{8,400}\.[A-Za-z0-9_-]{8,400}\.[A-Za-z0-9_-]{8,400}",
      ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjMifQ.SflKxwRJSMeKKF2QT4fw",),
      ("eyJ.a.b", "version 1.2.3", "eyJhbGciOiJIUzI1NiJ9 alone"))
_rule("email", "an e-mail address", r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b",
      ("write to jane.doe@example.com", "a+b@mail.co.uk"), ("user@localhost", "a @ b . com", "x@y", "f(a@b)"))
_rule("phone", "a phone number",
      r"(?<![\w.+-])(?:\+\d{1,3}[ .-]?)?\(?\d{3}\)?[ .-]\d{3}[ .-]\d{4}(?![\w-])|(?<![\w.+])\+\d{10,15}(?!\w)",
      ("call 555-123-4567", "(555) 123-4567", "+1 555.123.4567", "+4915112345678"),
      ("5551234567", "2024-12-06", "1.234.567", "x = 555 - 123 - 4567", "v1.555.123"))
_rule("card_number", "a payment card number (13-19 digits passing the Luhn check)",
      r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])",
      ("4111 1111 1111 1111", "card 5500-0000-0000-0004", "378282246310005"),
      ("4111 1111 1111 1112", "1234567890123", "12345", "2024-12-06 10:00"), check=luhn)


def scan(text: str, rules: list[str] | tuple[str, ...] | None = None, start: int = 0) -> list[Hit]:
    """Every match of ``rules`` (default: all) in ``text`` from ``start`` on (what comes before
    still counts as context: ``\b`` and look-behinds see it), leftmost first; a match overlapping
    an earlier one is dropped."""
    names = CONTENT_RULES.names() if rules is None else list(rules)
    hits = []
    for name in names:
        rule = CONTENT_RULES.get(name)
        for m in rule.pattern.finditer(text, start):
            if rule.check is None or rule.check(m.group(0)):
                hits.append(Hit(name, m.start(), m.end()))
    hits.sort(key=lambda h: (h.start, -h.end))
    kept: list[Hit] = []
    for h in hits:
        if kept and h.start < kept[-1].end:  # overlapping matches are one span (named by the first):
            kept[-1] = Hit(kept[-1].rule, kept[-1].start, max(kept[-1].end, h.end))  # nothing of either shows
        else:
            kept.append(h)
    return kept


def redact(text: str, hits: list[Hit], start: int = 0) -> str:
    """``text[start:]`` with each hit (all at or after ``start``) written as ``[redacted:<rule>]``."""
    out, at = [], start
    for h in hits:
        out += [text[at:h.start], f"[redacted:{h.rule}]"]
        at = h.end
    return "".join(out) + text[at:]


ACTIONS = ("redact", "block")
HOLD = 128
"""Characters a stream keeps back from its end, so that a match still arriving is never sent in
part: matches longer than this (a long JWT) may be."""


class ContentFilter:
    """Which rules act on a served text and how: ``{rule: "redact" | "block"}``.

    ``view(raw, final)`` is what may be shown of ``raw``: redacted matches written as
    ``[redacted:<rule>]``, the text cut before the first match of a block rule, and (unless
    ``final``) the last ``HOLD`` characters and any match reaching into them kept back. The shown
    text only grows as ``raw`` does, so a stream can send its new end each time.
    """

    def __init__(self, actions: dict[str, str]) -> None:
        check_rule_names("--filter", list(actions))
        for rule, action in actions.items():
            if action not in ACTIONS:
                raise ConfigError(f"--filter {rule}={action}: the action must be one of {', '.join(ACTIONS)}")
        self.actions = dict(actions)
        self.blocks = [rule for rule, action in actions.items() if action == "block"]

    @classmethod
    def parse(cls, text: str) -> ContentFilter | None:
        """``"card_number=block,email"`` (action redact unless given; ``all`` for every rule); None if empty."""
        actions: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            rule, _, action = item.partition("=")
            for name in CONTENT_RULES.names() if rule == "all" else [rule]:
                actions[name] = action or "redact"
        return cls(actions) if actions else None

    def view(self, raw: str, final: bool, start: int = 0) -> tuple[str, list[Hit], str | None, int]:
        """What may be shown of ``raw[start:]`` (``start``: where an earlier view of a prefix of
        ``raw`` ended, so a stream scans each character about once): ``(the shown text, the hits it
        redacted, the block rule that cut it or None, the end in raw)``."""
        hits = scan(raw, list(self.actions), start)
        end = len(raw) if final else max(start, len(raw) - HOLD)
        blocked = next((h for h in hits if self.actions[h.rule] == "block"), None)
        if blocked is not None:
            end = min(end, blocked.start)
        for h in hits:
            if h.start < end < h.end:  # never show part of a match
                end = h.start
        shown = [h for h in hits if h.end <= end]
        return redact(raw[:end], shown, start), shown, blocked.rule if blocked is not None else None, end


def check_rule_names(key: str, names: list[str]) -> None:
    """``ConfigError`` naming ``key`` for a rule that is not registered."""
    unknown = [n for n in names if n not in CONTENT_RULES]
    if unknown:
        raise ConfigError(f"'{key}' names unknown content rule(s) {unknown}; choose from: {', '.join(CONTENT_RULES.names())}")
