"""Shared fixtures: a tiny tokenizer + random Llama saved as a Hugging Face directory."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random tiny Llama + a tokenizer trained on a small slice of the math corpus."""
    import rlvr.tasks  # noqa: F401  (registers the built-in domains)
    from rlvr.model.checkpoint import save_model_dir
    from rlvr.model.tiny import TinyModelConfig, build_tiny_model
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.tasks.base import DOMAINS

    docs = DOMAINS.get("math.arith").corpus(0, 200) + DOMAINS.get("math.word").corpus(0, 200)
    tokenizer = train_tokenizer(docs, vocab_size=320)
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64)
    model = build_tiny_model(cfg, tokenizer, seed=0)
    path = tmp_path_factory.mktemp("tiny") / "model"
    save_model_dir(path, model, tokenizer)
    return str(path)


@pytest.fixture(scope="module")
def sandbox():
    """A 2-worker sandbox installed for the code verifier for one test module (skips where no
    strict backend exists); a module may define its own ``sandbox`` instead."""
    from rlvr.sandbox import Sandbox, choose
    from rlvr.verifiers.code import use_sandbox

    if not choose("auto").strict:
        pytest.skip("no strict sandbox backend here")
    with Sandbox(workers=2) as sb:
        previous = use_sandbox(sb)
        yield sb
        use_sandbox(previous)


# --- RLVR_REQUIRE_STRICT_SANDBOX: where a strict sandbox is expected (CI), its absence fails ---
#
# The attack suite, the verifier-cheat, code-conformance and tamper tests skip where this machine
# has no strict sandbox backend (rlvr/sandbox/detect.py decides), so a machine without one would
# stay green without running them. With RLVR_REQUIRE_STRICT_SANDBOX=1 (`.ci/run` sets it) every
# such skip becomes a failure naming what is missing. A skip is "such a skip" when its reason
# contains one of STRICT_SKIP_REASONS: write new sandbox skips with the reason
# "no strict sandbox backend here" and they are covered without touching this file.

REQUIRE_STRICT_ENV = "RLVR_REQUIRE_STRICT_SANDBOX"
STRICT_SKIP_REASONS = ("strict sandbox", "bubblewrap")  # bubblewrap: `make setup` installs it as root


def _env_on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def strict_sandbox_required() -> bool:
    return _env_on(REQUIRE_STRICT_ENV)


def _sandbox_here() -> str:
    try:
        from rlvr.sandbox.detect import choose, describe_caps

        backend = choose("auto")
        return f"backend here: {backend.describe()}; machine: {describe_caps(backend.caps)}"
    except Exception as e:  # the message must still come out
        return f"the backend could not be detected: {e!r}"


def strict_sandbox_failure(reason: str) -> str | None:
    """The failure message for a skip the switch forbids; None where the skip may stay a skip."""
    if not strict_sandbox_required() or not any(p in reason for p in STRICT_SKIP_REASONS):
        return None
    return (f"{REQUIRE_STRICT_ENV}=1 expects a strict sandbox, but this test would skip: {reason}. "
            f"{_sandbox_here()}. Needed: Linux with seccomp and landlock, run as root (forkserver) "
            f"or with unprivileged user namespaces (forkserver-userns), and bubblewrap as root "
            f"(`make setup` installs it); `rlvr sandbox info` shows what this machine allows. "
            f"Unset {REQUIRE_STRICT_ENV} to let these tests skip.")


# --- RLVR_FAIL_ON_SKIP: in CI, a skip is a failure unless it is on the written allow-list ---
#
# A test that skips because an optional dependency (ray, openai, fastapi, reasoning_gym, ...) is
# missing proves nothing, and a green run hides it. With RLVR_FAIL_ON_SKIP=1 (`.ci/run` sets it)
# every skip whose reason contains none of ALLOWED_SKIPS fails, naming the reason. Add an entry
# only with the reason a reviewer would accept.

FAIL_ON_SKIP_ENV = "RLVR_FAIL_ON_SKIP"
ALLOWED_SKIPS = {  # a fragment of the skip reason -> why CI may skip it
    "this machine has a GPU": "checks of what a CPU-only machine does; they run wherever CI has no GPU",
    "no forkserver-userns backend here": "the unprivileged (user-namespace) backend: CI runs as root, where the "
                                         "root forkserver backend runs the same tests",
}


def unexpected_skip_failure(reason: str) -> str | None:
    """The failure message for a skip that is not on ALLOWED_SKIPS (None: the skip may stay)."""
    if not _env_on(FAIL_ON_SKIP_ENV) or any(fragment in reason for fragment in ALLOWED_SKIPS):
        return None
    return (f"{FAIL_ON_SKIP_ENV}=1: this test would skip ({reason}), and that skip is not on "
            "tests/conftest.py's ALLOWED_SKIPS: install what it needs (`make setup` installs every "
            "dependency the suite uses), or list the reason there with why CI may skip it.")


def skip_failure(reason: str) -> str | None:
    return strict_sandbox_failure(reason) or unexpected_skip_failure(reason)


def _skip_reason(longrepr) -> str:
    reason = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


class StrictSandboxMissing(pytest.Item):
    """Stands in for a test module that skipped at import for want of a strict sandbox (or of
    anything else, under RLVR_FAIL_ON_SKIP)."""

    def __init__(self, *, message: str, **kwargs):
        super().__init__(**kwargs)
        self.message = message

    def runtest(self):
        pytest.fail(self.message, pytrace=False)

    def reportinfo(self):
        return self.path, 0, self.name


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and not hasattr(report, "wasxfail"):
        message = skip_failure(_skip_reason(report.longrepr))
        if message:
            report.outcome, report.longrepr = "failed", message
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if report.skipped:
        reason = _skip_reason(report.longrepr)
        message = skip_failure(reason)
        if message:  # one failing test for the whole module, and the run goes on
            report.outcome, report.longrepr = "passed", None
            name = "strict_sandbox_required" if strict_sandbox_failure(reason) else "skip_not_allowed"
            report.result = [StrictSandboxMissing.from_parent(collector, name=name, message=message)]
    return report


def pytest_report_header(config):
    required = "required" if strict_sandbox_required() else f"optional (set {REQUIRE_STRICT_ENV}=1 to require)"
    return f"rlvr sandbox: {_sandbox_here()}; strict sandbox {required}"
