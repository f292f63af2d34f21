"""tree_rl: tree-structured rollouts for multi-turn LLM agent RL (chain GRPO, Tree-GRPO, PATR)."""

__version__ = "0.1.0"
