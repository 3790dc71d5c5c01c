"""Algorithm math as pure, registered functions: tensors in, tensors (and float metrics) out.

- ``advantages``: ``ADVANTAGES`` (grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline) and
  ``group_has_variance``.
- ``losses``: ``POLICY_LOSSES`` (ppo_clip, gspo, cispo), ``AGGREGATIONS`` (token_mean,
  seq_mean_token_mean, seq_mean_token_sum_norm), ``token_logprobs``, ``sft_loss``.
- ``kl``: ``KL_ESTIMATORS`` (k1, k2, k3), ``kl_reward_penalty`` (KL in the reward).
- ``gae``: PPO with a learned critic: ``gae``, ``outcome_token_rewards``, ``value_loss``,
  ``whiten``, ``explained_variance`` (the critic itself is ``rlvr.train.critic``).
- ``distill``: on-policy distillation's per-token reverse-KL advantages.
- ``penalties``: ``overlong_penalty`` (DAPO), ``truncated_is_weights`` (async off-policy).
- ``passk``: unbiased pass@k and confidence intervals.
- ``preference``: ``PREFERENCE_LOSSES`` (sigmoid/cDPO, robust, ipo, simpo), ``sequence_logps``,
  ``preference_metrics``.

No I/O, no model calls, no config objects: the trainer reads its config and passes plain values.
Importing this package populates the registries.
"""

from rlvr.algos import advantages, distill, gae, kl, losses, passk, penalties, preference
from rlvr.algos.advantages import ADVANTAGES, group_has_variance
from rlvr.algos.kl import KL_ESTIMATORS
from rlvr.algos.losses import AGGREGATIONS, POLICY_LOSSES, sft_loss, token_logprobs
from rlvr.algos.passk import confidence_interval, mean_pass_at_k, pass_at_k, wilson_interval
from rlvr.algos.penalties import overlong_penalty, truncated_is_weights
from rlvr.algos.preference import PREFERENCE_LOSSES

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "advantages",
    "confidence_interval",
    "distill",
    "gae",
    "group_has_variance",
    "kl",
    "losses",
    "mean_pass_at_k",
    "overlong_penalty",
    "pass_at_k",
    "passk",
    "penalties",
    "preference",
    "sft_loss",
    "token_logprobs",
    "truncated_is_weights",
    "wilson_interval",
]
