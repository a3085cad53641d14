#!/bin/sh
# Run the node agent's GPU validation from the repository root (see docs/validation.md).
# Writes $OUT/agent_validation.json when OUT is set, else ./agent_validation.json.
set -eu
cd "$(dirname "$0")/.."
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec python3 bench/agent_h200_validation.py "$@"
