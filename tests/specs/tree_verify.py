"""Tree verification in plain Python, one request at a time, in float64, written from
the rule (specdraft.ops.sampling.tree_verify's module docstring): walk from the root,
try each node's children in ascending node index, accept greedily (token == argmax)
or with probability r(x) / R against the residual r of the target's distribution,
zeroing each rejected token; emit the argmax, a sample of the residual after
rejections, or a sample of the target at a leaf. The noise is the counter-based hash
of specs.sampling, on Python ints."""

import math

from specs.sampling import (
    STREAM_ACCEPT,
    STREAM_SAMPLE,
    bits,
    exponential,
    first_argmax,
    row_key,
    softmax,
    truncate,
    uniform,
)


def children(parents, node):
    """The children of `node`, in the order they are tried: later nodes whose parent it is."""
    return [j for j in range(node + 1, len(parents)) if parents[j] == node]


def sample_race(weights, e):
    """argmax_i weights[i] / e[i] (the exponential race: a sample of weights / sum)."""
    return first_argmax([w / x for w, x in zip(weights, e, strict=True)])


def tree_verify(tokens, parents, logits, temperature, seed, position, salt, max_depth, cuts=None):
    """One request. tokens, parents: N ints; logits: N lists of V floats; cuts: N
    logit cuts of the node rows, or None (greedy requests ignore them).
    Returns (nodes [D + 1], emitted tokens [D + 1], count, ranks [D]), D = max_depth,
    padded with -1."""
    vocab = len(logits[0])
    if cuts is not None and temperature > 0:
        logits = [truncate(row, cut) for row, cut in zip(logits, cuts, strict=True)]
    cur, path, ranks = 0, [0], []
    tried = []  # the children of `cur` tried and rejected
    residual = None
    while True:
        depth = len(path) - 1
        kids = children(parents, cur) if depth < max_depth else []
        accepted = None
        if temperature <= 0:
            best = first_argmax(logits[cur])
            for rank, j in enumerate(kids):
                if tokens[j] == best:
                    accepted = (rank, j)
                    break
        else:
            residual = softmax(logits[cur], temperature)
            rejected_mass = 0.0
            key = row_key(seed, position + depth, salt, STREAM_ACCEPT)
            for rank, j in enumerate(kids):
                x = tokens[j]
                r = residual[x] if 0 <= x < vocab else 0.0
                u = uniform(bits(key, rank))
                if r > 0 and u * (1.0 - rejected_mass) <= r:
                    accepted = (rank, j)
                    break
                if 0 <= x < vocab:
                    residual[x] = 0.0
                rejected_mass += r
        if accepted is None:
            tried = kids
            break
        rank, cur = accepted
        path.append(cur)
        ranks.append(rank)

    count = len(path) - 1
    if temperature <= 0:
        emitted = first_argmax(logits[cur])
    else:
        key = row_key(seed, position + count, salt, STREAM_SAMPLE)
        e = [exponential(bits(key, i)) for i in range(vocab)]
        if tried:
            p = softmax(logits[cur], temperature)
            emitted = sample_race(residual, e) if max(residual) > 0 else sample_race(p, e)
        else:
            emitted = first_argmax([x / temperature - math.log(e[i]) for i, x in enumerate(logits[cur])])
    pad = max_depth - count
    emitted_tokens = [tokens[j] for j in path[1:]] + [emitted] + [-1] * pad
    return path + [-1] * pad, emitted_tokens, count, ranks + [-1] * pad
