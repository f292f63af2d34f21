"""Tool-call QA: multi-hop questions over a generated knowledge base, answered with a search tool
(BM25 on device) as a token env.

    kb          the seeded knowledge base and its 1- to 3-hop questions
    env         `ToolCallEnv`: parsing, retrieval, reward and text, on device
    reference   the host renderer and parser the tests hold the env to
    qa          the knowledge base as a TFDS dataset (`toolcall_qa`); tasks: the task set
    heuristic   the process score (facts shown); judge: the judge's search / answer prompt
    expert      the warm start's demonstrator (searches hop by hop, then answers)
    checks      config checks

Everything the rest of tree_rl needs is named in the one `register` below.
"""

from tree_rl.envs.registry import register
from tree_rl.envs.toolcall.env import (HEADS, KIND_ANSWER, KIND_INVALID, KIND_SEARCH, MAX_HOPS,
                                       ST_ANSWERED, ST_INVALID, ST_NO_CALLS, ST_NO_RESULTS,
                                       ST_SEARCH, ST_START, TAIL, ToolAction, ToolCallEnv,
                                       ToolCallParams, ToolCallState, calls_text, host_words,
                                       instructions)
from tree_rl.envs.toolcall.kb import KnowledgeBase, Question, generate_kb

_INT_POS = "int [1 _)"
register("toolcall", ToolCallEnv,
         fields=dict(
             split="train",   # question split episodes draw from (train | test)
             kb_scale=1,      # the generated KB's entity counts times this (1: 60 people, 30
                              # cities, 10 countries, 20 companies; about 570 questions, 100 held out)
             top_k=3,         # facts returned per search
             max_calls=4,     # tool calls per episode (methods compare at equal budgets)
         ),
         ranges=dict(kb_scale=_INT_POS, top_k=_INT_POS, max_calls=_INT_POS),
         config_fields=("preset", "split", "data_dir", "data_seed", "top_k", "max_calls"),
         tasks="tree_rl.envs.toolcall.tasks:task_set",
         heuristic="tree_rl.envs.toolcall.heuristic:progress",
         judge="tree_rl.envs.toolcall.judge:JUDGE",
         expert="tree_rl.envs.toolcall.expert:ToolCallExpert",
         checks="tree_rl.envs.toolcall.checks:check")
