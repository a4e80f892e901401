"""GLAForCausalLM: the native GLA behind Transformers' PreTrainedModel and GenerationMixin, so
`AutoModelForCausalLM.from_pretrained(<gla folder>)` and `generate()` work after `import assay`
(assay.models.auto registers it, as flash-linear-attention registers its own GLA).

Weights: the checkpoint keeps fla's key names (model.embeddings.weight, model.layers.{i}.attn.q_proj...);
this class holds the native GLA under `model` and renames on load (Transformers' key_mapping), so one
set of modules serves training, serving and Transformers.

Generation: the cache is Transformers' own, with one LinearAttentionLayer per layer (the config's
layer_types are all "linear_attention"): each holds the layer's fixed-size [B, H, K, V] float32 state,
never keys or values, so a "static" cache is just those states and its size does not depend on the
length. A prompt goes through the chunked form (gla_chunk) from the cached state; one new token through
the recurrent step. With short convolutions the layer's conv state (its last W - 1 projected q, k, v) sits
in the same cache layer's conv slot, as Transformers lays it out: [B, channels, W - 1]. The attention mask is not read: a GLA state has no padding positions, so batched
prompts must be unpadded (or right-padded and cut).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from assay.models.gla.args import GLAArgs
from assay.models.gla.hf_config import GLAConfig
from assay.models.gla.model import GLA
from assay.models.common.linear_attention import ShortConvolution
from assay.models.common.norm import RMSNorm

# fla checkpoint key (regex) -> this class's key. Transformers applies it when loading (key_mapping).
FLA_KEY_MAPPING = {
    r"^model\.embeddings\.": "model.tok_embeddings.",
    r"^lm_head\.": "model.output.",
    r"\.attn_norm\.": ".attention_norm.",
    r"\.mlp_norm\.": ".ffn_norm.",
    r"\.attn\.q_proj\.": ".attention.wq.",
    r"\.attn\.k_proj\.": ".attention.wk.",
    r"\.attn\.v_proj\.": ".attention.wv.",
    r"\.attn\.g_proj\.": ".attention.wg.",
    r"\.attn\.o_proj\.": ".attention.wo.",
    r"\.attn\.gk_proj\.0\.": ".attention.gk_down.",
    r"\.attn\.gk_proj\.1\.": ".attention.gk_up.",
    r"\.attn\.g_norm(_swish_gate)?\.": ".attention.out_norm.",
    r"\.mlp\.gate_proj\.": ".mlp.w1.",
    r"\.mlp\.down_proj\.": ".mlp.w2.",
    r"\.mlp\.up_proj\.": ".mlp.w3.",
    r"\.attn\.([qkv])_conv1d\.": r".attention.\1_conv.",
}


class GLAPreTrainedModel(PreTrainedModel):
    config_class = GLAConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    # A fixed-size recurrent state: it cannot be rolled back to an earlier token (no assisted generation).
    _is_stateful = True
    _supports_sdpa = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # fla's initialisation: normal(0, initializer_range) matrices and embedding, zero biases, unit norms.
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.normal_(0.0, std)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        elif isinstance(module, RMSNorm):
            module.reset_parameters()
        elif isinstance(module, ShortConvolution):
            module.reset_parameters()


class GLAForCausalLM(GLAPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"model.output.weight": "model.tok_embeddings.weight"}

    def __init__(self, config: GLAConfig):
        super().__init__(config)
        self.model = GLA(GLAArgs.from_hf_config(config.to_dict()))
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        # fla's key names on disk, the native module's in memory.
        kwargs.setdefault("key_mapping", FLA_KEY_MAPPING)
        return super().from_pretrained(*args, **kwargs)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.tok_embeddings

    def set_input_embeddings(self, embeddings: nn.Embedding) -> None:
        self.model.tok_embeddings = embeddings

    def get_output_embeddings(self) -> nn.Linear:
        return self.model.output

    def set_output_embeddings(self, output: nn.Linear) -> None:
        self.model.output = output

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: Cache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        # input_ids: [B, T] -> logits [B, T or logits_to_keep, vocab]; cache: one state per layer
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        native = self.model
        h = native.tok_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        short_conv = native.args.use_short_conv
        for layer_id, block in enumerate(native.layers):
            state = cache.get_recurrent_state(layer_id) if use_cache else None
            conv_state = cache.get_conv_state(layer_id) if use_cache and short_conv else None
            conv_state = conv_state.transpose(1, 2) if conv_state is not None else None  # -> [B, W - 1, channels]
            if state is not None and h.shape[1] == 1:
                h, new_state, new_conv_state = block.step(h, state, conv_state)
            else:
                h, new_state, new_conv_state = block(h, state, output_final_state=use_cache, conv_state=conv_state)
            if use_cache:
                cache.update_recurrent_state(new_state, layer_id)
                if short_conv:
                    # The whole W - 1 window each time: Transformers keeps the last conv_kernel_size columns of
                    # what it holds and what it is given, which is then this window.
                    cache.update_conv_state(new_conv_state.transpose(1, 2), layer_id, conv_kernel_size=native.args.conv_size - 1)
                # Transformers marks a linear layer as holding history only from its conv-state update;
                # a GLA layer has no short convolution, so it says so itself.
                cache.layers[layer_id].has_previous_state[0] = True
        logits = native.logits(native.norm(h), logits_to_keep)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache if use_cache else None)


__all__ = ["FLA_KEY_MAPPING", "GLAForCausalLM", "GLAPreTrainedModel"]
