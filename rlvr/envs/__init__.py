"""Environments: the episode protocol (``base``), tool calling (``tools``), token-faithful chat
rendering (``tokens``) and the built-in environments, registered in ``ENVS``."""

from rlvr.envs import code_repair, data_analysis, repo_fix, tool_use  # noqa: F401  (registration)
from rlvr.envs.base import ENVS, EnvConfig, Environment, SingleTurnEnv, Step, ToolEnv, make_env

__all__ = ["ENVS", "EnvConfig", "Environment", "SingleTurnEnv", "Step", "ToolEnv", "make_env"]
