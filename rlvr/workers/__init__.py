"""Scale-out workers: rollout, verification and training as Ray actors (``backend: ray``).

The trainer's loop does not change: ``rlvr.workers.ray_rollout.RayRollout`` is a ``RolloutSource``
(``rlvr.rollout.source``) whose generate and verify phases run on actors, and
``rlvr.train.ray_train`` runs the trainer itself as an actor that is restarted from its last
checkpoint when it is lost. The in-process default (``backend: local``) needs none of this and
never imports Ray. docs/distributed.md has the multi-node recipe.

    config.py        RayConfig: address, workers and resources per role, retries
    cluster.py       connect to (or start) the cluster; the extra's import check
    actors.py        RolloutWorker (an engine copy of the policy), VerifierWorker (a sandbox pool)
    group.py         ActorGroup: chunks to actors, a dead actor's chunks rerun on a replacement
    ray_rollout.py   RayWorkers (broadcast, generate, verify) and RayRollout (the sync source)
    verify_service.py  VerificationService: sandbox jobs spread over verifier actors
"""
