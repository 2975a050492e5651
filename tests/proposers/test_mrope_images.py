"""M-RoPE batches holding images. An image of H x W tokens advances the temporal row
by one (and the others by H and W), so after it a token's temporal position lags its
index in the sequence. KV slots, seq_lens and the max_model_len clamp follow the
index; the rows only rotate.

Every proposer against an oracle that never sees a slot (specs.proposer: each
request's true sequence recomputed from a fresh cache at every step), and the whole
cache compared before and after: draft KV lands in each request's own next slots
(sequence indices kept, kept + 1, ...) and nowhere else. Rows equal to the sequence
index (text only) give exactly the 1-D results."""

import dataclasses

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.models import TinyTargetModel
from specdraft.ops.sampling import draft_sample_reference
from specdraft.proposers import (
    AutoregressiveSpeculator,
    DraftLM,
    EagleProposer,
    GroupedBatchMetadata,
    MultiGroupMTPProposer,
)
from specdraft.testing.proposers import make_draft_batch

from fixtures.draft_heads import VOCAB, draft_config, make_head
from fixtures.multi_proposers import mtp_head
from specs.proposer import oracle_propose, run_sequence

K, BLOCK_SIZE, BLOCKS = 3, 4, 10
QUERY_LENS = [30, 6, 21, 28]  # prefills: sequence index = offset in the window
# (first token, H, W) of each window's image; the temporal row at the window's end lags
# the sequence index by 18, 0, 12 and 4.
IMAGES = [(3, 4, 6), None, (0, 4, 4), (18, 2, 4)]
REJECTED = [2, 0, 3, 1]  # every window still ends on text
TEMPERATURES = [0.0, 1.0, 0.5, 2.0]
MASK_TOKEN = 7


def image_rows(length: int, image) -> list[tuple[int, int, int]]:
    """Qwen2-VL's M-RoPE positions of one window: text (t, t, t); the image's tokens
    (a, a + row, a + col); text after it from a + max(H, W)."""
    rows = []
    for i in range(length):
        if image is None or i < image[0]:
            rows.append((i, i, i))
        elif i < image[0] + image[1] * image[2]:
            r, c = divmod(i - image[0], image[2])
            rows.append((image[0], image[0] + r, image[0] + c))
        else:
            t = image[0] + max(image[1], image[2]) + i - image[0] - image[1] * image[2]
            rows.append((t, t, t))
    return rows


def image_batch(target_hidden: int, *, text_only: bool = False):
    """make_draft_batch's prefills (slots and seq_lens by sequence index), with image
    M-RoPE rows (or, text_only, three rows equal to the index)."""
    batch = make_draft_batch(
        QUERY_LENS, vocab_size=VOCAB, target_hidden_size=target_hidden, block_size=BLOCK_SIZE,
        blocks_per_request=BLOCKS, temperatures=TEMPERATURES,
    )  # fmt: skip
    images = [None] * len(IMAGES) if text_only else IMAGES
    rows = [r for n, image in zip(QUERY_LENS, images, strict=True) for r in image_rows(n, image)]
    return dataclasses.replace(batch, target_positions=torch.tensor(rows, dtype=torch.int64).T.contiguous())


def kept_lens(rejected) -> list[int]:
    return [n - (rejected[b] if rejected else 0) for b, n in enumerate(QUERY_LENS)]


def slots_of(table, indices_by_req, block_size=BLOCK_SIZE) -> set[int]:
    table = table.tolist()
    return {
        table[b][i // block_size] * block_size + i % block_size for b, idx in enumerate(indices_by_req) for i in idx
    }


def changed_slots(before: torch.Tensor, after: torch.Tensor) -> set[int]:
    """Slots of a [2, blocks, block_size, heads, dim] cache whose K or V changed."""
    diff = (before != after).any(dim=4).any(dim=3).any(dim=0).reshape(-1)
    return set(torch.nonzero(diff).flatten().tolist())


def random_caches(caches, seed=7):
    gen = torch.Generator().manual_seed(seed)
    for cache in caches:
        cache.copy_(torch.randn(cache.shape, generator=gen))
    return [c.clone() for c in caches]


def config(method="eagle", **kw) -> SpeculativeConfig:
    return SpeculativeConfig(
        method=method, num_speculative_tokens=K, max_model_len=kw.pop("max_model_len", 256), block_size=BLOCK_SIZE,
        draft_sampling="probabilistic", **kw,
    )  # fmt: skip


def run_path(proposer, batch, path):
    rejected = None if path == "plain" else torch.tensor(REJECTED, dtype=torch.int32)
    with torch.no_grad():
        if path == "plain":
            return proposer.propose(*batch.propose_args())
        if path == "padded":
            qsl = batch.metadata.query_start_loc
            return proposer.propose(
                *batch.propose_args(), token_indices_to_sample=qsl[1:] - 1 - rejected, num_rejected_tokens=rejected
            )
        args = batch.propose_args()
        return proposer.propose_unpadded(
            *args[:4], rejected, batch.metadata, num_kept_tokens=sum(QUERY_LENS), sampling=batch.sampling
        )


# ----------------------------------------------------------- EAGLE, one token a step


@pytest.mark.parametrize("path", ["plain", "padded", "unpadded"])
@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_eagle_drafts_and_kv_follow_the_sequence_index(method, path):
    head, target_hidden = make_head(method, mrope=True)
    batch = image_batch(target_hidden)
    proposer = EagleProposer(head, config(method), head.allocate_kv_caches(len(QUERY_LENS) * BLOCKS, BLOCK_SIZE))
    before = random_caches(proposer.kv_caches)
    rejected = None if path == "plain" else REJECTED
    got = run_path(proposer, batch, path)
    with torch.no_grad():
        want = oracle_propose(head, batch, K, rejected=rejected, greedy=False)
    assert got.draft_tokens.tolist() == want
    # The window (the unpadded path drops the rejected rows first), then the K - 1
    # steps' tokens at indices kept .. kept + K - 2.
    window = kept_lens(rejected) if path == "unpadded" else QUERY_LENS
    indices = [range(max(w, kept + K - 1)) for w, kept in zip(window, kept_lens(rejected), strict=True)]
    want_slots = slots_of(batch.metadata.block_table, indices)
    for old, new in zip(before, proposer.kv_caches, strict=True):
        assert changed_slots(old, new) == want_slots


def test_eagle_clamp_follows_the_sequence_index():
    """max_model_len 30: request 0 (30 tokens) feeds index 30 at step 1 although its
    temporal row is only at 12; request 3 reaches 29. Clamped steps write nothing."""
    mml = 30
    head, target_hidden = make_head("eagle", mrope=True)
    batch = image_batch(target_hidden)
    proposer = EagleProposer(
        head, config(max_model_len=mml), head.allocate_kv_caches(len(QUERY_LENS) * BLOCKS, BLOCK_SIZE)
    )
    before = random_caches(proposer.kv_caches)
    got = run_path(proposer, batch, "plain")
    with torch.no_grad():
        want = oracle_propose(head, batch, K, greedy=False)
    for b, n in enumerate(QUERY_LENS):
        valid = [k for k in range(K) if k == 0 or n - 1 + k < mml]  # draft k fed at index n - 1 + k
        assert [got.draft_tokens[b, k].item() for k in valid] == [want[b][k] for k in valid]
    indices = [range(min(n + K - 1, mml)) for n in QUERY_LENS]
    assert changed_slots(before[0], proposer.kv_caches[0]) == slots_of(batch.metadata.block_table, indices)


# -------------------------------------------------------------- parallel drafting


def oracle_parallel(head, batch, rejected):
    """Per request: [kept tokens shifted by one, next token, K - 1 mask tokens] at the
    kept tokens' own positions, the mask tokens continuing the last one's by one."""
    qsl = batch.metadata.query_start_loc.tolist()
    out = []
    for b, kept in enumerate(kept_lens(rejected)):
        start = qsl[b]
        ids = batch.target_token_ids[start + 1 : start + kept].tolist() + [int(batch.next_token_ids[b])]
        ids += [MASK_TOKEN] * (K - 1)
        last = batch.target_positions[:, start + kept - 1 : start + kept]
        positions = torch.cat([batch.target_positions[:, start : start + kept], last + torch.arange(1, K)], dim=1)
        hidden = head.combine_hidden_states(batch.target_hidden_states[start : start + kept])
        hidden = torch.cat([hidden, hidden.new_zeros(K - 1, hidden.shape[1])])
        h_sample, _ = run_sequence(head, torch.tensor(ids, dtype=torch.int32), positions, hidden, spec_step_idx=0)
        logits = head.compute_logits(h_sample[kept - 1 :], spec_step_idx=0)
        temp = batch.sampling.temperature[b].repeat(K)
        out.append(
            draft_sample_reference(logits, temp, batch.sampling.seeds[b].repeat(K), positions[0, kept - 1 :] + 1)
        )
    return [t.tolist() for t in out]


@pytest.mark.parametrize("rejected", [None, REJECTED], ids=["all-kept", "rejected"])
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_parallel_drafting_follows_the_sequence_index(method, rejected):
    head, target_hidden = make_head(method, mrope=True)
    batch = image_batch(target_hidden)
    cfg = config(method, parallel_drafting=True, parallel_drafting_token_id=MASK_TOKEN)
    proposer = EagleProposer(head, cfg, head.allocate_kv_caches(len(QUERY_LENS) * BLOCKS, BLOCK_SIZE))
    before = random_caches(proposer.kv_caches)
    nrej = torch.tensor(rejected or [0] * len(QUERY_LENS), dtype=torch.int32)
    with torch.no_grad():
        got = proposer.propose(*batch.propose_args(), num_rejected_tokens=nrej)
        want = oracle_parallel(head, batch, rejected)
    assert got.draft_tokens.tolist() == want
    # Kept tokens and the next token at 0 .. kept - 1, the mask slots after them;
    # rejected slots write nothing.
    indices = [range(kept + K - 1) for kept in kept_lens(rejected)]
    assert changed_slots(before[0], proposer.kv_caches[0]) == slots_of(batch.metadata.block_table, indices)


# ------------------------------------------------------------ several KV groups


def test_multi_group_follows_the_sequence_index():
    """Two groups (block sizes 4 and 8, tables of their own): the same drafts as the
    single-group EAGLE loop (whose KV placement the tests above check), and each
    layer's KV only at the sequence indices it writes (layer 0: the window and step
    2; layer 1: step 1)."""
    head = mtp_head(True, 2, per_layer_lm_head=True)
    batch = image_batch(32)
    md = batch.metadata
    gen = torch.Generator().manual_seed(5)
    table1 = torch.randperm(len(QUERY_LENS) * 6, generator=gen).view(len(QUERY_LENS), 6).int()
    index = torch.cat([torch.arange(n) for n in QUERY_LENS])
    owner = torch.cat([torch.full((n,), b) for b, n in enumerate(QUERY_LENS)])
    slots1 = table1[owner, index // 8].long() * 8 + index % 8
    grouped = GroupedBatchMetadata.from_groups(
        md.query_start_loc, md.seq_lens, [md.block_table, table1], [md.slot_mapping, slots1], md.max_query_len,
        md.max_seq_len,
    )  # fmt: skip
    caches = [torch.zeros(head.kv_cache_shape(len(QUERY_LENS) * BLOCKS, 4)), torch.zeros(head.kv_cache_shape(24, 8))]
    multi = MultiGroupMTPProposer(head, config("mtp"), caches, layer_groups=[0, 1], block_sizes=[4, 8])
    single = EagleProposer(head, config("mtp"), head.allocate_kv_caches(len(QUERY_LENS) * BLOCKS, BLOCK_SIZE))
    # Zero caches: each layer also reads indices only the other layer wrote, and
    # zeros read the same in both layouts.
    before = [c.clone() for c in multi.kv_caches]
    with torch.no_grad():
        got = multi.propose(*batch.propose_args()[:4], grouped, batch.sampling)
        want = single.propose(*batch.propose_args())
    assert got.draft_tokens.tolist() == want.draft_tokens.tolist()
    layer0 = [[*range(n), n + 1] for n in QUERY_LENS]  # first pass, then step 2 (index n + 1)
    layer1 = [[n] for n in QUERY_LENS]  # step 1 (index n)
    assert changed_slots(before[0], multi.kv_caches[0]) == slots_of(md.block_table, layer0)
    assert changed_slots(before[1], multi.kv_caches[1]) == slots_of(table1, layer1, block_size=8)


# ------------------------------------------------------------ autoregressive draft LM


def oracle_autoregressive(lm, batch, rejected):
    """Per request: the kept tokens and the next token at the last kept position + 1,
    then K - 1 steps, each appending the newest draft one position on."""
    model = DraftLM(lm)
    qsl = batch.metadata.query_start_loc.tolist()
    out = []
    for b, kept in enumerate(kept_lens(rejected)):
        start = qsl[b]
        ids = batch.target_token_ids[start : start + kept].tolist() + [int(batch.next_token_ids[b])]
        pos = batch.target_positions[:, start : start + kept]
        pos = torch.cat([pos, pos[:, -1:] + 1], dim=1)
        tokens = []
        for _ in range(K):
            h, _ = run_sequence(model, torch.tensor(ids, dtype=torch.int32), pos, None, spec_step_idx=0)
            temp = batch.sampling.temperature[b : b + 1]
            token = draft_sample_reference(
                lm.compute_logits(h[-1:]), temp, batch.sampling.seeds[b : b + 1], pos[0, -1:] + 1
            )
            tokens.append(int(token[0]))
            ids.append(tokens[-1])
            pos = torch.cat([pos, pos[:, -1:] + 1], dim=1)
        out.append(tokens)
    return out


@pytest.mark.parametrize("rejected", [None, REJECTED], ids=["plain", "rejected"])
def test_autoregressive_follows_the_sequence_index(rejected):
    torch.manual_seed(0)
    lm = TinyTargetModel(draft_config(True, num_layers=2)).eval()
    batch = image_batch(8)
    spec = AutoregressiveSpeculator(DraftLM(lm), config(), lm.allocate_kv_caches(len(QUERY_LENS) * BLOCKS, BLOCK_SIZE))
    before = random_caches(spec.kv_caches)
    nrej = None if rejected is None else torch.tensor(rejected, dtype=torch.int32)
    with torch.no_grad():
        got = spec.propose(*batch.propose_args(), num_rejected_tokens=nrej)
        want = oracle_autoregressive(lm, batch, rejected)
    assert got.draft_tokens.tolist() == want
    # Kept rows, the next token at index kept, the decode steps after it; rejected rows PAD.
    indices = [range(kept + K) for kept in kept_lens(rejected)]
    for old, new in zip(before, spec.kv_caches, strict=True):
        assert changed_slots(old, new) == slots_of(batch.metadata.block_table, indices)


# ------------------------------------------------ rows equal to the index: 1-D parity


@pytest.mark.parametrize("kind", ["eagle", "parallel", "multi-group", "autoregressive"])
def test_rows_equal_to_the_index_give_the_1d_results(kind):
    """Text-only M-RoPE rows ([3, T], all equal to the sequence index) against the same
    batch's 1-D positions: the same drafts and the same caches, bit for bit."""
    results = []
    for rows in (1, 3):
        if kind == "autoregressive":
            torch.manual_seed(0)
            head = TinyTargetModel(draft_config(True, num_layers=2)).eval()
            model, target_hidden = DraftLM(head), 8
        elif kind == "multi-group":
            model, target_hidden = mtp_head(True, 2, per_layer_lm_head=True), 32
        else:
            model, target_hidden = make_head("eagle", mrope=True)
        batch = image_batch(target_hidden, text_only=True)
        if rows == 1:
            batch = dataclasses.replace(batch, target_positions=batch.target_positions[0].contiguous())
        caches = model.allocate_kv_caches(len(QUERY_LENS) * BLOCKS, BLOCK_SIZE)
        random_caches(caches)
        metadata = batch.metadata
        if kind == "autoregressive":
            proposer = AutoregressiveSpeculator(model, config(), caches)
        elif kind == "multi-group":
            proposer = MultiGroupMTPProposer(model, config("mtp"), caches, layer_groups=[0, 0], block_sizes=[4])
            metadata = GroupedBatchMetadata.from_groups(
                metadata.query_start_loc, metadata.seq_lens, [metadata.block_table], [metadata.slot_mapping],
                metadata.max_query_len, metadata.max_seq_len,
            )  # fmt: skip
        else:
            cfg = config(parallel_drafting=kind == "parallel", parallel_drafting_token_id=MASK_TOKEN)
            proposer = EagleProposer(model, cfg, caches)
        rejected = torch.tensor(REJECTED, dtype=torch.int32)
        args = (*batch.propose_args()[:4], metadata, batch.sampling)
        with torch.no_grad():
            if kind in ("eagle", "multi-group"):
                qsl = metadata.query_start_loc
                out = proposer.propose(
                    *args, token_indices_to_sample=qsl[1:] - 1 - rejected, num_rejected_tokens=rejected
                )
            else:
                out = proposer.propose(*args, num_rejected_tokens=rejected)
        results.append((out.draft_tokens, caches))
    (tokens_1d, caches_1d), (tokens_3, caches_3) = results
    assert torch.equal(tokens_1d, tokens_3)
    for a, b in zip(caches_1d, caches_3, strict=True):
        assert torch.equal(a, b)
