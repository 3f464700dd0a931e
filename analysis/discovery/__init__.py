"""Circuit discovery: which components and sites carry the difference between clean and corrupted prompts.

``batched``: activation patching of many sites in one forward pass, the patches laid along
the batch axis, in chunks that fit a memory budget; equal to patching one site at a time.
"""

from .batched import (
    COMPONENTS,
    Site,
    logit_diff_per_row,
    patch_sites,
    patch_sites_one_by_one,
    patching_figure,
    sites,
)

__all__ = [
    "COMPONENTS",
    "Site",
    "logit_diff_per_row",
    "patch_sites",
    "patch_sites_one_by_one",
    "patching_figure",
    "sites",
]
