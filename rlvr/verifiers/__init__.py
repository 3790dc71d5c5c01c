"""Verifiers. Importing this package registers the built-in ones (``math``)."""

from rlvr.verifiers import math  # noqa: F401  (registration side effect)
from rlvr.verifiers.base import VERIFIERS, Verifier, get_verifier

__all__ = ["VERIFIERS", "Verifier", "get_verifier"]
