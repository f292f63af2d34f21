"""Supervised warm start for from-scratch policies: on-device expert demonstrations, then SFT.

    params, stats = warm_start(config.warmstart, model, tokenizer, env, key, env_name=config.env.name)

An env's expert is registered with the env (`tree_rl.envs.register(name, factory, expert=...)`),
so a notebook can add one for a new environment.
"""

from tree_rl.warmstart.experts import Expert, make_expert, registered_experts
from tree_rl.warmstart.demos import DemoGenerator, Demos, ReplyTable
from tree_rl.warmstart.rows import SFTRows, one_per_row, pack
from tree_rl.warmstart.sft import SFTTrainer, draw_demos, make_optimizer, sft_loss, validate, warm_start
from tree_rl.warmstart.greedy import first_move_accuracy, first_move_hits, greedy_replies, turn_hits
