import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from ..shape_checks import shape_checked


class LayerNorm(nn.Module):
    """LayerNorm over ``d_model``: ``normalized = (x - mean(x)) / scale * w + b``.

    ``hook_scale`` is ``sqrt(mean((x - mean(x))^2) + eps)``, shape ``[batch, pos, 1]``;
    ``hook_normalized`` is the output, after ``w`` and ``b``. Freezing ``scale``
    (reading it from a cache) makes LayerNorm affine in ``x``, which is what
    direct logit attribution relies on.

    The explicit formula is the reference and the only path that produces ``scale``;
    while nothing hooks or caches ``hook_scale``, PyTorch's fused ``layer_norm``
    (the same formula in one pass) runs instead. ``uses_fused_path()`` decides.
    """

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.w = nn.Parameter(torch.ones(d_model))
        self.b = nn.Parameter(torch.zeros(d_model))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        self.use_fused_layer_norm = True  # set False to always run the explicit path

    def uses_fused_path(self) -> bool:
        """True when the fused kernel may run: nobody observes the scale."""
        return self.use_fused_layer_norm and not self.hook_scale.has_hooks()

    @shape_checked
    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if self.uses_fused_path():
            return self.hook_normalized(F.layer_norm(x, self.w.shape, self.w, self.b, self.eps))
        x = x - x.mean(dim=-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale * self.w + self.b)
