"""Supervised warm start for from-scratch policies: on-device expert demonstrations, then SFT.

    params, stats = warm_start(config, model, tokenizer, env, key, evaluate=None)

Experts live in a registry keyed by env name (`register_expert`), so a notebook can add one for a
new environment.
"""

from tree_rl.warmstart.experts import Expert, make_expert, register_expert, registered_experts
from tree_rl.warmstart import frozenlake_expert as _frozenlake_expert  # noqa: F401 (registers)
from tree_rl.warmstart import toolcall_expert as _toolcall_expert  # noqa: F401 (registers)
from tree_rl.warmstart.demos import DemoGenerator, Demos, ReplyTable
from tree_rl.warmstart.sft import SFTTrainer, make_optimizer, sft_loss, validate, warm_start
from tree_rl.warmstart.greedy import first_move_accuracy, greedy_replies
