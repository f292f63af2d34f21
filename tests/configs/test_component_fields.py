"""A rollout method registered outside tree_rl with a knob of its own: the knob joins the schema
(`config.imports` names the module), round-trips through config.json, reaches the method, is
range-checked before compute, and `experiments.evaluate` reads the saved config back."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tree_rl import config as config_lib
from tree_rl import fields
from tree_rl.rollout import build, methods
from tree_rl.validation import ConfigError, validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE = textwrap.dedent('''
    from tree_rl.fields import Field
    from tree_rl.rollout import methods

    @methods.register("wide_chain", dict(width=Field(3, "int [1 _)", "chains per prompt")))
    def make(rc):
      return methods.Chain(name="wide_chain", num_trees=1, slots=int(rc.width),
                           keep_contexts=False, group_size=int(rc.width))
''')


@pytest.fixture
def component(tmp_path, monkeypatch):
  """`wide_chain_probe`, a module on sys.path registering the method `wide_chain`; the
  registries are restored afterwards."""
  (tmp_path / "wide_chain_probe.py").write_text(MODULE)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(fields, "_DECLARED", {k: dict(v) for k, v in fields._DECLARED.items()})
  monkeypatch.setattr(methods._REGISTRY, "_items", dict(methods._REGISTRY._items))
  monkeypatch.setattr(config_lib, "RANGES", dict(config_lib.RANGES))
  monkeypatch.delitem(sys.modules, "wide_chain_probe", raising=False)
  yield tmp_path
  sys.modules.pop("wide_chain_probe", None)


def _config():
  c = config_lib.base_config(imports=("wide_chain_probe",))
  c.rollout.method, c.rollout.width = "wide_chain", 5
  c.sampler.num_pages = 0   # the pool its worst case needs
  return c


def test_a_method_knob_round_trips_and_reaches_the_method(component):
  c = _config()
  assert config_lib.base_config(imports=("wide_chain_probe",)).rollout.width == 3   # its default
  back = config_lib.from_json(c.to_json())
  assert (back.imports, back.rollout.method, back.rollout.width) == (("wide_chain_probe",),
                                                                     "wide_chain", 5)
  assert build.make_method(back).slots == 5
  back.rollout.width = 0
  with pytest.raises(ConfigError, match=r"config\.rollout\.width=0 must be an integer >= 1"):
    validate(back)


def test_evaluate_reads_the_saved_config_with_the_component(component):
  workdir = component / "run"
  workdir.mkdir()
  saved = json.loads(_config().to_json())

  def evaluate(config_json):
    (workdir / "config.json").write_text(json.dumps(config_json))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(component), ROOT]))
    return subprocess.run([sys.executable, "-m", "experiments.evaluate", f"--workdir={workdir}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

  proc = evaluate(saved)   # the schema holds rollout.width: it validates and looks for checkpoints
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith(
      f"error: no checkpoint in {workdir}/checkpoints"), proc.stderr
  saved["imports"] = []     # without the module the field is unknown, and the error says which
  proc = evaluate(saved)
  assert proc.returncode == 2
  assert "saved config field 'rollout.width' is not in this version's schema" in proc.stderr
