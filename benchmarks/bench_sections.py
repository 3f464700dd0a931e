"""The timed sections of ``bench.py`` (forward, ``run_with_cache``, generation, FLOP/s), one table each.

Every section takes our model, the Hugging Face models holding the same weights
(``hf``: attention implementation -> model, eager first; the last is the fastest,
the one generation and FLOP/s compare with) and the model's ``targets`` (a dict of
ratios, see ``bench.BENCH_MODELS``); each table title starts with the model's name.
"""

import collections
import statistics

import torch

from bench_report import Table
from bench_timing import TransformerLensWorker, interleaved_medians, meets, timed
from hf_models import random_tokens

PROMPT_LEN, NEW_TOKENS = 16, 64
LOGITS_TOLERANCE = 1e-3  # largest |our logit - HF logit| (float32) before the forward section refuses to time


def fastest_hf(hf: dict) -> tuple[str, object]:
    """``("HF sdpa", model)``: the last of ``hf``'s attention implementations, and its model."""
    attention = list(hf)[-1]
    return f"HF {attention}", hf[attention]


def logit_differences(model: str, ours, hf: dict, tokens: torch.Tensor) -> dict[str, float]:
    """Max |our logits - HF logits| against each HF model; RuntimeError above ``LOGITS_TOLERANCE``.

    Timing two models is only a comparison if they compute the same function.
    """
    with torch.inference_mode():
        logits = ours(tokens)
        differences = {
            f"HF {attention}": float((logits - hf_model(tokens).logits).abs().max())
            for attention, hf_model in hf.items()
        }
    for name, difference in differences.items():
        if not difference <= LOGITS_TOLERANCE:
            shape = "x".join(str(n) for n in tokens.shape)
            raise RuntimeError(
                f"{model}: our logits differ from {name}'s by {difference:.3e} at {shape} "
                f"(expected at most {LOGITS_TOLERANCE}): from_pretrained did not reproduce the Hugging Face model"
            )
    return differences


def bench_forward(
    model: str,
    ours,
    hf: dict,
    tl: TransformerLensWorker | None,
    tl_note: str,
    shapes,
    rounds,
    warmup,
    seed,
    targets: dict,
) -> Table:
    """Forward pass timings; before timing each shape, our logits must match every HF model's
    (``logit_differences``)."""
    from interp_transformer import shape_checking

    target = targets["forward"]
    table = Table(
        f"{model}: Forward pass (tokens -> logits)",
        [
            "shape",
            "contender",
            "median ms",
            "x HF best",
            f"target <= {target}x",
            "median CPU ms",
            "x HF best, CPU time",
            "max abs logit diff, ours vs HF",
        ],
    )
    for batch, pos in shapes:
        tokens = random_tokens(batch, pos, seed, ours.cfg.d_vocab)
        differences = logit_differences(model, ours, hf, tokens)

        def unchecked():
            with shape_checking(False):
                ours(tokens)

        contenders = {
            "interp_transformer": timed(lambda: ours(tokens)),
            "interp_transformer, shape checks off": timed(unchecked),
        }
        for attention, hf_model in hf.items():
            contenders[f"HF {attention}"] = timed(lambda hf_model=hf_model: hf_model(tokens))
        if tl is not None:
            contenders["TransformerLens"] = tl.timer("forward", batch, pos)
        medians, cpu = interleaved_medians(contenders, rounds, warmup, f"{model} forward {batch}x{pos}")
        best = min(medians[name] for name in differences)
        best_cpu = min(cpu[name] for name in differences)
        ours_difference = f"{max(differences.values()):.1e}"
        for name, median in medians.items():
            verdict = meets(median / best, target, lower_is_better=True) if name.startswith("interp") else ""
            difference = (
                ours_difference
                if name.startswith("interp")
                else f"{differences[name]:.1e}"
                if name in differences
                else "-"
            )
            table.add(
                f"{batch}x{pos}",
                name,
                f"{median * 1e3:.1f}",
                f"{median / best:.3f}",
                verdict,
                f"{cpu[name] * 1e3:.1f}",
                f"{cpu[name] / best_cpu:.3f}",
                difference,
            )
        if tl is None:
            table.add(f"{batch}x{pos}", "TransformerLens", "-", "-", tl_note, "-", "-", "-")
    return table


def bench_cache(
    model: str, ours, tl: TransformerLensWorker | None, shapes, rounds, warmup, seed, targets: dict
) -> Table:
    n_layers = ours.cfg.n_layers
    filters = {
        "everything": None,
        "attention patterns": [f"blocks.{layer}.attn.hook_pattern" for layer in range(n_layers)],
        "resid_post": [f"blocks.{layer}.hook_resid_post" for layer in range(n_layers)],
    }
    tl_ops = {"everything": "cache_all", "attention patterns": "cache_pattern", "resid_post": "cache_resid_post"}
    target = targets["cache_all"]
    table = Table(
        f"{model}: run_with_cache",
        [
            "shape",
            "contender",
            "cached",
            "median ms",
            "x our forward",
            "MiB held",
            "estimate exact",
            "page faults",
            f"target (all) <= {target}x",
        ],
    )
    for batch, pos in shapes:
        tokens = random_tokens(batch, pos, seed, ours.cfg.d_vocab)
        held: dict[str, tuple[int, int]] = {}
        faults: dict[str, list[int]] = collections.defaultdict(list)

        def cache_run(name, names_filter, dtype=None):
            estimate = ours.estimate_cache_bytes(batch, pos, names_filter=names_filter, dtype=dtype)

            def keep():
                _, cache = ours.run_with_cache(tokens, names_filter=names_filter, dtype=dtype)
                held[name] = (cache.nbytes(), estimate)

            return timed(keep, faults[name])

        contenders = {"forward": timed(lambda: ours(tokens), faults["forward"])}
        for name, names_filter in filters.items():
            contenders[name] = cache_run(name, names_filter)
        contenders["everything, bfloat16 storage"] = cache_run("everything, bfloat16 storage", None, torch.bfloat16)
        tl_bytes: dict[str, int] = {}
        if tl is not None:
            contenders["TL forward"] = tl.timer("forward", batch, pos)
            for name, op in tl_ops.items():

                def tl_run(op=op, name=name):
                    answer = tl.ask(op=op, batch=batch, pos=pos)
                    tl_bytes[name] = answer["cache_bytes_unique"]
                    return answer["seconds"], answer["cpu_seconds"]

                contenders[f"TL {name}"] = tl_run
        medians, _ = interleaved_medians(contenders, rounds, warmup, f"{model} cache {batch}x{pos}")
        shape = f"{batch}x{pos}"
        table.add(
            shape,
            "interp_transformer",
            "nothing (forward)",
            f"{medians['forward'] * 1e3:.1f}",
            "1.000",
            "0",
            "",
            f"{statistics.median(faults['forward']):.0f}",
            "",
        )
        for name in ["everything", "everything, bfloat16 storage", "attention patterns", "resid_post"]:
            ratio = medians[name] / medians["forward"]
            verdict = meets(ratio, target, lower_is_better=True) if name == "everything" else ""
            nbytes, estimate = held[name]
            exact = "yes" if nbytes == estimate else f"NO ({estimate} estimated, {nbytes} held)"
            table.add(
                shape,
                "interp_transformer",
                name,
                f"{medians[name] * 1e3:.1f}",
                f"{ratio:.3f}",
                f"{nbytes / 2**20:.1f}",
                exact,
                f"{statistics.median(faults[name]):.0f}",
                verdict,
            )
        if tl is not None:
            for name in tl_ops:
                ratio = medians[f"TL {name}"] / medians["TL forward"]
                table.add(
                    shape,
                    "TransformerLens",
                    name,
                    f"{medians[f'TL {name}'] * 1e3:.1f}",
                    f"{ratio:.3f} (of its own)",
                    f"{tl_bytes[name] / 2**20:.1f}",
                    "",
                    "",
                    "",
                )
    return table


def bench_generate(model: str, ours, hf: dict, rounds, warmup, seed, targets: dict) -> Table:
    """Greedy decoding of ``NEW_TOKENS`` tokens: ours with and without the key/value cache, HF ``generate`` (its fastest
    attention)."""
    hf_name, hf_model = fastest_hf(hf)
    hf_label = f"HF generate ({hf_name.removeprefix('HF ')})"
    prompt = random_tokens(1, PROMPT_LEN, seed, ours.cfg.d_vocab)
    outputs: dict[str, torch.Tensor] = {}

    def ours_run(use_kv_cache):
        def run():
            outputs[f"ours {use_kv_cache}"] = ours.generate(
                prompt, max_new_tokens=NEW_TOKENS, temperature=0.0, stop_at_eos=False, use_kv_cache=use_kv_cache
            )

        return timed(run)

    def hf_run():
        outputs["hf"] = hf_model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )

    contenders = {
        "with key/value cache": ours_run(True),
        "without key/value cache": ours_run(False),
        hf_label: timed(hf_run),
    }
    medians, cpu = interleaved_medians(contenders, rounds, warmup, f"{model} generate")
    rate = {name: NEW_TOKENS / seconds for name, seconds in medians.items()}
    same = torch.equal(outputs["ours True"], outputs["hf"]) and torch.equal(outputs["ours False"], outputs["hf"])
    table = Table(
        f"{model}: Greedy generation, {NEW_TOKENS} new tokens after a {PROMPT_LEN}-token prompt (ids equal to HF's: "
        f"{'yes' if same else 'NO'})",
        [
            "contender",
            "median s",
            "tokens/s",
            "x HF",
            "x ours without cache",
            "target",
            "median CPU s",
            "x HF, CPU time",
        ],
    )
    hf_rate, slow_rate = rate[hf_label], rate["without key/value cache"]
    for name in contenders:
        verdict = ""
        if name == "with key/value cache":
            verdicts = [
                f"x HF >= {targets['generate_vs_hf']}: {meets(rate[name] / hf_rate, targets['generate_vs_hf'])}"
            ]
            if "generate_vs_no_cache" in targets:
                target = targets["generate_vs_no_cache"]
                verdicts.append(f"x no cache >= {target}: {meets(rate[name] / slow_rate, target)}")
            verdict = "; ".join(verdicts)
        table.add(
            name,
            f"{medians[name]:.3f}",
            f"{rate[name]:.1f}",
            f"{rate[name] / hf_rate:.2f}",
            f"{rate[name] / slow_rate:.2f}",
            verdict,
            f"{cpu[name]:.3f}",
            f"{cpu[hf_label] / cpu[name]:.2f}",
        )
    return table


def forward_flops(model, batch: int, pos: int) -> float:
    """Multiply-adds x 2 of one forward: every weight matrix of the blocks and the unembedding once per token,
    plus attention's two ``pos x pos`` products per query head (the masked half included, as kernels compute it).

    Counting the stored matrices covers GPT-2's four projections and two-matrix MLP as well as Llama's
    narrower key/value projections (grouped-query attention) and three-matrix gated MLP. A mixture
    of experts (``cfg.n_experts`` experts, ``cfg.experts_per_token`` of them per token) counts each
    expert's matrices at ``experts_per_token / n_experts``: the work the sparse path does.
    """
    cfg = model.cfg
    expert_share = getattr(cfg, "experts_per_token", 1) / getattr(cfg, "n_experts", 1)
    per_token = sum(
        p.numel() * (expert_share if ".experts." in name else 1)
        for name, p in model.named_parameters()
        if name.startswith(("blocks.", "unembed.")) and name.rsplit(".", 1)[-1].lstrip("_").startswith("W_")
    )
    attention = cfg.n_layers * 2 * batch * cfg.n_heads * pos * pos * cfg.d_head
    return 2.0 * (per_token * batch * pos + attention)


def bench_flops(model: str, ours, hf: dict, shapes, rounds, warmup, seed) -> Table:
    hf_name, hf_model = fastest_hf(hf)
    size = 2048
    a, b = torch.randn(size, size), torch.randn(size, size)
    table = Table(
        f"{model}: Achieved GFLOP/s against a plain {size}x{size} @ {size}x{size} float32 matmul",
        ["shape", "contender", "GFLOP/s", "x plain matmul"],
    )
    for batch, pos in shapes:
        tokens = random_tokens(batch, pos, seed, ours.cfg.d_vocab)
        contenders = {
            "plain matmul": timed(lambda: torch.mm(a, b)),
            "interp_transformer": timed(lambda: ours(tokens)),
            hf_name: timed(lambda: hf_model(tokens)),
        }
        medians, _ = interleaved_medians(contenders, rounds, warmup, f"{model} flops {batch}x{pos}")
        rates = {"plain matmul": 2 * size**3 / medians["plain matmul"] / 1e9}
        for name in ("interp_transformer", hf_name):
            rates[name] = forward_flops(ours, batch, pos) / medians[name] / 1e9
        for name, rate in rates.items():
            table.add(f"{batch}x{pos}", name, f"{rate:.1f}", f"{rate / rates['plain matmul']:.2f}")
    return table
