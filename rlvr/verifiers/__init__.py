"""Verifiers. Importing this package registers the built-in ones: ``math``, ``code``,
``number``, ``exact``, ``regex``, ``choice``, ``json``, ``svg``, ``cad`` (docs/verifiers.md), ``python`` (the
user's reward functions) and ``reasoning_gym`` (with the optional extra; docs/reasoning-gym.md).

``code`` imports the sandbox only when it first runs code, so importing this package stays cheap.
"""

from rlvr.verifiers import cad, choice, code, json_schema, math, number, python_reward, reasoning_gym, refusal, svg, text  # noqa: F401  (registration)
from rlvr.verifiers.base import VERIFIERS, Verifier, check_all, get_verifier

__all__ = ["VERIFIERS", "Verifier", "check_all", "get_verifier"]
