"""EAGLE-2's tree build in plain Python, one request at a time, written from the
algorithm (specdraft.proposers.tree_build's module docstring), with its tie rules:
the frontier and the final selection prefer the lower pool index among equal scores,
and the final selection a shallower node."""

import numpy as np


def build_tree(root_token, steps, topk, num_verify_tokens):
    """steps[0]: the root's children as [(token, logprob)] * topk; steps[k] for k >= 1:
    per frontier node (in frontier order), its children [(token, logprob)] * topk.
    Returns (tokens, parents, depths, scores, ancestors) of the kept tree as lists.
    Scores add in float32, as the library's do, so equal sums tie the same way."""
    pool = []  # (token, score, parent pool index or -1, depth)
    for token, logprob in steps[0]:
        pool.append((token, np.float32(logprob), -1, 1))
    frontier = list(range(topk))
    for depth, children in enumerate(steps[1:], start=2):
        start = len(pool)
        for node, kids in zip(frontier, children, strict=True):
            for token, logprob in kids:
                pool.append((token, np.float32(pool[node][1] + np.float32(logprob)), node, depth))
        candidates = list(range(start, len(pool)))
        frontier = sorted(candidates, key=lambda i: (-pool[i][1], i))[:topk]
    kept = sorted(range(len(pool)), key=lambda i: (-pool[i][1], pool[i][3], i))[: num_verify_tokens - 1]
    kept = sorted(kept, key=lambda i: (pool[i][3], i))
    where = {node: k + 1 for k, node in enumerate(kept)}
    tokens = [root_token] + [pool[i][0] for i in kept]
    parents = [-1] + [0 if pool[i][2] < 0 else where[pool[i][2]] for i in kept]
    depths = [0] + [pool[i][3] for i in kept]
    scores = [0.0] + [float(pool[i][1]) for i in kept]
    n = len(tokens)
    ancestors = [[False] * n for _ in range(n)]
    for i in range(n):
        j = i
        while j >= 0:
            ancestors[i][j] = True
            j = parents[j]
    return tokens, parents, depths, scores, ancestors


def top_ids(logprobs, k: int) -> list[int]:
    """The k likeliest ids of a [V] row, ties to the lower id, by a plain sort."""
    return sorted(range(logprobs.shape[0]), key=lambda i: (-float(logprobs[i]), i))[:k]


def path_of(pool, b: int, index: int) -> list[int]:
    """The tokens from request b's root down to pool node `index` (a TreePool)."""
    path = []
    while index >= 0:
        path.append(int(pool.tokens[b, index]))
        index = int(pool.parents[b, index])
    return path[::-1]
