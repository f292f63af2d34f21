"""The HBM byte count (`tree_rl/aot/hbm.py`) against hand counts: small HLO modules written
out by hand (staging into VMEM, slices, in-place updates, loops, Pallas calls) and one matmul
compiled for a v5e chip, whose HBM traffic is its two operands and its result."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import SingleDeviceSharding

from tree_rl.aot import chips, hbm, topology

# bf16[32,896] = 57,344 B; bf16[896,4864] = 8,716,288 B; bf16[32,4864] = 311,296 B
X, W, OUT = 32 * 896 * 2, 896 * 4864 * 2, 32 * 4864 * 2

STAGED_MATMUL = """HloModule m, is_scheduled=true

%fused_computation (param_0: bf16[32,896], param_1: bf16[896,4864]) -> bf16[32,4864] {
  %param_0 = bf16[32,896]{1,0:T(8,128)(2,1)} parameter(0)
  %param_1 = bf16[896,4864]{1,0:T(8,128)(2,1)S(1)} parameter(1)
  ROOT %convolution.1 = bf16[32,4864]{1,0:T(8,128)(2,1)} convolution(%param_0, %param_1), dim_labels=bf_io->bf
}

ENTRY %main.1 (x.1: bf16[32,896], w.1: bf16[896,4864]) -> bf16[32,4864] {
  %w.1 = bf16[896,4864]{1,0:T(8,128)(2,1)} parameter(1), sharding={replicated}
  %copy-start = (bf16[896,4864]{1,0:T(8,128)(2,1)S(1)}, bf16[896,4864]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) copy-start(%w.1), cross_program_prefetch_index=0
  %x.1 = bf16[32,896]{1,0:T(8,128)(2,1)} parameter(0), sharding={replicated}
  %copy-done = bf16[896,4864]{1,0:T(8,128)(2,1)S(1)} copy-done(%copy-start)
  ROOT %fusion = bf16[32,4864]{1,0:T(8,128)(2,1)} fusion(%x.1, %copy-done), kind=kOutput, calls=%fused_computation
}
"""


def test_staged_weight_counts_once_from_hbm():
  # the copy into VMEM reads W from HBM once; the matmul reads x from HBM and W from VMEM
  assert hbm.Program(STAGED_MATMUL).hbm_bytes() == X + W + OUT


LOOP = """HloModule loop, is_scheduled=true

%slicer (p0: f32[1024,256], p1: s32[]) -> f32[8,256] {
  %p0 = f32[1024,256]{1,0} parameter(0)
  %p1 = s32[]{:S(1)} parameter(1)
  %zero = s32[]{:S(1)} constant(0)
  %b = f32[1024,256]{1,0} bitcast(%p0)
  ROOT %ds = f32[8,256]{1,0} dynamic-slice(%b, %p1, %zero), dynamic_slice_sizes={8,256}
}

%writer (q0: f32[512,64], q1: f32[4,64], q2: s32[]) -> f32[512,64] {
  %q0 = f32[512,64]{1,0} parameter(0)
  %q1 = f32[4,64]{1,0} parameter(1)
  %q2 = s32[]{:S(1)} parameter(2)
  %z = s32[]{:S(1)} constant(0)
  ROOT %dus = f32[512,64]{1,0} dynamic-update-slice(%q0, %q1, %q2, %z)
}

%body (t: (s32[], f32[1024,256], f32[512,64])) -> (s32[], f32[1024,256], f32[512,64]) {
  %t = (s32[]{:S(1)}, f32[1024,256]{1,0}, f32[512,64]{1,0}) parameter(0)
  %i = s32[]{:S(1)} get-tuple-element(%t), index=0
  %table = f32[1024,256]{1,0} get-tuple-element(%t), index=1
  %buf = f32[512,64]{1,0} get-tuple-element(%t), index=2
  %rows = f32[8,256]{1,0:S(1)} fusion(%table, %i), kind=kLoop, calls=%slicer
  %small = f32[4,64]{1,0:S(1)} slice(%rows), slice={[0:4], [0:64]}
  %new = f32[512,64]{1,0} fusion(%buf, %small, %i), kind=kLoop, calls=%writer
  %kern = f32[8,256]{1,0} custom-call(%table, %rows), custom_call_target="tpu_custom_call"
  %one = s32[]{:S(1)} constant(1)
  %next = s32[]{:S(1)} add(%i, %one)
  ROOT %out = (s32[]{:S(1)}, f32[1024,256]{1,0}, f32[512,64]{1,0}) tuple(%next, %table, %new)
}

%cond (c: (s32[], f32[1024,256], f32[512,64])) -> pred[] {
  %c = (s32[]{:S(1)}, f32[1024,256]{1,0}, f32[512,64]{1,0}) parameter(0)
  %ci = s32[]{:S(1)} get-tuple-element(%c), index=0
  %lim = s32[]{:S(1)} constant(10)
  ROOT %lt = pred[]{:S(1)} compare(%ci, %lim), direction=LT
}

ENTRY %main (a: f32[1024,256], b: f32[512,64]) -> f32[512,64] {
  %a = f32[1024,256]{1,0} parameter(0)
  %b = f32[512,64]{1,0} parameter(1)
  %z0 = s32[]{:S(1)} constant(0)
  %init = (s32[]{:S(1)}, f32[1024,256]{1,0}, f32[512,64]{1,0}) tuple(%z0, %a, %b)
  %w = (s32[]{:S(1)}, f32[1024,256]{1,0}, f32[512,64]{1,0}) while(%init), condition=%cond, body=%body
  %res = f32[512,64]{1,0} get-tuple-element(%w), index=2
  %part = f32[128,64]{1,0} slice(%res), slice={[0:128], [0:64]}
  ROOT %sum = f32[512,64]{1,0} add(%res, %res)
}
"""


def test_loop_body_slices_and_in_place_updates():
  p = hbm.Program(LOOP)
  assert p.running() == ["main", "body", "cond"]   # fused computations are not programs
  # body: the fusion slices 8 rows out of the table (8 x 256 x 4 B, into VMEM); the slice of
  # them reads VMEM only; the in-place update reads its 4 x 64 update from VMEM and writes it
  # into the HBM buffer; the Pallas call is counted from its own DMAs, not here
  assert p.hbm_bytes(["body"]) == 8 * 256 * 4 + 4 * 64 * 4
  assert p.hbm_bytes(["cond"]) == 0
  # entry: the slice reads and writes 128 x 64 floats; the add reads the buffer twice and
  # writes one
  assert p.hbm_bytes(["main"]) == 2 * 128 * 64 * 4 + 3 * 512 * 64 * 4
  assert p.hbm_bytes() == sum(p.hbm_bytes([c]) for c in p.running())


def test_types_memory_spaces_and_sizes():
  assert hbm.arrays("(bf16[2,3]{1,0:T(8,128)(2,1)S(1)}, f32[4]{0}, s32[]{:S(2)})") == [
      (12, 1), (16, 0), (4, 2)]
  assert hbm.in_hbm("(bf16[2,3]{1,0:S(1)}, f32[4]{0})") == 16
  assert hbm.size("pred[8,8]") == 64


@pytest.fixture(scope="module")
def v5e_chip():
  topo = chips.topology("v5e:2x2")
  topology.quiet_libtpu(topo)
  return topology.devices(topo)[0]


def test_compiled_decode_matmul_moves_its_operands_once(v5e_chip):
  """XLA's "bytes accessed" counts the weight's staging into VMEM and the read there; the HBM
  count sees x, W and the result once each."""
  sh = SingleDeviceSharding(v5e_chip)
  x = jax.ShapeDtypeStruct((32, 896), jnp.bfloat16, sharding=sh)
  w = jax.ShapeDtypeStruct((896, 4864), jnp.bfloat16, sharding=sh)
  compiled = jax.jit(lambda x, w: x @ w).lower(x, w).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  counted = hbm.Program(compiled.as_text()).hbm_bytes()
  assert counted == X + W + OUT
  assert cost["bytes accessed"] > 3 * counted


RULES = """HloModule rules, is_scheduled=true

%inner (i0: f32[64,1024], i1: s32[]) -> f32[64,16] {
  %i0 = f32[64,1024]{1,0} parameter(0)
  %i1 = s32[]{:S(1)} parameter(1)
  %iz = s32[]{:S(1)} constant(0)
  ROOT %ids = f32[64,16]{1,0} dynamic-slice(%i0, %iz, %i1), dynamic_slice_sizes={64,16}
}

%outer (o0: f32[64,1024], o1: s32[], o2: f32[8,64]) -> f32[8,16] {
  %o0 = f32[64,1024]{1,0} parameter(0)
  %o1 = s32[]{:S(1)} parameter(1)
  %o2 = f32[8,64]{1,0} parameter(2)
  %w = f32[64,16]{1,0} fusion(%o0, %o1), kind=kLoop, calls=%inner
  ROOT %mm = f32[8,16]{1,0} dot(%o2, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%add (a0: f32[], a1: f32[]) -> f32[] {
  %a0 = f32[] parameter(0)
  %a1 = f32[] parameter(1)
  ROOT %sum = f32[] add(%a0, %a1)
}

%set (b0: f32[], b1: f32[]) -> f32[] {
  %b0 = f32[] parameter(0)
  ROOT %b1 = f32[] parameter(1)
}

%big (c0: f32[256,256]) -> f32[256,256] {
  %c0 = f32[256,256]{1,0} parameter(0)
  ROOT %e = f32[256,256]{1,0} exponential(%c0)
}

%small (d0: f32[256,256]) -> f32[256,256] {
  %d0 = f32[256,256]{1,0} parameter(0)
  ROOT %d1 = f32[256,256]{1,0} negate(%d0)
}

ENTRY %main (w: f32[64,1024], k: s32[], x: f32[8,64], t: f32[1000,32], idx: s32[4,1], u: f32[4,32], p: pred[], m: f32[256,256], v: f32[1024]) -> f32[8,16] {
  %w = f32[64,1024]{1,0} parameter(0)
  %k = s32[]{:S(1)} parameter(1)
  %x = f32[8,64]{1,0:S(1)} parameter(2)
  %y = f32[8,16]{1,0} fusion(%w, %k, %x), kind=kOutput, calls=%outer
  %t = f32[1000,32]{1,0} parameter(3)
  %idx = s32[4,1]{1,0:S(1)} parameter(4)
  %u = f32[4,32]{1,0:S(1)} parameter(5)
  %sa = f32[1000,32]{1,0} scatter(%t, %idx, %u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
  %ss = f32[1000,32]{1,0} scatter(%sa, %idx, %u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%set
  %p = pred[]{:S(1)} parameter(6)
  %m = f32[256,256]{1,0} parameter(7)
  %c = f32[256,256]{1,0} conditional(%p, %m, %m), true_computation=%big, false_computation=%small
  %v = f32[1024]{0} parameter(8)
  %cp = (f32[1024]{0}, f32[1024]{0}, u32[]{:S(2)}, u32[]{:S(2)}) collective-permute-start(%v), source_target_pairs={{0,1},{1,0}}
  %cd = f32[1024]{0} collective-permute-done(%cp)
  %kern = f32[1024]{0:S(1)} custom-call(%v), custom_call_target="tpu_custom_call", backend_config={"cost_estimate":{"flops":"0","bytes_accessed":"8192"}}
  ROOT %r = f32[8,16]{1,0} copy(%y)
}
"""


def test_nested_slices_scatter_add_branches_collectives_and_kernels():
  p = hbm.Program(RULES)
  entry = {i.name: i for i in p.comps["main"]}
  b = lambda name: p.instruction_bytes(entry[name], "main")  # noqa: E731
  # the matmul fusion reads the 64 x 16 window its nested fusion slices, not the 64 x 1024 weight
  assert b("y") == 64 * 16 * 4 + 8 * 16 * 4
  # the updates are in VMEM: scatter-add reads the 4 rows it adds to and writes them back, a
  # plain set only writes them
  assert b("sa") == 2 * 4 * 32 * 4 and b("ss") == 4 * 32 * 4
  # a collective permute reads its operand and writes its result (element 1 of the tuple)
  assert b("cp") == 2 * 1024 * 4
  # a kernel's estimate counts in the share of its operands and result that is in HBM
  assert b("kern") == 8192 / 2
  # a conditional runs one branch: the costlier of the two
  branch = 2 * 256 * 256 * 4
  assert p.hbm_bytes() == (b("y") + b("sa") + b("ss") + b("cp") + b("kern") + branch
                           + 2 * 8 * 16 * 4)


def test_compiled_matmul_with_a_sliced_weight_reads_the_slice(v5e_chip):
  """`x @ w[:, :4096]` with w the 896 x 151,936 embedding: the compiler slices inside the
  matmul's fusion; the count reads the slice, not the table."""
  sh = SingleDeviceSharding(v5e_chip)
  x = jax.ShapeDtypeStruct((32, 896), jnp.bfloat16, sharding=sh)
  w = jax.ShapeDtypeStruct((896, 151936), jnp.bfloat16, sharding=sh)
  compiled = jax.jit(lambda x, w: x @ w[:, :4096]).lower(x, w).compile()
  assert hbm.Program(compiled.as_text()).hbm_bytes() == X + 896 * 4096 * 2 + 32 * 4096 * 2
