"""AdamW's two parameter groups, chosen by what each parameter does, never by what it is called.

Weight decay pulls weight matrices towards zero. It has no business with the parameters that
set a scale or an offset: norm gains and biases, biases of linear maps, and embedding tables
(a row of ``W_E`` is only trained when its token occurs, so decay would shrink rare tokens'
rows for no reason). Each parameter gets one role, asked of the part that holds it:

``"norm"``
    a parameter of a norm: a part with the norm protocol (``fold_into`` and ``removes_mean``,
    ``components.layer_norm``) or one of torch's norm layers;
``"embedding"``
    a parameter of a part that writes to the residual stream while reading none of it
    (``output_weights()`` declared, no ``input_weights()``): token, position and token-type
    embeddings, whose input is ids; or of a ``torch.nn.Embedding``;
``"bias"``
    the bias ``b`` of a pair ``(W, b)`` a part reads its input with (``input_weights()``: the
    per-head ``b_Q``/``b_K``/``b_V`` as well); a parameter shaped as the output of one of its
    part's matrices, ``W.shape`` without its input axis (cross-attention's ``b_K``/``b_V``,
    which read the encoder's output and so are no pair of ``input_weights()``); and every
    other parameter with fewer than two axes (``b_O``, ``b_out``, ``b_U``, an attention sink's
    logits, an adapter's gate);
``"matrix"``
    every other parameter: ``W_Q``, ``W_O``, ``W_in``, ``W_U``, a router, a relative-position
    table that writes attention scores.

Only ``"matrix"`` parameters are decayed. Renaming a module or a parameter changes nothing:
the roles come from the parts' protocols and the parameters' shapes.

>>> from interp_transformer import DemoTransformer, TransformerConfig
>>> model = DemoTransformer(TransformerConfig(d_model=8, n_layers=1, n_heads=2, d_head=4, d_mlp=16, d_vocab=5, n_ctx=4))
>>> roles = parameter_roles(model)
>>> roles["embed.W_E"], roles["blocks.0.ln1.w"], roles["blocks.0.attn.b_Q"], roles["blocks.0.attn.W_Q"]
('embedding', 'norm', 'bias', 'matrix')
"""

from torch import nn

ROLES = ("matrix", "bias", "norm", "embedding")
DECAYED_ROLES = ("matrix",)
TORCH_NORMS = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a norm: it follows the norm protocol, or is one of torch's norm layers."""
    protocol = callable(getattr(module, "fold_into", None)) and hasattr(module, "removes_mean")
    return protocol or isinstance(module, TORCH_NORMS)


def is_embedding(module: nn.Module) -> bool:
    """Whether ``module`` is an embedding: it writes to the residual stream and reads none of it (its input is
    ids), or is a ``torch.nn.Embedding``."""
    writes_without_reading = callable(getattr(module, "output_weights", None)) and not callable(
        getattr(module, "input_weights", None)
    )
    return writes_without_reading or isinstance(module, nn.Embedding)


def _paired_biases(model: nn.Module) -> set[int]:
    """The ids of the biases ``b`` of the ``(W, b)`` pairs the parts read their inputs with."""
    biases: set[int] = set()
    for module in model.modules():
        input_weights = getattr(module, "input_weights", None)
        if callable(input_weights):
            biases.update(id(b) for _, b in input_weights() if b is not None)
    return biases


def parameter_roles(model: nn.Module) -> dict[str, str]:
    """Each parameter's role (see the module docstring), by its name in ``model.named_parameters()``.

    A parameter shared by two parts (tied weights) is named once, as ``named_parameters`` names it, and takes
    the role of the first part that holds it.
    """
    biases = _paired_biases(model)
    role_of: dict[int, str] = {}
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if not own:
            continue
        part_role = "norm" if is_norm(module) else "embedding" if is_embedding(module) else None
        outputs = {W.shape[:-2] + W.shape[-1:] for W in own if W.dim() >= 3}  # the shapes a matrix's bias has
        for parameter in own:
            if id(parameter) in role_of:
                continue
            is_bias = id(parameter) in biases or parameter.dim() < 2 or parameter.shape in outputs
            role_of[id(parameter)] = part_role or ("bias" if is_bias else "matrix")
    return {name: role_of[id(parameter)] for name, parameter in model.named_parameters()}


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW's groups: the ``"matrix"`` parameters with ``weight_decay``, every other one with none."""
    roles = parameter_roles(model)
    parameters = dict(model.named_parameters())
    decayed = [name for name in parameters if roles[name] in DECAYED_ROLES]
    kept = [name for name in parameters if roles[name] not in DECAYED_ROLES]
    return [
        {"params": [parameters[name] for name in decayed], "weight_decay": weight_decay},
        {"params": [parameters[name] for name in kept], "weight_decay": 0.0},
    ]


__all__ = ["DECAYED_ROLES", "ROLES", "is_embedding", "is_norm", "parameter_groups", "parameter_roles"]
