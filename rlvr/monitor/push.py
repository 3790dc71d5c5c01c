"""Pushed alerts: each alert of a run POSTed as JSON to a webhook, off the training step.

``AlertPusher(cfg)`` owns one daemon thread and a bounded queue. ``push(alert)`` only enqueues
(it never waits on the network: a full queue drops the alert and counts it); the thread POSTs
``{"run": ..., "alert": {...}}`` with ``Content-Type: application/json`` and retries a failed
POST (a connection error, a timeout, a status >= 300) ``retries`` times after ``backoff_s``,
doubling each time. ``close(wait_s)`` gives the queue that long to drain, then stops the thread;
what is left is counted as dropped. ``counts`` holds ``pushed``, ``failed`` (given up after the
retries; both per channel: an alert sent to a webhook and by e-mail counts twice) and ``dropped``.

The receiver is whatever takes a JSON POST (a chat tool's incoming webhook, an alerting service,
your own endpoint). ``email_to`` also (or instead) mails each alert through an SMTP server
(``smtplib``: plain, or STARTTLS with a login whose password is read from the environment variable
``smtp_password_env``, never from the config), from the same thread, with the same retries.
Alerts are also in ``<run>/alerts.jsonl`` either way: pushing is a copy.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field

from rlvr.config import check_choice, check_range
from rlvr.errors import ConfigError

SEVERITY_ORDER = {"info": 0, "warning": 1, "critical": 2}


@dataclass
class PushConfig:
    """``monitor.push``: where a run's alerts are pushed (nowhere when ``url`` and ``email_to``
    are empty)."""

    url: str = ""
    """Webhook URL (http:// or https://) that gets each alert as a JSON POST; empty: no webhook."""
    email_to: list[str] = field(default_factory=list)
    """Addresses that get each alert as an e-mail; empty: no e-mail."""
    email_from: str = "rlvr@localhost"
    """The sender address of the alert e-mails."""
    smtp_host: str = "localhost"
    """SMTP server the e-mails go through."""
    smtp_port: int = 25
    """Its port (587 with smtp_starttls, typically)."""
    smtp_starttls: bool = False
    """Upgrade the connection with STARTTLS before sending (and before a login)."""
    smtp_user: str = ""
    """Login name; empty: no login."""
    smtp_password_env: str = ""
    """Environment variable that holds the login's password (never the password itself)."""
    min_severity: str = "warning"
    """Push alerts of this severity or above: info | warning | critical."""
    timeout_s: float = 5.0
    """Seconds one POST may take."""
    retries: int = 3
    """POSTs retried after a failure, waiting backoff_s, then twice that, ..."""
    backoff_s: float = 1.0
    """First wait before a retry."""
    headers: dict[str, str] = field(default_factory=dict)
    """Extra request headers (e.g. an Authorization token)."""
    queue_size: int = 1000
    """Alerts waiting to be sent at most; more are dropped (and counted), never waited for."""

    def __post_init__(self) -> None:
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"'monitor.push.url' = {self.url!r} must start with http:// or https://")
        check_choice("monitor.push.min_severity", self.min_severity, tuple(SEVERITY_ORDER))
        check_range("monitor.push.timeout_s", self.timeout_s, 0.001, None)
        check_range("monitor.push.retries", self.retries, 0, None)
        check_range("monitor.push.backoff_s", self.backoff_s, 0.0, None)
        check_range("monitor.push.queue_size", self.queue_size, 1, None)
        check_range("monitor.push.smtp_port", self.smtp_port, 1, 65535)
        for address in [*self.email_to, self.email_from]:
            if "@" not in address or any(c in address for c in " \r\n,;<>"):
                raise ConfigError(f"'monitor.push.email_to/email_from': {address!r} is not one e-mail address")
        if self.smtp_user and not self.smtp_password_env:
            raise ConfigError("'monitor.push.smtp_user' needs 'monitor.push.smtp_password_env' (the variable "
                              "holding the password)")

    @property
    def enabled(self) -> bool:
        return bool(self.url or self.email_to)


class AlertPusher:
    def __init__(self, cfg: PushConfig, run: str = "") -> None:
        self.cfg, self.run = cfg, run
        self.counts: Counter = Counter()
        self._queue: queue.Queue = queue.Queue(maxsize=cfg.queue_size)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rlvr-alert-push", daemon=True)
        self._thread.start()

    def push(self, alert: dict) -> None:
        """Queue ``alert`` if its severity is pushed; never blocks."""
        if SEVERITY_ORDER.get(alert.get("severity", "info"), 0) < SEVERITY_ORDER[self.cfg.min_severity]:
            return
        try:
            self._queue.put_nowait(alert)
        except queue.Full:
            self.counts["dropped"] += 1

    def close(self, wait_s: float = 5.0) -> None:
        """Let the queue drain for up to ``wait_s`` seconds, then stop the thread."""
        deadline = time.monotonic() + wait_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stop.set()
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()) + self.cfg.timeout_s)
        if self._queue.qsize():
            self.counts["dropped"] += self._queue.qsize()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                alert = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            try:
                channels = ([self._send] if self.cfg.url else []) + ([self._mail] if self.cfg.email_to else [])
                for channel in channels:
                    self.counts["pushed" if self._retried(channel, alert) else "failed"] += 1
            finally:
                self._queue.task_done()

    def _retried(self, send, alert: dict) -> bool:
        """``send(alert)`` tried ``retries + 1`` times, ``backoff_s`` apart, doubling."""
        wait = self.cfg.backoff_s
        for attempt in range(self.cfg.retries + 1):
            if send(alert):
                return True
            if attempt < self.cfg.retries and not self._stop.wait(wait):
                wait *= 2
            elif self._stop.is_set():
                return False
        return False

    def _mail(self, alert: dict) -> bool:
        import os
        import smtplib
        from email.message import EmailMessage

        msg = EmailMessage()
        msg["From"], msg["To"] = self.cfg.email_from, ", ".join(self.cfg.email_to)
        where = f" at step {alert['step']}" if "step" in alert else ""
        msg["Subject"] = f"[rlvr] {alert.get('severity', 'info')} {alert.get('detector', 'alert')}{where}: {self.run}"
        msg.set_content(json.dumps({"run": self.run, "alert": alert}, indent=2, default=str))
        try:
            with smtplib.SMTP(self.cfg.smtp_host, self.cfg.smtp_port, timeout=self.cfg.timeout_s) as smtp:
                if self.cfg.smtp_starttls:
                    smtp.starttls()
                if self.cfg.smtp_user:
                    smtp.login(self.cfg.smtp_user, os.environ.get(self.cfg.smtp_password_env, ""))
                smtp.send_message(msg)
            return True
        except (smtplib.SMTPException, OSError, ValueError):
            return False

    def _send(self, alert: dict) -> bool:
        body = json.dumps({"run": self.run, "alert": alert}).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "rlvr-alerts", **self.cfg.headers}
        request = urllib.request.Request(self.cfg.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.cfg.timeout_s) as response:
                return response.status < 300
        except (urllib.error.URLError, OSError, ValueError):
            return False
