"""`specdraft COMMAND ...` (or `python -m specdraft COMMAND ...`): the command line.

    specdraft demo                       # speculative decoding with the shipped pair (specdraft.demo)
    specdraft capture TARGET OUT         # a target's outputs on text files, as shards (specdraft.capture)
    specdraft eval HEAD DATA             # a draft head on those shards (specdraft.eval)

`specdraft COMMAND --help` lists a command's options. Each command is also
`python -m specdraft.COMMAND`.

This module also holds what the three commands share: they parse their arguments
before importing torch-heavy modules (so --help answers at once), and turn bad input
(an unreadable folder, a malformed config.json, a device this machine lacks) into
one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

COMMANDS = {
    "demo": "speculative decoding with the shipped byte-level pair, plain vs speculative",
    "capture": "run a byte-level target over text files, save its outputs as shards",
    "eval": "evaluate a draft head on saved target outputs (shards)",
}
# specdraft.assets.DEMO_PAIR, without importing specdraft.assets (which loads the models' code).
DEMO_PAIR = Path(__file__).resolve().parent / "assets" / "demo_pair"
DEVICE_HELP = 'where to run: "cpu" (default), "cuda", "cuda:1", ...'
NO_PROGRESS_HELP = "no progress bars or status lines on stderr: only the final output"
THREADS_HELP = (
    "CPU threads (default 1: the matmuls are tiny, and more threads only contend on a shared machine); ignored on CUDA"
)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line on stderr (exit status 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def main(argv=None) -> int:
    parser = ArgumentParser(
        prog="specdraft", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {name:<9} {what}" for name, what in COMMANDS.items())
        + "\n\nspecdraft COMMAND --help lists a command's options.",
    )  # fmt: skip
    parser.add_argument("command", choices=tuple(COMMANDS), help="the command to run (listed below)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's arguments (specdraft COMMAND --help)")
    args = parser.parse_args(argv)
    module = importlib.import_module(f"specdraft.{args.command}")
    return module.main(args.args, prog=f"specdraft {args.command}")


# --- shared by the commands ---------------------------------------------------------


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """--threads N, the same for every command (checked by check_threads)."""
    parser.add_argument("--threads", type=int, default=1, help=THREADS_HELP)


def check_threads(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--threads >= 1, refused at parse time (torch.set_num_threads raises on it later)."""
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")


def use_threads(threads: int, device) -> None:
    """--threads, where the command runs on the CPU."""
    import torch

    if device.type == "cpu":
        torch.set_num_threads(threads)


def one_line(error: BaseException) -> str:
    """The error's message on one line."""
    return " ".join(str(error).split()) or type(error).__name__


def is_bad_input(error: BaseException) -> bool:
    """Errors that mean bad input (reported in one line, exit status 2), not a bug."""
    from safetensors import SafetensorError

    return isinstance(error, (ValueError, OSError, SafetensorError))


def run_reporting_errors(fn, *args, quiet: bool = False) -> int:
    """fn(*args), with bad input (is_bad_input) printed as one `error: ...` line on
    stderr and exit status 2; quiet: exit status 2 without the line (a torchrun rank
    other than 0, whose error rank 0 reports)."""
    try:
        return fn(*args)
    except Exception as error:
        if not is_bad_input(error):
            raise
        if not quiet:
            print(f"error: {one_line(error)}", file=sys.stderr)
        return 2


def check_device(name: str):
    """torch.device(name), checked to exist on this machine (a ValueError otherwise)."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ValueError(f'--device: unknown device {name!r} (expected "cpu", "cuda", "cuda:1", ...)') from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: no CUDA device is available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        raise ValueError(f"--device {name}: not usable here ({one_line(error)})") from None
    return device


def model_folder(what: str, name: str, demo_part: str) -> Path:
    """The folder of a HEAD / TARGET argument: "demo" is the shipped pair's part."""
    folder = DEMO_PAIR / demo_part if name == "demo" else Path(name)
    if not folder.is_dir():
        raise ValueError(f"{what}: {folder} is not a folder")
    return folder


def load_model_folder(what: str, folder: Path, load):
    """load(), with a malformed JSON file or an unreadable safetensors file of the
    folder reported as a ValueError naming the file."""
    from safetensors import SafetensorError, safe_open

    for name in ("config.json", "model.safetensors.index.json"):
        path = folder / name
        if path.is_file():
            try:
                json.loads(path.read_text())
            except (ValueError, UnicodeDecodeError) as error:
                raise ValueError(f"{what}: {path} is not valid JSON ({one_line(error)})") from None
    try:
        return load()
    except SafetensorError as error:
        for path in sorted(folder.glob("*.safetensors")):
            try:
                with safe_open(str(path), framework="pt"):
                    pass
            except SafetensorError:
                break
        else:
            path = folder
        raise ValueError(f"{what}: {path} is not a readable safetensors file ({one_line(error)})") from None


def check_safetensors(what: str, paths: list[Path]) -> None:
    """A ValueError naming the first path that is not a readable safetensors file
    (reads the headers only)."""
    from safetensors import SafetensorError, safe_open

    for path in paths:
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except SafetensorError as error:
            raise ValueError(f"{what}: {path} is not a safetensors file ({one_line(error)})") from None


def check_writable(option: str, path: Path) -> None:
    """An output path that can be written, checked before the work: its missing
    folders made (as the options' help says), the file opened for appending (and
    removed again if it was not there)."""
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a"):
            pass
    except OSError as error:
        raise ValueError(f"{option} {path}: cannot be written ({error.strerror or error})") from None
    if not existed:
        path.unlink()


def status(message: str) -> None:
    """A status line on stderr that leaves a running progress bar intact."""
    from tqdm.auto import tqdm

    tqdm.write(message, file=sys.stderr)


def compile_message(what: str, device) -> str:
    cpu = getattr(device, "type", str(device)) == "cpu"
    return f"compiling {what} (one-time{', ~20-60 s on CPU' if cpu else ''})..."


def announce_first_call(fn, what: str, device):
    """fn, whose first call (the compiling one) is framed by status lines: "compiling
    WHAT (one-time...)..." then "compiled in 23.4 s"."""
    called = False

    def wrapper(*args, **kwargs):
        nonlocal called
        if called:
            return fn(*args, **kwargs)
        called = True
        status(compile_message(what, device))
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        status(f"compiled in {time.perf_counter() - start:.1f} s")
        return out

    return wrapper


if __name__ == "__main__":
    sys.exit(main())
