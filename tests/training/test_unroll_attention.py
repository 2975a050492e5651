"""The unroll's attention rule and its two implementations, and the unroll's
argument checks.

- chain_attention, dense and flex, against a plain-loop spec: for each query, the
  list of keys it sees (context keys of its sequence up to t - offset, the diagonal
  keys its mask allows), softmax over them, zeros when there are none. GQA heads.
  FlexAttention runs eager and without autograd here (torch 2.13 has no CPU
  backward for it); compiled with gradients it runs on CUDA (the cuda test).
- The unroll with attention="flex" drafts what "dense" drafts, both loops.
- Bad arguments: a ValueError naming the argument.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.models import MTPHead
from specdraft.testing import CompileCounts, fresh_compile
from specdraft.training import unroll, unroll_for_eval
from specdraft.training.attention import chain_attention

from fixtures.draft_heads import draft_config
from fixtures.unroll_batches import head_for, make_packed

HEADS, KV_HEADS, DIM = 4, 2, 8


def spec_attention(q, ctx_k, ctx_v, diag_k, diag_v, seq, offset, visible, scale):
    num_blocks, num_rows = q.shape[:2]
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[2] // ctx_k.shape[1]
    for b in range(num_blocks):
        for t in range(num_rows):
            keys = [(ctx_k[s], ctx_v[s]) for s in range(num_rows) if seq[s] == seq[t] and s <= t - offset]
            keys += [(diag_k[c, t], diag_v[c, t]) for c in range(diag_k.shape[0]) if visible[b][c][t]]
            for h in range(q.shape[2]):
                if not keys:
                    continue
                scores = [float(q[b, t, h].double() @ k[h // group].double()) * scale for k, _ in keys]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                for w, (_, v) in zip(weights, keys, strict=True):
                    out[b, t, h] += w / total * v[h // group].double()
    return out


@st.composite
def attention_case(draw):
    lengths = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    num_rows = sum(lengths)
    num_blocks, num_diag = draw(st.integers(1, 3)), draw(st.integers(0, 3))
    offset = draw(st.integers(0, 2))
    visible = draw(
        st.lists(
            st.lists(
                st.lists(st.booleans(), min_size=num_rows, max_size=num_rows), min_size=num_diag, max_size=num_diag
            ),
            min_size=num_blocks,
            max_size=num_blocks,
        )
    )
    return lengths, num_blocks, num_diag, offset, visible, draw(st.integers(0, 2**31 - 1))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@settings(max_examples=20)
@given(case=attention_case())
@pytest.mark.parametrize("backend", ["dense", "flex"])
def test_chain_attention_matches_spec(backend, device, case):
    lengths, num_blocks, num_diag, offset, visible, seed = case
    num_rows = sum(lengths)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(num_blocks, num_rows, HEADS, DIM, generator=gen)
    ctx_k, ctx_v = (torch.randn(num_rows, KV_HEADS, DIM, generator=gen) for _ in range(2))
    diag_k, diag_v = (torch.randn(num_diag, num_rows, KV_HEADS, DIM, generator=gen) for _ in range(2))
    seq = [i for i, n in enumerate(lengths) for _ in range(n)]
    scale = DIM**-0.5
    want = spec_attention(q, ctx_k, ctx_v, diag_k, diag_v, seq, offset, visible, scale)
    args = [x.to(device) for x in (q, ctx_k, ctx_v)]
    diag = (diag_k.to(device), diag_v.to(device)) if num_diag else (None, None)
    mask = torch.tensor(visible, dtype=torch.bool, device=device) if num_diag else None
    with torch.no_grad():
        got = chain_attention(*args, *diag, seq_id=torch.tensor(seq, device=device), ctx_offset=offset,
                              diag_visible=mask, backend=backend, scale=scale)  # fmt: skip
    torch.testing.assert_close(got.double().cpu(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize(("kind", "tokens"), [("eagle3", "draft"), ("multi_layer", "draft"), ("mtp", "data")])
def test_flex_unroll_equals_dense(kind, tokens, device):
    head, target_hidden, loop = head_for(kind, True, device)
    packed = make_packed([4, 1, 6], target_hidden=target_hidden, mrope=True, seed=2, device=device)
    with torch.no_grad():
        dense = unroll(head, *packed.unroll_args(), num_steps=3, tokens=tokens, loop=loop, attention="dense")
        flex = unroll(head, *packed.unroll_args(), num_steps=3, tokens=tokens, loop=loop, attention="flex")
    assert torch.equal(flex.draft_tokens, dense.draft_tokens)
    torch.testing.assert_close(flex.logits, dense.logits, atol=2e-5, rtol=1e-5)


def test_flex_traces_fullgraph(device):
    """The flex path under torch.compile(fullgraph=True): the mask_mod with its
    captured tensors and create_block_mask trace with no graph break (aot_eager:
    Inductor lowers flex_attention to its fused kernel on CUDA only)."""
    head, target_hidden, loop = head_for("multi_layer", True, device)
    packed = make_packed([4, 1, 6], target_hidden=target_hidden, mrope=True, seed=2, device=device)
    args = packed.unroll_args()
    dense = unroll_for_eval(head, *args, num_steps=3, loop=loop, attention="dense")
    compiled = fresh_compile(
        lambda: unroll_for_eval(head, *args, num_steps=3, loop=loop, attention="flex"), fullgraph=True,
        backend="aot_eager",
    )  # fmt: skip
    with CompileCounts.measure() as counts:
        got = compiled()
    assert counts.graph_breaks == 0 and counts.compiles == 1
    assert torch.equal(got.draft_tokens, dense.draft_tokens)
    torch.testing.assert_close(got.logits, dense.logits, atol=2e-5, rtol=1e-5)


@pytest.mark.cuda
def test_compiled_flex_gradients_equal_dense_eager():
    """On CUDA, "auto" under torch.compile is the fused FlexAttention kernel: its loss
    and gradients equal the eager dense path's. head_dim 16 (flex's smallest)."""
    import copy

    torch.manual_seed(0)
    head = MTPHead(draft_config(False, hidden_size=64, num_heads=4, num_kv_heads=2, n_predict=3)).cuda()
    packed = make_packed([37, 5, 60], target_hidden=64, mrope=False, seed=1, device="cuda")

    def loss_fn(h):
        out = unroll(h, *packed.unroll_args(), num_steps=3, tokens="draft", loop="multi_layer")
        return (torch.logsumexp(out.logits.float(), -1) * out.valid).sum()

    eager_head = copy.deepcopy(head)
    want = loss_fn(eager_head)
    want.backward()
    got = torch.compile(loss_fn, fullgraph=True)(head)
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for (name, p), q in zip(head.named_parameters(), eager_head.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)


def test_padding_rows_change_nothing(device):
    """Rows past cu_seqlens[-1] (a padded batch) leave every real row's drafts as
    they are and start no valid step."""
    head, target_hidden, loop = head_for("eagle3", False, device)
    packed = make_packed([4, 3], target_hidden=target_hidden, mrope=False, seed=0, device=device)
    padded = make_packed([4, 3, 5], target_hidden=target_hidden, mrope=False, seed=0, device=device)
    padded.cu_seqlens = padded.cu_seqlens[:-1]
    padded.token_ids[:7], padded.hidden_states[:7] = packed.token_ids, packed.hidden_states
    with torch.no_grad():
        want = unroll(head, *packed.unroll_args(), num_steps=3, tokens="draft", loop=loop)
        got = unroll(head, *padded.unroll_args(), num_steps=3, tokens="draft", loop=loop)
    assert torch.equal(got.draft_tokens[:, :7], want.draft_tokens)
    torch.testing.assert_close(got.logits[:, :7], want.logits, atol=1e-6, rtol=1e-6)
    assert torch.equal(got.valid[:, :7], want.valid) and not got.valid[:, 7:].any()


@pytest.mark.parametrize("kind", ["eagle3", "multi_layer"])
def test_hidden_output_is_what_the_logits_read(kind, device):
    """hidden[k] is the state step k samples from: the head's own compute_logits of it
    gives the logits; return_logits=False leaves the rest as it is."""
    head, target_hidden, loop = head_for(kind, False, device)
    packed = make_packed([5, 2], target_hidden=target_hidden, mrope=False, seed=1, device=device)
    with torch.no_grad():
        out = unroll(head, *packed.unroll_args(), num_steps=3, tokens="draft", loop=loop)
        bare = unroll(head, *packed.unroll_args(), num_steps=3, tokens="draft", loop=loop, return_logits=False)
        for k in range(3):
            logits = head.compute_logits(out.hidden[k], spec_step_idx=k)
            if kind == "eagle3":
                logits = logits[:, head.draft_token_target_ids()]
            torch.testing.assert_close(out.logits[k], logits)
    assert bare.logits is None
    assert torch.equal(bare.hidden, out.hidden) and torch.equal(bare.draft_tokens, out.draft_tokens)


# ------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def eagle3():
    head, width, _ = head_for("eagle3", False)
    return head, make_packed([3, 4], target_hidden=width, mrope=False, seed=0)


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("tokens", lambda a, kw: kw.update(tokens="sampled")),
        ("loop", lambda a, kw: kw.update(loop="chained")),
        ("attention", lambda a, kw: kw.update(attention="sdpa")),
        ("num_steps", lambda a, kw: kw.update(num_steps=0)),
        ("return_logits", lambda a, kw: kw.update(return_logits=1)),
        ("token_ids", lambda a, kw: a.__setitem__(1, a[1].float())),
        ("hidden_states", lambda a, kw: a.__setitem__(2, a[2][:-1])),
        ("positions", lambda a, kw: a.__setitem__(3, torch.stack([a[3], a[3]]))),
        ("cu_seqlens", lambda a, kw: a.__setitem__(4, a[4][:1])),
        ("head", lambda a, kw: a.__setitem__(0, torch.nn.Linear(2, 2))),
        ("head", lambda a, kw: kw.update(loop="multi_layer")),  # EAGLE-3 has no layers to chain
    ],
)
def test_bad_arguments_name_themselves(eagle3, name, change):
    head, packed = eagle3
    args, kwargs = [head, *packed.unroll_args()], {"num_steps": 2}
    change(args, kwargs)
    with pytest.raises(ValueError, match=name):
        unroll(*args, **kwargs)


def test_heads_the_unroll_cannot_run():
    packed = make_packed([3], target_hidden=32, mrope=False, seed=0)
    torch.manual_seed(0)
    layered = MTPHead(draft_config(False, n_predict=2))
    with pytest.raises(ValueError, match="head.*multi_layer"):  # EAGLE's loop needs one layer
        unroll(layered, *packed.unroll_args(), num_steps=2)
    layered.missing_weights = frozenset({"lm_head"})
    with pytest.raises(ValueError, match="head has no lm_head"):
        unroll(layered, *packed.unroll_args(), num_steps=2, loop="multi_layer")
