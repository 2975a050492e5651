"""Plain-Python oracles for ops.vocab_metrics (one row at a time, float64: explicit
softmax, min, sum) and for training.draft_metrics (loops over sequences, starts and
steps, with a request's truncation by specs.truncation's rule)."""

import math

import specs.truncation as truncation_spec

INF = math.inf


def argmax(values: list[float]) -> int:
    """The first index of the maximum (0 when nothing beats -inf), as torch.argmax."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def logsumexp(z: list[float]) -> float:
    top = max(z)
    if top == -INF:
        return -INF
    return top + math.log(sum(math.exp(v - top) for v in z))


def softmax(z: list[float]) -> list[float]:
    """exp(z) / sum exp(z); all zeros for a row of -inf (no mass)."""
    top = max(z)
    if top == -INF:
        return [0.0] * len(z)
    weights = [math.exp(v - top) for v in z]
    total = sum(weights)
    return [w / total for w in weights]


def log_softmax(z: list[float]) -> list[float]:
    lse = logsumexp(z)
    return [-INF if v == -INF or lse == -INF else v - lse for v in z]


def row_metrics(draft_row, target_row, temperature: float, d2t=None, target_is_probs=False) -> dict:
    """Everything ops.vocab_metrics computes for one row, from its definitions."""
    draft_vocab, vocab = len(draft_row), len(target_row)
    ids = [i + (0 if d2t is None else d2t[i]) for i in range(draft_vocab)]
    greedy = not temperature > 0
    scale = 1.0 if greedy else temperature
    z_d = [x / scale for x in draft_row]
    log_t = [(math.log(x) if x > 0 else -INF) for x in target_row] if target_is_probs else list(target_row)
    z_t = [x / scale for x in log_t]
    draft_token = ids[argmax(draft_row)]
    target_token = argmax(target_row)
    if greedy:  # one-hot p and q
        q = [1.0 if i == argmax(draft_row) else 0.0 for i in range(draft_vocab)]
        p = [1.0 if j == target_token else 0.0 for j in range(vocab)]
    else:
        q, p = softmax(z_d), softmax(z_t)
    p_on_draft = [p[j] if 0 <= j < vocab else 0.0 for j in ids]
    accept = sum(min(a, b) for a, b in zip(q, p_on_draft, strict=True))

    # Divergences: the target restricted to the draft ids, renormalised, against q at `scale`.
    z_on_draft = [z_t[j] if 0 <= j < vocab else -INF for j in ids]
    pd = softmax(z_on_draft)
    log_pd = log_softmax(z_on_draft)
    log_q = log_softmax(z_d)
    cross_entropy = sum(-w * lq for w, lq in zip(pd, log_q, strict=True) if w > 0)
    kl = sum(w * (lp - lq) for w, lp, lq in zip(pd, log_pd, log_q, strict=True) if w > 0)
    return {
        "draft_token": draft_token,
        "target_token": target_token,
        "draft_lse": logsumexp(z_d),
        "target_lse": logsumexp(z_t),
        "accept": accept,
        "cross_entropy": cross_entropy,
        "kl": kl,
    }


def truncated(row: list[float], temperature: float, truncation, probs: bool = False):
    """(row with the entries below specs.truncation's cut removed: -inf logits, 0
    probabilities (cut on their log), the cut's top-p margin)."""
    keys = [(math.log(x) if x > 0 else -INF) for x in row] if probs else row
    cut, margin = truncation_spec.truncation_cut(keys, temperature, *truncation)
    return [x if key >= cut else (0.0 if probs else -INF) for x, key in zip(row, keys, strict=True)], margin


BINS_PER_OCTAVE, NUM_BINS = 8, 256  # training.budget_curve's gain bins, from its docstring


def gain_bin(gain: float, margins: list | None = None) -> int:
    """The bin of an expected gain: floor(-8 log2 g) clamped to [0, 255], 0 in the
    last. margins: appended the distance of -8 log2 g to the nearest bin edge
    (g = 1 is exact in any precision: none)."""
    if not gain > 0:
        return NUM_BINS - 1
    octaves = -math.log2(gain) * BINS_PER_OCTAVE
    if margins is not None and 0 < octaves < NUM_BINS - 1:  # g = 1 is exact
        margins.append(abs(octaves - round(octaves)))
    return min(max(math.floor(octaves), 0), NUM_BINS - 1)


def largest_probability(row: list[float], temperature: float) -> float:
    """The largest probability of softmax(row / T), T = 1 when greedy."""
    scale = temperature if temperature > 0 else 1.0
    return max(softmax([x / scale for x in row]))


def draft_metric_sums(draft, target, loss_mask, temperatures, seq_lens, d2t=None, target_is_probs=False,
                      truncations=None, margins=None, survival=None, bin_margins=None) -> dict:  # fmt: skip
    """training.draft_metrics from its definition. draft[k][t], target[j]: lists of
    floats; loss_mask[j]: bool per target row; temperatures[t] per start; seq_lens:
    the packed sequences' lengths. Step k from start t is scored when row t + k + 1
    is in t's sequence and loss_mask[t + k + 1]; a full start has all K scored; its
    acceptance length is its number of leading greedy matches. truncations[t]: start
    t's (top_k, top_p, min_p), or None: accept is then sum min(p~, q~) of the draft
    row and the target row each truncated (`truncated`), the rest untruncated; each
    truncation's top-p margin is appended to `margins` when given. survival: [k][t]
    floats, or "draft" (each draft row's largest probability, of the truncated row
    when truncated): then the budget sums, per full start the gain of draft k is the
    product of survivals 0..k (each clamped to [0, 1], NaN as 0), and each bin of it
    (`gain_bin`) sums the drafts, those accepted (drafts 0..k all matched) and the
    product of accept over 0..k; expected_prefix[k] sums that product per step;
    bin_margins: each gain's distance to a bin edge."""
    num_steps = len(draft)
    sums = {
        name: [0.0] * num_steps for name in ("count", "matches", "accept", "accepted_prefix", "cross_entropy", "kl")
    }
    sums["starts"] = 0.0
    sums["expected_prefix"] = [0.0] * num_steps
    for name in ("budget_drafts", "budget_accepted", "budget_expected"):
        sums[name] = [0.0] * NUM_BINS
    lengths = []
    begin = 0
    for length in seq_lens:
        end = begin + length
        for t in range(begin, end):
            matched, accepts, survivals = [], [], []
            for k in range(num_steps):
                row = t + k + 1
                if row >= end or not loss_mask[row]:
                    matched.append(None)
                    continue
                m = row_metrics(draft[k][t], target[row], temperatures[t], d2t, target_is_probs)
                if truncations is not None:
                    draft_row, draft_margin = truncated(draft[k][t], temperatures[t], truncations[t])
                    target_row, target_margin = truncated(target[row], temperatures[t], truncations[t],
                                                          target_is_probs)  # fmt: skip
                    cut = row_metrics(draft_row, target_row, temperatures[t], d2t, target_is_probs)
                    m["accept"] = cut["accept"]
                    if margins is not None:
                        margins += [draft_margin, target_margin]
                if survival == "draft":
                    values = draft[k][t] if truncations is None else draft_row
                    survivals.append(largest_probability(values, temperatures[t]))
                elif survival is not None:
                    survivals.append(survival[k][t])
                accepts.append(m["accept"])
                match = m["draft_token"] == m["target_token"]
                matched.append(match)
                sums["count"][k] += 1
                sums["matches"][k] += match
                for name in ("accept", "cross_entropy", "kl"):
                    sums[name][k] += m[name]
            if all(v is not None for v in matched):
                sums["starts"] += 1
                run = 0
                while run < num_steps and matched[run]:
                    run += 1
                lengths.append(run)
                for k in range(run):
                    sums["accepted_prefix"][k] += 1
                if survival is not None:
                    gain, product = 1.0, 1.0
                    for k in range(num_steps):
                        rate = survivals[k]
                        gain *= 0.0 if rate != rate else min(max(rate, 0.0), 1.0)
                        product *= accepts[k]
                        b = gain_bin(gain, bin_margins)
                        sums["budget_drafts"][b] += 1
                        sums["budget_accepted"][b] += k < run
                        sums["budget_expected"][b] += product
                        sums["expected_prefix"][k] += product
        begin = end
    sums["acceptance_lengths"] = lengths
    return sums


def simulated_acceptance_length(per_step_accuracy: list[float]) -> float:
    """SpecForge's simulated acceptance length, a product of per-step means:
    a0 + a0 a1 + a0 a1 a2 + ..."""
    cumulative, total = 1.0, 0.0
    for acc in per_step_accuracy:
        cumulative *= acc
        total += cumulative
    return total
