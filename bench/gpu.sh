#!/usr/bin/env bash
# Every check of Keel that needs a CUDA GPU, in one run, for a GPU machine with no network.
#
#   bash bench/gpu.sh fetch     # here, with network: wheels of what the GPU machine lacks -> .whl/
#   bash bench/gpu.sh run       # there, from the repository root; results in $OUT (or ./gpu-out)
#
# The GPU machine is expected to have python3 with a CUDA build of torch, pytest and numpy;
# everything else Keel needs (the server's dependencies, websockets) comes from .whl/, built
# for that machine's Python (PY_VERSION, 3.12 by default) and installed into /tmp/keel-site.
# `run` prints each check's figures and writes them under $OUT:
#   nvidia-smi.txt   the GPU
#   tests.txt        tests/trainer_hooks/test_monitor_device.py (log/log_batch only queue GPU
#                    work, values exact), the merged-partials and device tests of test_metrics,
#                    and the step details computed on the GPU (test_details)
#   log_overhead.txt python -m bench.log_overhead --device cuda (log() host time, a GPU step
#                    with and without log_batch)
#   lm.txt           keel lm --device cuda against a local keel serve (a real learner streaming)
set -uo pipefail
cd "$(dirname "$0")/.."

fetch() {
    local py="${PY_VERSION:-3.12}"
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    # The server's install, resolved for the GPU machine's Python and platform.
    python3 -m pip download -q --only-binary=:all: --python-version "$py" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d .whl \
        ".[server]" "pytest-timeout>=2.3"
    # Already on the GPU machine, and large: keep its own.
    rm -f .whl/numpy-* .whl/torch-* .whl/keel_rl-*  # Keel itself runs from the checkout
    du -sh .whl
}

run() {
    local out="${OUT:-gpu-out}" py="${PYTHON:-python3}"
    mkdir -p "$out"
    if [ -d .whl ]; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/keel-site .whl/*.whl || exit 1
        export PYTHONPATH="/tmp/keel-site:$PWD"
    else
        export PYTHONPATH="$PWD"
    fi
    export PYTHONUNBUFFERED=1 CI=true
    nvidia-smi 2>&1 | tee "$out/nvidia-smi.txt"
    "$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; print(torch.__version__, torch.cuda.get_device_name())" \
        || exit 1
    "$py" -m pytest -q -p no:cacheprovider tests/trainer_hooks/test_monitor_device.py \
        tests/trainer_hooks/test_details.py tests/trainer_hooks/test_metrics.py -k "device or merged or partials" 2>&1 | tee "$out/tests.txt"
    timeout 300 "$py" -m bench.log_overhead --device cuda --rounds "${ROUNDS:-10}" 2>&1 | tee "$out/log_overhead.txt"
    local port=8751 db
    db="sqlite:///$(mktemp -d)/keel.db"
    "$py" -m keel serve --port "$port" --database-url "$db" --log-level warning > "$out/server.log" 2>&1 &
    local server=$!
    for _ in $(seq 1 60); do "$py" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/readyz')" 2>/dev/null && break; sleep 1; done
    timeout 300 "$py" -m keel lm --device cuda --loss cispo --lag 4 --steps "${LM_STEPS:-200}" \
        --server "http://127.0.0.1:$port" 2>&1 | tee "$out/lm.txt"
    kill "$server"
}

case "${1:-}" in
    fetch) fetch ;;
    run) run ;;
    *) echo "usage: bash bench/gpu.sh fetch|run" >&2; exit 2 ;;
esac
