"""specdraft.testing: the hypothesis-free helpers import without hypothesis (and the
demo with them); the strategies and checkers load on first use and, without
hypothesis, fail with an ImportError naming the extra to install. With hypothesis,
every exported name resolves."""

import subprocess
import sys

import specdraft.testing

WITHOUT_EXTRAS = """
import sys
sys.modules["hypothesis"] = None  # makes `import hypothesis` raise ImportError
sys.modules["triton"] = None
import specdraft.demo
from specdraft.testing import CompileCounts, DraftBatch, fresh_compile, make_draft_batch
assert not any(name == "hypothesis" or name.startswith("hypothesis.") for name in sys.modules if sys.modules[name])
try:
    from specdraft.testing import shift_layouts
except ImportError as error:
    print(error)
else:
    raise SystemExit("shift_layouts imported without hypothesis")
"""


def test_helpers_import_without_hypothesis_and_strategies_name_the_extra():
    out = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert 'pip install "hypothesis>=6.100" (or, in a clone, pip install ".[testing]")' in out.stdout
    assert "shift_layouts" in out.stdout


def test_every_exported_name_resolves_with_hypothesis():
    for name in specdraft.testing.__all__:
        assert getattr(specdraft.testing, name) is not None, name
    assert set(specdraft.testing.__all__) <= set(dir(specdraft.testing))
