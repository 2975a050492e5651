"""torch.ops.specdraft resolves after a plain `import specdraft`, in a fresh process:
a program saved with torch.export (which holds torch.ops.specdraft.* calls) loads and
runs there, and gives what the op called directly gives."""

import subprocess
import sys
import textwrap

import torch

import specdraft.ops  # noqa: F401  (registers the ops in this process)


def run_fresh(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True, timeout=300
    )


def test_the_op_namespace_resolves_after_import_specdraft_in_either_order():
    for imports in ("import specdraft; import torch", "import torch; import specdraft"):
        done = run_fresh(
            f"""
            {imports}
            import sys
            assert "specdraft.ops" not in sys.modules
            print(torch.ops.specdraft.step_metadata.default)
            print(torch.ops.specdraft.top_logprobs.default)
            """
        )
        assert done.returncode == 0, (imports, done.stderr[-3000:])
        assert "specdraft.step_metadata" in done.stdout and "specdraft.top_logprobs" in done.stdout, done.stdout


class TopLogprobs(torch.nn.Module):
    def forward(self, logits: torch.Tensor):
        return torch.ops.specdraft.top_logprobs(logits, 3)


def test_an_exported_program_with_a_specdraft_op_loads_and_runs_after_import_specdraft(tmp_path):
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    program = torch.export.export(TopLogprobs(), (logits,))
    assert "specdraft.top_logprobs" in str(program.graph)
    torch.export.save(program, tmp_path / "program.pt2")
    torch.save(logits, tmp_path / "logits.pt")
    done = run_fresh(
        """
        import sys
        import specdraft
        import torch
        program = torch.export.load(sys.argv[1] + "/program.pt2")
        logits = torch.load(sys.argv[1] + "/logits.pt")
        torch.save(program.module()(logits), sys.argv[1] + "/loaded_out.pt")
        """,
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = torch.load(tmp_path / "loaded_out.pt")
    direct = torch.ops.specdraft.top_logprobs(logits, 3)
    assert len(loaded) == len(direct) == 2
    for got, want in zip(loaded, direct, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # And an oracle outside specdraft: the k likeliest ids and their log-softmax values.
    expected = torch.log_softmax(logits, -1).topk(3, -1)
    torch.testing.assert_close(loaded[0], expected.indices)
    torch.testing.assert_close(loaded[1], expected.values)
