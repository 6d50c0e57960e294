#!/usr/bin/env bash
# Switch the current Python environment from Pillow to pillow-simd (same `PIL` module).
#
#   PYTHON=.venv/bin/python bash scripts/use-pillow-simd.sh          # switch to pillow-simd
#   PYTHON=.venv/bin/python bash scripts/use-pillow-simd.sh --undo   # back to Pillow
#
# pillow-simd has no wheels: it is built from source (needs gcc and the libjpeg/zlib
# headers; ~30 s). AVX2 is enabled when the CPU has it. Every run records which PIL
# is loaded in env.json (`inrbench env` shows it), so results never hide the switch.
set -euo pipefail
PY=${PYTHON:-python}
VERSION=${PILLOW_SIMD_VERSION:-12.1.1.post0}

if [[ "${1:-}" == "--undo" ]]; then
  "$PY" -m pip uninstall -y pillow-simd
  "$PY" -m pip install --force-reinstall --no-deps pillow
else
  flags=""
  if grep -q avx2 /proc/cpuinfo 2>/dev/null; then flags="-mavx2"; fi
  "$PY" -m pip uninstall -y pillow pillow-simd >/dev/null 2>&1 || true
  CC="${CC:-cc} $flags" "$PY" -m pip install --no-binary pillow-simd --no-deps --force-reinstall "pillow-simd==$VERSION"
fi
"$PY" -c 'from bench.envinfo import pil_info; import json; print(json.dumps(pil_info()))' 2>/dev/null \
  || "$PY" -c 'import PIL, PIL.features as f; print("PIL", PIL.__version__, "libjpeg", f.version("jpg"))'
