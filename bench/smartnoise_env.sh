#!/usr/bin/env bash
# Create .venv-smartnoise: SmartNoise Synth 1.0.8 for bench/synthetic.py's comparison.
#
# It needs mbi<2 and opacus<0.15, which conflict with the project's own pins, so it lives in
# its own virtualenv next to (never inside) .venv; bench/smartnoise_worker.py runs there as a
# subprocess. Every package is pinned in bench/smartnoise-constraints.txt and installed
# without resolving, so the environment is the same on every machine.
#
#     bash bench/smartnoise_env.sh            # creates or refreshes .venv-smartnoise
#     SMARTNOISE_VENV=/elsewhere bash bench/smartnoise_env.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${SMARTNOISE_VENV:-$root/.venv-smartnoise}"
python="${PYTHON:-python3.11}"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --no-deps -r "$root/bench/smartnoise-constraints.txt"
# the MST and AIM synthesizers import cleanly (opacus stays unimported: no torch here)
"$venv/bin/python" -c "from snsynth.mst import MSTSynthesizer; from snsynth.aim import AIMSynthesizer"
echo "SmartNoise Synth ready in $venv"
