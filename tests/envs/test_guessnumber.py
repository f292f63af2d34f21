"""Guess the number, the example device env of docs/extending.md: its rules worked by hand, its
text and reply parsing, and a short RL run through its config."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import guessnumber
from configs.common import apply
from tree_rl import envs
from tree_rl.envs.guessnumber import dynamics as dyn
from tree_rl.envs.guessnumber.heuristic import narrowed
from tree_rl.metrics import read_jsonl
from tree_rl.train import train_and_evaluate


@pytest.fixture(scope="module")
def env(builtin_tok):
  return envs.make("guessnumber", tokenizer=builtin_tok, max_turns=5)


def test_an_episode_by_hand(env):
  root = dyn.init_state(6, 9)
  state, rewards, seen, scores = root, [], [], []
  # 3: higher (4..9 left); 8: lower (4..7); no digit: nothing learned; 6: correct; then it stays
  for guess in (3, 8, dyn.INVALID, 6, 2):
    state, answer, reward, done, _ = env.step(None, state, jnp.int32(guess))
    rewards.append(float(reward))
    seen.append((int(answer), int(state.low), int(state.high), bool(done)))
    scores.append(float(narrowed(env, None, state, root)))
  assert rewards == [0.0, 0.0, 0.0, 1.0, 0.0]
  assert seen == [(dyn.HIGHER, 4, 9, False), (dyn.LOWER, 4, 7, False), (dyn.NO_DIGIT, 4, 7, False),
                  (dyn.CORRECT, 4, 7, True), (dyn.CORRECT, 4, 7, True)]
  # the heuristic: 1 - (numbers left - 1) / 9, and 1 once guessed
  np.testing.assert_allclose(scores, [1 - 5 / 9, 1 - 3 / 9, 1 - 3 / 9, 1.0, 1.0], rtol=1e-6)
  assert int(state.turns) == 4


def test_the_turn_limit_ends_an_episode_without_reward(env):
  state = dyn.init_state(0, 9)
  for _ in range(5):
    state, _, reward, done, _ = env.step(None, state, jnp.int32(9))
    assert float(reward) == 0.0
  assert bool(done) and not bool(state.won) and int(state.high) == 8


def test_text_and_reply_parsing(env, builtin_tok):
  state = dyn.init_state(6, 9)
  tokens, n = env.initial_prompt_tokens(state)
  assert builtin_tok.decode(list(np.asarray(tokens[:n]))) == (
      "<|im_start|>user\nGuess my number from 0 to 9. Reply with one digit.<|im_end|>\n"
      "<|im_start|>assistant\n")
  obs, m = env.observation_tokens(state.replace(answer=jnp.int32(dyn.LOWER)), jnp.bool_(True))
  assert builtin_tok.decode(list(np.asarray(obs[:m]))) == (
      "\n<|im_start|>user\nLower.<|im_end|>\n<|im_start|>assistant\n")
  for reply, guess in (("4", 4), ("5 or 7", 7), ("none", dyn.INVALID), ("", dyn.INVALID)):
    ids = builtin_tok.encode(reply)
    padded = jnp.asarray(ids + [builtin_tok.pad_id] * (8 - len(ids)), jnp.int32)
    assert int(env.parse_action(padded, jnp.int32(len(ids)))) == guess, reply


def test_episodes_are_drawn_over_every_secret(env):
  states = jax.vmap(lambda k: env.reset(k)[0])(jax.random.split(jax.random.key(0), 200))
  assert set(np.asarray(states.secret).tolist()) == set(range(10))


def test_a_short_rl_run_through_the_config(tmp_path):
  """PATR (scored by the env's heuristic) for 2 steps of the smoke config."""
  config = guessnumber.get_config("algo=patr,smoke")
  apply(config, {"env.data_dir": str(tmp_path / "tfds")})
  summary = train_and_evaluate(config, str(tmp_path / "run"))
  assert summary["step"] == 2 and not summary["stopped_early"]
  steps = [r for r in read_jsonl(os.path.join(str(tmp_path / "run"), "metrics.jsonl"))
           if "learner/loss" in r]
  assert [r["step"] for r in steps] == [1, 2]
  for r in steps:
    assert r["rollout/trajectories"] > 0 and np.isfinite(r["learner/loss"])
    assert 0.0 <= r["rollout/success_rate"] <= 1.0
  assert 0.0 <= summary["eval_after"]["eval/greedy_success"] <= 1.0
