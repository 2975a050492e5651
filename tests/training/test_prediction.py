"""Prediction meets reality on the shipped pair: the training-time unroll, run once
over the text that greedy speculative generation produced, predicts that
generation's acceptance exactly.

Greedy generation is deterministic, so the unroll's greedy drafts at every start
(draft tokens fed back, as at inference) say how many drafts each verification
accepts: the leading run of steps whose draft equals the next text token. Walking
the verification path (a chain starts at the last prompt row; after a accepted
drafts the next one starts a + 1 rows later) for as many passes as each request
made must give the accepted count per position that generate measured. The text
comes from a longer run (generation is a prefix of itself), so the last pass's
drafts past max_new_tokens can be checked too."""

import torch

from specdraft.demo import PROMPTS, build_decoders, encode
from specdraft.generation.verify import prompt_batch
from specdraft.training import draft_metrics, finalize, unroll_for_eval

K = 3
MAX_NEW = 40


def replay(draft_tokens, token_ids, cu_seqlens, prompt_lens, passes) -> torch.Tensor:
    """Accepted drafts per position along each request's verification path (a plain loop)."""
    accepted = torch.zeros(K, dtype=torch.long)
    for i, prompt_len in enumerate(prompt_lens):
        end = int(cu_seqlens[i + 1])
        start = int(cu_seqlens[i]) + prompt_len - 1
        for _ in range(int(passes[i])):
            run = 0
            while run < K and int(draft_tokens[run, start]) == int(token_ids[start + run + 2]):
                assert start + run + 2 < end, "the text must reach past the last pass"
                accepted[run] += 1
                run += 1
            start += run + 1
    return accepted


def test_unroll_predicts_greedy_generation():
    _, decoder = build_decoders("cpu", K, len(PROMPTS), compile=False)
    prompts = encode(PROMPTS)
    measured = decoder.generate(prompts, max_new_tokens=MAX_NEW).stats
    longer = decoder.generate(prompts, max_new_tokens=MAX_NEW + 2 * K + 2)
    texts = [p + t.tolist() for p, t in zip(prompts, longer.tokens, strict=True)]

    seqs, requests = decoder.requests(texts, 8, None, None)
    token_ids, positions, metadata, _ = prompt_batch(seqs, requests.block_table, decoder.block_size, decoder.reach)
    with torch.no_grad():
        hidden, aux = decoder.run_target(token_ids, positions, metadata)
        target_logits = decoder.target.compute_logits(hidden)
    head, cu_seqlens = decoder.proposer.model, metadata.query_start_loc
    out = unroll_for_eval(head, token_ids, aux, positions, cu_seqlens, num_steps=K)

    predicted = replay(out.draft_tokens, token_ids, cu_seqlens, [len(p) for p in prompts], measured.request_passes)
    assert predicted.tolist() == measured.accepted_per_position.tolist()

    # draft_metrics over the generated rows (target rows whose argmax is the next text
    # token) counts the same greedy matches as a plain loop over the text.
    total = token_ids.shape[0]
    generated_rows = torch.zeros(total, dtype=torch.bool)
    for i, p in enumerate(prompts):
        generated_rows[int(cu_seqlens[i]) + len(p) - 1 : int(cu_seqlens[i + 1]) - 1] = True
    sums = draft_metrics(out.logits, target_logits, generated_rows, 0.0, d2t=head.d2t, cu_seqlens=cu_seqlens)
    plain = [
        sum(int(out.draft_tokens[k, t]) == int(token_ids[t + k + 2]) for t in range(total - k - 1)
            if generated_rows[t + k + 1])
        for k in range(K)
    ]  # fmt: skip
    assert sums.matches.long().tolist() == plain
    metrics = finalize(sums)
    print(f"measured accepted drafts per pass {measured.mean_accepted_drafts.item():.3f}; predicted over every "
          f"start {metrics.acceptance_length.item():.3f} (product of marginals {metrics.marginal_acceptance_length.item():.3f})")  # fmt: skip
