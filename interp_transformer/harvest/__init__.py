"""Harvest activations over a corpus: sharded, resumable, reproducible, and spread over processes with ``torchrun``.

>>> import tempfile
>>> from interp_transformer.harvest import ActivationShards, harvest
>>> documents = [[3, 7, 11, 5, 9, 2, 8, 4] * 4, [6, 1, 12, 13] * 5]   # token ids: induction-2l has no tokenizer
>>> folder = tempfile.TemporaryDirectory()
>>> out = folder.name
>>> manifest = harvest("induction-2l", documents, out, hooks="blocks.*.hook_resid_post", context_length=9,
...                    batch_size=2, bos_token_id=0, progress=False)
>>> manifest.n_contexts, manifest.hook_names
(6, ['blocks.0.hook_resid_post', 'blocks.1.hook_resid_post'])
>>> ActivationShards(out)[0]["blocks.1.hook_resid_post"].shape      # [pos, d_model]
torch.Size([9, 64])
>>> folder.cleanup()

Axes: stored tensors add ``context`` (a context's global index) in front of a
hook's own axes, e.g. ``[context, pos, d_model]``.

Pieces, one file each: ``corpus`` (where documents come from), ``contexts``
(tokens -> fixed-length contexts, the BOS convention), ``selection`` (which
hooks, how deep), ``budget`` (batch and shard sizes under a memory budget),
``fingerprint`` (what determines the activations, hashed), ``manifest``
(``manifest.json``), ``storage`` (atomic files), ``distributed`` (the process
group), ``run`` (``harvest`` itself), ``dataset`` (reading back), ``saelens``
(export to SAELens' cached-activations layout) and ``cli`` (the command line).
"""

from interp_transformer.harvest.contexts import iter_contexts, make_contexts
from interp_transformer.harvest.corpus import Corpus, as_corpus
from interp_transformer.harvest.dataset import ActivationShards, ActivationStream, ShardShuffleSampler
from interp_transformer.harvest.manifest import Manifest, ShardRecord
from interp_transformer.harvest.run import harvest
from interp_transformer.harvest.saelens import export_saelens
from interp_transformer.harvest.selection import select_hooks

__all__ = [
    "ActivationShards",
    "ActivationStream",
    "Corpus",
    "Manifest",
    "ShardRecord",
    "ShardShuffleSampler",
    "as_corpus",
    "export_saelens",
    "harvest",
    "iter_contexts",
    "make_contexts",
    "select_hooks",
]
