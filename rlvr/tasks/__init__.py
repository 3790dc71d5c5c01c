"""Tasks: domain generators and helpers. Importing this package registers the built-in domains."""

from rlvr.tasks import cad_shapes, code_debug, code_gen, code_repair, data_analysis, docs_tables, long_aggregate, long_ctx, long_keychain, long_needle, math_arith, math_word, reasoning_gym, render_svg, repo_fix, safety, tool_use  # noqa: F401  (registration)
from rlvr.tasks.base import DOMAINS, Domain, check_disjoint, generate_tasks, seeded_rng, split_of

__all__ = ["DOMAINS", "Domain", "check_disjoint", "generate_tasks", "seeded_rng", "split_of"]
