#!/usr/bin/env bash
# Label Studio in a venv of its own (its Django pins clash with TriDerm's), for tests/labelstudio/: the real
# server, and label-studio-sdk (label-studio 1.23 pins its own, 2.1.2) for the test's driver.
#   scripts/labelstudio_venv.sh [VENV]     (default .venv-labelstudio; the tests read $TRIDERM_LABEL_STUDIO_VENV)
# About 2 min from the package index on 2 cores; re-running upgrades nothing already there.
set -euo pipefail
venv="${1:-.venv-labelstudio}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "label-studio==1.23.*" label-studio-sdk
"$venv/bin/python" -c "import label_studio, label_studio_sdk; print('label-studio', label_studio.__version__)"
