"""Slow per-request oracles for proposers whose draft layers each keep their own KV
(multi-layer EAGLE, several KV-cache groups), written from the references as plain
Python loops.

What a layer "remembers" is modelled directly: for each request and layer, a dict
position -> the input row (token id, position column, hidden state) last written at
that position. Every forward recomputes the layer over the whole sequence 0 .. p
from a fresh, zero-filled cache: remembered rows are written, positions never
written stay zero (as in a fresh paged cache, which is what the batched proposer
reads there), and the forward's own rows are new. Nothing is shared with the batched
code but the model weights and the sampler's noise: no block tables, no slot
mappings, no step metadata, no shift ops.

Groups only change *where* a layer's KV lives, so the multi-group proposer has the
same oracle as a single-group one.
"""

import torch

from specdraft.layout import BatchMetadata
from specdraft.ops.sampling import draft_sample_reference

BLOCK = 8


def first_row(positions):
    return positions[0] if positions.dim() == 2 else positions


def run_layer(model, memory, spec_step_idx, ids, positions, hidden):
    """Forward rows (ids [n], positions [n] or [R, n] at consecutive positions,
    hidden [n, H]) through the layer spec_step_idx picks, attending to `memory`
    (position -> (id, position column, hidden row)) for earlier positions. Records
    the rows in memory; returns the model's two outputs for them."""
    p = first_row(positions).tolist()
    assert p == list(range(p[0], p[0] + len(p))), "rows must sit at consecutive positions"
    length = p[-1] + 1
    seq_ids, seq_pos, seq_hidden, slots = [], [], [], []
    for q in range(length):
        if q >= p[0]:
            i = q - p[0]
            row = (int(ids[i]), positions[..., i], hidden[i])
        elif q in memory:
            row = memory[q]
        else:  # never written: zero K/V, like a fresh cache
            row = (0, torch.full_like(positions[..., 0], q), torch.zeros_like(hidden[0]))
        seq_ids.append(row[0])
        seq_pos.append(row[1])
        seq_hidden.append(row[2])
        slots.append(q if (q >= p[0] or q in memory) else -1)
    num_blocks = (length + BLOCK - 1) // BLOCK
    kv = model.allocate_kv_caches(num_blocks, BLOCK)
    meta = BatchMetadata(
        query_start_loc=torch.tensor([0, length], dtype=torch.int32),
        seq_lens=torch.tensor([length], dtype=torch.int32),
        block_table=torch.arange(num_blocks, dtype=torch.int32)[None],
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        max_query_len=length,
        max_seq_len=num_blocks * BLOCK,
    )
    h_sample, h_next = model(
        torch.tensor(seq_ids, dtype=torch.int32),
        torch.stack(seq_pos, dim=-1),
        torch.stack(seq_hidden),
        meta,
        kv,
        spec_step_idx=spec_step_idx,
    )
    for i, q in enumerate(p):
        memory[q] = (int(ids[i]), positions[..., i].clone(), hidden[i].clone())
    return h_sample[p[0] :], h_next[p[0] :]


def sample_one(model, h, spec_step_idx, b, token_pos, sampling, greedy, salt=0):
    logits = model.compute_logits(h[None], spec_step_idx=spec_step_idx)
    temp = torch.zeros(1) if greedy else sampling.temperature[b : b + 1]
    pos = torch.tensor([token_pos], dtype=torch.int64)
    return int(draft_sample_reference(logits, temp, sampling.seeds[b : b + 1], pos, salt)[0])


def shift_by_one(ids, sample_rows, tokens):
    """Reference 002's input shift over the packed batch: row i takes row i + 1's id
    (the last row keeps its own), then row sample_rows[b] takes tokens[b]."""
    out = list(ids[1:]) + [ids[-1]]
    for row, token in zip(sample_rows, tokens, strict=True):
        out[row] = int(token)
    return out


class Memories:
    """Per request, per layer: position -> row last written."""

    def __init__(self, num_layers):
        self.num_layers = num_layers
        self.rows = {}

    def of(self, b, layer):
        return self.rows.setdefault((b, layer), {})


def oracle_stepwise(model, batch, k, memories, *, rejected=None, greedy=True):
    """The shared propose loop (reference 002/003): one pass of layer 0 over the
    whole packed window (rejected rows included: they are written too), then K - 1
    single-token steps, step s with layer s % n_predict at position p + s."""
    n_predict = memories.num_layers
    qsl = batch.metadata.query_start_loc.tolist()
    num_reqs = len(qsl) - 1
    rej = rejected or [0] * num_reqs
    samples = [qsl[b + 1] - 1 - rej[b] for b in range(num_reqs)]
    ids = shift_by_one(batch.target_token_ids.tolist(), samples, batch.next_token_ids.tolist())
    hidden_all = model.combine_hidden_states(batch.target_hidden_states)
    out = []
    for b in range(num_reqs):
        start, stop = qsl[b], qsl[b + 1]
        positions = batch.target_positions[..., start:stop]
        h_sample, h_next = run_layer(model, memories.of(b, 0), 0, ids[start:stop], positions, hidden_all[start:stop])
        i = samples[b] - start
        pos = positions[..., i : i + 1]
        p0 = int(first_row(pos)[0])
        tokens = [sample_one(model, h_sample[i], 0, b, p0 + 1, batch.sampling, greedy)]
        hidden = h_next[i : i + 1]
        for s in range(1, k):
            layer = s % n_predict
            h_sample, hidden = run_layer(model, memories.of(b, layer), s, [tokens[-1]], pos + s, hidden)
            tokens.append(sample_one(model, h_sample[0], s, b, p0 + s + 1, batch.sampling, greedy))
        out.append(tokens)
    return out


class MultiLayerOracle:
    """Reference 000, one request at a time: adjust_input on the target window with a
    per-request tail of at most L = n_predict rows, then L whole-window passes."""

    def __init__(self, model, num_reqs):
        self.model = model
        self.num_layers = model.config.n_predict
        self.tails = [[] for _ in range(num_reqs)]  # rows (id, position column, hidden, slot)
        self.memories = Memories(self.num_layers)

    def adjust(self, b, window, sample):
        """window: the request's rows; sample: index of its token to sample in it.
        Returns (shifted window, moved sample index, shift); refreshes the tail."""
        n, tail = len(window), self.tails[b]
        first_pos = int(first_row(window[0][1][..., None])[0]) if n else 0
        shift = max(0, min(n - 1 - sample, first_pos))
        shift = min(shift, len(tail))
        shifted = tail[len(tail) - shift :] + window[: n - shift]
        sample += shift
        self.tails[b] = shifted[max(0, sample + 1 - self.num_layers) : sample + 1]
        return shifted, sample, shift

    def propose(self, batch, *, rejected=None, greedy=True):
        """Draft tokens [B][L] and the adjusted slot mapping / seq_lens (for checks)."""
        model = self.model
        qsl = batch.metadata.query_start_loc.tolist()
        num_reqs = len(qsl) - 1
        rej = rejected or [0] * num_reqs
        hidden_all = model.combine_hidden_states(batch.target_hidden_states)
        slots_in = batch.metadata.slot_mapping.tolist()
        ids, cols, hidden, slots, samples, seq_lens = [], [], [], [], [], []
        for b in range(num_reqs):
            start, stop = qsl[b], qsl[b + 1]
            window = [
                (int(batch.target_token_ids[t]), batch.target_positions[..., t], hidden_all[t], slots_in[t])
                for t in range(start, stop)
            ]
            shifted, sample, shift = self.adjust(b, window, stop - start - 1 - rej[b])
            for row in shifted:
                ids.append(row[0])
                cols.append(row[1])
                hidden.append(row[2])
                slots.append(row[3])
            samples.append(start + sample)
            seq_lens.append(int(batch.metadata.seq_lens[b]) - shift)
        positions = torch.stack(cols, dim=-1)
        hidden = torch.stack(hidden)
        tokens = [[] for _ in range(num_reqs)]
        nxt = batch.next_token_ids.tolist()
        for k in range(self.num_layers):
            ids = shift_by_one(ids, samples, nxt if k == 0 else [t[-1] for t in tokens])
            new_hidden = torch.empty_like(hidden)
            for b in range(num_reqs):
                start, stop = qsl[b], qsl[b + 1]
                h_sample, h_next = run_layer(
                    model, self.memories.of(b, k), k, ids[start:stop], positions[..., start:stop], hidden[start:stop]
                )
                new_hidden[start:stop] = h_next
                i = samples[b] - start
                p = int(first_row(positions[..., samples[b] : samples[b] + 1])[0])
                tokens[b].append(sample_one(model, h_sample[i], k, b, p + k + 1, batch.sampling, greedy))
            hidden = new_hidden
        return tokens, slots, seq_lens
