#!/usr/bin/env bash
# Makes (or brings up to date) .venv-ultralytics, the environment benchmarks/peer_train.py runs in:
# Ultralytics and torch kept out of the library's .venv. Running it again changes nothing when
# the pins of benchmarks/peer-requirements.txt are already installed. PYTHON: the interpreter
# that makes the environment (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-ultralytics
if ! "$venv/bin/python" -c "" 2>/dev/null; then
    rm -rf "$venv"  # absent, or its interpreter is gone
    "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/pip" install --quiet -r benchmarks/peer-requirements.txt
# Importing torchvision's operators is the check that torch and torchvision fit together.
"$venv/bin/python" -c "
import importlib.metadata as metadata, torch, torchvision.ops
print(f'$venv: ultralytics {metadata.version(\"ultralytics\")}, torch {torch.__version__}, '
      f'torchvision {metadata.version(\"torchvision\")}')
"
