"""Chunked LM-head log-probs: the same values and gradients as all logits at once."""

from __future__ import annotations

import pytest
import torch

from rlvr.train.chunked_head import chunked_token_logprobs, token_logprobs


@pytest.mark.parametrize("chunk", [0, 1, 7, 16, 64])
def test_chunked_logprobs_equal_the_one_shot_values_and_gradients(chunk):
    torch.manual_seed(0)
    head = torch.nn.Linear(12, 50, bias=False)
    hidden = torch.randn(37, 12, requires_grad=True)
    targets = torch.randint(0, 50, (37,))
    weights = torch.randn(37)

    ref = token_logprobs(head, hidden, targets)
    (ref * weights).sum().backward()
    ref_grads = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None

    got = chunked_token_logprobs(head, hidden, targets, chunk)
    (got * weights).sum().backward()
    assert torch.allclose(got, ref, atol=1e-6)
    assert torch.allclose(hidden.grad, ref_grads[0], atol=1e-6)
    assert torch.allclose(head.weight.grad, ref_grads[1], atol=1e-6)


def test_a_plain_loop_reference():
    torch.manual_seed(1)
    head = torch.nn.Linear(4, 9)
    hidden, targets = torch.randn(5, 4), torch.randint(0, 9, (5,))
    got = chunked_token_logprobs(head, hidden, targets, 2)
    for i in range(5):
        logits = head(hidden[i]).double()
        expected = logits[targets[i]] - torch.log(torch.exp(logits).sum())
        assert got[i].item() == pytest.approx(expected.item(), abs=1e-6)
