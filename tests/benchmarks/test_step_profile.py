"""The pieces of benchmarks/step_profile.py that decide its numbers: which ops are matmuls, which model part an
op belongs to, and exclusive op times from a trace with nested events."""
import collections

import jax
import jax.numpy as jnp
import pytest

from benchmarks import measure
from benchmarks import step_profile
from benchmarks import train_step
from transformer import ops
from transformer.train.config import build_task


def test_parse_hlo_finds_dots_directly_and_inside_called_fusions():
  def f(x, w):
    return jnp.tanh(x @ w).sum() + jnp.exp(x).sum()

  x = jnp.ones((16, 32))
  w = jnp.ones((32, 8))
  compiled = jax.jit(f).lower(x, w).compile()
  hlo = step_profile.parse_hlo(compiled.as_text())
  matmuls = [name for name, op in hlo.items() if op.matmul]
  others = [name for name, op in hlo.items() if not op.matmul]
  assert matmuls, "the x @ w dot (alone or fused) must be found"
  assert others, "the exp and the sums are not matmuls"
  # Every instruction XLA lists is named, and the dot's op_name says where it came from.
  assert any("dot_general" in hlo[name].op_name for name in matmuls)


def test_parse_hlo_follows_fusion_calls_through_nested_computations():
  text = "\n".join([
      "%inner (p: f32[2,2]) -> f32[2,2] {",
      "  %p = f32[2,2] parameter(0)",
      "  ROOT %d = f32[2,2] dot(%p, %p), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
      "}",
      "%outer (p: f32[2,2]) -> f32[2,2] {",
      "  %p.1 = f32[2,2] parameter(0)",
      "  ROOT %f = f32[2,2] fusion(%p.1), kind=kOutput, calls=%inner",
      "}",
      "%plain (p: f32[2,2]) -> f32[2,2] {",
      "  %p.2 = f32[2,2] parameter(0)",
      "  ROOT %e = f32[2,2] exponential(%p.2)",
      "}",
      "ENTRY %main (a: f32[2,2]) -> f32[2,2] {",
      "  %a = f32[2,2] parameter(0)",
      '  %gemm_fusion.1 = f32[2,2] fusion(%a), kind=kCustom, calls=%outer, metadata={op_name="jit(f)/encoder/dot"}',
      '  %loop_fusion.2 = f32[2,2] fusion(%a), kind=kLoop, calls=%plain, metadata={op_name="jit(f)/exp"}',
      '  ROOT %custom-call.3 = f32[2,2] custom-call(%a), custom_call_target="__cublas$gemm"',
      "}",
  ])
  hlo = step_profile.parse_hlo(text)
  assert hlo["gemm_fusion.1"] == step_profile.HloOp("jit(f)/encoder/dot", True)
  assert hlo["loop_fusion.2"] == step_profile.HloOp("jit(f)/exp", False)
  assert hlo["custom-call.3"].matmul


@pytest.mark.parametrize("op_name, part", [
    ("jit(traced)/jvp(EncoderDecoder)/EncoderDecoder.decode/decoder/layer_0/self_attention_norm/sub", "layer norm"),
    ("jit(traced)/jvp(EncoderDecoder)/EncoderDecoder.encode/encoder/layer_1/attention/bld,df->blf", "attention"),
    ("jit(traced)/jvp(EncoderDecoder)/EncoderDecoder.decode/decoder/layer_0/cross_attention/dropout/ge",
     "dropout and RNG"),
    ("jit(traced)/jit(_threefry_fold_in)/Embed.setup/while/body/add", "dropout and RNG"),
    ("jit(traced)/transpose(jvp(EncoderDecoder))/EncoderDecoder.encode/encoder/layer_0/feed_forward/dot_general",
     "feed-forward"),
    ("jit(traced)/jvp(jit(take_along_axis))/gather", "loss"),
    ("jit(traced)/transpose(EncoderDecoder)/EncoderDecoder.decode/decoder/bld,vd->blv",
     "embeddings, output projection, rest of model"),
    ("jit(traced)/jvp()/cross_entropy/exp", "loss"),
    ("jit(traced)/optimizer/sqrt", "optimizer (gradient scaling, clipping, Adam)"),
    ("jit(traced)/sqrt", step_profile.OTHER_PART),
    ("", step_profile.OTHER_PART),
])
def test_model_part(op_name, part):
  assert step_profile.model_part(op_name) == part


def test_dropout_ops_carry_the_dropout_name_scope():
  """step_profile attributes dropout by this scope; without it dropout's time would count as its caller's."""
  x = jnp.ones((4, 8))
  text = jax.jit(lambda key: ops.dropout(x, 0.5, key)).lower(jax.random.PRNGKey(0)).compile().as_text()
  parts = {step_profile.model_part(op.op_name) for op in step_profile.parse_hlo(text).values() if op.op_name}
  assert "dropout and RNG" in parts


@pytest.mark.slow
def test_the_train_step_names_every_part_the_profile_reports():
  """Every part of PARTS appears in our compiled train step (model, loss and optimizer are named), and the
  unnamed remainder is a small minority of its instructions."""
  config, model_config = train_step.experiment_config("transformer_small", smoke=True)
  model = build_task(config).build_model(model_config)
  with measure.persistent_cache_disabled():  # the test session's cache may hold a program traced before a rename
    step = train_step.compile_step(config, model, train_step.random_batch(2, 8, 8, model_config.vocab_size),
                                   smoke=True)
  named = [op for op in step_profile.parse_hlo(step.compiled.as_text()).values() if op.op_name]
  parts = collections.Counter(step_profile.model_part(op.op_name) for op in named)
  assert set(parts) - {step_profile.OTHER_PART} == {part for part, _ in step_profile.PARTS}
  assert parts[step_profile.OTHER_PART] < 0.1 * len(named)


def _event(op, start, duration, tid=1):
  return {"ph": "X", "pid": 1, "tid": tid, "ts": start, "dur": duration, "name": op, "args": {"hlo_op": op}}


def test_exclusive_op_times_subtract_nested_events_on_the_same_thread_only():
  events = [
      _event("while.1", 0.0, 10.0),
      _event("body_add", 1.0, 3.0),  # inside while.1
      _event("body_mul", 5.0, 2.0),  # inside while.1
      _event("inner", 5.5, 1.0),  # inside body_mul: counts against body_mul, not while.1
      _event("after", 10.0, 4.0),  # starts as while.1 ends: not nested
      _event("other_thread", 2.0, 5.0, tid=2),  # overlaps while.1 in time, on another thread
      {"ph": "X", "pid": 1, "tid": 1, "ts": 2.0, "dur": 1.0, "name": "end: body_add", "args": {}},  # no hlo_op
      {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
  ]
  times = step_profile.exclusive_op_times(events)
  assert times == {"while.1": pytest.approx(5.0), "body_add": pytest.approx(3.0), "body_mul": pytest.approx(1.0),
                   "inner": pytest.approx(1.0), "after": pytest.approx(4.0), "other_thread": pytest.approx(5.0)}
  # Exclusive times add up to the time the outermost events span on each thread.
  assert sum(times.values()) == pytest.approx(10.0 + 4.0 + 5.0)


def test_unannotated_device_kernels_count_by_name_and_match_the_hlo_by_kernel_name():
  events = [{"ph": "X", "pid": 2, "tid": 1, "ts": 0.0, "dur": 3.0, "name": "loop_add_fusion_3"},
            {"ph": "X", "pid": 2, "tid": 1, "ts": 3.0, "dur": 2.0, "name": "sm90_xmma_gemm_bf16bf16"}]
  assert step_profile.exclusive_op_times(events) == {}  # not annotated: nothing unless asked
  times = step_profile.exclusive_op_times(events, by_event_name=True)
  assert times == {"loop_add_fusion_3": pytest.approx(3.0), "sm90_xmma_gemm_bf16bf16": pytest.approx(2.0)}
  hlo = {"loop_add_fusion.3": step_profile.HloOp("jit(f)/optimizer/add", False)}
  assert step_profile.hlo_op_info(hlo, "loop_add_fusion_3") == hlo["loop_add_fusion.3"]
  assert step_profile.hlo_op_info(hlo, "sm90_xmma_gemm_bf16bf16") == step_profile.HloOp("", True)
  assert step_profile.hlo_op_info(hlo, "some_kernel") == step_profile.HloOp("", False)


def test_exclusive_op_times_leave_the_trace_events_unchanged():
  events = [{"ph": "X", "pid": 2, "tid": 1, "ts": 0.0, "dur": 3.0, "name": "loop_add_fusion_3"}]
  step_profile.exclusive_op_times(events, by_event_name=True)
  assert events == [{"ph": "X", "pid": 2, "tid": 1, "ts": 0.0, "dur": 3.0, "name": "loop_add_fusion_3"}]
