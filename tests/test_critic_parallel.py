"""The learned critic data parallel (torchrun, gloo on CPU): one ``Critic.update`` on 2 processes
steps the weights one process steps, and both ranks report the same metrics.

Run as a script under torchrun (``_rank_main``) it is one rank of the 2-process update."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

from rlvr.train.critic import Critic, CriticConfig

ROOT = Path(__file__).resolve().parents[1]


def _updated(model_dir: str, **kw) -> tuple[Critic, dict[str, float], int]:
    """A critic with a random head after one update (2 epochs, mini-batches of 4 rows, micro-batches
    of 2) on 5 rows: mini-batches of 2 and 1 micro-batches, so rank 1 has none in the second; its
    metrics and the number of micro-batches this process ran."""
    torch.set_num_threads(1)
    critic = Critic.build(CriticConfig(lr=3e-3, epochs=2), model_dir, device="cpu", total_steps=10)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # values that are not zero, so value clipping acts
        critic.model.score.weight.copy_(torch.randn(critic.model.score.weight.shape, generator=g))
    ids = torch.randint(3, critic.model.config.vocab_size, (5, 10), generator=g)
    lengths = [10, 8, 6, 9, 7]
    attn = torch.tensor([[1] * n + [0] * (10 - n) for n in lengths])
    loss_mask = torch.zeros(5, 10)
    for b, n in enumerate(lengths):
        loss_mask[b, 3:n] = 1
    returns = torch.randn(5, 1, generator=g).expand(5, 10) * loss_mask
    old = critic.values(ids, attn, microbatch_size=2, loss_mask=loss_mask)
    forward, calls = critic._forward, []
    critic._forward = lambda *a: calls.append(1) or forward(*a)
    metrics = critic.update(ids, attn, loss_mask, returns, old, torch.Generator().manual_seed(1),
                            minibatch_size=4, microbatch_size=2, **kw)
    return critic, metrics, len(calls)


def _rank_main(model_dir: str, out: str) -> None:
    from rlvr.train.distributed import DistributedConfig, close_group, launched, open_group

    open_group(DistributedConfig(backend="gloo"), torch.device("cpu"))
    critic, metrics, calls = _updated(model_dir, bucket_mb=0.001)  # ~1 KB buckets; the group: the open one
    rank = launched().rank
    metrics["micro_batches"] = calls
    torch.save({k: v.detach().clone() for k, v in critic.model.state_dict().items()}, Path(out) / f"weights_{rank}.pt")
    (Path(out) / f"metrics_{rank}.json").write_text(json.dumps(metrics))
    close_group()


def test_two_processes_update_the_critic_as_one_does(tiny_model_dir, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           __file__, tiny_model_dir, str(tmp_path)], env=env, capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    alone, metrics, calls = _updated(tiny_model_dir)

    m0, m1 = (json.loads((tmp_path / f"metrics_{r}.json").read_text()) for r in (0, 1))
    # each rank ran its share: micro-batch u of a mini-batch on rank u % 2, 2 epochs of (2, 1)
    assert (calls, m0.pop("micro_batches"), m1.pop("micro_batches")) == (6, 4, 2)
    assert m0 == m1  # every rank has every micro-batch's metrics, summed in the same order
    assert m0.keys() == metrics.keys()
    assert all(math.isclose(m0[k], metrics[k], rel_tol=1e-6, abs_tol=1e-9) for k in m0), (m0, metrics)
    assert metrics["critic/value_clip_frac"] > 0
    one = alone.model.state_dict()
    for r in (0, 1):
        w = torch.load(tmp_path / f"weights_{r}.pt")
        assert w.keys() == one.keys()
        assert all(torch.allclose(w[k], one[k], rtol=0, atol=1e-6) for k in w), r
    w0, w1 = torch.load(tmp_path / "weights_0.pt"), torch.load(tmp_path / "weights_1.pt")
    assert all(torch.equal(w0[k], w1[k]) for k in w0)  # every rank stepped the same


if __name__ == "__main__":
    _rank_main(*sys.argv[1:3])
