"""One RL step's summary from its compiled programs: does it fit, the peak per chip, the
compiled / real ratios that matter, and a roofline estimate of the step time."""

from __future__ import annotations

from tree_rl.aot.analysis import Result
from tree_rl.aot.chips import GIB, Topology


# What a chip holds through each phase (`programs.resident_bytes`): the KV pool is freed
# before the learner's update (`sampling.free`) and rebuilt after it.
RESIDENT_IN = {"rollout": ("sampler_cache", "train_state", "reference", "scorer_cache",
                           "scorer_weights"),
               "eval": ("sampler_cache", "train_state", "reference"),
               "learner": ("train_state", "reference", "gradient_sums")}


def in_step_peak(result: Result, resident: dict) -> float:
  """A chip's memory while `result`'s program runs inside the step: what stays resident in its
  phase (its arguments are part of it), plus the program's temporaries, code and outputs that
  do not reuse a donated argument."""
  held = sum(v for k, v in resident.items() if k in RESIDENT_IN.get(result.phase, resident))
  return held + result.temp_bytes + result.code_bytes + max(
      0, result.output_bytes - result.alias_bytes)


def summary(results: list[Result], topo: Topology, model: str, resident: dict,
            rollout_tokens: float) -> dict:
  """The final line: fits, peak GiB per chip, the learner's FLOPs ratio, the decode's bytes
  ratio and the estimated step time (roofline: an estimate, not a measurement). Programs the
  step does not call (calls 0: a path printed for comparison) are left out."""
  step = [r for r in results if r.calls > 0]
  ok = [r for r in step if not r.error]
  peaks = [in_step_peak(r, resident) for r in ok]
  peak = max(peaks) if peaks else sum(resident.values())
  refused = [r.name for r in step if r.error]
  chips = topo.num_chips

  def ratio(phase_prefix, which, name_part, bytes_kind="bytes"):
    vals = [r.ratios(chips, bytes_kind)[which] for r in ok
            if r.name.startswith(phase_prefix) and name_part in r.name]
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None

  times = {}
  for r in ok:
    times[r.phase] = times.get(r.phase, 0.0) + r.calls * r.roofline_s(topo)
  step_s = sum(times.values())
  rollout_s = times.get("rollout", 0.0)
  return {"kind": "summary", "topology": topo.name, "chip": topo.chip.name, "chips": chips,
          "model": model, "fits": not refused and peak <= topo.chip.hbm_bytes,
          "hbm_peak_gib": round(peak / GIB, 3), "hbm_gib": round(topo.chip.hbm_bytes / GIB, 3),
          "resident_gib": {k: round(v / GIB, 3) for k, v in resident.items()},
          "refused": refused,
          "learner_flops_ratio": ratio("learner/", 0, "micro_add") or ratio("learner/", 0, "update"),
          "decode_bytes_ratio": ratio("rollout/", 1, "decode"),
          "decode_xla_bytes_ratio": ratio("rollout/", 1, "decode", "xla_bytes"),
          "step_estimate_s": round(step_s, 4),
          "phase_estimate_s": {k: round(v, 4) for k, v in times.items()},
          "rollout_tokens_per_s_estimate": round(rollout_tokens / rollout_s, 1) if rollout_s else None,
          "estimate": "roofline: max(FLOPs / peak, HBM bytes / HBM bandwidth) per program x calls"}


def table(results: list[Result], topo: Topology, resident: dict) -> str:
  """A fixed-width table of the programs."""
  head = (f"{'program':<46}{'calls':>7}{'peak GiB':>10}{'TFLOP/chip':>11}{'HBM GB':>9}"
          f"{'FLOPs x':>8}{'bytes x':>8}{'XLA x':>7}{'roofline ms':>12}  collectives")
  lines = [head, "-" * len(head)]
  for r in results:
    if r.error:
      lines.append(f"{r.name:<46}{r.calls:>7.2f}  refused: {r.error[:90]}")
      continue
    fr, br = r.ratios(topo.num_chips)
    xr = r.ratios(topo.num_chips, "xla_bytes")[1]
    coll = ",".join(f"{k.split('-')[0][:3]}{k.split('-')[1][:1] if '-' in k else ''}={v}"
                    for k, v in r.collectives.items())
    lines.append(f"{r.name[:46]:<46}{r.calls:>7.2f}{in_step_peak(r, resident) / GIB:>10.2f}"
                 f"{r.turn('flops') / 1e12:>11.3f}{r.turn('bytes') / 1e9:>9.2f}"
                 f"{(f'{fr:.2f}' if fr else '-'):>8}{(f'{br:.2f}' if br else '-'):>8}"
                 f"{(f'{xr:.2f}' if xr else '-'):>7}"
                 f"{1e3 * r.roofline_s(topo):>12.3f}  {coll}")
  lines.append("resident per chip: " + ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in resident.items()))
  return "\n".join(lines)
