#!/usr/bin/env bash
# Everything perfsuite checks and measures on a CUDA machine, in one run (docs/benchmarks.md#on-a-gpu).
#
#   bash bench/gpu_session.sh [OUT_DIR]
#
# 1. the GPU-only tests (pytest -m gpu): every decode mode, slot and paged, equals unbatched greedy decoding in
#    float32 and bfloat16; graphs are captured at build and go with their engines; the CUDA copy probe;
# 2. bench/decode_graphs.py: a decode step packed, static and as a CUDA graph, slot cache and paged pool;
# 3. the shipped suite (smoke profile, SmolLM2-135M's shapes with random weights) with --perf-decode-mode packed
#    and cuda-graph, each once;
# 4. bench/roofline.py: prefill MFU and decode MBU of static, in-flight and paged at B=1, 8, 32 for random-llama-1b
#    in bfloat16, packed and CUDA-graph decode (the goal: decode MBU >= 60% with CUDA graphs at B=1).
# 5. the bitwise lane on CUDA (tests/test_bitwise_lane.py -m gpu): the normal runner must fail it (SmolLM2's shapes,
#    random weights, bfloat16). The batch-invariant runner is refused on CUDA today (ModelRunner raises: torch has
#    no batch-invariant eager operators, check_batch_invariance), so this step expects that refusal, not a pass,
#    until torch ships them; then its test fails and is to be replaced by "the invariant runner passes on CUDA".
# Each part has its own time limit, so one that hangs leaves the others their time. Run it from the repository
# root: without an installed perfsuite, the checkout is put on PYTHONPATH and its plugin registered with -p.
set -u
out=${1:-${OUT:-reports/gpu}}
mkdir -p "$out"
python=${PYTHON:-python3}
plugin=()
if ! $python -c "import importlib.metadata as m, sys; sys.exit(not any(e.value == 'perfsuite.plugin.hooks' for e in m.entry_points(group='pytest11')))" 2>/dev/null; then
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
    plugin=(-p perfsuite.plugin.hooks)
fi
nvidia-smi -L | tee "$out/device.log"
$python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())" | tee -a "$out/device.log"
export PYTHONUNBUFFERED=1
timeout 200 $python -m pytest -q -p no:cacheprovider -m gpu -rs --durations=10 \
    tests/test_cuda_decode.py tests/test_static_decode.py tests/test_model_runner_paged.py tests/test_machine_probe.py \
    tests/test_models.py tests/test_equivalence.py 2>&1 | tee "$out/gpu_tests.log"
timeout 120 $python bench/decode_graphs.py --model random-smollm2-135m --batch-sizes 1,8,32 --steps 20 --rounds 5 \
    2>&1 | tee "$out/decode_graphs.log"
for mode in packed cuda-graph; do
    timeout 75 $python -m pytest "${plugin[@]}" --pyargs perfsuite.suites --perf --perf-device cuda --perf-model random-smollm2-135m \
        --perf-profile smoke --perf-decode-mode "$mode" --perf-history none -p no:cacheprovider -q \
        --perf-report-dir "/tmp/suite-$mode" 2>&1 | tail -40 | tee "$out/suite_$mode.log"
done
for mode in packed cuda-graph; do
    timeout 150 $python bench/roofline.py --model random-llama-1b --dtype bfloat16 --device cuda --decode-mode "$mode" \
        --prompt 512 --output 64 2>&1 | tee "$out/roofline_$mode.log"
done
timeout 150 $python -m pytest -q -p no:cacheprovider -m gpu -rs --durations=5 tests/test_bitwise_lane.py 2>&1 \
    | tee "$out/bitwise_lane.log"
