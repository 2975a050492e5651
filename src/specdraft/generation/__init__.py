"""Speculative decoding for batches of prompts of different lengths.

    result = generate(target, prompts, proposer, max_new_tokens=64, eos_token_id=2)
    result.tokens[b]                      # request b's generated ids (EOS included)
    result.stats.mean_acceptance_length   # tokens per verify pass, bonus included

Prefill (the target over each prompt, the first token sampled, the draft's first
propose), then iterations until every request is done, each one function of tensors
(`SpeculativeDecoder.iteration`, compilable with fullgraph=True):

1. verify: the target over [last token, K drafts] of every request (K + 1 query
   tokens at positions lens .. lens + K, paged KV, slots from the block table);
2. rejection sampling: strict greedy at temperature 0, Leviathan otherwise
   (per-request temperature and seed); commit the accepted drafts and the
   recovered / bonus token, cut at EOS and at each request's limit;
3. draft: the proposer's padded path over the verified windows.

Greedy output equals the target's own greedy decoding token for token; sampled
output has the target's distribution. Modules: state (what a batch carries between
iterations, the commit), verify (the target's pass and sampling), decoder (the
iteration and the host loop), stats (GenerationStats), checks (input validation).
"""

from specdraft.config import SamplingParams

from .chain_or_tree import ChainOrTree
from .decoder import GenerationResult, SpeculativeDecoder, Verified, num_kv_blocks
from .state import DecodeState, Requests, commit
from .stats import GenerationStats
from .tree_decoder import TreeDecodeState, TreeSpeculativeDecoder

__all__ = [
    "ChainOrTree",
    "DecodeState",
    "GenerationResult",
    "GenerationStats",
    "Requests",
    "SpeculativeDecoder",
    "TreeDecodeState",
    "TreeSpeculativeDecoder",
    "Verified",
    "commit",
    "generate",
    "generate_plain",
    "num_kv_blocks",
]


def generate(
    target,
    prompts,
    proposer=None,
    *,
    max_new_tokens: int | list[int] = 32,
    sampling: SamplingParams | None = None,
    eos_token_id: int | list[int | None] | None = None,
    max_model_len: int | None = None,
    block_size: int | None = None,
    aux_layers: tuple[int, ...] | None = None,
    compile: bool | dict = False,
    time_split: bool = False,
    progress: bool = False,
    budget: int | None = None,
) -> GenerationResult:
    """Generate for a batch of prompts with `target`, speculatively when `proposer`
    is given (plain target decoding when it is None).

    prompts: B token id sequences (lists or 1-D int tensors), lengths 1 ..
        max_model_len - 1, any mix.
    proposer: EagleProposer (method "eagle", "eagle3", "mtp"), MultiLayerEagleProposer,
        AutoregressiveSpeculator or BlockProposer (method "block": DFlash, DSpark;
        K <= the head's block_size), built with KV caches of at least
        num_kv_blocks(B, max_model_len, K, block_size) blocks per layer; its config
        gives K, max_model_len and block_size. At temperature > 0 its drafts must be
        greedy (draft_sampling="greedy": one-hot draft probabilities) or
        probabilistic with return_probs="probs".
    max_new_tokens: per request (one int, or B ints) >= 1.
    sampling: SamplingParams(temperature [B] (0 = greedy), seeds [B]); default greedy.
        A token's noise is keyed by the request's seed and the token's position, so
        a request generates the same tokens in any batch.
    eos_token_id: one id, B ids (None = none for that request) or None. A request
        stops after emitting it (EOS is included in its tokens).
    max_model_len / block_size: for plain decoding (block_size default 16); with a
        proposer they come from its config.
    aux_layers: the target layers whose entering residual EAGLE-3 fuses (default
        default_aux_layers(num_layers)); a block drafter reads those its
        target_layer_ids name (any other value is an error); other methods read the
        final hidden state.
    compile: False, True or torch.compile options for the iteration (fullgraph=True).
    time_split: run each iteration as two calls (verify, draft) timed apart, which
        fills stats.verify_time_s / draft_time_s; off, an iteration is one call.
    progress: show a tqdm bar of generated tokens.
    budget: None (every request verifies K drafts) or the most drafts verified per
        iteration over the batch, the ones of best expected gain (SpeculativeDecoder).

    Returns GenerationResult(tokens: list of 1-D int32 CPU tensors, stats:
    GenerationStats (see there for the definition of every statistic)). For
    repeated runs keep a SpeculativeDecoder (its compiled iteration is reused).
    """
    decoder = SpeculativeDecoder(
        target,
        proposer,
        max_model_len=max_model_len,
        block_size=block_size,
        aux_layers=aux_layers,
        compile=compile,
        budget=budget,
    )
    return decoder.generate(
        prompts, max_new_tokens=max_new_tokens, sampling=sampling, eos_token_id=eos_token_id,
        time_split=time_split, progress=progress,
    )  # fmt: skip


def generate_plain(target, prompts, **kwargs) -> GenerationResult:
    """The baseline: `generate` with no proposer (one target pass per token; the same
    statistics, with K = 0: mean_acceptance_length 1). max_model_len is required."""
    if "proposer" in kwargs:
        raise ValueError("proposer: generate_plain decodes without one; call generate instead")
    return generate(target, prompts, None, **kwargs)
