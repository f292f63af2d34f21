"""The codefix host env: actions, rewards, stages, forks of a real workspace, nothing left behind."""

import os

import jax
import numpy as np
import pytest

from tree_rl.envs.codefix.env import CodeFix, parse
from tree_rl.envs.codefix.expert import CodefixExpert, intended_plan
from tree_rl.envs.codefix.gen import generate
from tree_rl.envs.codefix.heuristic import progress as codefix_progress
from tree_rl.envs.codefix.judge import stage as codefix_stage
from tree_rl.models.tokenizers import BuiltinTokenizer

TOK = BuiltinTokenizer()
TASKS = generate(seed=3, num_train=12, num_test=2)["train"]


@pytest.fixture
def env():
  # a fresh temp root: tests run as nobody, fully fenced
  e = CodeFix(TOK, TASKS, max_turns=6, max_reply_tokens=192)
  root = e.sandbox.root
  yield e
  e.close()
  assert not os.path.exists(root)


def test_building_the_env_touches_no_disk_until_an_episode_starts():
  env = CodeFix(TOK, TASKS)
  assert env._sandbox is None and env.num_tasks == len(TASKS)
  env.close()
  assert env._sandbox is None


def test_parse_takes_the_first_action():
  assert parse("hm <test/> then <submit/>") == ("test", ())
  assert parse('<replace path="a.py">x = 1 ||| x = 2</replace>') == ("replace", ("a.py", "x = 1", "x = 2"))
  assert parse('<replace path="a.py">x = 1</replace>') == ("bad_replace", ())
  assert parse("<read> solution.py </read>") == ("read", ("solution.py",))
  assert parse("nothing here") == ("", ())


def test_the_expert_plan_resolves_every_task_and_walks_the_stages(env):
  ids = np.arange(len(TASKS))
  handles, prompts = env.reset(ids)
  assert all("solution.py" in p for p in prompts)
  plans = [intended_plan(t) for t in TASKS]
  stages, visible = [], []
  for turn in range(5):
    obs, reward, done, info = env.step(handles, [p[turn] for p in plans])
    stages.append(info["stage"])
    visible.append(info["visible_pass"])
    if turn == 0:   # read: the buggy module itself
      assert obs == [t.files[t.path] for t in TASKS]
    assert done.all() == (turn == 4)
  np.testing.assert_array_equal(np.stack(stages), [[1] * 12, [1] * 12, [2] * 12, [3] * 12, [3] * 12])
  np.testing.assert_array_equal(reward, np.ones(12))   # every hidden test passes after the fix
  np.testing.assert_array_equal(info["hidden_pass"], np.ones(12))
  assert (visible[2] == 1.0).all()                     # measured on the edited workspace
  assert (visible[1] < 1.0).mean() > 0.5               # the visible tests catch most bugs
  env.release(handles)
  assert env.sandbox.live() == [] and env.episodes == {}


def test_a_wrong_or_missing_fix_is_not_resolved(env):
  handles, _ = env.reset(np.array([0, 1]))
  t = TASKS[1]
  obs, reward, done, _ = env.step(handles, ["<submit/>", f'<replace path="solution.py">{t.buggy} ||| {t.buggy}  </replace>'])
  assert reward.tolist() == [0.0, 0.0] and done.tolist() == [True, False]
  passed, total = map(int, obs[0].split()[1].split("/"))   # "submitted: p/t hidden tests pass"
  assert obs[0].startswith("submitted: ") and 0 <= passed < total
  env.release(handles)


def test_branches_forked_from_one_workspace_never_see_each_others_edits(env):
  t = TASKS[0]
  (root,), _ = env.reset(np.array([0]))
  env.step(np.array([root]), ["<read>solution.py</read>"])
  a, b = env.fork(np.array([root]), np.array([2]))
  fix = f'<replace path="solution.py">{t.buggy} ||| {t.fixed}</replace>'
  env.step(np.array([a, b]), [fix, "<test/>"])
  (obs_a, obs_b, obs_root), *_ = env.step(np.array([a, b, root]), ["<read>solution.py</read>"] * 3)
  fixed = t.files[t.path].replace(t.buggy, t.fixed, 1)
  assert obs_a == fixed and obs_b == t.files[t.path] and obs_root == t.files[t.path]
  _, reward, _, _ = env.step(np.array([a, b]), ["<submit/>", "<submit/>"])
  assert reward.tolist() == [1.0, 0.0]
  env.release(np.array([a, b, root]))
  assert env.sandbox.live() == [] and os.listdir(env.sandbox.root) == []


@pytest.mark.parametrize("reply,message", [
    ("<read>../../etc/passwd</read>", "refused"), ("<read>/etc/passwd</read>", "refused"),
    ("<read>missing.py</read>", ""), ("let me think", "no action found"),
    ('<replace path="solution.py">x</replace>', "refused: a replace needs"),
])
def test_refused_or_unknown_actions_answer_one_line_and_change_nothing(env, reply, message):
  (h,), _ = env.reset(np.array([2]))
  (obs,), reward, done, info = env.step(np.array([h]), [reply])
  assert message in obs and "\n" not in obs and "root:" not in obs
  assert reward[0] == 0 and not done[0] and info["stage"][0] == 0
  (now,), *_ = env.step(np.array([h]), ["<read>solution.py</read>"])
  assert now == TASKS[2].files["solution.py"]
  env.release(np.array([h]))


def test_heuristic_and_judge_stage_read_the_device_state(env):
  handles, _ = env.reset(np.array([0, 1, 2]))
  t0 = TASKS[0]
  fix = f'<replace path="solution.py">{t0.buggy} ||| {t0.fixed}</replace>'
  env.step(handles, ["<read>solution.py</read>", "<read>solution.py</read>", "<submit/>"])
  obs, reward, done, info = env.step(handles[:2], [fix, "<test/>"])
  states = env.initial_states(np.array([0, 1, 2]))
  vals = np.zeros((3, len(env.info_fields)), np.float32)
  for j, f in enumerate(env.info_fields):
    vals[:2, j] = info[f]
  vals[2, env.info_fields.index("stage")] = 0
  states = states.replace(info=jax.numpy.asarray(vals), done=jax.numpy.asarray([False, False, True]))
  score = jax.vmap(lambda s: codefix_progress(env, None, s, s))(states)
  stage = jax.vmap(lambda s: codefix_stage(env, None, s, s))(states)
  # edited and passing every visible test: 0.6 * 1 + 0.4 * 2/3; tests run, not edited: stage 1
  want1 = 0.6 * info["visible_pass"][1] + 0.4 / 3
  np.testing.assert_allclose(score, [0.6 + 0.4 * 2 / 3, want1, 0.0], rtol=1e-6)
  np.testing.assert_array_equal(stage, [1, 0, 0])
  env.release(handles)


def test_expert_demos_play_the_real_env(env):
  from tree_rl.warmstart.host_demos import HostDemoGenerator
  gen = HostDemoGenerator(env, TOK, CodefixExpert(0.0), max_len=1024)
  demos = jax.device_get(gen(jax.random.key(0), 6))
  assert demos.success.all() and (demos.turns == 5).all() and not demos.truncated.any()
  for i in range(6):
    text = TOK.decode(demos.tokens[i, :demos.length[i]].tolist())
    trained = TOK.decode(demos.tokens[i][demos.loss_mask[i] > 0].tolist())
    # the last reply is the submit; no observation follows the episode's end
    assert trained.endswith("<submit/><|im_end|>") and text.endswith("<submit/><|im_end|>")
  assert env.sandbox.live() == []


def test_demos_with_a_reply_longer_than_a_turn_are_refused():
  from tree_rl.warmstart.host_demos import HostDemoGenerator
  env = CodeFix(TOK, TASKS, max_turns=6, max_reply_tokens=16)   # a replace takes ~60-180
  try:
    with pytest.raises(ValueError, match="raise config.rollout.max_tokens_per_turn"):
      HostDemoGenerator(env, TOK, CodefixExpert(0.0), max_len=1024)(jax.random.key(0), 2)
    # a plan expert says nothing of hard turns: a turn weight is refused before any episode
    with pytest.raises(ValueError, match="hard_turn_weight=2.0 needs an on-device expert"):
      HostDemoGenerator(env, TOK, CodefixExpert(0.0), max_len=1024, hard_turn_weight=2.0)
    assert env.sandbox.live() == []
  finally:
    env.close()


def test_tool_calls_count_actions_and_keys_name_situations(env):
  handles, _ = env.reset(np.array([4, 4, 5]))
  start = env.start_keys(handles)
  assert start[0] == start[1] != start[2]          # same task, same files, same stage
  _, _, _, info = env.step(handles, ["thinking...", "<read>solution.py</read>", "<test/>"])
  np.testing.assert_array_equal(info["tool_calls"], [0, 1, 1])
  # no action: the situation is the start's; a read moves to stage 1, a new situation
  assert info["state_key"][0] == start[0] and info["state_key"][1] != start[1]
  assert env.action_key("so <test/>") == env.action_key("<test/> now") != env.action_key("<submit/>")
  env.release(handles)
