"""AutoregressiveSpeculator (standalone draft LM) against a slow per-request oracle
written here: one request at a time, the whole sequence recomputed from a fresh KV
cache at every draft step (no slot mapping, no step metadata, no batching). Greedy
and seeded sampling, 1-D and M-RoPE, advance_draft_positions True and False, the
logits buffer, rejected tokens, inputs_embeds, and requests at the edge of
max_model_len (clamped positions, PAD slots, KV written only where it should be)."""

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.layout import BatchMetadata
from specdraft.models import TinyTargetModel
from specdraft.ops.sampling import draft_sample_reference
from specdraft.proposers import AutoregressiveSpeculator, DraftLM
from specdraft.testing.proposers import make_draft_batch

from fixtures.draft_heads import VOCAB, draft_config

K = 3
BLOCK_SIZE = 4
QUERY_LENS = [5, 1, 9, 3]
REJECTED = [2, 0, 3, 1]
TEMPERATURES = [0.0, 1.0, 0.5, 2.0]


def make_lm(mrope: bool, seed: int = 0) -> TinyTargetModel:
    torch.manual_seed(seed)
    return TinyTargetModel(draft_config(mrope, num_layers=2)).eval()


# ------------------------------------------------------------------- the oracle


def run_sequence(lm, ids, positions, inputs_embeds=None):
    n = len(ids)
    num_blocks = (n + 7) // 8
    kv = lm.allocate_kv_caches(num_blocks, 8)
    meta = BatchMetadata(
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        block_table=torch.arange(num_blocks, dtype=torch.int32)[None],
        slot_mapping=torch.arange(n, dtype=torch.int64),
        max_query_len=n,
        max_seq_len=num_blocks * 8,
    )
    h, _ = lm(torch.tensor(ids, dtype=torch.int32), positions, meta, kv, inputs_embeds=inputs_embeds)
    return h


def oracle(lm, batch, *, max_model_len, advance=True, rejected=None, temperatures=None, inputs_embeds=None):
    """Per request: (tokens [K], logits / T [K, V], valid [K]); valid[k] is False when
    step k's fed token sits at or past max_model_len (its draft is unspecified)."""
    qsl = batch.metadata.query_start_loc.tolist()
    out = []
    for b in range(len(qsl) - 1):
        start, stop = qsl[b], qsl[b + 1] - (rejected[b] if rejected else 0)
        ids = batch.target_token_ids[start:stop].tolist() + [int(batch.next_token_ids[b])]
        pos = batch.target_positions[..., start:stop]
        pos = torch.cat([pos, pos[..., -1:] + 1], dim=-1)
        embeds = None
        if inputs_embeds is not None:
            next_embed = lm.embed_tokens(batch.next_token_ids[b : b + 1])
            embeds = torch.cat([inputs_embeds[start:stop], next_embed])
        temp = 0.0 if temperatures is None else temperatures[b]
        tokens, logits_t, valid = [], [], []
        for step in range(K):
            h = run_sequence(lm, ids, pos, embeds)
            logits = lm.compute_logits(h[-1:])
            fed = int(pos.reshape(-1, pos.shape[-1])[0, -1])
            token = draft_sample_reference(
                logits, torch.tensor([temp]), batch.sampling.seeds[b : b + 1], torch.tensor([fed + 1])
            )
            tokens.append(int(token[0]))
            logits_t.append(logits[0] / (temp if temp > 0 else 1.0))
            valid.append(fed < max_model_len)
            if advance or step == 0:
                ids = ids + [tokens[-1]]
                pos = torch.cat([pos, pos[..., -1:] + 1], dim=-1)
                if embeds is not None:
                    embeds = torch.cat([embeds, lm.embed_tokens(token)])
            else:  # constant positions: the newest draft token replaces the previous one
                ids = ids[:-1] + [tokens[-1]]
                if embeds is not None:
                    embeds = torch.cat([embeds[:-1], lm.embed_tokens(token)])
        out.append((tokens, torch.stack(logits_t), valid))
    return out


# -------------------------------------------------------------------- helpers


def build(mrope, sampling, *, query_lens=QUERY_LENS, blocks=6, max_model_len=256, advance=True, probs=None):
    lm = make_lm(mrope)
    batch = make_draft_batch(
        query_lens,
        vocab_size=VOCAB,
        target_hidden_size=8,
        block_size=BLOCK_SIZE,
        blocks_per_request=blocks,
        mrope=mrope,
        temperatures=TEMPERATURES[: len(query_lens)] if sampling == "probabilistic" else None,
    )
    config = SpeculativeConfig(
        num_speculative_tokens=K,
        max_model_len=max_model_len,
        block_size=BLOCK_SIZE,
        draft_sampling=sampling,
        return_probs=probs,
    )
    kv = lm.allocate_kv_caches(len(query_lens) * blocks, BLOCK_SIZE)
    for cache in kv:
        cache.copy_(torch.randn(cache.shape, generator=torch.Generator().manual_seed(7)))
    spec = AutoregressiveSpeculator(DraftLM(lm), config, kv, advance_draft_positions=advance)
    return lm, batch, spec


def propose(spec, batch, rejected=None, inputs_embeds=None):
    args = (batch.target_token_ids, batch.target_positions, None, batch.next_token_ids, batch.metadata, batch.sampling)
    nrej = None if rejected is None else torch.tensor(rejected, dtype=torch.int32)
    with torch.no_grad():
        return spec.propose(*args, num_rejected_tokens=nrej, inputs_embeds=inputs_embeds)


def assert_matches(got, want, check_logits=False):
    for b, (tokens, logits_t, valid) in enumerate(want):
        for k in range(K):
            if valid[k]:
                assert int(got.draft_tokens[b, k]) == tokens[k], (b, k)
                if check_logits:
                    torch.testing.assert_close(got.draft_probs[b, k], logits_t[k], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------- tests


@pytest.mark.parametrize("rejected", [None, REJECTED], ids=["plain", "rejected"])
@pytest.mark.parametrize("advance", [True, False], ids=["advance", "constant"])
@pytest.mark.parametrize("mrope", [False, True], ids=["1d", "mrope"])
@pytest.mark.parametrize("sampling", ["greedy", "probabilistic"])
def test_matches_oracle(sampling, mrope, advance, rejected):
    lm, batch, spec = build(mrope, sampling, advance=advance, probs="logits")
    temps = TEMPERATURES if sampling == "probabilistic" else None
    with torch.no_grad():
        want = oracle(lm, batch, max_model_len=256, advance=advance, rejected=rejected, temperatures=temps)
    got = propose(spec, batch, rejected)
    assert got.draft_tokens.dtype == torch.int32 and got.draft_tokens.shape == (len(QUERY_LENS), K)
    assert all(all(v) for _, _, v in want)
    assert_matches(got, want, check_logits=True)


def test_greedy_without_buffer_returns_no_probs():
    lm, batch, spec = build(False, "greedy")
    with torch.no_grad():
        want = oracle(lm, batch, max_model_len=256)
    got = propose(spec, batch)
    assert got.draft_probs is None
    assert_matches(got, want)


def test_inputs_embeds_replace_the_target_embeddings():
    lm, batch, spec = build(False, "greedy")
    embeds = torch.randn(len(batch.target_token_ids), lm.config.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = oracle(lm, batch, max_model_len=256, inputs_embeds=embeds)
        plain = oracle(lm, batch, max_model_len=256)
    got = propose(spec, batch, inputs_embeds=embeds)
    assert_matches(got, want)
    assert [w[0] for w in want] != [p[0] for p in plain]  # the embeddings mattered


def test_prefill_then_decode_equals_propose_and_leaves_state():
    lm, batch, spec = build(True, "probabilistic", probs="probs")
    args = (batch.target_token_ids, batch.target_positions, None, batch.next_token_ids, batch.metadata, batch.sampling)
    with torch.no_grad():
        whole = spec.propose(*args)
        state = spec.prefill(*args)
        before = (state.step.positions.clone(), state.step.batch.seq_lens.clone(), state.draft_step.clone())
        split = spec.decode(state)
    assert torch.equal(whole.draft_tokens, split.draft_tokens)
    torch.testing.assert_close(whole.draft_probs, split.draft_probs)
    assert torch.equal(state.step.positions, before[0]) and torch.equal(state.step.batch.seq_lens, before[1])
    assert int(state.draft_step) == int(before[2]) == 0
    torch.testing.assert_close(split.draft_probs.sum(-1), torch.ones(len(QUERY_LENS), K))


# ------------------------------------------------------------ edge of max_model_len

EDGE_LENS = [11, 12, 9, 5]  # next token / draft steps cross max_model_len = 12 differently
EDGE_MML, EDGE_BLOCKS = 12, 3  # reach = 3 * 4 = max_model_len


def allowed_slots(batch, kept_lens, advance):
    """Slots each request may write: its own blocks, positions < max_model_len, up to
    its last draft position (kept + K - 1 advancing, kept + 1 constant)."""
    table = batch.metadata.block_table.tolist()
    slots = set()
    for b, kept in enumerate(kept_lens):
        last = kept + (K - 1 if advance else min(K - 1, 1))
        for p in range(min(last + 1, EDGE_MML)):
            slots.add(table[b][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE)
    return slots


def changed_slots(before, after):
    changed = set()
    for old, new in zip(before, after, strict=True):
        diff = (old != new).reshape(2, -1, old.shape[2], old.shape[3] * old.shape[4]).any(-1).any(0)
        changed |= {int(i) for i in torch.nonzero(diff.reshape(-1)).flatten()}
    return changed


@pytest.mark.parametrize("rejected", [None, [3, 1, 0, 2]], ids=["plain", "rejected"])
@pytest.mark.parametrize("advance", [True, False], ids=["advance", "constant"])
@pytest.mark.parametrize("mrope", [False, True], ids=["1d", "mrope"])
def test_edge_of_max_model_len(mrope, advance, rejected):
    lm, batch, spec = build(
        mrope, "probabilistic", query_lens=EDGE_LENS, blocks=EDGE_BLOCKS, max_model_len=EDGE_MML, advance=advance,
        probs="logits",
    )  # fmt: skip
    before = [c.clone() for c in spec.kv_caches]
    with torch.no_grad():
        want = oracle(lm, batch, max_model_len=EDGE_MML, advance=advance, rejected=rejected, temperatures=TEMPERATURES)
    got = propose(spec, batch, rejected)
    assert_matches(got, want, check_logits=True)
    assert not all(all(v) for _, _, v in want)  # some steps clamp
    kept = [n - (rejected[b] if rejected else 0) for b, n in enumerate(EDGE_LENS)]
    assert changed_slots(before, spec.kv_caches) == allowed_slots(batch, kept, advance)


def test_prefill_state_clamps_the_next_token():
    lm, batch, spec = build(False, "greedy", query_lens=EDGE_LENS, blocks=EDGE_BLOCKS, max_model_len=EDGE_MML)
    args = (batch.target_token_ids, batch.target_positions, None, batch.next_token_ids, batch.metadata)
    with torch.no_grad():
        state = spec.prefill(*args)
    # request 1 (12 tokens) puts its next token at 12 = max_model_len: position 0, PAD, seq_len 1
    assert state.step.positions.tolist() == [11, 12, 9, 5]
    assert state.step.clamped_positions.tolist() == [11, 0, 9, 5]
    assert state.step.batch.slot_mapping[1] == -1 and state.step.batch.seq_lens.tolist() == [12, 1, 10, 6]


def test_bad_inputs_name_the_argument():
    lm, batch, spec = build(False, "greedy")
    args = [batch.target_token_ids, batch.target_positions, None, batch.next_token_ids, batch.metadata]
    with pytest.raises(ValueError, match="next_token_ids"):
        spec.propose(args[0], args[1], None, args[3][:-1], args[4])
    with pytest.raises(ValueError, match="target_positions"):
        spec.propose(args[0], args[1][:-1], None, args[3], args[4])
    with pytest.raises(ValueError, match="inputs_embeds"):
        spec.propose(*args, inputs_embeds=torch.zeros(3, lm.config.hidden_size))
    with pytest.raises(ValueError, match="kv_caches"):
        AutoregressiveSpeculator(DraftLM(lm), spec.config, spec.kv_caches[:1])
