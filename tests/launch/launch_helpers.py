"""Running the launch scripts in a controlled PATH (only the tools a test lends, plus fakes)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
BASH = shutil.which("bash")


def tool_dir(tmp_path, tools=(), fakes=None) -> str:
  """A bin folder holding links to the real `tools` and executable `fakes` {name: script}."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  for tool in tools:
    (bin_dir / tool).symlink_to(shutil.which(tool))
  for name, script in (fakes or {}).items():
    path = bin_dir / name
    path.write_text(script)
    path.chmod(0o755)
  return str(bin_dir)


def recorder(log_path, exit_code_for=None) -> str:
  """A fake command appending its argv as a JSON line to `log_path`; exits with
  `exit_code_for[first arg words]` when given (e.g. {"describe": 1})."""
  rules = json.dumps(exit_code_for or {})
  return (f"#!{sys.executable}\n"
          "import json, sys\n"
          f"open({str(log_path)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
          f"for word, code in json.loads({rules!r}).items():\n"
          "  if word in sys.argv[1:]:\n"
          "    sys.exit(code)\n")


def run_script(script, args=(), *, path, env=None, cwd=None):
  base = {"PATH": path, "HOME": str(cwd or REPO), "LANG": "C.UTF-8"}
  return subprocess.run([BASH, str(REPO / script), *args], capture_output=True, text=True,
                        env={**base, **(env or {})}, cwd=cwd or REPO, timeout=60)


def read_log(log_path) -> list[list[str]]:
  if not os.path.exists(log_path):
    return []
  return [json.loads(line) for line in open(log_path)]
