"""The report builder on hand-made summaries: verdict lines of claims that hold, do not hold, are
inconclusive and have not run; the verdict table and figure at the top; readings at equal steps
and at matched spent budget; budget flags; the tables; the PNGs; and the CLI end to end."""

import json
import math
import os
import subprocess
import sys

import pytest
from report_fixtures import ROOT, summary, write_run, write_summaries

from experiments.reports import claim_text, claims, figures, make_report as report, measures

T3 = 4.302653          # t_{0.975,2}: the 95% interval's multiplier at 3 seeds
MDE3 = 5.363313        # t_{0.975,2} + t_{0.80,2}
MDE5 = 3.717410        # t_{0.975,4} + t_{0.80,4}


def t_row(diffs):
  """(mean, low, high, mde, mde projected to 5 seeds) of per-seed effects, by the textbook
  formulas (3 seeds)."""
  n = len(diffs)
  mean = sum(diffs) / n
  sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
  se = sd / math.sqrt(n)
  return mean, mean - T3 * se, mean + T3 * se, MDE3 * se, MDE5 * sd / math.sqrt(5)


def points(x):
  return f"{100 * x:+.1f} points"

BEFORE = (0.5, 0.6, 0.7)   # each seed's warm start (sampled and greedy success), shared
AFTER = {
    "grpo": (0.52, 0.61, 0.75),                # gains 0.02, 0.01, 0.05
    "tree_random": (0.56, 0.65, 0.78),         # gains 0.06, 0.05, 0.08
    "patr": (0.60, 0.70, 0.81),                # gains 0.10, 0.10, 0.11
    "tree_grpo_quarter": (0.32, 0.71, 0.80),   # grpo's gains + (-0.2, +0.1, +0.05)
    "tree_grpo": (0.50, 0.60, 0.70),           # gains 0
    "tree_grpo_intra": (0.55, 0.65, 0.75),     # gains 0.05: 0.05 above Tree-GRPO on every seed
    "arpo": (0.50, 0.60, 0.70),
}
KW = {"tree_grpo_quarter": dict(spent=25.0), "tree_grpo": dict(trajectories=12, turns=4.0),
      "patr": dict(spent=105.0, turns=2.5), "arpo": dict(spent=150.0)}


def fixture(directory, after=AFTER, kw=KW):
  write_summaries(directory, [summary(m, s, BEFORE[s], a[s], **kw.get(m, {}))
                              for m, a in after.items() for s in range(3)])
  return directory


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("report"))
  path, overview = report.build(fixture(os.path.join(root, "runs")), os.path.join(root, "out"))
  with open(path) as f:
    return root, path, overview, f.read()


def test_verdict_lines(built):
  _, path, overview, text = built
  assert os.path.basename(path) == "frozenlake.md" and text.startswith("# FrozenLake")
  assert overview == [
      "- a. PATR > Tree-Random > GRPO at equal budget: **holds**",
      # quarter - full gains per seed -0.2, +0.1, +0.05: the interval [-0.2, +0.1] straddles 0
      "- b. Tree-GRPO at a quarter of the budget >= chain GRPO at full budget: **inconclusive**",
      # 12 vs 8 trajectories at the same spent budget: 1.5 on every seed
      "- b2. Tree-GRPO gets 1.5x the trajectories per unit of budget: **holds**",
      # both - intra = -0.05 on every seed; inter-only has not run
      "- c. Intra-only advantages collapse at N=2; inter-only helps; both best: **does not hold**",
      "- d. Tree methods change turn counts (Tree-GRPO longer, PATR shorter); PATR trajectories "
      "are not longer: **holds**",
      "- e. PATR's default group (keep pruned branches) > the other group arms: **not run yet**"]
  assert "\n".join(overview) in text


def test_comparison_rows_by_hand(built):
  text = built[3]
  # PATR - Tree-Random gains per seed at the last evals (steps 4): 0.04, 0.05, 0.03. The curve
  # has evals at steps 0 and 4 only, so its mean gain over the steps is half the last gain.
  last, mean_gain = t_row([0.04, 0.05, 0.03]), t_row([0.02, 0.025, 0.015])
  assert last[1:3] == pytest.approx((0.015159, 0.064841), abs=1e-6)
  assert (f"| PATR - Tree-Random | mean gain in eval/sampled_success over the RL steps | "
          f"> 0.0 points | 3 | [0, 1, 2] | {points(mean_gain[0])} | "
          f"[{points(mean_gain[1])}, {points(mean_gain[2])}] | [+1.5 points, +2.5 points] | "
          f"{100 * mean_gain[3]:.1f} points | **holds** |") in text
  # three seeds: the bootstrap interval is the range of the effects
  assert (f"| PATR - Tree-Random | gain in eval/sampled_success at the last eval | > 0.0 points | "
          f"3 | [0, 1, 2] | +4.0 points | [+1.5 points, +6.5 points] | [+3.0 points, +5.0 points] "
          f"| {100 * last[3]:.1f} points | **holds** |") in text
  # matched: PATR spent 4 x 105 = 420, Tree-Random 400; PATR reaches 400 at step 4 (315 at
  # step 3) and is read at its step-4 eval, so this secondary row repeats the last eval's
  assert ("| PATR - Tree-Random | gain in eval/sampled_success at matched spent budget "
          "(secondary) | > 0.0 points | 3 | [0, 1, 2] | +4.0 points |") in text
  assert ("Matched spent budget (the smaller of the two runs' totals; mean over seeds): PATR "
          "reaches it at step 4 (read at its eval of step 4), Tree-Random at step 4 (eval 4); "
          "Tree-Random reaches it at step 4") in text
  assert ("| PATR - Tree-Random | mean gain in eval/greedy_success over the RL steps (secondary) |"
          in text)
  assert ("| Tree-GRPO / chain GRPO | trajectories per budget | >= 1.35x | 3 | [0, 1, 2] | 1.50x | "
          "[1.50x, 1.50x] | [1.50x, 1.50x] | 0.00x | **holds** |") in text
  # quarter - full per seed -0.2, +0.1, +0.05 at the last eval, against the 5-point margin
  quarter = t_row([-0.2, 0.1, 0.05])
  assert (f"| Tree-GRPO, 1/4 budget - chain GRPO | gain in eval/sampled_success at the last eval | "
          f"> -5.0 points | 3 | [0, 1, 2] | {points(quarter[0])} | "
          f"[{points(quarter[1])}, {points(quarter[2])}] |") in text
  assert ("| Tree-GRPO - Tree-GRPO inter-only | mean gain in eval/sampled_success over the RL "
          "steps | > 0.0 points | 0 | – | – | – | – | – | **not run yet: no summaries of "
          "tree_grpo_inter** |") in text
  assert "PATR paper: +9.3 points PATR over GRPO (66.5% -> 75.8%)." in text
  assert "PATR 1.05 (meant 1), Tree-Random 1.00 (meant 1)" in text


def test_verdict_table_and_figure_open_the_report(built):
  text = built[3]
  head = text.split("## Claims\n")[0]
  assert head.index("How verdicts are read.") < head.index("## Verdicts")
  assert "[-5.4, -1.9] is inconclusive" in head and "5.36 x sd / sqrt(3)" in head
  assert "3.72 x sd / sqrt(5)" in head
  mean_gain = t_row([0.02, 0.025, 0.015])
  assert (f"| a. PATR > Tree-Random > GRPO at equal budget | **holds** | PATR - Tree-Random | "
          f"mean gain in eval/sampled_success over the RL steps | > 0.0 points | "
          f"{100 * mean_gain[0]:+.1f} [{100 * mean_gain[1]:+.1f}, {100 * mean_gain[2]:+.1f}] "
          f"points | {100 * mean_gain[3]:.1f} points (3); "
          f"{100 * mean_gain[4]:.1f} points (5) | holds |") in head
  # one row per primary comparison: the claim's name and verdict on its first row only
  assert ("|  |  | PATR - Tree-Random | gain in eval/sampled_success at the last eval | > 0.0 "
          "points | +4.0 [+1.5, +6.5] points |") in head
  assert "(secondary)" not in head
  assert ("| c. Intra-only advantages collapse at N=2; inter-only helps; both best | "
          "**does not hold** |") in head
  assert "| – | – | not run yet |" in head
  assert head.rstrip().endswith("![frozenlake_success_vs_step.png](frozenlake_success_vs_step.png)")
  assert "![frozenlake_success_vs_step.png]" not in text.split("## Plots")[1]


def test_figure_panels_follow_the_success_claims(built):
  runs = measures.group(report.summaries.load_summaries(os.path.join(built[0], "runs")))
  # e compares PATR with arms that have not run: no panel; b2 and d are not about success
  assert figures.panels(runs, "frozenlake") == [
      ("a. PATR > Tree-Random > GRPO at equal budget", ["grpo", "tree_random", "patr"]),
      ("b. Tree-GRPO at a quarter of the budget >= chain GRPO at full budget",
       ["grpo", "tree_grpo_quarter"]),
      ("c. Intra-only advantages collapse at N=2; inter-only helps; both best",
       ["tree_grpo", "tree_grpo_intra"])]


def test_rule_baselines_beside_the_summaries(tmp_path):
  directory = fixture(str(tmp_path / "runs"))
  rows = [{"rule": "hint", "success": 0.75}, {"rule": "random", "success": 0.33},
          {"rule": "local", "success": 0.95}, {"rule": "expert", "success": 1.0}]
  (tmp_path / "runs" / "rules.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert report.rule_lines(directory) == {"hint": 0.75, "random": 0.33, "local view": 0.95}
  assert report.rule_lines(str(tmp_path)) == {}
  path, _ = report.build(directory, str(tmp_path / "out"))
  with open(tmp_path / "out" / "frozenlake_success_vs_step.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_named_report_keeps_the_env_reports_files(tmp_path):
  # two testbeds of one env (frozenlake and its long-horizon testbed) keep two reports
  directory = fixture(str(tmp_path / "runs"))
  out = tmp_path / "out"
  (out).mkdir()
  (out / "frozenlake_long_notes.md").write_text("## Notes of the long testbed\n")
  path, _ = report.build(directory, str(out), name="frozenlake_long")
  assert path == str(out / "frozenlake_long.md")
  assert sorted(os.listdir(out)) == ["frozenlake_long.md", "frozenlake_long_mean_turns.png",
                                     "frozenlake_long_notes.md",
                                     "frozenlake_long_success_vs_budget.png",
                                     "frozenlake_long_success_vs_step.png"]
  text = (out / "frozenlake_long.md").read_text()
  assert "--name frozenlake_long` from" in text and text.startswith("# FrozenLake reproduction")
  assert "![frozenlake_long_success_vs_step.png]" in text
  assert text.rstrip().endswith("## Notes of the long testbed")


def test_tables(built):
  text = built[3]
  lines = text.splitlines()
  row = next(line for line in lines if line.startswith("| chain GRPO | [0, 1, 2] |"))
  assert "| 4 | generated | 200 ± 0 | 100 ± 0 | 1.00 | 1.00 | 4.0 ± 0.0 |" in row
  quarter = next(line for line in lines if line.startswith("| Tree-GRPO, 1/4 budget | [0, 1, 2]"))
  assert "| 0.25 | 0.25 |" in quarter                  # meant to spend a quarter: not flagged
  arpo = next(line for line in lines if line.startswith("| ARPO | [0, 1, 2]"))
  assert "1.50 (**not within 10% of 1**)" in arpo
  # success: before 0.6 ± 0.1 for every method; chain GRPO's gain 0.027 ± 0.021
  assert "| chain GRPO | 0.600 ± 0.100 | 0.627 ± 0.116 | +0.027 ± 0.021 |" in text
  assert "| sampled side_2 | turns / episode | tokens / episode | train entropy |" in text
  assert "tool calls" not in text.split("## Claims in detail")[0]


def test_pngs(built):
  root = built[0]
  for name in ("frozenlake_success_vs_step.png", "frozenlake_success_vs_budget.png",
               "frozenlake_mean_turns.png"):
    with open(os.path.join(root, "out", name), "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert "![frozenlake_success_vs_budget.png](frozenlake_success_vs_budget.png)" in built[3]


def test_budget_premise_flag_and_loose_pairing(tmp_path):
  kw = {**KW, "patr": dict(spent=130.0)}
  after = {m: AFTER[m] for m in ("grpo", "tree_random", "patr")}
  directory = fixture(str(tmp_path / "runs"), after, kw)
  write_summaries(directory, [summary("tree_random", 1, 0.55, 0.60)])   # another warm start
  _, overview = report.build(directory, str(tmp_path / "out"))
  # PATR spends 1.3x per step; the primary rows compare equal steps, so the premise is flagged
  assert overview[0] == ("- a. PATR > Tree-Random > GRPO at equal budget: **holds** (budget "
                         "premise not met: PATR)")
  text = open(tmp_path / "out" / "frozenlake.md").read()
  assert "PATR 1.30 (meant 1, **off by more than 10%**)" in text
  assert "The primary rows compare equal RL steps at the planned budget" in text
  # PATR reaches Tree-Random's 400 at step 4 (390 at step 3)
  assert "PATR reaches it at step 4 (read at its eval of step 4), Tree-Random at step 4" in text
  assert "Seeds [1] of PATR - Tree-Random started from different warm starts" in text


def _curve_run():
  """Evals at steps 0, 10, 20 (0.5, 0.7, 0.8); 20 steps spending 10 each but step 15, 60:
  cumulative 100 at step 10, 140 at 14, 200 at 15, 240 at 19, 250 at 20."""
  s = summary("grpo", 0, 0.5, 0.8)
  cost = [10.0] * 14 + [60.0] + [10.0] * 5
  s["train"] = [{"step": t + 1, "rollout/cost_per_prompt/generated": c} for t, c in enumerate(cost)]
  s["evals"] = [{"step": t, "spent": c, claims.SAMPLED: v}
                for t, c, v in ((0, 0.0, 0.5), (10, 100.0, 0.7), (20, 250.0, 0.8))]
  return s


def test_mean_gain_over_the_steps_by_hand():
  s = _curve_run()
  # gains 0, 0.2, 0.3 at steps 0, 10, 20: trapezoids 1.0 + 2.5 over 20 steps
  assert measures.mean_gain(s, claims.SAMPLED) == pytest.approx(3.5 / 20)
  assert measures.value(s, f"mean_gain {claims.SAMPLED}", until=10) == pytest.approx(0.1)
  assert measures.value(s, f"gain {claims.SAMPLED}", until=15) == pytest.approx(0.2)
  assert math.isnan(measures.mean_gain({"evals": s["evals"][1:]}, claims.SAMPLED))  # no step 0


def test_reading_at_a_spent_budget_from_the_per_step_spend():
  s = _curve_run()
  # 150 is reached at step 15 (140 at step 14), not at step 13.3 as a line between the evals
  # at steps 10 and 20 would put it; the run is read at its last eval by then, step 10
  assert measures.step_at_spent(s, 150.0) == 15
  assert measures.step_at_spent(s, 100.0) == 10
  assert math.isnan(measures.step_at_spent(s, 251.0))
  assert measures.value(s, f"gain {claims.SAMPLED}", spent=150.0) == pytest.approx(0.2)
  assert math.isnan(measures.value(s, f"gain {claims.SAMPLED}", spent=251.0))
  # a quarter-budget run's spending counts four times: 4 x 15 = 60 -> 240 < chain's 250, so
  # both are read at 240 chain units: the quarter run at step 4, chain GRPO at step 19 (its
  # step-10 eval)
  quarter = summary("tree_grpo_quarter", 0, 0.5, 0.9, spent=15.0)
  c = claims.Comparison("tree_grpo_quarter", "grpo", f"gain {claims.SAMPLED}", "not_less",
                        matched=True)
  assert claims.matched_level(quarter, s, c) == pytest.approx(240.0)
  r = claims.evaluate({"grpo": {0: s}, "tree_grpo_quarter": {0: quarter}}, c)
  assert r["values"] == [pytest.approx(0.4 - 0.2)]
  assert r["read_at"] == (4, 4, 19, 10)


def test_equal_steps_read_both_runs_up_to_the_shorter_one():
  s = _curve_run()
  short = summary("tree_grpo", 0, 0.5, 0.6, steps=10)       # evals at steps 0 and 10
  for measure, want in (("gain", 0.1 - 0.2), ("mean_gain", 0.05 - 0.1)):
    c = claims.Comparison("tree_grpo", "grpo", f"{measure} {claims.SAMPLED}", "greater")
    r = claims.evaluate({"grpo": {0: s}, "tree_grpo": {0: short}}, c)
    assert r["values"] == [pytest.approx(want)]


def test_gain_curve_and_measures():
  runs = {s: summary("grpo", s, BEFORE[s], AFTER["grpo"][s]) for s in range(3)}
  x, mean, low, high = figures.gain_curve(runs, claims.SAMPLED, "spent")
  assert list(x) == [0.0, 400.0] and mean[1] == pytest.approx(0.08 / 3)
  assert (low[1], high[1]) == (pytest.approx(0.01), pytest.approx(0.05))
  # 8 trajectories over 2 prompts x 100 tokens, every step
  assert measures.trajectories_per_budget(runs[0]) == pytest.approx(0.04)


def test_toolcall_report(tmp_path):
  ms = {"grpo": dict(turns=2.4, tool_calls=1.5), "tree_grpo": dict(turns=3.0, tool_calls=2.0)}
  gains = {"grpo": (0.3, 0.4, 0.5), "tree_grpo": (0.36, 0.45, 0.56)}   # +6, +5, +6 points
  write_summaries(str(tmp_path / "tc"), [
      summary(m, s, 0.2, gains[m][s], env="toolcall", sides=False, **ms[m])
      for m in ms for s in range(3)])
  path, overview = report.build(str(tmp_path / "tc"), str(tmp_path / "out"))
  text = open(path).read()
  assert os.path.basename(path) == "toolcall.md" and text.startswith("# Tool-call QA")
  assert overview[0] == "- a. Tree-GRPO > chain GRPO at equal budget: **holds**"
  assert "- c. Tree-GRPO takes more turns and tool calls than chain GRPO: **holds**" in overview
  # the advantage ablation is FrozenLake's alone: no tool-call claim waits on runs never planned
  assert [line[2:4] for line in overview] == ["a.", "b.", "b2", "c."]
  assert "tool calls / episode" in text and "side_" not in text
  assert os.path.exists(tmp_path / "out" / "toolcall_mean_turns.png")


def test_mixed_envs_are_refused(tmp_path):
  write_summaries(str(tmp_path), [summary("grpo", 0, 0.5, 0.6),
                                  summary("patr", 0, 0.5, 0.6, env="toolcall")])
  with pytest.raises(SystemExit, match="several envs"):
    report.main(["--summaries", str(tmp_path), "--out_dir", str(tmp_path / "out")])


def test_cli_end_to_end(tmp_path):
  """Run directories -> summaries CLI -> report CLI, as run_reproductions does."""
  runs, out = str(tmp_path / "sweep"), str(tmp_path / "out")
  for method, gains in (("grpo", (0.0, 0.1, 0.0)), ("tree_random", (0.1, 0.2, 0.15)),
                        ("patr", (0.2, 0.3, 0.25))):
    for seed, g in enumerate(gains):
      write_run(runs, f"{method}_seed{seed}", [
          {"step": 0, "eval/sampled_success": 0.5, "eval/greedy_success": 0.5},
          {"step": 1, "rollout/cost_per_prompt/generated": 300.0, "rollout/trajectories": 8},
          {"step": 2, "rollout/cost_per_prompt/generated": 340.0, "rollout/trajectories": 8,
           "eval/sampled_success": 0.5 + g, "eval/greedy_success": 0.5 + g}])
  env = dict(os.environ, PYTHONPATH=ROOT)
  for argv in (["experiments.reports.summaries", "--runs", runs, "--out", str(tmp_path / "s")],
               ["experiments.reports.make_report", "--summaries",
                str(tmp_path / "s"), "--out_dir", out]):
    proc = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
  assert "- a. PATR > Tree-Random > GRPO at equal budget: **holds**" in proc.stdout
  assert "- e. PATR's default group (keep pruned branches) > the other group arms: " \
         "**not run yet**" in proc.stdout
  assert sorted(os.listdir(tmp_path / "s"))[0] == "grpo_seed0.json"
  text = open(os.path.join(out, "frozenlake.md")).read()
  # planned: 4 chains x 160 tokens; spent: (300 + 340) / 2 per step
  assert "| chain GRPO | [0, 1, 2] | 2 | generated | 640 ± 0 | 320 ± 0 |" in text


def test_two_seeds_that_agree_are_inconclusive(tmp_path):
  write_summaries(str(tmp_path), [summary(m, s, 0.5, after) for s in range(2)
                                  for m, after in (("grpo", 0.5), ("tree_random", 0.6),
                                                   ("patr", 0.7))])
  path, overview = report.build(str(tmp_path), str(tmp_path / "out"))
  assert overview[0] == "- a. PATR > Tree-Random > GRPO at equal budget: **inconclusive**"
  assert ("| +10.0 points | [+10.0 points, +10.0 points] | [+10.0 points, +10.0 points] | "
          "0.0 points | **inconclusive: 2 seeds, a verdict needs 3** |") in open(path).read()
