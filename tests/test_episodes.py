"""Multi-turn episodes: the environment protocol, tool calls, and token-faithful trajectories."""

from __future__ import annotations

import pytest
import torch

import rlvr.rollout.episodes as episodes_mod
from rlvr.envs.base import ENVS, EnvConfig, SingleTurnEnv, ToolEnv, play
from rlvr.envs.tokens import conversation_ids, observation_ids
from rlvr.envs.tools import Tool, ToolCallError, parse_tool_call
from rlvr.tool_calls import format_call
from rlvr.model.load import load_model_and_tokenizer
from rlvr.model.tokenizer import encode_chat_prompt
from rlvr.model.logprobs import sequence_logprobs
from rlvr.rollout.engine import Completion, SamplingParams
from rlvr.rollout.episodes import EnvPool, collect_episodes, run_tasks
from rlvr.verifiers.judge import judge
from rlvr.types import EpisodeInfo, Spec, Task, Verdict


class EchoEnv(ToolEnv):
    """Test environment: `echo(text)` returns the text; `submit(answer)` passes iff answer == 'ok'."""

    name = "echo.test"

    def tools(self):
        return [Tool("echo", "Echo the text.", lambda text: f"echo: {text}", {"text": ("string", "text")}),
                Tool("submit", "Submit an answer.", self._submit, {"answer": ("string", "answer")})]

    def _submit(self, answer: str) -> str:
        self.answer = answer
        self.finish_with("submit")
        return "submitted"

    def _verify(self) -> Verdict:
        return Verdict(self.answer == "ok", float(self.answer == "ok"), "ok" if self.answer == "ok" else "mismatch")


@pytest.fixture(scope="module", autouse=True)
def echo_env():
    """``echo.test`` is registered while this module's tests run, and removed after them."""
    with ENVS.temporary("echo.test", EchoEnv):
        yield


def echo_task(i: int = 0) -> Task:
    return Task(id=f"echo/v1/train/1/{i:06d}", domain="echo.test", level=1,
                prompt=({"role": "user", "content": f"Say ok ({i})."},), spec=Spec("echo", {}),
                env="echo.test", key=str(i))


@pytest.fixture(scope="module")
def model_tok(tiny_model_dir):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    model.config.max_position_embeddings = 512
    # A random model rarely ends a turn; a bias towards EOS gives episodes of several short turns.
    bias = torch.zeros(model.lm_head.out_features)
    bias[tok.eos_token_id] = 4.0
    model.lm_head.bias = torch.nn.Parameter(bias)
    return model.eval(), tok


# ------------------------------------------------------------------ tool-call parsing


def test_parse_tool_call_accepts_the_format_and_rejects_malformed_calls():
    call = parse_tool_call('I will look. <tool_call>{"name": "echo", "arguments": {"text": "a"}}</tool_call>')
    assert call.name == "echo" and call.arguments == {"text": "a"}
    assert parse_tool_call("no call here") is None
    for bad in ['<tool_call>{"name": "echo"', '<tool_call>{bad json}</tool_call>',
                '<tool_call>["echo"]</tool_call>', '<tool_call>{"name": "e", "arguments": 3}</tool_call>',
                '<tool_call>{"name": "e", "x": 1}</tool_call>',
                format_call("echo", {"text": "a"}) + format_call("echo", {"text": "b"})]:
        with pytest.raises(ToolCallError):
            parse_tool_call(bad)


def test_malformed_unknown_and_badly_typed_calls_are_error_observations_and_the_episode_goes_on():
    env = EchoEnv(EnvConfig(max_turns=10))
    env.reset(echo_task())
    for action in ["<tool_call>{oops</tool_call>", format_call("nope", {}), format_call("echo", {}),
                   format_call("echo", {"text": 3}), format_call("echo", {"text": "a", "b": 1}), "just text"]:
        step = env.step(action)
        assert not step.done and step.observation[0]["role"] == "tool"
        assert step.observation[0]["content"].startswith("error"), (action, step)
    step = env.step(format_call("echo", {"text": "hi"}))
    assert step.observation[0]["content"] == "echo: hi"
    assert env.step(format_call("submit", {"answer": "ok"})).done
    assert env.verify().passed and env.verify().details["turns"] == 8


def test_budget_of_turns_ends_and_fails_the_episode():
    env = EchoEnv(EnvConfig(max_turns=3))
    messages, verdict = play(env, echo_task(), [format_call("echo", {"text": "x"})] * 10)
    assert env.finish == "turns" and env.turns == 3
    assert not verdict.passed and verdict.reason == "budget" and verdict.score == 0.0
    # the right answer after the budget is spent changes nothing
    with pytest.raises(RuntimeError):
        env.step(format_call("submit", {"answer": "ok"}))


def test_single_turn_env_is_the_one_step_case_and_agrees_with_the_verifier():
    import rlvr.tasks  # noqa: F401
    from rlvr.tasks.base import generate_tasks
    from rlvr.verifiers import check_all

    task = generate_tasks("math.arith", "train", 1, seed=0)[0]
    for completion in (task.reference, "Answer: \\boxed{-12345}"):
        env = SingleTurnEnv()
        assert env.reset(task) == list(task.prompt)
        step = env.step(completion)
        assert step.done and step.finish == "answer"
        assert env.verify().passed == check_all([(task, completion)])[0].passed


# ------------------------------------------------------------------ token fidelity


def test_template_renders_tools_and_tool_messages(model_tok):
    _, tok = model_tok
    env = EchoEnv()
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=[t.schema() for t in env.tools()],
                                   add_generation_prompt=True, tokenize=False)
    assert "- echo(text): Echo the text." in text and "- submit(answer)" in text and "<tool_call>" in text
    obs = observation_ids(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}],
                          [{"role": "tool", "name": "echo", "content": "echo: x"}])
    assert tok.decode(obs) == "\n<|tool|>\necho: x<|end|>\n<|assistant|>\n"


def test_sampled_episodes_are_token_faithful(model_tok, monkeypatch):
    """Every turn's prompt is exactly the trajectory prefix; segments concatenate to the ids;
    policy logprobs equal a fresh forward pass over the whole trajectory (env tokens included)."""
    model, tok = model_tok
    seen: list[list[int]] = []
    real = episodes_mod.generate

    def recording(model, prompts, params, **kw):
        seen.extend(list(p) for p in prompts)
        return real(model, prompts, params, **kw)

    monkeypatch.setattr(episodes_mod, "generate", recording)
    cfg = EnvConfig(max_turns=4, turn_tokens=12, max_tokens=40, max_context=400)
    pool = EnvPool(cfg)
    eps = collect_episodes(model, tok, [echo_task(0), echo_task(1)], SamplingParams(n=3, temperature=1.0), pool,
                           generator=torch.Generator().manual_seed(0))
    assert len(eps) == 6 and [e.trajectory.group_id for e in eps] == [0, 0, 0, 1, 1, 1]
    assert len(seen) > 2  # the first round prefilled 2 distinct prompts; later rounds one per episode
    for ep in eps:
        t = ep.trajectory
        concat = [i for _, ids in t.segments for i in ids]
        assert tuple(concat) == t.token_ids
        assert t.loss_mask == tuple(int(src == "policy") for src, ids in t.segments for _ in ids)
        assert t.segments[0][0] == "prompt" and t.segments[0][1] == tuple(
            encode_chat_prompt(tok, list(echo_task(t.group_id).prompt), [x.schema() for x in ep.env.tools()]))
        policy = sum(len(ids) for src, ids in t.segments if src == "policy")
        assert policy == t.num_policy_tokens <= cfg.max_tokens and len(t.token_ids) <= cfg.max_context
        # every prompt the policy was given in this episode is a prefix of its trajectory
        starts = [sum(len(ids) for _, ids in t.segments[:k]) for k, (src, _) in enumerate(t.segments) if src == "policy"]
        for s in starts:
            assert list(t.token_ids[:s]) in seen
        with torch.no_grad():
            fresh = sequence_logprobs(model, torch.tensor([t.token_ids]), torch.ones(1, len(t.token_ids), dtype=torch.long))[0]
        mask = torch.tensor(t.loss_mask, dtype=torch.bool)
        assert torch.allclose(fresh[mask], torch.tensor(t.logprobs)[mask], atol=1e-4)
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask) if not m)
        assert t.episode.finish in ("length", "tokens", "context", "turns", "submit")
    pool.close()


def scripted_generate(script: list[str], tok):
    """A fake engine: every episode plays ``script`` turn by turn (its tokens + EOS)."""
    def fake(model, prompts, params, **kw):
        out = []
        for i, p in enumerate(prompts):
            turn = sum(1 for x in p if x == tok.convert_tokens_to_ids("<|assistant|>")) - 1
            ids = tok(script[min(turn, len(script) - 1)], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            out += [Completion(i, ids, [-0.5] * len(ids), "stop")] * params.n
        return out
    return fake


def test_every_turn_samples_with_the_episodes_settings(model_tok, monkeypatch):
    """Temperature, top-p, stop tokens and precision reach every turn's generate call (a bf16
    rollout stays bf16 after the first turn); only the budget and group size are per turn."""
    model, tok = model_tok
    seen: list[SamplingParams] = []
    fake = scripted_generate([format_call("echo", {"text": "a"}), format_call("submit", {"answer": "ok"})], tok)

    def recording(model, prompts, params, **kw):
        seen.append(params)
        return fake(model, prompts, params, **kw)

    monkeypatch.setattr(episodes_mod, "generate", recording)
    params = SamplingParams(n=2, temperature=0.7, top_p=0.9, stop_token_ids=[tok.eos_token_id], precision="bf16")
    pool = EnvPool(EnvConfig(max_turns=4, turn_tokens=200, max_tokens=1000, max_context=2048))
    eps = collect_episodes(model, tok, [echo_task(0)], params, pool, generator=torch.Generator().manual_seed(0))
    pool.close()
    assert [e.trajectory.episode.finish for e in eps] == ["submit", "submit"]
    assert len(seen) >= 2  # the first turn and the one after the tool result
    for p in seen:
        assert (p.temperature, p.top_p, p.stop_token_ids, p.precision) == (0.7, 0.9, (tok.eos_token_id,), "bf16")
        assert p.max_new_tokens <= 200


def test_scripted_episode_trajectory_equals_the_rendered_conversation(model_tok, monkeypatch):
    model, tok = model_tok
    script = [format_call("echo", {"text": "hi"}), "<tool_call>{broken", format_call("submit", {"answer": "ok"})]
    monkeypatch.setattr(episodes_mod, "generate", scripted_generate(script, tok))
    pool = EnvPool(EnvConfig(max_turns=5, max_context=2048, max_tokens=1000, turn_tokens=200))
    (ep,) = run_tasks(model, tok, [echo_task()], SamplingParams(n=1), pool)
    t = ep.trajectory
    assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert t.messages[2]["content"] == "echo: hi" and t.messages[4]["content"].startswith("error")
    assert t.finish_reason == "stop" and t.episode == EpisodeInfo(env="echo.test", finish="submit", turns=3,
                                                                    max_tokens=1000)
    # the same conversation rendered for SFT gives exactly the rollout's ids and mask
    ids, mask = conversation_ids(tok, list(t.messages), [x.schema() for x in ep.env.tools()])
    assert tuple(ids) == t.token_ids and tuple(mask) == t.loss_mask
    assert judge([echo_task()], [ep])[0].passed


def test_a_turn_that_runs_out_of_tokens_cuts_the_episode(model_tok, monkeypatch):
    model, tok = model_tok
    monkeypatch.setattr(episodes_mod, "generate", scripted_generate([format_call("echo", {"text": "x" * 80})], tok))
    pool = EnvPool(EnvConfig(max_turns=5, turn_tokens=10, max_context=2048))
    (ep,) = collect_episodes(model, tok, [echo_task()], SamplingParams(n=1), pool)
    assert ep.trajectory.finish_reason == "length" and ep.trajectory.episode.finish == "length"
    assert ep.trajectory.num_policy_tokens == 10
    verdict = judge([echo_task()], [ep])[0]
    assert verdict.reason == "budget" and not verdict.passed


def test_episodes_reuse_each_turns_cache_and_match_running_the_whole_conversation(tiny_model_dir, monkeypatch):
    """On the fast decoder a turn starts from the K/V of the episode's earlier turns (only the new
    tokens run), and the episodes equal the ones that run the whole conversation every turn:
    same tokens, logprobs equal to a fresh forward pass over the trajectory."""
    from rlvr.rollout.kv_cache import DecodeState

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    model.config.max_position_embeddings = 512
    ran: list[tuple[int, int]] = []  # (columns computed, prompt width) per prefill
    real = DecodeState.prefill

    def counting(self, prompts, expand, pad_token_id, past=None, **kwargs):
        W = max(len(p) for p in prompts)
        cached = [min(c.length, len(p) - 1) if c is not None else 0 for c, p in zip(past or [None] * len(prompts), prompts)]
        ran.append((max(len(p) - m for p, m in zip(prompts, cached)), W))
        return real(self, prompts, expand, pad_token_id, past, **kwargs)

    monkeypatch.setattr(DecodeState, "prefill", counting)
    cfg = EnvConfig(max_turns=4, turn_tokens=24, max_tokens=80, max_context=400)
    # A random model rarely emits EOS: a band of stop tokens ends its turns after a few tokens.
    params = SamplingParams(n=3, temperature=1.0, stop_token_ids=tuple(range(40, 100)))
    runs = []
    for reuse in (True, False):
        ran.clear()
        pool = EnvPool(cfg)
        eps = collect_episodes(model, tok, [echo_task(0), echo_task(1)], params, pool,
                               generator=torch.Generator().manual_seed(0), reuse_cache=reuse)
        runs.append(([e.trajectory for e in eps], list(ran)))
        pool.close()
    (with_cache, ran_reuse), (without, ran_full) = runs
    assert max(e.episode.turns for e in with_cache) >= 3
    assert all(c == w for c, w in ran_full)  # no reuse: every prefill runs the whole width
    assert all(c < w for c, w in ran_reuse[1:]) and sum(c for c, _ in ran_reuse) < sum(c for c, _ in ran_full) / 2
    for a, b in zip(with_cache, without):
        assert a.token_ids == b.token_ids and a.segments == b.segments
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
        with torch.no_grad():
            fresh = sequence_logprobs(model, torch.tensor([a.token_ids]), torch.ones(1, len(a.token_ids), dtype=torch.long))[0]
        mask = torch.tensor(a.loss_mask, dtype=torch.bool)
        assert torch.allclose(fresh[mask], torch.tensor(a.logprobs)[mask], atol=1e-4)
