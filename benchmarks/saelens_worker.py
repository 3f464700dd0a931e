"""Read a SAELens-layout export with SAELens' own ActivationsStore; run inside the SAELens venv.

    .venv-saelens/bin/python benchmarks/saelens_worker.py DATASET_DIR HOOK CONTEXT_SIZE D_IN N_ROWS OUT.safetensors

Builds ``ActivationsStore(cached_activations_path=DATASET_DIR, dataset=None, ...)``,
takes one raw batch of N_ROWS contexts (``get_raw_llm_batch``: activations
``[(N_ROWS * CONTEXT_SIZE), D_IN]`` and token ids) and saves both to OUT, so that
tests/test_harvest.py can compare them with the harvest they came from.
SAELens pins TransformerLens, which cannot share our environment: see
benchmarks/saelens_env.sh.
"""

import sys

import torch
from sae_lens.training.activations_store import ActivationsStore
from safetensors.torch import save_file


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        print(__doc__, file=sys.stderr)
        return 2
    path, hook = argv[0], argv[1]
    context_size, d_in, n_rows = int(argv[2]), int(argv[3]), int(argv[4])
    store = ActivationsStore(
        model=None,
        dataset=None,
        streaming=False,
        hook_name=hook,
        hook_head_index=None,
        context_size=context_size,
        d_in=d_in,
        n_batches_in_buffer=2,
        total_training_tokens=n_rows * context_size,
        store_batch_size_prompts=n_rows,
        train_batch_size_tokens=context_size,
        prepend_bos=True,
        normalize_activations="none",
        device=torch.device("cpu"),
        dtype="float32",
        cached_activations_path=path,
    )
    acts, token_ids = store.get_raw_llm_batch()
    save_file({"acts": acts.contiguous(), "token_ids": token_ids.contiguous()}, argv[5])
    print(f"SAELens read {tuple(acts.shape)} activations and {tuple(token_ids.shape)} token ids from {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
