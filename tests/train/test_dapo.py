"""DAPO in the RL loop: its preset, clip-higher, dynamic sampling with a scripted reward, and
exact resume of a run whose steps draw a varying number of prompts."""

import os

import jax
import jax.numpy as jnp
import numpy as np

from configs import frozenlake, toolcall
from tree_rl import train
from tree_rl.learner import from_rollout, losses
from tree_rl.metrics import read_jsonl

from loop_helpers import checkpoint_params, max_abs_diff, smoke


def _script_rewards(monkeypatch, rule):
  """Every rollout of the loop gets outcome rewards rule(out) [P, L] (the rest is real)."""
  real = train.run

  def scripted(*args, **kwargs):
    out, cache = real(*args, **kwargs)
    return out.replace(reward=jnp.where(out.valid, rule(out), 0.0).astype(jnp.float32)), cache

  monkeypatch.setattr(train, "run", scripted)


def test_the_preset_sets_every_part():
  for module in (frozenlake, toolcall):
    for model in ("tiny", "hf"):   # the papers' setting for hf must not undo DAPO's clipping / KL
      c = module.get_config(f"algo=dapo,model={model}")
      assert (c.rollout.method, c.learner.advantage, c.learner.aggregation) == (
          "chain", "grpo", "token_mean")
      assert (c.learner.clip_low, c.learner.clip_high, c.learner.kl_coef) == (0.2, 0.28, 0.0)
      assert c.rollout.dynamic_sampling and c.learner.overlong_window == 0.2
      assert (c.rollout.draw_factor, c.rollout.max_draws) == (3, 10)
      assert c.learner.overlong_truncated == "penalize" and c.learner.overlong_penalty == 0.5
      # the recipe's 512 prompts in mini-batches of 32; 2 on the CPU presets
      assert c.train.minibatches == (16 if model == "hf" else 2) and c.train.ppo_epochs == 1


def test_clip_higher_is_asymmetric():
  # rho = 1.25 is inside DAPO's [0.8, 1.28] (a symmetric 0.2 would clip it); rho = 0.78 is
  # below 0.8. A > 0: the pessimistic min keeps 1.25 and 0.78 live. A < 0: max(rho, clip) keeps
  # 1.25 live and clips 0.78 (zero gradient).
  old = jnp.log(jnp.array([[0.5, 0.4, 0.5 / 0.78]]))
  logp = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))          # rho = 1, 1.25, 0.78
  mask = jnp.array([[False, True, True]])

  def grad(adv, clip_high):
    return np.asarray(jax.grad(lambda lp: losses.policy_loss(
        lp, old, jnp.array([adv]), mask, aggregation="token_sum", clip_low=0.2,
        clip_high=clip_high)[0])(logp))[0]

  np.testing.assert_allclose(grad(1.0, 0.28), [0.0, -1.25, -0.78], rtol=1e-5)
  np.testing.assert_allclose(grad(-1.0, 0.28), [0.0, 1.25, 0.0], rtol=1e-5)
  np.testing.assert_allclose(grad(1.0, 0.2), [0.0, 0.0, -0.78], rtol=1e-5)   # symmetric: clipped


def test_dynamic_sampling_drops_all_equal_groups_and_fills_the_batch(data_dir, monkeypatch,
                                                                    capsys):
  # Scripted: a group (stream position) is informative iff its position is odd (its first leaf
  # wins, the others lose); even positions lose everywhere. Draws of P = 2 prompts here.
  def rule(out):
    odd = (out.tree.prompt_id % 2 == 1)[:, None]
    first = jnp.arange(out.leaf.shape[1])[None] == 0
    return (odd & first).astype(jnp.float32)

  _script_rewards(monkeypatch, rule)
  c = smoke(frozenlake, "dapo", data_dir, **{"rollout.max_draws": 3, "rollout.draw_factor": 1})
  parts = train.build_parts(c)
  cache = train.new_cache(parts, parts.train_step.init().params)
  # P = 2: draw 0 (positions 0, 1) keeps 1; draw 1 (2, 3) keeps 3 and the batch is full.
  trees, drawn, cache, m = train._rollouts(parts, cache, step=0, position=0)
  assert sorted({t.group_id for t in trees}) == [1, 3] and drawn == 4
  assert (m["rollout/draws"], m["rollout/groups_kept"], m["rollout/groups_dropped"]) == (2, 2, 2)
  # From position 4 the same rule keeps positions 5 and 7.
  trees, drawn, cache, m = train._rollouts(parts, cache, step=1, position=4)
  assert sorted({t.group_id for t in trees}) == [5, 7]
  assert m["rollout/groups_short"] == 0 and "dynamic sampling kept" not in capsys.readouterr().out
  # The cap: one draw keeps what it has (one group), says so in one line and logs the shortfall.
  c2 = smoke(frozenlake, "dapo", data_dir, **{"rollout.max_draws": 1, "rollout.draw_factor": 1})
  parts2 = train.build_parts(c2)
  trees, drawn, cache, m = train._rollouts(parts2, cache, step=0, position=0)
  assert sorted({t.group_id for t in trees}) == [1] and drawn == 2
  assert (m["rollout/draws"], m["rollout/groups_kept"], m["rollout/groups_dropped"]) == (1, 1, 1)
  assert m["rollout/groups_short"] == 1
  lines = [l for l in capsys.readouterr().out.splitlines() if "dynamic sampling kept" in l]
  assert lines == ["step 1: dynamic sampling kept 1 of 2 groups after 1 draws of 2 prompts "
                   "(rollout.max_draws); training on 1"]
  # The preset's draws are 3x the prompts (DAPO's generation batch): positions 0-5 in one draw
  # hold 1, 3 and 5; the batch is cut to exactly P = 2 groups.
  c3 = smoke(frozenlake, "dapo", data_dir)
  parts3 = train.build_parts(c3)
  trees, drawn, cache, m = train._rollouts(parts3, cache, step=0, position=0)
  assert sorted({t.group_id for t in trees}) == [1, 3] and drawn == 6
  assert (m["rollout/draws"], m["rollout/groups_kept"], m["rollout/groups_dropped"]) == (1, 2, 4)


def test_a_resumed_dapo_run_equals_the_uninterrupted_one(tmp_path, data_dir, monkeypatch):
  """Smoke runs of the preset with a reward scripted from the sampled tokens (the smoke policy
  wins nothing): 3 steps straight, and 1 step then a resume to 3. Dynamic sampling makes the
  prompts per step vary, so the resumed run must restore the stream position."""
  # a reward from each leaf's first token; the first draw's six stream positions (3 x P) lose
  # everywhere, so step 1 draws at least twice and the resumed run starts from a position past
  # one draw
  _script_rewards(monkeypatch, lambda out: ((out.tree.tokens[
      jnp.arange(out.leaf.shape[0])[:, None], jnp.maximum(out.leaf, 0), 0] % 2)
      * (out.tree.prompt_id[:, None] >= 6)).astype(jnp.float32))
  straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
  train.train_and_evaluate(smoke(frozenlake, "dapo", data_dir, **{"train.num_steps": 3}), straight)
  train.train_and_evaluate(smoke(frozenlake, "dapo", data_dir, **{"train.num_steps": 1}), split)
  summary = train.train_and_evaluate(smoke(frozenlake, "dapo", data_dir, **{"train.num_steps": 3}),
                                     split)
  assert summary["step"] == 3
  rows = {w: {r["step"]: r for r in read_jsonl(os.path.join(w, "metrics.jsonl"))
              if "rollout/draws" in r} for w in (straight, split)}
  assert sorted(rows[straight]) == sorted(rows[split]) == [1, 2, 3]
  for s in (1, 2, 3):
    for k in ("rollout/draws", "rollout/groups_kept", "learner/updates"):
      assert rows[straight][s][k] == rows[split][s][k], (s, k)
  assert rows[straight][1]["rollout/draws"] > 1
  assert rows[straight][2]["learner/updates"] + rows[straight][3]["learner/updates"] > 0
  a, b = checkpoint_params(straight, 3), checkpoint_params(split, 3)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert max_abs_diff(a, checkpoint_params(straight, 1)) > 0   # the resumed steps trained


def test_clipping_binds_after_the_first_minibatch(data_dir, monkeypatch):
  """Under the DAPO preset a step is several updates: the first sees the sampler's own policy
  (ratio 1 to float error, nothing clipped); the second sees weights one update away, so the
  ratio leaves 1 and clip-higher binds on some tokens."""
  _script_rewards(monkeypatch, lambda out: (jnp.arange(out.leaf.shape[1])[None] == 0
                                            ).astype(jnp.float32) * jnp.ones_like(out.reward))
  # a large step so one update moves the tiny policy past the clip range on some tokens
  c = smoke(frozenlake, "dapo", data_dir, **{"learner.learning_rate": 0.05})
  assert c.train.minibatches == 2
  parts = train.build_parts(c)
  state = parts.train_step.init()
  cache = train.new_cache(parts, state.params)
  trees, _, cache, _ = train._rollouts(parts, cache, step=0, position=0)
  batches = from_rollout.make_batches(c.learner, trees, minibatches=int(c.train.minibatches),
                                      row_multiple=parts.train_step.row_multiple)
  assert len(batches) == 2   # one prompt's group each
  state, first = parts.train_step(state, batches[0])
  state, second = parts.train_step(state, batches[1])
  first, second = jax.device_get(first), jax.device_get(second)
  assert abs(float(first["ratio_max"]) - 1.0) < 1e-4 and float(first["clip_frac"]) == 0.0
  assert float(second["ratio_dev"]) > 1e-3
  assert float(second["clip_frac"]) > 0.0
