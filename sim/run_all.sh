#!/usr/bin/env bash
# Builds reccl_sim, runs every scenario in sim/scenarios, writes CSV + markdown + PNG plots to
# sim/results/. Usage: bash sim/run_all.sh [BUILD_DIR]   (default: build/sim-release)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/sim-release}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRECCL_BUILD_TESTS=OFF -DRECCL_BUILD_EXAMPLES=OFF \
      -DRECCL_INSTALL=OFF >/dev/null
cmake --build "$build" --target reccl.sim -j 2
mkdir -p sim/results
start=$(date +%s)
"$build/sim/reccl_sim" --out sim/results sim/scenarios/*.json
echo "scenarios: $(( $(date +%s) - start )) s"
if [ -x /usr/bin/python3 ]; then
  /usr/bin/python3 sim/plot.py sim/results
else
  echo "/usr/bin/python3 not found: plots skipped"
fi
