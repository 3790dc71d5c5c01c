"""Pushed alerts (``rlvr.monitor.push``): a run's alerts reach a local webhook receiver within
seconds, a failing receiver is retried with backoff, and a dead or hanging one never holds up the
step (``push`` only enqueues)."""

from __future__ import annotations

import json
import time

import pytest

from rlvr.errors import ConfigError
from rlvr.monitor.alerts import AlertLog
from rlvr.monitor.push import AlertPusher, PushConfig
from webhook_receiver import MailReceiver, Receiver

ALERT = {"step": 3, "detector": "tampering", "severity": "critical", "evidence": {"flagged": 1},
         "trajectory_ids": ["3-1"], "action": "logged"}


def test_an_alert_reaches_the_receiver_with_its_run_and_headers(tmp_path):
    receiver = Receiver()
    pusher = AlertPusher(PushConfig(url=receiver.url, headers={"Authorization": "Bearer t"}), run="runs/x")
    log = AlertLog(tmp_path, echo=None, pusher=pusher)
    log.write(ALERT)
    log.write({**ALERT, "detector": "reward_jump", "severity": "info"})  # below min_severity: file only
    log.close()
    receiver.close()
    [(_, body, headers)] = receiver.bodies
    assert body == {"run": "runs/x", "alert": ALERT} and headers["Authorization"] == "Bearer t"
    assert pusher.counts == {"pushed": 1} and len(log.path.read_text().splitlines()) == 2
    assert "pushed 1" in log.summary()


def test_a_failing_receiver_is_retried_with_backoff_and_a_dead_one_given_up(tmp_path):
    receiver = Receiver(fail_first=2)
    pusher = AlertPusher(PushConfig(url=receiver.url, retries=3, backoff_s=0.05))
    pusher.push(ALERT)
    pusher.close(wait_s=10)
    receiver.close()
    assert len(receiver.bodies) == 1 and pusher.counts == {"pushed": 1}
    dead = AlertPusher(PushConfig(url="http://127.0.0.1:9/nothing", retries=2, backoff_s=0.01, timeout_s=0.5))
    dead.push(ALERT)
    dead.close(wait_s=10)
    assert dead.counts == {"failed": 1}


def test_an_alert_is_mailed_through_smtp_retried_and_a_dead_server_given_up(monkeypatch):
    mail = MailReceiver(fail_first=1)
    hook = Receiver()
    monkeypatch.setenv("RLVR_TEST_SMTP_PASSWORD", "unused")  # no login: the receiver offers none
    cfg = PushConfig(url=hook.url, email_to=["oncall@example.com", "ml@example.com"], email_from="rlvr@example.com",
                     smtp_host="127.0.0.1", smtp_port=mail.port, retries=2, backoff_s=0.05)
    pusher = AlertPusher(cfg, run="runs/x")
    start = time.monotonic()
    pusher.push(ALERT)
    pusher.close(wait_s=10)
    mail.close()
    hook.close()
    assert pusher.counts == {"pushed": 2} and len(hook.bodies) == 1  # the webhook and the e-mail
    (arrived, sender, rcpts, text), = mail.messages  # the first DATA was refused: retried once
    assert arrived - start < 5 and sender == "rlvr@example.com" and rcpts == ["oncall@example.com", "ml@example.com"]
    assert "Subject: [rlvr] critical tampering at step 3: runs/x" in text and '"flagged": 1' in text
    dead = AlertPusher(PushConfig(email_to=["a@example.com"], smtp_host="127.0.0.1", smtp_port=9, retries=1,
                                  backoff_s=0.01, timeout_s=0.5))
    dead.push(ALERT)
    dead.close(wait_s=10)
    assert dead.counts == {"failed": 1}


def test_a_hanging_receiver_never_holds_up_the_writer(tmp_path):
    receiver = Receiver(hang_s=3.0)
    pusher = AlertPusher(PushConfig(url=receiver.url, timeout_s=2.0, retries=0, queue_size=5))
    log = AlertLog(tmp_path, echo=None, pusher=pusher)
    start = time.monotonic()
    for step in range(20):  # each POST would wait 2 s: the writes do not
        log.write({**ALERT, "step": step})
    assert time.monotonic() - start < 1.0  # far under one POST's timeout: nothing waited on the network
    assert len(log.path.read_text().splitlines()) == 20  # the file has every alert
    log.close(wait_s=0.5)
    receiver.close()
    assert pusher.counts["dropped"] >= 14  # the queue holds 5; the rest were dropped and counted


def test_bad_push_configs_name_the_key():
    with pytest.raises(ConfigError, match="monitor.push.url"):
        PushConfig(url="smtp://mail")
    with pytest.raises(ConfigError, match="monitor.push.min_severity"):
        PushConfig(url="http://x", min_severity="loud")
    with pytest.raises(ConfigError, match="monitor.push.email_to"):
        PushConfig(email_to=["a@example.com, b@example.com"])
    with pytest.raises(ConfigError, match="smtp_password_env"):
        PushConfig(email_to=["a@example.com"], smtp_user="rlvr")
    assert not PushConfig().enabled and PushConfig(email_to=["a@example.com"]).enabled


def test_a_runs_alert_reaches_a_local_receiver_within_seconds(tiny_model_dir, tmp_path, monkeypatch):
    import rlvr.train.grpo as grpo
    from hack_policy import HackPolicy
    from rlvr.config import load_config
    from rlvr.train import sources
    from rlvr.train.grpo import GRPOConfig

    receiver = Receiver()
    written: dict[int, float] = {}
    real_write = AlertLog.write

    def write(self, alert):
        written.setdefault(alert["step"], time.monotonic())
        real_write(self, alert)
    monkeypatch.setattr(AlertLog, "write", write)
    monkeypatch.setattr(sources, "rollout", HackPolicy(["answer_stuffing"], per_step=4).wrap(sources.rollout))
    cfg = load_config(GRPOConfig, None, [
        f"model={tiny_model_dir}", f"out={tmp_path}", "domains=[math.arith]", "levels=[1]", "train_tasks=16",
        "rollout.tasks_per_step=4", "rollout.samples_per_task=4", "rollout.max_new_tokens=8", "steps=3",
        "checkpoint_every=100", f"monitor.push.url={receiver.url}"])
    grpo.run_grpo(cfg, progress=False)
    receiver.close()
    pushed = [(t, body["alert"]) for t, body, _ in receiver.bodies]
    assert [a["detector"] for _, a in pushed if a["detector"] == "answer_stuffing"] == ["answer_stuffing"]
    for t, alert in pushed:
        assert t - written[alert["step"]] < 5.0, alert  # arrived within seconds of being written
    assert json.loads((tmp_path / "alerts.jsonl").read_text().splitlines()[0]) == pushed[0][1]
