"""The README's and docs/usage.md's examples run as written, on CPU.

Every ```python block is run on its own, in a fresh namespace (each block is meant
to be copied alone, so none may lean on an earlier one's names), in README order.
When a ```text block follows a python block directly, it is that block's output:
what the block prints must equal it. Blocks not meant to run are ```bash or ```text.

Also checked: every fenced block says its language, every repository path either
names in backticks exists (a moved test file leaves no stale pointer), and every
relative link resolves from its file's folder.
"""

import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch._inductor.config

# CPU lane: Inductor keeps its SIMD code generation here (tests/conftest.py).
pytestmark = pytest.mark.vectorised

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, ROOT / "docs" / "usage.md", ROOT / "docs" / "development.md"]
LANGUAGES = {"python", "bash", "text"}
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass
class Block:
    language: str
    line: int  # 1-based line of the opening fence
    source: str
    output: str | None = None  # the ```text block right after a python block
    path: Path = README

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(text: str, path: Path = README) -> list[Block]:
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i] != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"README.md:{start + 1}: the fence is never closed")
        block = Block(match.group(1), start + 1, "\n".join(body) + "\n", path=path)
        previous = found[-1] if found else None
        # Output: a text block separated from its python block by blank lines only.
        if block.language == "text" and previous is not None and previous.language == "python":
            between = lines[previous.line + previous.source.count("\n") + 1 : start]  # after its closing fence
            if all(not line.strip() for line in between):
                previous.output = block.source
        found.append(block)
        i += 1
    return found


ALL = [block for doc in DOCS for block in blocks(doc.read_text(), doc)]
PYTHON = [b for b in ALL if b.language == "python"]


def test_a_text_block_after_a_python_block_is_its_output():
    """The parser attaches the output (it once compared from the python block's closing
    fence, never blank, so no output was ever checked)."""
    doc = "```python\nprint(1)\n```\n\n```text\n1\n```\n\n```python\nx = 2\n```\nprose\n```text\n2\n```\n"
    first, _, second, _ = blocks(doc)
    assert first.output == "1\n" and second.output is None
    assert sum(b.output is not None for b in PYTHON) >= 10  # the docs' shown outputs are checked


def test_every_block_says_its_language():
    bad = [f"{b.where}: ```{b.language}" for b in ALL if b.language not in LANGUAGES]
    assert not bad, f"use one of {sorted(LANGUAGES)}: {bad}"
    assert PYTHON, "the README has no python examples"


# torch 2.11's Inductor emits vectorised C++ that does not build for the sampled
# propose example on CPU ("no match for operator< (VectorizedN<long, 2>, long)": a
# constant 0 reused as a scalar in vector code; torch 2.13 builds it). The README's
# workaround, scalar C++ (cpp.simdlen = 0), is what runs there: the GPU lane's machine
# has torch 2.11, and there the example must run, not fail expectedly.
OLD_INDUCTOR = tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 12)


@pytest.mark.parametrize("block", PYTHON, ids=[f"{b.path.stem}{b.line}" for b in PYTHON])
def test_python_block_runs(block):
    # Compiled with the README's name and line numbers, so a traceback points there.
    code = compile("\n" * (block.line) + block.source, str(block.path), "exec")
    stdout = io.StringIO()
    workaround = {"cpp.simdlen": 0} if OLD_INDUCTOR else {}
    with contextlib.redirect_stdout(stdout), torch._inductor.config.patch(workaround):
        exec(code, {"__name__": f"{block.path.stem}_line{block.line}"})
    if block.output is not None:
        assert stdout.getvalue() == block.output, f"{block.where}: the output shown below the block differs"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_named_paths_exist(doc):
    text = doc.read_text()
    paths = re.findall(r"`((?:src|tests|benchmarks|docs|scripts|examples|\.ci)/[\w./-]*)`", text)
    missing = sorted({p for p in paths if not (ROOT / p).exists()})
    links = re.findall(r"\]\(((?!https?:|#)[^)#\s]+)(?:#[^)]*)?\)", text)
    missing += sorted({link for link in links if not (doc.parent / link).exists()})
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"
