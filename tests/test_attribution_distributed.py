"""Attribution under torchrun (two CPU processes, gloo): every rank computes its share of the targets, and the graph
equals one process's."""

import os
import subprocess
import sys
from pathlib import Path

import torch

from analysis.attribution_graphs import attribute, attribute_prompts

from .attribution_graph_helpers import PROMPT, folded, transcoders

ROOT = Path(__file__).resolve().parents[1]


def test_two_ranks_give_one_processs_graph(tmp_path):
    out = tmp_path / "graphs.pt"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += [str(ROOT / "tests" / "attribution_distributed_run.py"), str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = torch.load(out, weights_only=False)
    assert saved["world"] == 2
    model = folded("llama_gqa", torch.float64)
    tc = transcoders(model, "topk")
    full = attribute(model, tc, PROMPT, batch_size=4)
    assert torch.equal(saved["full"]["adjacency_matrix"], full.adjacency_matrix)  # the same chunks, the same kernels
    assert torch.equal(saved["full"]["bias"], full.bias)
    kept = attribute(model, tc, PROMPT, batch_size=8, max_feature_nodes=13)  # 4 per rank per round = 8 per round
    assert torch.equal(saved["kept"]["selected_features"], kept.selected_features)
    torch.testing.assert_close(saved["kept"]["adjacency_matrix"], kept.adjacency_matrix, rtol=0, atol=1e-12)
    torch.testing.assert_close(saved["kept"]["unselected_effect"], kept.unselected_effect, rtol=0, atol=1e-12)
    batched = attribute_prompts(model, tc, [PROMPT, PROMPT[:3]], batch_size=4, max_padding=1.0)
    for saved_graph, graph in zip(saved["batched"], batched, strict=True):
        assert torch.equal(saved_graph["adjacency_matrix"], graph.adjacency_matrix)  # each rank's passes, summed
