#!/usr/bin/env bash
# Packs the GPU tests for a machine with a GPU that lacks this machine's
# libraries: the CUDA test binaries (stripped), every shared library they
# load (glibc and its loader too, so the target's own glibc does not matter)
# and a run.sh that runs them with that loader. libcuda comes from the
# target's driver (run.sh looks in /usr/local/nvidia/lib64, then ldconfig).
#
#   scripts/pack_gpu_tests.sh [BUILD_DIR] [OUT_DIR]     (default: build, .gpu)
#   # on the GPU machine, in OUT_DIR:  ./run.sh        (exit status: 0 all passed)
#
# The tests themselves skip, visibly, where there is no GPU; on one they
# compare the CUDA codecs with the CPU bit for bit (compress_cuda_test) and
# push from and pull into device memory through pinned staging buffers
# against an in-process cluster (worker_cuda_test). The build must have found
# a CUDA toolkit (CMAKE_CUDA_ARCHITECTURES 90 by default: Hopper).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(realpath -m "${1:-$ROOT/build}")
OUT=$(realpath -m "${2:-$ROOT/.gpu}")
TESTS=(compress/cuda/compress_cuda_test worker/cuda/worker_cuda_test worker/device_staging_test)
for t in "${TESTS[@]}"; do
  if [ ! -x "$BUILD/$t" ]; then
    echo "pack_gpu_tests.sh: $BUILD/$t is missing: build with a CUDA toolkit first (cmake --build $BUILD)" >&2
    exit 1
  fi
done
rm -rf "$OUT"
mkdir -p "$OUT/lib"
for t in "${TESTS[@]}"; do
  strip -o "$OUT/$(basename "$t")" "$BUILD/$t"
  ldd "$BUILD/$t" | awk '/=>/ && $3 ~ /^\// {print $3} /ld-linux/ && $1 ~ /^\// {print $1}'
done | sort -u | while read -r lib; do cp -L "$lib" "$OUT/lib/"; done
cat >"$OUT/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs the packed GPU tests with the packed loader and libraries.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
driver=/usr/local/nvidia/lib64
[ -e "$driver/libcuda.so.1" ] || driver=$(dirname "$(ldconfig -p | awk '/libcuda.so.1 / {print $NF; exit}')")
nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
status=0
for t in compress_cuda_test worker_cuda_test device_staging_test; do
  echo "=== $t"
  "$here/lib/ld-linux-x86-64.so.2" --library-path "$here/lib:$driver:/usr/lib/x86_64-linux-gnu" "$here/$t" || status=1
done
exit $status
EOF
chmod +x "$OUT/run.sh"
echo "packed $(du -sh "$OUT" | cut -f1) into $OUT: copy it to the GPU machine and run $OUT/run.sh" >&2
