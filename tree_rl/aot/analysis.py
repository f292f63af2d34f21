"""Compile a lowered program and read what the compiler says of it: per-chip memory, FLOPs,
bytes, collectives, the ratios against the real work, and a roofline time.

Bytes are the HBM traffic counted from the compiled HLO's memory spaces (`hbm.py`); XLA's own
"bytes accessed", which also counts every staging copy into VMEM and every read there (a
decode step's weights about 3x), is kept beside it as `xla_bytes`."""

from __future__ import annotations

import dataclasses
import re
import time

from tree_rl.aot import hbm
from tree_rl.aot.chips import GIB, Topology
from tree_rl.aot.programs import Program

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


@dataclasses.dataclass
class Result:
  """One compiled program, per chip unless named otherwise."""

  name: str
  phase: str
  calls: float
  argument_bytes: int = 0
  output_bytes: int = 0
  alias_bytes: int = 0
  temp_bytes: int = 0
  code_bytes: int = 0
  flops: float = 0.0              # per chip, one call (a loop body counted once, as XLA does)
  bytes_accessed: float = 0.0     # HBM traffic (`hbm.py`), per chip, one call
  xla_bytes: float = 0.0          # XLA's "bytes accessed" (every memory space), per chip
  loops: list = dataclasses.field(default_factory=list)   # per loop: name, steps, flops, bytes,
                                                          # xla_bytes
  per_step: bool = False          # real work is one iteration of the first loop (decode: a token)
  collectives: dict = dataclasses.field(default_factory=dict)
  real_flops: float = 0.0         # all chips, one call (decode: one step)
  real_bytes: float = 0.0         # per chip, one call (decode: one step)
  compile_s: float = 0.0
  error: str = ""
  note: str = ""

  @property
  def peak_bytes(self) -> int:
    """What the chip holds while the program runs: arguments, outputs not aliased to a
    donated argument, temporaries and the program."""
    return (self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
            + self.code_bytes)

  def turn(self, what: str) -> float:
    """FLOPs, bytes or xla_bytes of one call as it runs, every loop iteration counted."""
    whole = {"flops": self.flops, "bytes": self.bytes_accessed, "xla_bytes": self.xla_bytes}[what]
    return whole + sum((lp["steps"] - 1) * lp[what] for lp in self.loops)

  def ratios(self, chips: int, bytes_kind: str = "bytes") -> tuple[float | None, float | None]:
    """(compiled / real FLOPs over all chips, compiled / real HBM bytes per chip; XLA's bytes
    with bytes_kind="xla_bytes"), per call with every loop iteration counted, or per
    iteration where the real work is (decode)."""
    one = self.loops[0] if self.per_step and self.loops else None
    flops = one["flops"] if one else self.turn("flops")
    by = one[bytes_kind] if one else self.turn(bytes_kind)
    fr = flops * chips / self.real_flops if self.real_flops else None
    br = by / self.real_bytes if self.real_bytes else None
    return fr, br

  def roofline_s(self, topo: Topology) -> float:
    """Time of one call at the chip's peak FLOPs or bandwidth, whichever binds (an estimate)."""
    return max(self.turn("flops") / topo.chip.bf16_flops,
               self.turn("bytes") / topo.chip.hbm_bandwidth)

  def record(self, topo: Topology) -> dict:
    fr, br = self.ratios(topo.num_chips)
    out = {"kind": "program", "topology": topo.name, "name": self.name, "phase": self.phase,
           "calls_per_step": round(self.calls, 4)}
    if self.error:
      return out | {"error": self.error}
    out |= {"argument_gib": self.argument_bytes / GIB, "output_gib": self.output_bytes / GIB,
            "alias_gib": self.alias_bytes / GIB, "temp_gib": self.temp_bytes / GIB,
            "code_gib": self.code_bytes / GIB, "peak_gib": self.peak_bytes / GIB,
            "hbm_gib": topo.chip.hbm_bytes / GIB, "fits": self.peak_bytes <= topo.chip.hbm_bytes,
            "flops_per_chip": self.flops, "bytes_per_chip": self.bytes_accessed,
            "xla_bytes_per_chip": self.xla_bytes,
            "collectives": self.collectives, "real_flops": self.real_flops,
            "real_bytes_per_chip": self.real_bytes, "flops_ratio": fr, "bytes_ratio": br,
            "xla_bytes_ratio": self.ratios(topo.num_chips, "xla_bytes")[1],
            "roofline_s": self.roofline_s(topo), "compile_s": round(self.compile_s, 1)}
    if self.loops:
      out["loops"] = [{"name": lp["name"], "steps": lp["steps"], "flops_per_chip": lp["flops"],
                       "bytes_per_chip": lp["bytes"], "xla_bytes_per_chip": lp["xla_bytes"]}
                      for lp in self.loops]
    if self.note:
      out["note"] = self.note
    return {k: (round(v, 4) if isinstance(v, float) and abs(v) < 1e6 else v)
            for k, v in out.items()}


def collective_counts(hlo_text: str) -> dict:
  """Collective instructions by kind in compiled HLO text (async starts counted once)."""
  out = {}
  for kind in COLLECTIVES:
    n = len(re.findall(rf"= [^=\n]*\b{kind}(?:-start)?\(", hlo_text))
    if n:
      out[kind] = n
  return out


def _cost(compiled, text: str | None = None) -> tuple[float, float, float]:
  """(FLOPs, HBM bytes, XLA's bytes accessed) of a compiled program (`text`: its HLO text,
  when the caller already has it)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  cost = cost or {}
  text = compiled.as_text() or "" if text is None else text
  return (float(cost.get("flops", 0.0)), hbm.Program(text).hbm_bytes(),
          float(cost.get("bytes accessed", 0.0)))


def _fit_message(error: Exception) -> str:
  text = str(error)
  m = re.search(r"RESOURCE_EXHAUSTED[^\n]*", text)
  return (m.group(0) if m else text.splitlines()[0] if text else type(error).__name__)[:400]


def compile_program(program: Program) -> Result:
  """Lower and compile `program`; a program the compiler refuses (e.g. it does not fit the
  chip's memory) comes back with `error` set, not raised."""
  res = Result(program.name, program.phase, program.calls, real_flops=program.real.flops,
               real_bytes=program.real.bytes, per_step=program.per_step, note=program.note)
  t = time.perf_counter()
  try:
    compiled = program.lower().compile()
  except Exception as e:   # the compiler's refusal is the answer
    res.error = _fit_message(e)
    res.compile_s = time.perf_counter() - t
    return res
  mem = compiled.memory_analysis()
  if mem is not None:
    res.argument_bytes = int(mem.argument_size_in_bytes)
    res.output_bytes = int(mem.output_size_in_bytes)
    res.alias_bytes = int(mem.alias_size_in_bytes)
    res.temp_bytes = int(mem.temp_size_in_bytes)
    res.code_bytes = int(mem.generated_code_size_in_bytes)
  text = compiled.as_text() or ""
  res.flops, res.bytes_accessed, res.xla_bytes = _cost(compiled, text)
  res.collectives = collective_counts(text)
  for loop in program.loops:
    if loop.steps <= 1:
      continue
    try:
      f2, b2, x2 = _cost(loop.body().compile())
    except Exception as e:
      res.note += f"; {loop.name} loop body failed: {_fit_message(e)}"
      continue
    if loop.twin:   # the program with one more iteration: the difference is one body
      f2, b2, x2 = (max(f2 - res.flops, 0.0), max(b2 - res.bytes_accessed, 0.0),
                    max(x2 - res.xla_bytes, 0.0))
    res.loops.append({"name": loop.name, "steps": loop.steps, "flops": f2, "bytes": b2,
                      "xla_bytes": x2})
  if program.kernel is not None:   # Pallas kernels' work, which the cost analysis cannot see
    res.flops += program.kernel.flops
    res.bytes_accessed += program.kernel.bytes
    res.xla_bytes += program.kernel.bytes
    if res.loops:
      res.loops[0]["flops"] += program.kernel.flops
      res.loops[0]["bytes"] += program.kernel.bytes
      res.loops[0]["xla_bytes"] += program.kernel.bytes
    res.note += "; Pallas kernel counted from its DMAs"
  res.compile_s = time.perf_counter() - t
  return res
