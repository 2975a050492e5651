"""`python -m specdraft.capture TARGET OUT` (or `specdraft capture`): run a byte-level
target over text files and save its outputs as shards for `python -m specdraft.eval`
(format: specdraft.training.shards).

    python -m specdraft.capture demo data/           # the shipped target, held-out stdlib files
    python -m specdraft.capture path/to/target data/ --files a.py b.py --aux-layers none

TARGET is a Llama/Qwen2-family folder (load_target_model) or "demo" (the shipped
target). The text is read as bytes, so the target must have the 256-byte vocabulary;
for a target with a tokenizer, tokenize yourself and call
`specdraft.training.capture_target_outputs` then `save_batch`. The files are laid
end to end (a blank line between files) and cut into windows of --seq-len bytes;
each shard packs --per-shard windows. OUT must be new or empty (--overwrite replaces
the shards of an earlier run), so runs never mix; every argument is checked before
OUT is created. Exit status 2 on bad input, with one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdraft.__main__ import (
    DEVICE_HELP,
    NO_PROGRESS_HELP,
    ArgumentParser,
    add_threads_option,
    check_device,
    check_threads,
    load_model_folder,
    model_folder,
    run_reporting_errors,
    use_threads,
)

# No models, training or generation code above: they load after the arguments are
# parsed (in main), so --help and argument errors answer without them.

BYTE_VOCAB = 256


def build_parser(prog: str = "python -m specdraft.capture") -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help='target folder, or "demo" for the shipped target')
    parser.add_argument("out", type=Path, help="folder to write the shards to (created; must be new or empty)")
    parser.add_argument(
        "--files", nargs="+", type=Path, help="text files (default, for demo: the held-out stdlib files)"
    )
    parser.add_argument("--seq-len", type=int, default=512, help="bytes per sequence (default 512)")
    parser.add_argument("--per-shard", type=int, default=8, help="sequences per shard (default 8)")
    parser.add_argument("--max-sequences", type=int, default=None, help="stop after this many sequences")
    parser.add_argument(
        "--aux-layers", default="eagle3", help='what hidden_states holds: "eagle3" (the default aux layers '
        '(2, N // 2, N - 3), what EAGLE-3 heads fuse), "none" (the final hidden state: EAGLE-1 / MTP), or '
        'layer ids "2,5,8"',
    )  # fmt: skip
    parser.add_argument(
        "--overwrite", action="store_true", help="write into a non-empty OUT: its *.safetensors files (an earlier "
        "run's shards) are deleted first",
    )  # fmt: skip
    parser.add_argument("--device", default="cpu", help=DEVICE_HELP)
    add_threads_option(parser)
    parser.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    return parser


def parse_args(argv=None, prog: str = "python -m specdraft.capture") -> argparse.Namespace:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.seq_len < 2 or args.per_shard < 1 or (args.max_sequences is not None and args.max_sequences < 1):
        parser.error("--seq-len must be >= 2, --per-shard and --max-sequences >= 1")
    check_threads(parser, args)
    if args.files is None and args.target != "demo":
        parser.error("--files is required unless TARGET is demo")
    return args


def aux_layers_of(spec: str, num_layers: int) -> tuple[int, ...]:
    from specdraft.models import default_aux_layers

    if spec == "eagle3":
        return default_aux_layers(num_layers)
    if spec == "none":
        return ()
    try:
        layers = tuple(int(i) for i in spec.split(","))
    except ValueError:
        raise ValueError(f'--aux-layers: expected "eagle3", "none" or comma-separated ints, got {spec!r}') from None
    for layer in layers:
        if not 0 <= layer < num_layers:
            raise ValueError(f"--aux-layers: layer {layer} is not in [0, {num_layers}) (the target's layers)")
    return layers


def read_text_bytes(files: list[Path]):
    """The files' bytes back to back (a blank line between files), as uint8."""
    import torch

    for f in files:
        if not f.is_file():
            raise ValueError(f"--files: {f} is not a file")
    blob = b"\n\n".join(f.read_bytes() for f in files)
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


def text_windows(files: list[Path], seq_len: int, what: str = "--files") -> list:
    """The files' bytes back to back, cut into full windows of seq_len bytes; what
    names the files in the error when they hold less than one window."""
    data = read_text_bytes(files).long()
    count = data.numel() // seq_len
    if count == 0:
        raise ValueError(f"--seq-len {seq_len}: {what} hold {data.numel()} bytes in all, fewer than one --seq-len "
                         f"window of {seq_len}")  # fmt: skip
    return list(data[: count * seq_len].view(count, seq_len))


def load_target(folder: Path, device):
    """load_target_model, with a folder that holds no target (a draft head's, say)
    named as TARGET's."""
    from specdraft.models.target_loading import load_target_model

    try:
        return load_target_model(folder, device=device)
    except ValueError as error:
        raise ValueError(f"TARGET: {folder} does not hold a target model ({error})") from None


def check_out(out: Path, overwrite: bool) -> None:
    """OUT is new, an empty folder, or (--overwrite) a folder to reuse."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"OUT: {out} exists and is not a folder")
    if out.is_dir() and not overwrite and any(out.iterdir()):
        raise ValueError(f"OUT: {out} is not empty; pass --overwrite to replace the shards of an earlier run")


def main(argv=None, prog: str = "python -m specdraft.capture") -> int:
    args = parse_args(argv, prog)
    return run_reporting_errors(capture, args)


def capture(args: argparse.Namespace) -> int:
    check_out(args.out, args.overwrite)
    from specdraft.assets import demo_held_out_files

    files = args.files if args.files is not None else demo_held_out_files()
    what = "--files" if args.files is not None else "the demo's held-out stdlib files"
    windows = text_windows(files, args.seq_len, what)[: args.max_sequences]
    device = check_device(args.device)
    use_threads(args.threads, device)

    from tqdm.auto import tqdm

    from specdraft.training.capture import capture_target_outputs
    from specdraft.training.shards import save_batch

    folder = model_folder("TARGET", args.target, "target")
    target = load_model_folder("TARGET", folder, lambda: load_target(folder, device)).eval()
    if target.config.vocab_size != BYTE_VOCAB:
        raise ValueError(
            f"target: vocab_size {target.config.vocab_size}; this command feeds raw bytes and needs 256. "
            "Tokenize yourself and call specdraft.training.capture_target_outputs."
        )
    aux_layers = aux_layers_of(args.aux_layers, target.config.num_layers)
    # Every argument checked: only now is OUT created (or its old shards cleared).
    args.out.mkdir(parents=True, exist_ok=True)
    if args.overwrite:
        for old in args.out.glob("*.safetensors"):
            old.unlink()
    shards = [windows[i : i + args.per_shard] for i in range(0, len(windows), args.per_shard)]
    for i, group in enumerate(tqdm(shards, desc="capture", unit="shard", disable=args.no_progress)):
        batch = capture_target_outputs(target, [w.to(device) for w in group], aux_layers=aux_layers)
        save_batch(args.out / f"shard-{i:05d}.safetensors", batch, aux_layers=aux_layers, target=str(folder))
    print(f"wrote {len(shards)} shards ({len(windows)} sequences of {args.seq_len} bytes) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
