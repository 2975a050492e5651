"""training.reduce under torch.distributed: two CPU processes (gloo), each with some
of the packed sequences, all-reduce their sums in one collective; the result equals,
bit for bit, the sums one process computes on the union of the data."""

import subprocess
import sys
import textwrap

import torch

from specdraft.training import DraftMetricSums

WORKER = textwrap.dedent(
    """
    import sys

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from specdraft.training import draft_metrics, reduce

    SEQ_LENS = [5, 8, 3, 6, 9]
    RANK_SEQUENCES = [[0, 1, 2], [3, 4]]  # rank 0: the first three sequences, rank 1: the rest
    K, VOCAB, DRAFT_VOCAB = 3, 13, 9
    SEEDS = 8


    def data(seed):
        g = torch.Generator().manual_seed(seed)
        total = sum(SEQ_LENS)
        target = torch.randn(total, VOCAB, generator=g) * 2
        draft = torch.randn(K, total, DRAFT_VOCAB, generator=g) * 2
        ids = torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB].sort().values
        draft = draft + torch.stack([torch.roll(target, -(k + 1), 0)[:, ids] for k in range(K)])
        loss_mask = torch.rand(total, generator=g) > 0.15
        # 0.02 to 2.7: per-pair values over many binades, where plain float64 sums depend on the order.
        temperature = torch.exp(torch.rand(total, generator=g) * 5 - 4)
        return draft, target, loss_mask, temperature, ids - torch.arange(DRAFT_VOCAB)


    def metrics(draft, target, loss_mask, temperature, d2t, seq_lens):
        cu = torch.tensor([0, *torch.tensor(seq_lens).cumsum(0).tolist()])
        return draft_metrics(draft, target, loss_mask, temperature, d2t=d2t, cu_seqlens=cu, divergence=True)


    def worker(rank, init_file, out_file):
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        starts = torch.tensor([0, *SEQ_LENS]).cumsum(0).tolist()
        rows = [t for s in RANK_SEQUENCES[rank] for t in range(starts[s], starts[s + 1])]
        results = []
        for seed in range(SEEDS):
            draft, target, loss_mask, temperature, d2t = data(seed)
            mine = metrics(draft[:, rows], target[rows], loss_mask[rows], temperature[rows], d2t,
                           [SEQ_LENS[s] for s in RANK_SEQUENCES[rank]])
            reduced = reduce(mine)
            whole = metrics(draft, target, loss_mask, temperature, d2t, SEQ_LENS)  # one process, all the data
            results.append({"reduced": tuple(reduced), "whole": tuple(whole), "local": tuple(mine)})
        if rank == 0:
            torch.save(results, out_file)
        dist.destroy_process_group()


    if __name__ == "__main__":
        mp.spawn(worker, args=(sys.argv[1], sys.argv[2]), nprocs=2, join=True)
    """
)


def test_reduce_over_two_processes_equals_one_process_on_the_union(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out_file = tmp_path / "sums.pt"
    subprocess.run(
        [sys.executable, str(script), str(tmp_path / "init"), str(out_file)], check=True, timeout=600,
        capture_output=True, text=True,
    )  # fmt: skip
    for seed, result in enumerate(torch.load(out_file)):
        reduced, whole, local = (DraftMetricSums(*result[key]) for key in ("reduced", "whole", "local"))
        for name, a, b in zip(DraftMetricSums._fields, reduced, whole, strict=True):
            assert torch.equal(a, b), (seed, name)
        # The reduction did something: rank 0 alone saw fewer pairs, and the sums are fractions.
        assert (local.count < whole.count).all() and (whole.accept != whole.accept.round()).all()
