"""What every native model shares, written once, one module per concern (torchtitan's models/common):

  args.py                ModelArgs / TransformerArgs: shared fields and checks, config.json both ways, --spec overrides
  key_map.py             KeyMap: the checkpoint key loops over a declarative map
  tp_plan.py             TP plans as data (applied by assay.models.parallel)
  norm.py, rope.py, attention.py, feed_forward.py, linear_attention.py   the layers and kernel seams
  block.py               TransformerBlock: the residual wiring (optional sandwich norms)
  kv_cache.py            the static KV cache and its decoding loop (batched prefill, window rings)
  decoder.py             the roots: NativeDecoder, RotaryDecoder
  counting.py            parameter counts for the MFU formula
  overrides.py           "layers=4,heads=2" parsing

The kernel registry (assay.kernels) targets the layer classes here, never a model class, so a new
architecture that builds from these layers gets the kernels with no kernel change:
  rope.RotaryEmbedding              (q, k, cos, sin) -> (q, k), [B, T, H, D]      kernel "rope"
  attention.CausalAttention         (q, k, v) -> out, [B, T, H, D]                 kernel "attention"
  feed_forward.GroupedExperts       (x, top_k_index, top_k_weights) -> out          kernel "grouped_experts"
  linear_attention.GLAOperator      (q, k, v, g, initial_state, output_final_state)  kernel "gla_chunk"
"""
