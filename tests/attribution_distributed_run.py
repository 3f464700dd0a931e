"""Run under ``torchrun --nproc_per_node 2`` by ``tests/test_attribution_distributed.py``: the graphs of one
prompt, and of two sharing their passes, every rank computing its share; rank 0 saves them to the path given."""

import sys

import torch

from analysis.attribution_graphs import attribute, attribute_prompts
from interp_transformer.harvest.distributed import init_distributed
from tests.attribution_graph_helpers import PROMPT, folded, transcoders


def main(out: str) -> None:
    group = init_distributed()
    model = folded("llama_gqa", torch.float64)
    tc = transcoders(model, "topk")
    full = attribute(model, tc, PROMPT, batch_size=4)
    kept = attribute(model, tc, PROMPT, batch_size=4, max_feature_nodes=13)
    batched = attribute_prompts(model, tc, [PROMPT, PROMPT[:3]], batch_size=4, max_padding=1.0)
    if group.is_rank0:
        saved = {"world": group.world_size, "full": vars(full), "kept": vars(kept)}
        torch.save(saved | {"batched": [vars(graph) for graph in batched]}, out)
    group.close()


if __name__ == "__main__":
    main(sys.argv[1])
