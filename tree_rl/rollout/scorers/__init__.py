"""Process scorers: one registry, one interface `scorer(weights, batch, key) -> [B] in [0, 1]`.

A scorer is built by a factory registered under a name::

    @register("mine")
    def make_mine(cfg, **resources):              # cfg: config.scorer; resources: see below
      def score(weights, batch: ScoreInput, key):  # weights: None unless it runs a model
        return jnp.clip(..., 0.0, 1.0)            # float32 [B]
      return score

and selected by `config.scorer.name`; `build` wraps it in a `Scorer`. The score only allocates
rollout budget (PATR): it never enters rewards or advantages.

Weights are arguments, never captured (as optax passes `params` to `update`). A model scorer
(the judge, the PRM) scores with the flat weights it is called with, laid out as
`sampling.Cache.params` (the leaves of `nnx.split(model)`). `scorer.weights_for(policy_weights)`
names the right ones: the policy's for a scorer that reads the policy (`judge_model='policy'`,
the policy judging itself; `prm_model='policy'`), or the scorer's own fixed checkpoint
(`judge_model='hf'`, `prm_model='hf'`), which the `Scorer` holds as data. The rollout driver
calls `scorer(scorer.weights_for(cache.params), batch, key)` with the rollout cache, which the
training loop rebinds to the new weights after every update: a scorer that reads the policy
always scores with the current policy. Scorers without a model (heuristic, random, most
registered ones) are called with `weights=None` inside one jit.

`resources` is what the engine has at hand: `env`, `env_params`, `tokenizer`,
`generate(weights, tokens [B, L], lengths [B], key) -> (new_tokens [B, G], new_lengths [B])`
(greedy decoding through the sampler, for judges) and `lm(weights, tokens [B, L],
positions [B, L]) -> logits [B, L, V]` (a causal-LM forward, for PRMs). A factory takes what it
needs and ignores the rest.
"""

from tree_rl.rollout.scorers.base import (ScoreFn, ScoreInput, Scorer, WEIGHTS_FROM, build, get,
                                          names, per_state, place_rows, register, score_input)
from tree_rl.rollout.scorers.heuristic import make_heuristic, make_random
from tree_rl.rollout.scorers.judge import (JUDGE_ASK, JudgePrompt, JudgeTemplate, judge_inputs,
                                           judge_prompt, make_judge, number_table, parse_score)
from tree_rl.rollout.scorers.prm import (AGGREGATIONS, PrmFormat, aggregate_steps, make_prm,
                                         prm_inputs, token_id)
from tree_rl.rollout.scorers.resources import dense_lm, from_config, model_weights, sampler_generate
