"""Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss): a router picks ``top_k`` gated MLPs per token.

For each token with normalized residual ``x``::

    router_logits   = x W_router (+ b_router)                   [expert]
    expert_weights  = softmax(router_logits)                    [expert]   (TransformerLens' name)
    expert_indices  = the top_k experts by expert_weights       [top_k]
    routing_weights = expert_weights[expert_indices]            [top_k]    divided by their sum when
                                                                           normalize_routing (Mixtral)
    out = sum_j routing_weights[j] * expert_{expert_indices[j]}(x)
        + sigmoid(x W_shared_gate) * shared_expert(x)           (Qwen2-MoE's shared expert, if any)

Each expert is a ``GatedMLP`` (``experts.E.hook_pre`` is its gate, ``hook_pre_linear`` its
up projection, ``hook_post`` the gated product; TransformerLens' MoE experts name the gate
``hook_gate`` and the up projection ``hook_pre`` instead), or any MLP part given as
``expert_part`` (``MLP``: a plain two-layer MLP with biases; ``ClampedSwiGLU``, gpt-oss's, whose
alpha and limit come in ``expert_settings``); ``router_bias=True`` gives the router a bias
``b_router``. ``routing_order="top_k_then_softmax"`` (gpt-oss) picks the top_k experts by
their router logits and takes the softmax over those alone::

    expert_indices  = the top_k experts by router_logits
    routing_weights = softmax(router_logits[expert_indices])    (in the logits' dtype, as Hugging Face)

the same weights as renormalised ``softmax_then_top_k`` (the default) in exact arithmetic, in
the reference's order of operations; ``hook_expert_weights`` is still the softmax over every
expert. Hooks of the router, in the order they fire:

==========================  =======================  ==================================================
hook                        shape                    value
==========================  =======================  ==================================================
``hook_router_logits``      ``batch pos expert``     ``x W_router (+ b_router)`` (HF's ``router_logits``)
``hook_expert_weights``     ``batch pos expert``     ``softmax(router_logits)`` over every expert
``hook_expert_indices``     ``batch pos top_k``      the chosen experts, largest weight first (int64)
``hook_routing_weights``    ``batch pos top_k``      what each chosen expert's output is multiplied by
``hook_shared_expert_gate`` ``batch pos 1``          ``sigmoid(x W_shared_gate)`` (shared expert only)
==========================  =======================  ==================================================

A hook may replace the indices (to force a routing): the routing weights are then read
from ``expert_weights`` at the indices given (``top_k_then_softmax``: the softmax of the router
logits at the indices given). The softmax, top-k and normalisation run in float32 for a
half-precision model, as Hugging Face's Mixtral and Qwen routers do, and in the model's dtype
otherwise; gpt-oss's softmax over the chosen logits runs in the logits' dtype, as its router does.

Two paths compute the experts' sum, chosen in one place, ``uses_sparse_path()``:

- the **explicit path** runs *every* expert on *every* token (the readable formula, and the
  reference): ``out = sum_E weight_E * expert_E(x)``, with ``weight_E`` the routing weight of
  expert ``E`` where it was chosen and 0 elsewhere. Each expert's hooks then hold that
  expert's activations on every token, chosen or not.
- the **sparse path** runs each expert only on the tokens that chose it, as the checkpoints
  are meant to run. It is used while no hook (forward or backward, a cache's included) is
  attached to any expert's hooks, the tensors are not on the meta device, and
  ``use_sparse_experts`` is True. The two agree to float rounding (tested).

Weights: ``W_router [d_model, expert]``; ``experts[E].W_gate``, ``W_in``, ``b_in``, ``W_out``,
``b_out`` as in ``GatedMLP``; ``stacked("W_in")`` gives ``[expert, d_model, d_mlp]``. A model's
stacked ``model.W_in`` (over layers) has no meaning here and raises, naming these.
"""

from types import SimpleNamespace
from typing import Any, NamedTuple

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.hooks import HookPoint
from interp_transformer.parts.affine import affine
from interp_transformer.parts.gated_mlp import GatedMLP

EXPERT_WEIGHTS = ("W_gate", "b_gate", "W_in", "b_in", "W_out", "b_out")
ROUTING_ORDERS = ("softmax_then_top_k", "top_k_then_softmax")  # MixtureOfExperts' routing_order


class Routing(NamedTuple):
    """Which experts each token uses: ``indices`` and ``weights``, both ``[batch, pos, top_k]``."""

    indices: Int[Tensor, "batch pos top_k"]
    weights: Float[Tensor, "batch pos top_k"]

    def per_expert(self, n_experts: int) -> Float[Tensor, "batch pos expert"]:
        """The weight of every expert, 0 where it was not chosen (a twice-chosen expert gets both weights)."""
        dense = self.weights.new_zeros(*self.weights.shape[:-1], n_experts)
        return dense.scatter_add(-1, self.indices, self.weights)


def routing_dtype(dtype: torch.dtype) -> torch.dtype:
    """What routing computes in: float32 for half-precision models, their own dtype otherwise."""
    return torch.promote_types(dtype, torch.float32)


class MixtureOfExperts(nn.Module):
    """A router and ``n_experts`` gated MLPs, ``experts_per_token`` of them per token (see the module docstring)."""

    experts: Any  # an nn.ModuleList of expert_part (GatedMLP, MLP) parts: its items read as the parts they are

    axis_sizes = {"d_model": "W_router[0]"}  # where the entry check finds this part's sizes (core.shape_checks)

    def __init__(
        self,
        d_model: int,
        d_mlp: int,
        n_experts: int,
        experts_per_token: int,
        act_fn: str,
        normalize_routing: bool,
        d_mlp_shared: int | None = None,
        *,
        expert_part: type = GatedMLP,
        router_bias: bool = False,
        expert_settings: dict | None = None,
        routing_order: str = "softmax_then_top_k",
    ):
        super().__init__()
        if routing_order not in ROUTING_ORDERS:
            raise ValueError(f"routing_order must be one of {ROUTING_ORDERS}, got {routing_order!r}")
        if routing_order == "top_k_then_softmax" and not normalize_routing:
            raise ValueError(
                "routing_order='top_k_then_softmax' gives weights that sum to 1 (normalize_routing=True); "
                "got normalize_routing=False"
            )
        if not isinstance(router_bias, bool):
            raise ValueError(f"router_bias must be a bool, got {router_bias!r}")
        if not (isinstance(expert_part, type) and issubclass(expert_part, nn.Module)):
            raise ValueError(f"expert_part must be an MLP part class (GatedMLP, MLP), got {expert_part!r}")
        for name, value in (
            ("d_model", d_model),
            ("d_mlp", d_mlp),
            ("n_experts", n_experts),
            ("experts_per_token", experts_per_token),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if experts_per_token > n_experts:
            raise ValueError(f"experts_per_token={experts_per_token} must be at most n_experts={n_experts}")
        self.n_experts, self.experts_per_token, self.normalize_routing = (
            n_experts,
            experts_per_token,
            bool(normalize_routing),
        )
        self.routing_order = routing_order
        self.use_sparse_experts = True  # set False to always run the explicit path
        self.W_router = nn.Parameter(torch.empty(d_model, n_experts))
        self.b_router = nn.Parameter(torch.zeros(n_experts)) if router_bias else None
        self.hook_router_logits = HookPoint()
        self.hook_expert_weights = HookPoint()
        self.hook_expert_indices = HookPoint()
        self.hook_routing_weights = HookPoint()
        expert = SimpleNamespace(**(expert_settings or {}), d_model=d_model, d_mlp=d_mlp, act_fn=act_fn)
        self.experts = nn.ModuleList(expert_part(expert) for _ in range(n_experts))
        self.shared_expert: GatedMLP | None = None
        if d_mlp_shared is not None:
            self.shared_expert = GatedMLP(SimpleNamespace(d_model=d_model, d_mlp=d_mlp_shared, act_fn=act_fn))
            self.W_shared_gate = nn.Parameter(torch.empty(d_model, 1))
            self.hook_shared_expert_gate = HookPoint()
        self._expert_hooks = [module for module in self.experts.modules() if isinstance(module, HookPoint)]

    # --- weights --------------------------------------------------------------------------
    def stacked(self, name: str) -> Tensor:
        """One expert weight stacked over experts: ``stacked("W_in")`` is ``[expert, d_model, d_mlp]``."""
        if name not in EXPERT_WEIGHTS:
            raise KeyError(f"stacked() stacks the expert weights {EXPERT_WEIGHTS}, got {name!r}")
        if not hasattr(self.experts[0], name):
            raise KeyError(f"these experts are {type(self.experts[0]).__name__}s, which have no {name}")
        return torch.stack([getattr(expert, name) for expert in self.experts])

    def why_no_weight(self, name: str) -> str:
        """Why a model-level stacked weight (``model.W_in``) is refused here: what to read instead."""
        return (
            f"this layer's MLP is a mixture of {self.n_experts} experts, so there is no single {name}; read one "
            "expert's "
            f"(model.blocks[L].mlp.experts[E].{name}) or every expert's (model.blocks[L].mlp.stacked({name!r}), "
            "[expert, ...]), and the router's model.blocks[L].mlp.W_router [d_model, expert]"
        )

    def input_weights(self) -> list[tuple[Tensor, Tensor | None]]:
        """``(W, b)`` pairs reading this part's input (the router, every expert, the shared expert and its gate)."""
        pairs: list[tuple[Tensor, Tensor | None]] = [(self.W_router, self.b_router)]
        for expert in self.experts:
            pairs += expert.input_weights()
        if self.shared_expert is not None:
            pairs += self.shared_expert.input_weights() + [(self.W_shared_gate, None)]
        return pairs

    def output_weights(self) -> list[Tensor]:
        """Weights whose last axis is ``d_model``: every expert's ``W_out``/``b_out`` (and the shared expert's)."""
        experts = list(self.experts) + ([self.shared_expert] if self.shared_expert is not None else [])
        return [weight for expert in experts for weight in expert.output_weights()]

    # --- as a writer of the residual stream (components.writers) ---------------------------
    routes_tokens = True

    def write_units(self) -> None:
        """None: the neurons belong to one expert each (``analysis.readouts.experts`` reads them)."""
        return None

    def bias_hooks(self) -> list[str]:
        """The routing hooks the biases' write depends on: chosen experts, their weights, the shared gate."""
        names = [self.hook_expert_indices.name, self.hook_routing_weights.name]
        return names + ([self.hook_shared_expert_gate.name] if self.shared_expert is not None else [])

    def bias_write(self, at) -> Float[Tensor, "... d_model"]:
        """The chosen experts' ``b_out`` times their routing weights (plus the shared expert's, times its gate)."""
        indices, weights = at(self.hook_expert_indices.name), at(self.hook_routing_weights.name)
        written = einops.einsum(weights, self.stacked("b_out")[indices], "... top_k, ... top_k d_model -> ... d_model")
        if self.shared_expert is not None:
            written = written + at(self.hook_shared_expert_gate.name) * self.shared_expert.b_out
        return written

    def expert_hooks(self) -> list[str]:
        """The hooks ``expert_writes`` reads: every expert's ``hook_post``, the routing (and the shared expert's)."""
        names = [expert.hook_post.name for expert in self.experts] + self.bias_hooks()
        return names + ([self.shared_expert.hook_post.name] if self.shared_expert is not None else [])

    def expert_writes(self, at) -> Float[Tensor, "expert ... d_model"]:
        """Each expert's share of the output, ``weight_E (post_E W_out_E + b_out_E)`` (0 where it was not chosen),
        then the shared expert's ``gate * shared(x)``: they sum to the output. Read from hooks on the experts,
        which run them on every token (the explicit path)."""
        routing = Routing(at(self.hook_expert_indices.name), at(self.hook_routing_weights.name))
        weights = routing.per_expert(self.n_experts)
        rows = [
            weights[..., number, None] * affine(at(expert.hook_post.name), expert.W_out, expert.b_out)
            for number, expert in enumerate(self.experts)
        ]
        if self.shared_expert is not None:
            shared = self.shared_expert
            gate = at(self.hook_shared_expert_gate.name)
            rows.append(gate * affine(at(shared.hook_post.name), shared.W_out, shared.b_out))
        return torch.stack(rows)

    # --- forward --------------------------------------------------------------------------
    def uses_sparse_path(self, x: Tensor) -> bool:
        """True when each expert may run on its own tokens only: nobody observes the experts' hooks."""
        return self.use_sparse_experts and not x.is_meta and not any(hook.has_hooks() for hook in self._expert_hooks)

    @shape_checked
    def forward(self, normalized: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        routing = self.route(normalized)
        if self.uses_sparse_path(normalized):
            out = self._sparse_experts(normalized, routing)
        else:
            out = self._explicit_experts(normalized, routing)
        if self.shared_expert is not None:
            shared = self.shared_expert(normalized)
            # x @ W_shared_gate is einsum(x, W_shared_gate, "batch pos d_model, d_model one -> batch pos one")
            gate = self.hook_shared_expert_gate(torch.sigmoid(normalized @ self.W_shared_gate))
            out = out + gate * shared
        return out

    def route(self, normalized: Float[Tensor, "batch pos d_model"]) -> Routing:
        """The router: which ``top_k`` experts each token uses, and their weights (hooks fire in order)."""
        # x @ W_router is einsum(x, W_router, "batch pos d_model, d_model expert -> batch pos expert")
        router_logits = normalized @ self.W_router
        router_logits = self.hook_router_logits(
            router_logits if self.b_router is None else router_logits + self.b_router
        )
        expert_weights = self.hook_expert_weights(
            router_logits.softmax(dim=-1, dtype=routing_dtype(router_logits.dtype))
        )
        if self.routing_order == "top_k_then_softmax":  # the top_k logits, then the softmax over those alone
            indices = self.hook_expert_indices(router_logits.topk(self.experts_per_token, dim=-1).indices)
            chosen = router_logits.gather(-1, indices).softmax(dim=-1)
        else:
            indices = self.hook_expert_indices(expert_weights.topk(self.experts_per_token, dim=-1).indices)
            chosen = expert_weights.gather(-1, indices)
            if self.normalize_routing:
                chosen = chosen / chosen.sum(dim=-1, keepdim=True)
        return Routing(indices, self.hook_routing_weights(chosen.to(normalized.dtype)))

    def _explicit_experts(self, x: Tensor, routing: Routing) -> Tensor:
        """``sum_E weight_E * expert_E(x)`` with every expert on every token (``weight_E = 0`` where not chosen)."""
        weights = routing.per_expert(self.n_experts)
        outputs = torch.stack([expert(x) for expert in self.experts])
        return einops.einsum(weights, outputs, "batch pos expert, expert batch pos d_model -> batch pos d_model")

    def _sparse_experts(self, x: Tensor, routing: Routing) -> Tensor:
        """The same sum, each expert run only on the tokens that chose it."""
        tokens = einops.rearrange(x, "batch pos d_model -> (batch pos) d_model")
        indices = einops.rearrange(routing.indices, "batch pos top_k -> (batch pos) top_k")
        weights = einops.rearrange(routing.weights, "batch pos top_k -> (batch pos) top_k")
        out = torch.zeros_like(tokens)
        for number, expert in enumerate(self.experts):
            token, slot = torch.where(indices == number)
            if token.numel():
                chosen = einops.rearrange(tokens[token], "token d_model -> 1 token d_model")
                written = einops.rearrange(expert(chosen), "1 token d_model -> token d_model")
                out.index_add_(0, token, written * weights[token, slot, None])
        return einops.rearrange(out, "(batch pos) d_model -> batch pos d_model", batch=x.shape[0])

    def extra_repr(self) -> str:
        shared = ", shared expert" if self.shared_expert is not None else ""
        routing = f"experts_per_token={self.experts_per_token}, normalize_routing={self.normalize_routing}"
        routing += "" if self.routing_order == "softmax_then_top_k" else f", routing_order={self.routing_order!r}"
        return f"n_experts={self.n_experts}, {routing}{shared}"


__all__ = ["EXPERT_WEIGHTS", "MixtureOfExperts", "ROUTING_ORDERS", "Routing", "routing_dtype"]
