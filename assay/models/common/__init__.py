"""What every native model shares, written once, one module per concern (torchtitan's models/common):

  args.py                ModelArgs / TransformerArgs: shared fields and checks, config.json both ways, --spec overrides
  state_dict_adapter.py  KeyMapAdapter: the checkpoint key loops over a declarative map
  tp_plan.py             TP plans as data (applied by assay.models.parallel)
  norm.py, rope.py, attention.py, feed_forward.py, linear_attention.py   the layers and kernel seams
  block.py               TransformerBlock: the residual wiring (optional sandwich norms)
  kv_cache.py            the static KV cache and its decoding loop (batched prefill, window rings)
  decoder.py             the roots: NativeDecoder, RotaryDecoder
  counting.py            parameter counts for the MFU formula
  overrides.py           "layers=4,heads=2" parsing

assay.models.layers re-exports the layers' public names.
"""
