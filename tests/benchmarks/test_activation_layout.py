"""What benchmarks/activation_layout.py counts in a compiled program's HLO (its smoke run: test_smoke.py)."""
from benchmarks.activation_layout import collective_counts

# Lines of the kinds XLA:CPU writes (a tuple all-to-all and its uses, a fused all-reduce), and an asynchronous pair.
HLO = """
  %all-to-all.29 = (f32[16,64,1,64]{3,2,1,0}, f32[16,64,1,64]{3,2,1,0}) all-to-all(%slice.40, %slice.39), channel_id=1
  %get-tuple-element.3 = f32[16,64,1,64]{3,2,1,0} get-tuple-element(%all-to-all.29), index=0
  %get-tuple-element.4 = f32[16,64,1,64]{3,2,1,0} get-tuple-element(%all-to-all.29), index=1
  %all-reduce.530 = (f32[], f32[32,64]{1,0}) all-reduce(%wrapped_reduce, %fusion.476), channel_id=169, to_apply=%add
  %all-gather-start = (f32[4], f32[16]) all-gather-start(%p0), channel_id=2, dimensions={0}
  %all-gather-done = f32[16] all-gather-done(%all-gather-start)
  %fusion.7 = f32[16] fusion(%all-gather-done), kind=kLoop, calls=%fused_all-reduce_like_name
"""


def test_each_collective_instruction_counts_once_whatever_its_results_and_uses():
  assert collective_counts(HLO) == {"all-gather": 1, "all-reduce": 1, "all-to-all": 1, "reduce-scatter": 0,
                                    "collective-permute": 0}
