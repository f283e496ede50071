#!/usr/bin/env bash
# One lent GPU machine's checks (issue 18, item 6), in the order of their value, each under its
# own time limit so that a slow one cannot cost the others: the estimator's GPU tests, the
# real-model time-to-precision cases (MiniLM, ViT-small, ResNet-18, GPT-2: padding, prefix and
# local reuse, bf16 with float32 decisions), then the zoo suite with its reuse table.
#
#   python benchmarks/real_models.py --export-offline .gpu   # here: what the cases read (49 MB)
#   bash benchmarks/gpu_session.sh OUT .gpu                  # there, from the repository root
#
# A GPU machine has no registry and none of the offline packages, so the cases read the copy
# made by --export-offline (MiniLM's weights stored as float16, run in float32). Writes into OUT:
# nvidia-smi.txt, test-gpu.log, real-gpu.json/.log, suite-gpu.json/.log. DEVICE=cpu with
# REAL_ARGS / SUITE_ARGS (e.g. "--quick --examples 2", "--tiny") rehearses it on a CPU.
set -uo pipefail
out=${1:?usage: gpu_session.sh OUT OFFLINE_DIR}
off=$(cd "${2:?usage: gpu_session.sh OUT OFFLINE_DIR}" && pwd)
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export SENSLAB_BENCH_MINILM="$off/minilm" SENSLAB_BENCH_MNIST="$off/mnist.npz"
export SENSLAB_DATA="$off/data" SENSLAB_BENCH_CACHE="${SENSLAB_BENCH_CACHE:-/tmp/senslab-bench}"
threads=$(nproc)
device=${DEVICE:-cuda}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
    || echo "no nvidia-smi"; } | tee "$out/nvidia-smi.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__)" | tee -a "$out/nvidia-smi.txt"
SENSLAB_TEST_DEVICE=$device timeout "${TEST_S:-90}" python3 -m pytest -p no:cacheprovider tests/measure/test_gpu.py \
    > "$out/test-gpu.log" 2>&1
echo "test_gpu.py: exit $? ($(tail -n 1 "$out/test-gpu.log"))"
timeout "${REAL_S:-330}" python3 benchmarks/real_models.py --device "$device" --threads "$threads" \
    ${REAL_ARGS:-} --out "$out/real-gpu.json" > "$out/real-gpu.log" 2>&1
echo "real_models.py: exit $?"
grep -E "^(minilm|vit_small|resnet18|gpt2)|FAILED|Traceback|Error" "$out/real-gpu.log" | head -40
timeout "${SUITE_S:-150}" python3 benchmarks/run.py --device "$device" --reps 3 --threads "$threads" \
    ${SUITE_ARGS:-} --out "$out/suite-gpu.json" > "$out/suite-gpu.log" 2>&1
echo "run.py: exit $?"
tail -n 30 "$out/suite-gpu.log"
