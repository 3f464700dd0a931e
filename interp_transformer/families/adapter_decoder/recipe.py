"""GPT-2 with a tanh-gated bottleneck adapter beside every MLP: the worked example of a new kind of writer.

The family is this module, its parts (``components/adapter.py``) and one ``register`` line:
no tool names it. See ``docs/architecture.md``, "A new kind of writer".
"""

from dataclasses import dataclass

from interp_transformer.families.gpt2.recipe import CAPABILITIES, TransformerConfig
from interp_transformer.families.recipe_parts import decoder_parts, fixed_architecture, layer_norms
from interp_transformer.families.registry import DecoderParts
from interp_transformer.hooks.names import DECODER_HOOK_NAMES, HookNames
from interp_transformer.parts import MLP, Attention, PosEmbed
from interp_transformer.parts.adapter import GatedAdapter
from interp_transformer.parts.blocks import PreNormBlock


@dataclass(frozen=True)
class AdapterDecoderConfig(TransformerConfig):
    """A GPT-2 config and the adapter's bottleneck width ``d_adapter`` (its activation is ``act_fn``'s)."""

    d_adapter: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.d_mlp is None:
            raise ValueError(
                "an adapter decoder runs its adapter beside an MLP: d_mlp must be a positive int, got None"
            )
        if isinstance(self.d_adapter, bool) or not isinstance(self.d_adapter, int) or self.d_adapter <= 0:
            raise ValueError(f"d_adapter must be a positive int, got {self.d_adapter!r}")


def build(cfg: AdapterDecoderConfig) -> DecoderParts:
    """GPT-2's parts, with an adapter beside each block's MLP."""

    norm = layer_norms(cfg)

    def block(layer: int) -> PreNormBlock:
        adapter = GatedAdapter(cfg.d_model, cfg.d_adapter, cfg.act_fn)
        return PreNormBlock(norm(), Attention(cfg), norm(), MLP(cfg), beside_mlp={"adapter": adapter})

    return decoder_parts(cfg, block, norm, pos_embed=PosEmbed(cfg))


HOOK_NAMES = HookNames(
    layer_keys={
        **DECODER_HOOK_NAMES.layer_keys,
        "adapter_out": "blocks.{layer}.hook_adapter_out",
        "adapter_pre": "blocks.{layer}.adapter.hook_pre",
        "adapter_post": "blocks.{layer}.adapter.hook_post",
    },
    global_keys=dict(DECODER_HOOK_NAMES.global_keys),
)

ARCHITECTURE = fixed_architecture("adapter_decoder", AdapterDecoderConfig, build, HOOK_NAMES, CAPABILITIES)
