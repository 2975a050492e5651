#!/usr/bin/env bash
# Ship what we test: build the wheel, install it (not editable) into a venv that has
# torch but neither hypothesis nor triton, import every module of the installed
# package from outside the source tree, check what it declares (py.typed, the
# license) and that torch.ops.specdraft resolves after `import specdraft`, run the
# demo, then save a head, capture shards and evaluate them (what a library user does
# first).
#
# The venv is kept between runs (torch is most of its install time) and rebuilt when
# its inputs change: the python, TORCH_SPEC, pyproject.toml (the dependencies) or
# this script. The wheel is rebuilt and reinstalled every run, from a copy of the
# tree, so no stale build/ folder can ship a module the source no longer has.
#
# Environment: PYTHON (creates the venv; default python3), TORCH_SPEC (default
# torch==2.13.0), SMOKE_VENV (default .venv-smoke in the repository root).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
SMOKE_VENV=${SMOKE_VENV:-$ROOT/.venv-smoke}
case "$SMOKE_VENV" in /*) ;; *) SMOKE_VENV=$ROOT/$SMOKE_VENV ;; esac
PY=$SMOKE_VENV/bin/python

key="$("$PYTHON" -c 'import sys; print(sys.version)') | $TORCH_SPEC | $(cksum < "$0") | $(cksum < "$ROOT/pyproject.toml")"
if [ ! -x "$PY" ] || [ "$(cat "$SMOKE_VENV/.smoke-key" 2>/dev/null)" != "$key" ]; then
    echo "wheel-smoke: creating $SMOKE_VENV ($TORCH_SPEC, no hypothesis, no triton)"
    rm -rf "$SMOKE_VENV"
    "$PYTHON" -m venv "$SMOKE_VENV"
    # torch first and pinned: a bare `torch` requirement would pull the CUDA build.
    "$PY" -m pip install -q "$TORCH_SPEC"
    echo "$key" > "$SMOKE_VENV/.smoke-key"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The files a commit would hold: tracked and untracked-but-not-ignored (a clean
# clone has only the former). Outside git, the tree itself.
mkdir "$work/src"
if git -C "$ROOT" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    # (Skipping files deleted but not yet staged, and the smoke venv wherever it is.)
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do
            case "$ROOT/$f" in "$SMOKE_VENV"/*) continue ;; esac
            [ -e "$f" ] && printf '%s\0' "$f"
        done | tar --null -T - -cf -) | tar -xf - -C "$work/src"
else
    (cd "$ROOT" && tar --exclude=./build --exclude='./.venv*' -cf - .) | tar -xf - -C "$work/src"
fi

"$PY" -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
wheel=$(ls "$work"/dist/specdraft-*.whl)
# With its declared dependencies (so a missing one fails here, not for a user), but
# torch held at TORCH_SPEC: the resolver must not swap in the CUDA build.
echo "$TORCH_SPEC" > "$work/constraints.txt"
"$PY" -m pip uninstall -q -y specdraft 2> /dev/null || true
"$PY" -m pip install -q -c "$work/constraints.txt" "$wheel"
echo "wheel-smoke: installed $(basename "$wheel")"

# From a folder outside the source tree, so only the installed package can be found.
cd "$work"
"$PY" "$ROOT/.ci/smoke_imports.py" "$work/src/src/specdraft"
# What the wheel declares: type hints (PEP 561's py.typed) and its license. And the
# op namespace a saved program looks up resolves after a plain `import specdraft`
# (this process never imports specdraft.ops itself).
"$PY" -c "
import importlib.metadata, importlib.resources, sys
import specdraft
import torch
assert importlib.resources.files('specdraft').joinpath('py.typed').is_file(), 'no py.typed in the installed package'
meta = importlib.metadata.metadata('specdraft')
assert meta['License-Expression'] == 'Apache-2.0', meta['License-Expression']
licenses = [f for f in importlib.metadata.files('specdraft') if f.name == 'LICENSE']
assert licenses and 'Apache License' in licenses[0].read_text(), licenses
assert 'specdraft.ops' not in sys.modules
print('wheel-smoke: py.typed, License-Expression', meta['License-Expression'], 'and', torch.ops.specdraft.step_metadata.default)
"
# --no-compile: the compiled demo is the CPU lane's (tests/generation); this step checks
# the installed package: its imports, its data files and what it declares.
# --json: the statistics a script reads, checked against the greedy identity it printed.
"$PY" -m specdraft.demo --no-compile --json demo.json
"$PY" -c "
import json
stats = json.load(open('demo.json'))
assert stats['greedy_identical'] is True, stats
print('wheel-smoke: demo --json holds', ', '.join(sorted(stats)))
"
# The block drafters ship too (demo_pair/dflash, demo_pair/dspark): DSpark, briefly.
"$PY" -m specdraft.demo --no-compile --drafter dspark --prompts 2 --max-new-tokens 24 --no-sampled --no-progress \
    | grep "greedy outputs identical: yes"
# Budgeted verification's shipped step costs (generation/demo_pair_step_costs.json): --budget auto.
"$PY" -m specdraft.demo --no-compile --budget auto --prompts 2 --max-new-tokens 24 --no-sampled --no-progress \
    | grep "greedy outputs identical: yes"

# A library user's path, which needs what the wheel declares (numpy, through
# safetensors): save a head, capture a target's outputs as shards, evaluate them.
"$PY" -c "
from specdraft.assets import load_demo_pair
from specdraft.models import save_draft_model
target, head = load_demo_pair()
save_draft_model(head, 'head')
"
"$PY" -m specdraft.capture demo shards --seq-len 128 --per-shard 2 --max-sequences 4 --no-progress
"$PY" -m specdraft.eval head shards --steps 2 --eager --no-progress
echo "wheel-smoke: saved a head, captured shards and evaluated them"
