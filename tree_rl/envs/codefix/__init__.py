"""Codefix: repair a bug in a small Python module in a real sandboxed workspace (a host env).

    gen         the task generator: templates x injected bugs, visible and hidden tests
    dataset     the tasks as a TFDS dataset (`codefix`); tasks: the task set
    env         `CodeFix`, the host env (read / replace / test / submit on a workspace)
    reward      the hidden tests judged in the trainer's process from plain data
    heuristic   the process score; judge: the judge's diagnose / edit / verify prompt
    expert      the warm start's demonstrator

Everything the rest of tree_rl needs is named in the one `register` below; nothing here is
imported until it is used (the sandbox starts processes).
"""

from tree_rl.envs.registry import register

register("codefix", "tree_rl.envs.codefix.env:make_codefix",
         fields=dict(
             scratch_dir="",   # where the sandbox's workspaces live ("" = a new temp dir per env)
         ),
         config_fields=("preset", "scratch_dir"),
         tasks="tree_rl.envs.codefix.tasks:task_set",
         heuristic="tree_rl.envs.codefix.heuristic:progress",
         judge="tree_rl.envs.codefix.judge:JUDGE",
         expert="tree_rl.envs.codefix.expert:for_env")
