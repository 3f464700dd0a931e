"""Classic interpretability-course exercises (transformers from scratch; induction heads), written as for
TransformerLens.

The exercise code below is what such notebooks write against ``transformer_lens``; the one
import that changed is ``from interp_transformer import ...``. The models stand in for the
hub's: the 2-layer attention-only model is our shipped ``induction-2l`` (a real trained
induction circuit: a previous-token head in layer 0 and induction heads in layer 1), loaded
into a ``HookedTransformer`` by ``load_state_dict`` as the course loads its checkpoint; the
course's own configuration (shortformer positions, no norms, ``use_attn_result``) is built
with random weights, where the exercises' exact identities still have to hold; GPT-2 is a
random model of its shape. No head index is hard-coded: each exercise's answer is checked
against another way of computing it.
"""

import einops
import pytest
import torch as t
import torch.nn as nn
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer import ActivationCache, FactoredMatrix, HookedTransformer, HookedTransformerConfig
from interp_transformer.compat import utils

from .hub import stand_in


# --------------------------------------------------------------------------------------------------
# the models
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model() -> HookedTransformer:
    """The 2-layer attention-only model with an induction circuit, loaded as the course loads its checkpoint."""
    from interp_transformer.pretrained import load_shipped

    cfg = HookedTransformerConfig(
        d_model=64,
        d_head=16,
        n_heads=4,
        n_layers=2,
        n_ctx=64,
        d_vocab=64,
        attention_dir="causal",
        attn_only=True,
        normalization_type="LN",
        seed=398,
        use_attn_result=True,
    )
    model = HookedTransformer(cfg)
    pretrained_weights = load_shipped("induction-2l").state_dict()  # the course: hf_hub_download + t.load
    model.load_state_dict(pretrained_weights)
    return model.eval()


@pytest.fixture(scope="module")
def course_config_model() -> HookedTransformer:
    """The course's attention-only configuration: shortformer positions, no norms, per-head results hooked."""
    cfg = HookedTransformerConfig(
        d_model=96,
        d_head=16,
        n_heads=6,
        n_layers=2,
        n_ctx=128,
        d_vocab=50257,
        attention_dir="causal",
        attn_only=True,
        tokenizer_name="gpt2",
        seed=398,
        use_attn_result=True,
        normalization_type=None,
        positional_embedding_type="shortformer",
    )
    model = HookedTransformer(cfg)
    with t.no_grad():  # biases too, so that every term of the decompositions matters
        for name, param in model.named_parameters():
            if name.startswith("blocks") and name.split(".")[-1].startswith("b_"):
                param.normal_(0, 0.1)
    return model.eval()


# --------------------------------------------------------------------------------------------------
# exercise code (as written for TransformerLens)
# --------------------------------------------------------------------------------------------------
def generate_repeated_tokens(
    model: HookedTransformer, seq_len: int, batch: int = 1, bos: int = 0
) -> Int[Tensor, "batch full_seq_len"]:
    prefix = (t.ones(batch, 1) * bos).long()
    rep_tokens_half = t.randint(
        1, model.cfg.d_vocab, (batch, seq_len), dtype=t.int64, generator=t.Generator().manual_seed(0)
    )
    return t.cat([prefix, rep_tokens_half, rep_tokens_half], dim=-1).to(model.cfg.device)


def run_and_cache_model_repeated_tokens(model: HookedTransformer, seq_len: int, batch: int = 1):
    rep_tokens = generate_repeated_tokens(model, seq_len, batch)
    rep_logits, rep_cache = model.run_with_cache(rep_tokens)
    return rep_tokens, rep_logits, rep_cache


def get_log_probs(
    logits: Float[Tensor, "batch posn d_vocab"], tokens: Int[Tensor, "batch posn"]
) -> Float[Tensor, "batch posn-1"]:
    logprobs = logits.log_softmax(dim=-1)
    return logprobs[:, :-1].gather(dim=-1, index=tokens[:, 1:].unsqueeze(-1)).squeeze(-1)


def current_attn_detector(cache: ActivationCache, model: HookedTransformer) -> list[str]:
    heads = []
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            attention_pattern = cache["pattern", layer][head]
            if attention_pattern.diagonal().mean() > 0.4:
                heads.append(f"{layer}.{head}")
    return heads


def head_scores(cache: ActivationCache, model: HookedTransformer, offset: int) -> Float[Tensor, "layer head"]:
    """Mean attention along the stripe ``offset`` below the diagonal (batchless cache), per head."""
    scores = t.zeros(model.cfg.n_layers, model.cfg.n_heads)
    for layer in range(model.cfg.n_layers):
        stripe = cache["pattern", layer].diagonal(dim1=-2, dim2=-1, offset=-offset)
        scores[layer] = stripe.mean(-1)
    return scores


def logit_attribution(
    embed: Float[Tensor, "seq d_model"],
    l1_results: Float[Tensor, "seq nheads d_model"],
    l2_results: Float[Tensor, "seq nheads d_model"],
    W_U: Float[Tensor, "d_model d_vocab"],
    tokens: Int[Tensor, "seq"],
) -> Float[Tensor, "seq-1 n_components"]:
    W_U_correct_tokens = W_U[:, tokens[1:]]
    direct_attributions = einops.einsum(W_U_correct_tokens, embed[:-1], "emb seq, seq emb -> seq")
    l1_attributions = einops.einsum(W_U_correct_tokens, l1_results[:-1], "emb seq, seq nhead emb -> seq nhead")
    l2_attributions = einops.einsum(W_U_correct_tokens, l2_results[:-1], "emb seq, seq nhead emb -> seq nhead")
    return t.concat([direct_attributions.unsqueeze(-1), l1_attributions, l2_attributions], dim=-1)


def head_ablation_hook(
    v: Float[Tensor, "batch seq n_heads d_head"], hook, head_index_to_ablate: int
) -> Float[Tensor, "batch seq n_heads d_head"]:
    v[:, :, head_index_to_ablate, :] = 0.0
    return v


def get_ablation_scores(
    model: HookedTransformer, tokens: Int[Tensor, "batch seq"]
) -> Float[Tensor, "n_layers n_heads"]:
    ablation_scores = t.zeros((model.cfg.n_layers, model.cfg.n_heads), device=model.cfg.device)
    model.reset_hooks()
    loss_no_ablation = model(tokens, return_type="loss")
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            temp_hook_fn = lambda v, hook, head=head: head_ablation_hook(v, hook, head)  # noqa: E731
            ablated_loss = model.run_with_hooks(
                tokens, return_type="loss", fwd_hooks=[(utils.get_act_name("v", layer), temp_hook_fn)]
            )
            ablation_scores[layer, head] = (ablated_loss - loss_no_ablation).detach()
    return ablation_scores


def top_1_acc(full_OV_circuit: FactoredMatrix, batch_size: int = 16) -> float:
    total = 0
    for indices in t.split(t.arange(full_OV_circuit.shape[-1]), batch_size):
        AB_slice = full_OV_circuit[indices].AB
        total += (t.argmax(AB_slice, dim=1) == indices).float().sum().item()
    return total / full_OV_circuit.shape[-1]


def decompose_qk_input(cache: ActivationCache) -> Float[Tensor, "n_heads+2 posn d_model"]:
    y0 = cache["embed"].unsqueeze(0)
    y1 = cache["pos_embed"].unsqueeze(0)
    y_rest = cache["result", 0].transpose(0, 1)
    return t.concat([y0, y1, y_rest], dim=0)


def decompose_q(
    decomposed_qk_input: Float[Tensor, "n_heads+2 posn d_model"], ind_head_index: int, model: HookedTransformer
):
    W_Q = model.W_Q[1, ind_head_index]
    return einops.einsum(decomposed_qk_input, W_Q, "n seq d_model, d_model d_head -> n seq d_head")


def get_comp_score(W_A: Float[Tensor, "in_A out_A"], W_B: Float[Tensor, "out_A out_B"]) -> float:
    W_A_norm = W_A.pow(2).sum().sqrt()
    W_B_norm = W_B.pow(2).sum().sqrt()
    W_AB_norm = (W_A @ W_B).pow(2).sum().sqrt()
    return (W_AB_norm / (W_A_norm * W_B_norm)).item()


# --------------------------------------------------------------------------------------------------
# the checks
# --------------------------------------------------------------------------------------------------
SEQ_LEN = 20


@pytest.fixture(scope="module")
def repeated(model):
    return run_and_cache_model_repeated_tokens(model, SEQ_LEN, batch=4)


def test_state_dict_loads_and_the_repeated_half_is_predicted(model, repeated):
    rep_tokens, rep_logits, _ = repeated
    log_probs = get_log_probs(rep_logits, rep_tokens)
    torch_loss = -log_probs
    assert t.allclose(torch_loss, utils.lm_cross_entropy_loss(rep_logits, rep_tokens, per_token=True), atol=1e-6)
    first_half, second_half = -log_probs[:, :SEQ_LEN].mean(), -log_probs[:, SEQ_LEN:].mean()
    assert second_half < first_half - 2.0, (first_half, second_half)
    assert t.allclose(model(rep_tokens, return_type="loss"), -log_probs.mean(), atol=1e-6)


def test_attention_detectors_find_the_circuit(model):
    rep_tokens, _, cache = run_and_cache_model_repeated_tokens(model, SEQ_LEN, batch=1)
    cache.remove_batch_dim()
    assert cache["pattern", 0].shape == (model.cfg.n_heads, 2 * SEQ_LEN + 1, 2 * SEQ_LEN + 1)
    previous, induction = head_scores(cache, model, 1), head_scores(cache, model, SEQ_LEN - 1)
    prev_layer, prev_head = divmod(int(previous.argmax()), model.cfg.n_heads)
    ind_layer, _ = divmod(int(induction.argmax()), model.cfg.n_heads)
    assert (prev_layer, ind_layer) == (0, 1) and previous.max() > 0.4 and induction.max() > 0.5
    # the hook-based detector of the course gives the same scores
    induction_score_store = t.zeros((model.cfg.n_layers, model.cfg.n_heads), device=model.cfg.device)

    def induction_score_hook(pattern: Float[Tensor, "batch head_index dest_pos source_pos"], hook):
        induction_stripe = pattern.diagonal(dim1=-2, dim2=-1, offset=1 - SEQ_LEN)
        induction_score = einops.reduce(induction_stripe, "batch head_index position -> head_index", "mean")
        induction_score_store[hook.layer(), :] = induction_score

    pattern_hook_names_filter = lambda name: name.endswith("pattern")  # noqa: E731
    model.run_with_hooks(rep_tokens, return_type=None, fwd_hooks=[(pattern_hook_names_filter, induction_score_hook)])
    assert t.allclose(induction_score_store, induction, atol=1e-6)
    assert current_attn_detector(cache, model) == [
        f"{layer}.{head}"
        for layer in range(2)
        for head in range(4)
        if cache["pattern", layer][head].diagonal().mean() > 0.4
    ]


def test_pattern_from_q_and_k_is_the_cached_pattern(model, repeated):
    _, _, cache = repeated
    q, k = cache["q", 0], cache["k", 0]
    seq = q.shape[1]
    attn_scores = einops.einsum(q, k, "batch seqQ n h, batch seqK n h -> batch n seqQ seqK")
    mask = t.triu(t.ones((seq, seq), dtype=t.bool), diagonal=1)
    layer0_pattern_from_q_and_k = (attn_scores.masked_fill(mask, -1e9) / model.cfg.d_head**0.5).softmax(-1)
    t.testing.assert_close(cache["pattern", 0], layer0_pattern_from_q_and_k, rtol=0, atol=1e-6)


def test_ablating_the_induction_heads_hurts_most(model, repeated):
    rep_tokens, _, cache = repeated
    ablation_scores = get_ablation_scores(model, rep_tokens)
    batchless = cache.apply_slice_to_batch_dim(0)
    previous, induction = head_scores(batchless, model, 1), head_scores(batchless, model, SEQ_LEN - 1)
    # the one previous-token head is what every induction head needs: ablating it costs the most
    assert int(ablation_scores.argmax()) == int(previous.argmax()) and ablation_scores.max() > 0.5
    # in layer 1 the costliest ablation is of an induction head (the three share the work, so each costs less)
    assert induction[1, int(ablation_scores[1].argmax())] > 0.5
    # the loss with the hook is the loss of the hooked forward's logits
    head = int(previous[0].argmax())
    hooked = model.run_with_hooks(
        rep_tokens, fwd_hooks=[(utils.get_act_name("v", 0), lambda v, hook: head_ablation_hook(v, hook, head))]
    )
    t.testing.assert_close(
        utils.lm_cross_entropy_loss(hooked, rep_tokens) - model(rep_tokens, return_type="loss"),
        ablation_scores[0, head],
        rtol=0,
        atol=1e-5,
    )


def test_logit_attribution_with_per_head_results_sums_to_the_logits(course_config_model):
    model = course_config_model
    text = "We think that powerful, significantly superhuman machine intelligence is more likely than not"
    logits, cache = model.run_with_cache(text, remove_batch_dim=True)
    str_tokens = model.to_str_tokens(text)
    tokens = model.to_tokens(text)
    with t.inference_mode():
        embed = cache["embed"]
        l1_results, l2_results = cache["result", 0], cache["result", 1]
        logit_attr = logit_attribution(embed, l1_results, l2_results, model.W_U, tokens[0])
        # no norms and shortformer positions: the residual stream is embed + each head's result + the biases
        biases = model.b_O.sum(0) @ model.W_U[:, tokens[0, 1:]] + model.b_U[tokens[0, 1:]]
        correct_token_logits = logits[0, t.arange(len(tokens[0]) - 1), tokens[0, 1:]]
        t.testing.assert_close(logit_attr.sum(1) + biases, correct_token_logits, atol=1e-3, rtol=0)
    assert logit_attr.shape == (len(str_tokens) - 1, 1 + 2 * model.cfg.n_heads)
    # the per-head results a hook records are the ones the cache computes from z
    t.testing.assert_close(
        cache["blocks.0.attn.hook_result"],
        einops.einsum(cache["z", 0], model.W_O[0], "s h d, h d m -> s h m"),
        rtol=0,
        atol=1e-6,
    )


def test_decomposing_the_query_input_of_a_shortformer_model(course_config_model):
    model = course_config_model
    rep_tokens, _, cache = run_and_cache_model_repeated_tokens(model, 10)
    cache.remove_batch_dim()
    decomposed_qk_input = decompose_qk_input(cache)
    # shortformer: the query and key inputs are the residual stream plus the positional embedding
    t.testing.assert_close(
        decomposed_qk_input.sum(0), cache["resid_pre", 1] + cache["pos_embed"] - model.b_O[0], rtol=0, atol=1e-5
    )
    for head in range(model.cfg.n_heads):
        decomposed_q = decompose_q(decomposed_qk_input, head, model)
        q_from_bias = (
            einops.einsum(model.b_O[0], model.W_Q[1, head], "d_model, d_model d_head -> d_head") + model.b_Q[1, head]
        )
        t.testing.assert_close(decomposed_q.sum(0) + q_from_bias, cache["q", 1][:, head], rtol=0, atol=1e-4)
    # and the residual stream itself never holds the positions
    t.testing.assert_close(cache["resid_pre", 0], cache["embed"], rtol=0, atol=0)


def test_full_ov_circuit_of_the_induction_heads_copies(model, repeated):
    _, _, cache = repeated
    induction = head_scores(cache.apply_slice_to_batch_dim(0), model, SEQ_LEN - 1)[1]
    W_O, W_V, W_E, W_U = model.W_O, model.W_V, model.W_E, model.W_U
    for head in range(model.cfg.n_heads):
        OV_circuit = FactoredMatrix(W_V[1, head], W_O[1, head])
        full_OV_circuit = W_E @ OV_circuit @ W_U
        dense = W_E @ W_V[1, head] @ W_O[1, head] @ W_U
        t.testing.assert_close(full_OV_circuit.AB, dense, rtol=1e-4, atol=1e-4)
        accuracy = top_1_acc(full_OV_circuit)
        assert accuracy == pytest.approx((dense.argmax(1) == t.arange(model.cfg.d_vocab)).float().mean().item())
        if induction[head] > 0.5:
            assert accuracy > 0.9, (head, accuracy)
    U, S, V = (W_E @ FactoredMatrix(W_V[1, 0], W_O[1, 0]) @ W_U).svd()
    assert V.shape == (model.cfg.d_vocab, model.cfg.d_head)


def test_positional_qk_circuit_of_the_previous_token_head(model, repeated):
    _, _, cache = repeated
    previous = head_scores(cache.apply_slice_to_batch_dim(0), model, 1)[0]
    prev_head = int(previous.argmax())
    W_pos = model.W_pos
    hits = []
    for head in range(model.cfg.n_heads):
        layer0_head_QK = FactoredMatrix(model.W_Q[0, head], model.W_K[0, head].T)
        pos_by_pos_scores = W_pos @ layer0_head_QK @ W_pos.T
        dense = W_pos @ model.W_Q[0, head] @ model.W_K[0, head].T @ W_pos.T
        t.testing.assert_close(pos_by_pos_scores.AB, dense, rtol=1e-4, atol=1e-4)
        masked = t.tril(pos_by_pos_scores.AB) + t.triu(t.full_like(dense, -1e9), diagonal=1)
        hits.append((masked.argmax(-1)[1:] == t.arange(model.cfg.n_ctx - 1)).float().mean().item())
    assert int(t.tensor(hits).argmax()) == prev_head


def test_k_composition_links_the_previous_token_head_to_the_induction_heads(model, repeated):
    _, _, cache = repeated
    batchless = cache.apply_slice_to_batch_dim(0)
    prev_head = int(head_scores(batchless, model, 1)[0].argmax())
    induction = head_scores(batchless, model, SEQ_LEN - 1)[1]
    W_QK = model.W_Q[1] @ model.W_K[1].transpose(-1, -2)
    W_OV = model.W_V[0] @ model.W_O[0]
    k_comp_scores = t.tensor([[get_comp_score(W_OV[i], W_QK[j].T) for j in range(4)] for i in range(4)])
    t.testing.assert_close(k_comp_scores, model.all_composition_scores("K")[0, :, 1, :].detach(), rtol=1e-4, atol=1e-5)
    t.testing.assert_close(
        k_comp_scores, utils.composition_scores(model.OV[0], model.QK.T[1]).detach(), rtol=1e-4, atol=1e-5
    )
    for ind_head in (induction > 0.5).nonzero().flatten().tolist():
        assert int(k_comp_scores[:, ind_head].argmax()) == prev_head
    assert (model.all_composition_scores("Q")[1] == 0).all()  # no later layer for layer 1 to compose into


# --------------------------------------------------------------------------------------------------
# transformers from scratch: our own modules against the reference model's
# --------------------------------------------------------------------------------------------------
class Config:
    def __init__(self, reference):
        c = reference.cfg
        self.d_model, self.debug, self.layer_norm_eps, self.d_vocab = c.d_model, True, c.eps, c.d_vocab
        self.init_range, self.n_ctx, self.d_head, self.d_mlp, self.n_heads, self.n_layers = (
            0.02,
            c.n_ctx,
            c.d_head,
            c.d_mlp,
            c.n_heads,
            c.n_layers,
        )


class LayerNorm(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(t.ones(cfg.d_model))
        self.b = nn.Parameter(t.zeros(cfg.d_model))

    def forward(self, residual):
        residual_mean = residual.mean(dim=-1, keepdim=True)
        residual_std = (residual.var(dim=-1, keepdim=True, unbiased=False) + self.cfg.layer_norm_eps).sqrt()
        return (residual - residual_mean) / residual_std * self.w + self.b


class Attention(nn.Module):
    IGNORE: Float[Tensor, ""]

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.W_Q = nn.Parameter(t.empty((cfg.n_heads, cfg.d_model, cfg.d_head)))
        self.W_K = nn.Parameter(t.empty((cfg.n_heads, cfg.d_model, cfg.d_head)))
        self.W_V = nn.Parameter(t.empty((cfg.n_heads, cfg.d_model, cfg.d_head)))
        self.W_O = nn.Parameter(t.empty((cfg.n_heads, cfg.d_head, cfg.d_model)))
        self.b_Q = nn.Parameter(t.zeros((cfg.n_heads, cfg.d_head)))
        self.b_K = nn.Parameter(t.zeros((cfg.n_heads, cfg.d_head)))
        self.b_V = nn.Parameter(t.zeros((cfg.n_heads, cfg.d_head)))
        self.b_O = nn.Parameter(t.zeros(cfg.d_model))
        self.register_buffer("IGNORE", t.tensor(float("-inf"), dtype=t.float32))

    def forward(self, normalized_resid_pre):
        q = einops.einsum(normalized_resid_pre, self.W_Q, "b p dm, nh dm dh -> b p nh dh") + self.b_Q
        k = einops.einsum(normalized_resid_pre, self.W_K, "b p dm, nh dm dh -> b p nh dh") + self.b_K
        v = einops.einsum(normalized_resid_pre, self.W_V, "b p dm, nh dm dh -> b p nh dh") + self.b_V
        attn_scores = einops.einsum(q, k, "b pq nh dh, b pk nh dh -> b nh pq pk") / self.cfg.d_head**0.5
        mask = t.triu(t.ones(attn_scores.size(-2), attn_scores.size(-1)), diagonal=1).bool()
        attn_pattern = attn_scores.masked_fill_(mask, self.IGNORE).softmax(-1)
        z = einops.einsum(v, attn_pattern, "b pk nh dh, b nh pq pk -> b pq nh dh")
        return einops.einsum(z, self.W_O, "b pq nh dh, nh dh dm -> b pq dm") + self.b_O


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.W_in = nn.Parameter(t.empty((cfg.d_model, cfg.d_mlp)))
        self.W_out = nn.Parameter(t.empty((cfg.d_mlp, cfg.d_model)))
        self.b_in = nn.Parameter(t.zeros(cfg.d_mlp))
        self.b_out = nn.Parameter(t.zeros(cfg.d_model))

    def forward(self, normalized_resid_mid):
        pre = einops.einsum(normalized_resid_mid, self.W_in, "b p dm, dm dmlp -> b p dmlp") + self.b_in
        return einops.einsum(utils.gelu_new(pre), self.W_out, "b p dmlp, dmlp dm -> b p dm") + self.b_out


class TransformerBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = LayerNorm(cfg), Attention(cfg), LayerNorm(cfg), MLP(cfg)

    def forward(self, resid_pre):
        resid_mid = self.attn(self.ln1(resid_pre)) + resid_pre
        return self.mlp(self.ln2(resid_mid)) + resid_mid


class DemoTransformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Module()
        self.embed.W_E = nn.Parameter(t.empty((cfg.d_vocab, cfg.d_model)))
        self.pos_embed = nn.Module()
        self.pos_embed.W_pos = nn.Parameter(t.empty((cfg.n_ctx, cfg.d_model)))
        self.blocks = nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = LayerNorm(cfg)
        self.unembed = nn.Module()
        self.unembed.W_U = nn.Parameter(t.empty((cfg.d_model, cfg.d_vocab)))
        self.unembed.b_U = nn.Parameter(t.zeros(cfg.d_vocab))

    def forward(self, tokens):
        residual = self.embed.W_E[tokens] + self.pos_embed.W_pos[: tokens.shape[1]]
        for block in self.blocks:
            residual = block(residual)
        return self.ln_final(residual) @ self.unembed.W_U + self.unembed.b_U


@pytest.fixture(scope="module")
def reference_gpt2() -> HookedTransformer:
    return stand_in("distilgpt2", fold_ln=False, center_unembed=False, center_writing_weights=False)


def test_from_scratch_parts_match_the_reference_on_its_cached_activations(reference_gpt2):
    reference_text = (
        "I am an amazing autoregressive, decoder-only, GPT-2 style transformer. One day I will exceed human level"
    )
    tokens = reference_gpt2.to_tokens(reference_text)
    logits, cache = reference_gpt2.run_with_cache(tokens)
    cfg = Config(reference_gpt2)
    last = reference_gpt2.cfg.n_layers - 1
    for cls, reference_part, given in (
        (LayerNorm, reference_gpt2.ln_final, cache["resid_post", last]),
        (Attention, reference_gpt2.blocks[0].attn, cache["normalized", 0, "ln1"]),
        (MLP, reference_gpt2.blocks[0].mlp, cache["normalized", 0, "ln2"]),
        (TransformerBlock, reference_gpt2.blocks[0], cache["resid_pre", 0]),
    ):
        layer = cls(cfg)
        layer.load_state_dict(reference_part.state_dict(), strict=False)
        t.testing.assert_close(layer(given), reference_part(given), rtol=0, atol=1e-4)
    t.testing.assert_close(
        reference_gpt2.blocks[0].attn(cache["normalized", 0, "ln1"]), cache["attn_out", 0], rtol=0, atol=1e-5
    )
    # the whole model, from the reference's state dict
    demo_gpt2 = DemoTransformer(cfg)
    missing, unexpected = demo_gpt2.load_state_dict(reference_gpt2.state_dict(), strict=False)
    # our own buffer
    assert unexpected == [] and missing == [f"blocks.{layer}.attn.IGNORE" for layer in range(cfg.n_layers)]
    t.testing.assert_close(demo_gpt2(tokens), logits, rtol=0, atol=1e-4)
    # the reference's processing flags were honoured: its norms still hold their weights
    assert reference_gpt2.cfg.normalization_type == "LN" and reference_gpt2.processing == ["fold_value_biases"]
