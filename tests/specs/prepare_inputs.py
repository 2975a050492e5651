"""Plain-Python oracles for the ops that drop rejected drafts (prepare_eagle.py,
prepare_inputs.py), one request at a time, and the edge layouts their tests share."""

from specdraft.testing import RejectionLayout, SampledLayout


def spec_prepare_eagle_input(qsl, rejected, num_tokens):
    cu_new, indices = [0], []
    for b in range(len(rejected)):
        kept = qsl[b + 1] - qsl[b] - rejected[b]
        indices += list(range(qsl[b], qsl[b] + kept))
        cu_new.append(cu_new[-1] + kept)
    return cu_new, (indices + [0] * num_tokens)[:num_tokens]


def spec_prepare_inputs_padded(cu_drafts, valid, qsl):
    samples, rejected = [], []
    for b in range(len(cu_drafts)):
        drafts = cu_drafts[b] - (cu_drafts[b - 1] if b else 0)
        rej = drafts + 1 - valid[b] if drafts > 0 else 0
        samples.append(qsl[b + 1] - 1 - rej)
        rejected.append(rej)
    return samples, rejected


def spec_next_token(layout: SampledLayout):
    next_ids, counts = [], []
    for row, discard, backup in zip(layout.sampled_token_ids, layout.discard, layout.backup, strict=True):
        valid = [t for t in row if 0 <= t < layout.vocab_size] if not discard else []
        next_ids.append(valid[-1] if valid else backup)
        counts.append(len(valid))
    return next_ids, counts


# Past one scan block (256 requests) and one token block (32 rows).
MANY_REQUESTS = RejectionLayout(
    query_lens=[(b % 5) + 1 if b % 7 else 40 for b in range(300)],
    num_draft_tokens=[(b % 5) if b % 7 else 0 for b in range(300)],
    valid_counts=[((b * 3) % ((b % 5) + 1)) + 1 if b % 7 else 1 for b in range(300)],
)


# K+1 = 21 > one 16-column chunk of the kernel: the last valid id in either chunk.
WIDE_ROWS = SampledLayout(
    [[5] * 20 + [-1], [5] * 3 + [-1] * 18, [-1] * 16 + [7, 99, 8, -1, -1], [-1] * 21],
    [False] * 4,
    [1, 2, 3, 4],
    50,
)
