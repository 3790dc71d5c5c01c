"""Verifiers. Importing this package registers the built-in ones (``math``, ``code``,
``python``: the user's reward functions).

``code`` imports the sandbox only when it first runs code, so importing this package stays cheap.
"""

from rlvr.verifiers import code, math, python_reward  # noqa: F401  (registration side effect)
from rlvr.verifiers.base import VERIFIERS, Verifier, check_all, get_verifier

__all__ = ["VERIFIERS", "Verifier", "check_all", "get_verifier"]
