"""The proposers of the invalid-input sweep (scripts/gpu_invalid_sweep.py): tiny
random heads of every kind on one device, their KV caches filled with a sentinel,
and one check per (invalid batch, path): no exception, vocabulary ids out, KV
changed only in the slots the batch names."""

import dataclasses

import torch

from specdraft.config import SpeculativeConfig
from specdraft.models import DraftModelConfig, Eagle3Head, EagleHead, MTPHead, TinyTargetModel
from specdraft.proposers import (
    AutoregressiveSpeculator,
    DraftLM,
    EagleProposer,
    GroupedBatchMetadata,
    MultiGroupMTPProposer,
    MultiLayerEagleProposer,
)

VOCAB, HIDDEN, TARGET_HIDDEN, K = 64, 32, 24, 3
BLOCK_SIZE, BLOCKS_PER_REQ, MAX_REQS, MAX_MODEL_LEN = 4, 6, 4, 256
NUM_BLOCKS = MAX_REQS * BLOCKS_PER_REQ + 3  # spare blocks no request owns
SENTINEL = 12345.0
PROPOSER_KINDS = ("eagle", "eagle3", "mtp", "parallel", "multi_layer", "multi_group", "autoregressive")
# Kinds whose propose takes token_indices_to_sample (parallel drafting and the
# autoregressive draft imply it from num_rejected_tokens).
TAKES_SAMPLE_INDEX = ("eagle", "eagle3", "mtp", "multi_layer", "multi_group")


def head_config(**overrides) -> DraftModelConfig:
    fields = dict(hidden_size=HIDDEN, intermediate_size=48, num_heads=4, num_kv_heads=2, vocab_size=VOCAB)
    return DraftModelConfig(**{**fields, **overrides})


def make_head(kind: str):
    """(model, config.method, width of the target hidden states it reads)."""
    torch.manual_seed(0)
    if kind in ("eagle", "parallel"):
        return EagleHead(head_config()).eval(), "eagle", HIDDEN
    if kind == "eagle3":
        head = Eagle3Head(head_config(draft_vocab_size=40, target_hidden_size=TARGET_HIDDEN)).eval()
        targets = torch.randperm(VOCAB)[:40].sort().values
        head.d2t.copy_(targets - torch.arange(40))
        head.t2d.zero_()[targets] = True
        return head, "eagle3", 3 * TARGET_HIDDEN
    if kind == "mtp":
        return MTPHead(head_config()).eval(), "mtp", HIDDEN
    if kind == "multi_layer":
        return MTPHead(head_config(n_predict=K)).eval(), "mtp", HIDDEN
    if kind == "multi_group":
        return MTPHead(head_config(n_predict=2), per_layer_lm_head=True).eval(), "mtp", HIDDEN
    if kind == "autoregressive":
        return DraftLM(TinyTargetModel(head_config(num_layers=1)).eval()), "eagle", HIDDEN
    raise ValueError(f"kind: unknown proposer kind {kind!r}")


class ProposerRig:
    def __init__(self, kind: str, device: str) -> None:
        self.kind, self.device = kind, device
        model, method, self.hidden_width = make_head(kind)
        self.model = model.to(device)
        config = SpeculativeConfig(
            method=method, num_speculative_tokens=K, max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE,
            draft_sampling="probabilistic", return_probs="probs", parallel_drafting=kind == "parallel",
            parallel_drafting_token_id=7 if kind == "parallel" else None,
        )  # fmt: skip
        caches = self.model.allocate_kv_caches(NUM_BLOCKS, BLOCK_SIZE, device=device)
        if kind == "multi_layer":
            self.proposer = MultiLayerEagleProposer(self.model, config, caches, max_num_reqs=MAX_REQS)
        elif kind == "multi_group":
            self.proposer = MultiGroupMTPProposer(
                self.model, config, caches, layer_groups=[0, 1], block_sizes=[BLOCK_SIZE, BLOCK_SIZE]
            )
        elif kind == "autoregressive":
            self.proposer = AutoregressiveSpeculator(self.model, config, caches)
        else:
            self.proposer = EagleProposer(self.model, config, caches)

    @property
    def batch_params(self) -> dict:
        return dict(vocab_size=VOCAB, target_hidden_size=self.hidden_width, block_size=BLOCK_SIZE,
                    blocks_per_request=BLOCKS_PER_REQ, num_blocks=NUM_BLOCKS, num_speculative_tokens=K,
                    max_model_len=MAX_MODEL_LEN, max_requests=MAX_REQS)  # fmt: skip

    def paths(self, case) -> list[str]:
        if self.kind in ("parallel", "autoregressive"):
            return ["propose"]
        return ["propose", "propose_padded", "propose_unpadded"]

    def on_device(self, case):
        batch = case.batch
        md = batch.metadata
        moved = dataclasses.replace(
            md, **{f: getattr(md, f).to(self.device) for f in ("query_start_loc", "seq_lens", "block_table", "slot_mapping")}
        )  # fmt: skip
        if self.kind == "multi_group":
            moved = GroupedBatchMetadata.from_groups(
                moved.query_start_loc, moved.seq_lens, [moved.block_table, moved.block_table],
                [moved.slot_mapping, moved.slot_mapping], moved.max_query_len, moved.max_seq_len,
            )  # fmt: skip
        sampling = dataclasses.replace(
            batch.sampling, temperature=batch.sampling.temperature.to(self.device), seeds=batch.sampling.seeds.to(self.device)
        )  # fmt: skip
        args = (batch.target_token_ids.to(self.device), batch.target_positions.to(self.device),
                batch.target_hidden_states.to(self.device), batch.next_token_ids.to(self.device), moved, sampling)  # fmt: skip
        kwargs = case.kwargs(self.device)
        if self.kind not in TAKES_SAMPLE_INDEX:
            kwargs.pop("token_indices_to_sample", None)
        return args, kwargs

    def call(self, case, path: str):
        args, kwargs = self.on_device(case)
        num_reqs = args[3].shape[0]
        p = self.proposer
        if path == "propose":
            return p.propose(*args, **kwargs)
        rejected = kwargs.get("num_rejected_tokens")
        if rejected is None:
            rejected = torch.zeros(num_reqs, dtype=torch.int32, device=self.device)
        if path == "propose_unpadded":
            return p.propose_unpadded(*args[:4], rejected, args[4], num_kept_tokens=args[0].shape[0], sampling=args[5])
        # propose_padded: a verification result as the sampler gives it, over the
        # batch's (possibly invalid) windows: drafts = window - 1 (at most K), some ids
        # past the vocabulary.
        qsl = case.batch.metadata.query_start_loc.tolist()
        drafts = [max(0, min(K, qsl[b + 1] - qsl[b] - 1)) for b in range(num_reqs)]
        cu = torch.tensor(drafts, dtype=torch.int32).cumsum(0).to(torch.int32)
        gen = torch.Generator().manual_seed(len(qsl))
        sampled = torch.randint(-1, VOCAB + 3, (num_reqs, K + 1), generator=gen, dtype=torch.int32)
        backup = torch.randint(0, VOCAB, (num_reqs,), generator=gen, dtype=torch.int32)
        return p.propose_padded(args[0], args[1], args[2], sampled.to(self.device), cu.to(self.device),
                                backup.to(self.device), args[4], args[5])  # fmt: skip

    def named_slots(self, case) -> torch.Tensor:
        """[NUM_BLOCKS * BLOCK_SIZE] bool: the slots the batch names."""
        md = case.batch.metadata
        named = torch.zeros(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool)
        blocks = md.block_table.flatten().long()
        blocks = blocks[(blocks >= 0) & (blocks < NUM_BLOCKS)]
        for offset in range(BLOCK_SIZE):
            named[blocks * BLOCK_SIZE + offset] = True
        slots = md.slot_mapping.long()
        named[slots[(slots >= 0) & (slots < NUM_BLOCKS * BLOCK_SIZE)]] = True
        return named

    def check(self, case, path: str) -> str | None:
        for cache in self.proposer.kv_caches:
            cache.fill_(SENTINEL)
        if hasattr(self.proposer, "reset_cache"):
            self.proposer.reset_cache()
        with torch.no_grad():
            out = self.call(case, path)
        if self.device == "cuda":
            torch.cuda.synchronize()
        tokens = out.draft_tokens
        if not bool(((tokens >= 0) & (tokens < VOCAB)).all()):
            return "draft token outside [0, V)"
        named = self.named_slots(case)
        for cache in self.proposer.kv_caches:
            changed = (cache != SENTINEL).any(dim=4).any(dim=3).any(dim=0).reshape(-1).cpu()
            if bool((changed & ~named).any()):
                return "KV written outside the batch's slots"
        return None
