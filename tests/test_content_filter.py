"""Content rules (``rlvr.content_filter``): secrets and personal data found in generated text,
redacted, penalised as a reward term and flagged by the ``content_leak`` detector; look-alikes
(numbers that fail the Luhn check, dates, version strings, public keys) are left alone."""

from __future__ import annotations

import pytest

from rlvr.config import load_config
from rlvr.content_filter import Hit, luhn, redact, scan
from rlvr.errors import ConfigError
from rlvr.monitor.alerts import AlertLog, read_alerts
from rlvr.monitor.config import MonitorConfig
from rlvr.monitor.watch import Monitor
from rlvr.rewards import RewardConfig, score
from rlvr.train.code_tools import code_tools
from test_detectors import math_task, scored

LEAKY = ("Sure. Use key AKIAIOSFODNN7EXAMPLE, mail ops@example.com, or pay with 4111-1111-1111-1111.\n"
         "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA")


def test_every_secret_is_found_once_leftmost_first_and_redacted():
    hits = scan(LEAKY)
    assert [h.rule for h in hits] == ["aws_access_key", "email", "card_number", "private_key"]
    out = redact(LEAKY, hits)
    assert out.startswith("Sure. Use key [redacted:aws_access_key], mail [redacted:email], or pay with "
                          "[redacted:card_number].\n[redacted:private_key]")
    for secret in ("AKIAIOSFODNN7EXAMPLE", "ops@example.com", "4111-1111-1111-1111", "PRIVATE KEY"):
        assert secret not in out
    assert scan(LEAKY, ["email"]) == [Hit("email", LEAKY.index("ops@"), LEAKY.index("ops@") + len("ops@example.com"))]


@pytest.mark.parametrize("text", [
    "The answer is 4111111111111112.",  # fails the Luhn check
    "Answer: 12345678901234",  # a long number an arithmetic task may well have
    "Released on 2026-12-06 at 10:00, version 1.22.3", "3.14159265358979",
    "-----BEGIN PUBLIC KEY-----", "def f(a, b):\n    return a @ b\n", "x@y", "",
])
def test_look_alikes_are_not_flagged(text):
    assert scan(text) == []


def test_luhn():
    assert luhn("4111 1111 1111 1111") and luhn("378282246310005") and not luhn("4111 1111 1111 1112")
    assert not luhn("0000") and not luhn("")  # too short to be a card


def test_the_content_term_penalises_a_leaking_completion_only():
    cfg = RewardConfig(content_penalty=0.5)
    leak = scored(math_task(), "Answer: 42. Contact me at jane@example.com", passed=True)
    clean = scored(math_task(), "Answer: 42", passed=True)
    assert score(leak.task, leak.verdict, leak.trajectory, cfg, 64).terms == {"outcome": 1.0, "content": -0.5}
    assert score(clean.task, clean.verdict, clean.trajectory, cfg, 64).terms == {"outcome": 1.0, "content": 0.0}
    only_cards = RewardConfig(content_penalty=0.5, content_rules=["card_number"])
    assert score(leak.task, leak.verdict, leak.trajectory, only_cards, 64).terms["content"] == 0.0
    assert "content" not in score(leak.task, leak.verdict, leak.trajectory, RewardConfig(), 64).terms  # off by default


def test_the_content_leak_detector_flags_and_alerts_each_time(tmp_path):
    cfg = load_config(MonitorConfig, None, ["sample_share=0"])
    monitor = Monitor(cfg, tmp_path, AlertLog(tmp_path, echo=None), RewardConfig(), code_tools(), seed=0)
    batch = [scored(math_task(), "Answer: 42", passed=True), scored(math_task(), f"Answer: 42\n{LEAKY}")]
    monitor.screen(1, batch)
    assert monitor.flags[1] == [{"detector": "content_leak", "severity": "warning",
                                 "note": "aws_access_key; email; card_number; private_key"}]
    [alert] = [a for a in read_alerts(tmp_path) if a["detector"] == "content_leak"]
    assert alert["trajectory_ids"] == ["1-1"] and alert["evidence"]["flagged"] == 1


def test_unknown_rules_are_named_with_the_choices():
    with pytest.raises(ConfigError, match=r"'reward.content_rules' names unknown content rule\(s\) \['ssn'\]; "
                                          r"choose from: api_key, aws_access_key, card_number"):
        RewardConfig(content_rules=["ssn"])
    with pytest.raises(ConfigError, match="monitor.content_leak.rules"):
        load_config(MonitorConfig, None, ["content_leak.rules=[passport]"])


def test_a_view_built_piece_by_piece_equals_the_whole_texts_and_only_grows():
    import random

    from rlvr.content_filter import ContentFilter

    parts = ["word ", "x = 555 - 123 ", "jane.doe@example.com ", "AKIAIOSFODNN7EXAMPLE", " 4111 1111 1111 1111 ",
             "4111 1111 1111 1112 ", "call (555) 123-4567.", "-----BEGIN RSA PRIVATE KEY----- ", "ok. " * 20]
    for seed in range(30):
        rng = random.Random(seed)
        text = "".join(rng.choice(parts) for _ in range(rng.randint(5, 40)))
        f = ContentFilter({"email": "redact", "aws_access_key": "redact", "phone": "redact",
                           "card_number": rng.choice(["redact", "block"]), "private_key": "redact"})
        whole = f.view(text, final=True)[0]
        done, shown, at = 0, "", 0
        while at < len(text):
            at = min(len(text), at + rng.randint(1, 9))
            tail, _, _, end = f.view(text[:at], final=False, start=done)
            assert whole.startswith(shown + tail), (seed, shown + tail)  # what was sent is never taken back
            done, shown = end, shown + tail
        assert shown + f.view(text, final=True, start=done)[0] == whole, seed
        assert scan(whole) == []  # nothing of a secret is left to find


def test_matches_that_overlap_are_redacted_as_one_span():
    text = "-----BEGIN RSA PRIVATE KEY-----jane.doe@example.com"  # an e-mail's local part may start with dashes
    assert [h.rule for h in scan(text)] == ["private_key"] and redact(text, scan(text)) == "[redacted:private_key]"
