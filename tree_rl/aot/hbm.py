"""HBM traffic of a compiled TPU program, counted from the memory spaces in its HLO.

XLA's `cost_analysis()["bytes accessed"]` adds every operand and output of every instruction,
wherever it lives: a weight the TPU compiler stages into VMEM (`copy-start` / `slice-start`
into a buffer whose layout says `S(1)`) is counted when it is read from HBM, again when it is
written into VMEM and again when the matmul reads it there. A 9 MB decode matmul
(bf16 32 x 896 by 896 x 4864, compiled for v5e) is costed at 44 MB (4.8x). This module counts
what crosses HBM only: an instruction's operands and results whose layout has no memory-space
annotation (`S(0)`, the default, is HBM; `S(1)` VMEM, higher spaces SMEM and sync flags).

Rules, per instruction of every computation that runs (the entry, loop bodies and conditions
and called computations, a loop body counted once, as XLA does; of a conditional's branches the
costliest):
  * no traffic: parameters, tuples, bitcasts, constants, loops and calls themselves (their
    bodies are counted) and the `-done` half of async pairs (the `-start` half counts it);
  * a Pallas kernel (`tpu_custom_call`) moves its `CostEstimate`'s bytes times the share of
    its operands and result that is in HBM (the training flash kernel gives one); without one,
    nothing here (the decode window kernel's DMAs are added by `aot/programs.py`);
  * async starts read their operands and write their result (the tuple element that is one);
  * slices and gathers read what they return; `dynamic-update-slice` and `scatter` update in
    place, reading and writing the update only (a combining scatter, e.g. scatter-add, also
    reads the values it updates);
  * a fusion reads each HBM operand whole unless the fused computation only slices it (then
    what the slices return, also where a nested fusion slices it) or updates it in place (then
    nothing: the update is the write);
  * anything else reads its HBM operands and writes its HBM results.
Sizes are logical (no tile padding).
"""

from __future__ import annotations

import dataclasses
import re

ITEM_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s4": 0.5, "u4": 0.5, "bf16": 2, "f16": 2, "s16": 2,
              "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8,
              "f8e4m3fn": 1, "f8e5m2": 1, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(" + "|".join(sorted(ITEM_BYTES, key=len, reverse=True))
                    + r")\[([0-9,]*)\](\{[^}]*\})?")
_SPACE = re.compile(r"S\((\d+)\)")
_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTR = re.compile(r"^\s+(?:ROOT )?%?([\w.\-]+) = ")
_NAME = re.compile(r"%([\w.\-]+)")
_KERNEL_BYTES = re.compile(r'bytes_accessed\\?"?\s*:\s*\\?"?(\d+)')

FREE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all",
        "partition-id", "replica-id", "opt-barrier", "while", "conditional", "call"}
SLICES = {"slice", "dynamic-slice", "gather"}
IN_PLACE = {"dynamic-update-slice", "scatter"}
PASS_THROUGH = {"bitcast", "reshape"}


def arrays(type_text: str) -> list[tuple[float, int]]:
  """(logical bytes, memory space) of each array in an HLO type (an array or a tuple)."""
  out = []
  for dtype, dims, layout in _ARRAY.findall(type_text):
    n = 1
    for d in dims.split(","):
      if d:
        n *= int(d)
    space = _SPACE.search(layout or "")
    out.append((n * ITEM_BYTES[dtype], int(space.group(1)) if space else 0))
  return out


def in_hbm(type_text: str) -> float:
  return sum(b for b, s in arrays(type_text) if s == 0)


def size(type_text: str) -> float:
  return sum(b for b, _ in arrays(type_text))


@dataclasses.dataclass
class Instr:
  name: str
  type: str          # the result type, with layouts
  op: str
  operands: list     # operand names
  args: str          # the operand list's text (a parameter's number)
  attrs: str         # the text after the operand list
  root: bool


def _balanced(text: str, start: int) -> int:
  """Index just past the bracket group opening at text[start]."""
  depth, i = 0, start
  pairs = {"(": ")", "{": "}", "[": "]"}
  closing = set(pairs.values())
  while i < len(text):
    c = text[i]
    if c in pairs:
      depth += 1
    elif c in closing:
      depth -= 1
      if depth == 0:
        return i + 1
    i += 1
  return len(text)


def _instruction(line: str) -> Instr | None:
  m = _INSTR.match(line)
  if not m:
    return None
  rest = line[m.end():]
  if rest.startswith("("):
    end = _balanced(rest, 0)
  else:
    end = rest.find(" ")
  type_text, rest = rest[:end], rest[end:].lstrip()
  op = re.match(r"[\w\-]+", rest)
  if not op or len(rest) <= op.end() or rest[op.end()] != "(":
    return None
  close = _balanced(rest, op.end())
  args = rest[op.end() + 1:close - 1]
  return Instr(m.group(1), type_text, op.group(0), _NAME.findall(args), args, rest[close:],
               line.lstrip().startswith("ROOT "))


def parse(text: str) -> tuple[dict, str]:
  """{computation: [Instr]} and the entry computation's name."""
  comps, cur, entry = {}, None, ""
  for line in text.splitlines():
    if line and not line[0].isspace():
      h = _HEADER.match(line)
      if h:
        cur = h.group(1)
        comps[cur] = []
        if line.startswith("ENTRY"):
          entry = cur
      continue
    if cur is not None:
      ins = _instruction(line)
      if ins is not None:
        comps[cur].append(ins)
  return comps, entry


def _attr(attrs: str, key: str) -> list[str]:
  m = re.search(rf"\b{key}=(\{{[^}}]*\}}|%?[\w.\-]+)", attrs)
  return _NAME.findall(m.group(1)) or [m.group(1).lstrip("%")] if m else []


@dataclasses.dataclass
class Body:
  """A fused computation: its parameters by number, each value's users, its root(s)."""

  params: dict
  users: dict
  types: dict      # each value's type (the module's map for this computation)
  root: Instr
  roots: list      # the root, or the instructions a tuple root gathers


# the element of an async start's result tuple that is the result (default: the last)
_RESULT = {"copy-start": 0, "slice-start": 1, "collective-permute-start": 1, "async-start": 1}


class Program:
  """A compiled module's text, parsed once; `hbm_bytes()` is its HBM traffic per call."""

  def __init__(self, text: str):
    self.comps, self.entry = parse(text)
    self.defs = {c: {i.name: i.type for i in instrs} for c, instrs in self.comps.items()}
    self._bodies = {}

  @staticmethod
  def _callees(ins: Instr) -> list[str]:
    if ins.op == "while":
      return _attr(ins.attrs, "body") + _attr(ins.attrs, "condition")
    if ins.op == "call":
      return _attr(ins.attrs, "to_apply")
    if ins.op == "conditional":
      return (_attr(ins.attrs, "branch_computations") + _attr(ins.attrs, "true_computation")
              + _attr(ins.attrs, "false_computation"))
    return []

  def running(self) -> list[str]:
    """The computations that run as programs (not fused bodies or reducers), entry first."""
    seen, todo = [], [self.entry]
    while todo:
      c = todo.pop(0)
      if c in seen or c not in self.comps:
        continue
      seen.append(c)
      for ins in self.comps[c]:
        todo += self._callees(ins)
    return seen

  def hbm_bytes(self, computations: list[str] | None = None) -> float:
    """HBM bytes of one call: the entry and what it runs, a loop's body and condition once,
    a conditional's costliest branch; or the sum over the named computations alone."""
    if computations:
      return sum(self.instruction_bytes(i, c) for c in computations for i in self.comps[c])
    return self._tree_bytes(self.entry, ())

  def _tree_bytes(self, comp: str, stack: tuple) -> float:
    if comp not in self.comps or comp in stack:
      return 0.0
    total = 0.0
    for ins in self.comps[comp]:
      total += self.instruction_bytes(ins, comp)
      inner = [self._tree_bytes(c, stack + (comp,)) for c in self._callees(ins)]
      if inner:
        total += max(inner) if ins.op == "conditional" else sum(inner)
    return total

  def instruction_bytes(self, ins: Instr, computation: str) -> float:
    """HBM bytes instruction `ins` of `computation` reads and writes (module docstring)."""
    op = ins.op
    if op in FREE or op.endswith("-done"):
      return 0.0
    ops = [self.defs[computation].get(o, "") for o in ins.operands]
    if op == "custom-call":
      target = re.search(r'custom_call_target="([^"]*)"', ins.attrs)
      target = target.group(1) if target else ""
      if target == "tpu_custom_call":   # a Pallas kernel: its cost estimate's HBM share
        est = _KERNEL_BYTES.search(ins.attrs)
        every = sum(size(t) for t in ops) + size(ins.type)
        held = sum(in_hbm(t) for t in ops) + in_hbm(ins.type)
        return float(est.group(1)) * held / every if est and every else 0.0
      if "Bitcast" in target:
        return 0.0
    if op.endswith("-start"):
      parts = arrays(ins.type)
      result = parts[_RESULT.get(op, -1)]
      read = sum(result[0] if op == "slice-start" else in_hbm(t) for t in ops if in_hbm(t))
      return read + (result[0] if result[1] == 0 else 0.0)
    if op in SLICES:
      out = size(ins.type)
      return (out if ops and in_hbm(ops[0]) else 0.0) + in_hbm(ins.type) + sum(
          in_hbm(t) for t in ops[1:])
    if op in IN_PLACE:
      # dynamic-update-slice(buffer, update, offsets...); scatter(buffer, indices, updates)
      update = ops[1] if op == "dynamic-update-slice" else ops[-1]
      indices = ops[2:] if op == "dynamic-update-slice" else ops[1:-1]
      written = size(update) if in_hbm(ins.type) else 0.0
      combined = written if self._combines(ins) else 0.0   # scatter-add reads the rows it adds to
      return in_hbm(update) + written + combined + sum(in_hbm(t) for t in indices)
    if op == "fusion":
      return self._fusion_bytes(ins, ops)
    return sum(in_hbm(t) for t in ops) + in_hbm(ins.type)

  def _combines(self, ins: Instr) -> bool:
    """Whether a scatter combines each update with the value it replaces (not plain set)."""
    if ins.op != "scatter":
      return False
    fn = self.comps.get((_attr(ins.attrs, "to_apply") or [""])[0], [])
    root = next((i for i in fn if i.root), None)
    return not (root is not None and root.op == "parameter" and root.args.strip() == "1")

  # ------------------------------------------------------------------ fusions
  def _body(self, fusion: Instr) -> Body | None:
    called = _attr(fusion.attrs, "calls")
    name = called[0] if called else ""
    if name not in self._bodies:
      instrs = self.comps.get(name)
      if not instrs:
        self._bodies[name] = None
      else:
        users = {}
        for i in instrs:
          for o in i.operands:
            users.setdefault(o, []).append(i)
        root = next((i for i in instrs if i.root), instrs[-1])
        roots = ([next((i for i in instrs if i.name == o), None) for o in root.operands]
                 if root.op == "tuple" else [root])
        self._bodies[name] = Body({int(i.args): i.name for i in instrs if i.op == "parameter"},
                                  users, self.defs[name], root, roots)
    return self._bodies[name]

  def _fusion_bytes(self, ins: Instr, ops: list[str]) -> float:
    body = self._body(ins)
    if body is None:
      return sum(in_hbm(t) for t in ops) + in_hbm(ins.type)
    read = 0.0
    for idx, t in enumerate(ops):
      if not in_hbm(t):
        continue
      used = self._param_reads(body.params.get(idx), body)
      read += in_hbm(t) if used is None else min(used, in_hbm(t))
    written = 0.0
    out_parts = arrays(ins.type)
    for k, r in enumerate(body.roots):
      if k >= len(out_parts) or out_parts[k][1] != 0 or r is None:
        continue
      if r.op in IN_PLACE:
        update = body.types.get(r.operands[1] if r.op == "dynamic-update-slice"
                                else r.operands[-1], "")
        n = size(update) if update else out_parts[k][0]
        written += n * (2 if self._combines(r) else 1)   # scatter-add also reads those rows
      else:
        written += out_parts[k][0]
    return read + written

  def _param_reads(self, name, body: Body) -> float | None:
    """Bytes a fused computation reads of its parameter `name`: what its slices return when
    every use slices it (directly, through bitcasts, or inside a nested fusion) or updates it
    in place at a root; None when it is read whole."""
    if name is None:
      return None
    total, todo, seen = 0.0, [name], set()
    while todo:
      n = todo.pop()
      if n in seen:
        continue
      seen.add(n)
      for u in body.users.get(n, []):
        if u.op in PASS_THROUGH:
          todo.append(u.name)
        elif u.op in SLICES and u.operands and u.operands[0] == n:
          total += size(u.type)
        elif u.op in IN_PLACE and u.operands and u.operands[0] == n and u in body.roots:
          continue
        elif u.op == "fusion" and (inner := self._body(u)) is not None:
          for k, o in enumerate(u.operands):
            if o != n:
              continue
            p = inner.params.get(k)
            if inner.root.op in PASS_THROUGH and inner.root.operands == [p]:
              todo.append(u.name)              # a bitcast fusion: follow its result
              continue
            r = self._param_reads(p, inner)
            if r is None:
              return None
            total += r
        else:
          return None
    return total
