"""capture_target_outputs against transformers: the shipped demo target, read by
transformers' LlamaForCausalLM from the same folder, run on each sequence alone. The
captured aux states are transformers' hidden_states[i] (the residual stream entering
layer i), the final state its last (normed) hidden state, the logits its logits."""

import pytest
import torch

from specdraft.assets import DEMO_PAIR, load_demo_pair
from specdraft.models import default_aux_layers
from specdraft.training import capture_target_outputs

LENGTHS = (37, 5, 20)


def sequences():
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (n,), generator=gen) for n in LENGTHS]


@pytest.fixture(scope="module")
def target():
    return load_demo_pair()[0]


def test_matches_transformers(target):
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        DEMO_PAIR / "target", dtype=torch.float32, attn_implementation="eager"
    ).eval()
    aux_layers = default_aux_layers(target.config.num_layers)
    seqs = sequences()
    with torch.no_grad():
        with_aux = capture_target_outputs(target, seqs, aux_layers=aux_layers)
        final = capture_target_outputs(target, seqs)
        start = 0
        for seq in seqs:
            out = reference(seq[None], output_hidden_states=True)
            rows = slice(start, start + seq.shape[0])
            want_aux = torch.cat([out.hidden_states[i][0] for i in aux_layers], -1)
            torch.testing.assert_close(with_aux.hidden_states[rows], want_aux, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(final.hidden_states[rows], out.hidden_states[-1][0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(with_aux.target_logits[rows], out.logits[0], rtol=1e-4, atol=1e-4)
            start += seq.shape[0]
    assert with_aux.cu_seqlens.tolist() == [0, 37, 42, 62]
    assert with_aux.positions.tolist() == [i for n in LENGTHS for i in range(n)]
    assert torch.equal(with_aux.token_ids, torch.cat(seqs))


def test_bad_sequences_are_refused(target):
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 256\)"):
        capture_target_outputs(target, [torch.tensor([1, 256])])
    with pytest.raises(ValueError, match="sequences: at least one"):
        capture_target_outputs(target, [])
    with pytest.raises(ValueError, match=r"sequences\[1\] must be a non-empty 1-D integer tensor"):
        capture_target_outputs(target, [torch.tensor([1]), torch.zeros(0, dtype=torch.long)])
    with pytest.raises(ValueError, match="past the target's max_position_embeddings 1024"):
        capture_target_outputs(target, [torch.zeros(1025, dtype=torch.long)])
