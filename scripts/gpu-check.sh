#!/bin/sh
# The one prepared GPU check of stoke's CUDA code (issue 20): H2D bandwidth
# from pinned staging vs pageable memory, a T2 load of a synthetic ~1.5 GB
# FP8 checkpoint (preset 1b) from the node cache into device memory (GB/s),
# the GPU forward pass against the CPU model (F32, BF16, FP8), golden
# greedy ids of stories260K on the GPU (through the engine's scheduler,
# and through the loader `stoke engine --device cuda` serves with), decode
# tokens/s of the 1b FP8 model at 1, 16 and 64 streams and prefill
# tokens/s of a 2,048-token prompt.
#
# Two halves, since the device machine has no Go toolchain to rely on and
# at most 64 MiB of ignored files travel there:
#
#   scripts/gpu-check.sh build   here: compiles the test binaries (-tags
#                                cuda, stripped, gzipped; a cuBLAS and a
#                                driver-only `nocublas` variant) into
#                                .gpucheck/ (gitignored) with a copy of
#                                ../shared/models/stories260K
#   scripts/gpu-check.sh run     there: runs them, prints every figure
#                                (lines starting GPUCHECK) and writes the
#                                logs and figures under $OUT when it is set
#
# With the device tool: build here, then
#   run(command="sh scripts/gpu-check.sh run", carry=[".gpucheck"], timeout_s=420)
# It is sized to finish in about 3 to 5 minutes of device time (most of it
# synthesizing and hashing the 1b checkpoint); the timeout leaves a rerun
# within a 15-minute lease. A variant is chosen by what the machine has:
# the cuBLAS binaries need CUDA 11's libcublas.so.11, which a CUDA 12/13
# image lacks, so there the nocublas ones (PTX SGEMM) run.
set -eu
cd "$(dirname "$0")/.."
GO=${GO:-go}
dir=.gpucheck

build() {
	sh ./scripts/install-cuda-headers.sh
	env=$(sh ./scripts/install-cuda-headers.sh --print-env)
	export CGO_ENABLED=1
	export CGO_CFLAGS="${CGO_CFLAGS:-} $(echo "$env" | sed -n 's/^CGO_CFLAGS=//p')"
	export CGO_LDFLAGS="${CGO_LDFLAGS:-} $(echo "$env" | sed -n 's/^CGO_LDFLAGS=//p')"
	rm -rf "$dir"
	mkdir -p "$dir/bin" "$dir/shared/models/stories260K"
	# The device package links no cuBLAS: one variant serves both.
	for spec in device:./engine/device/cuda:nocublas cudaexec:./engine/cudaexec:cublas cudaexec:./engine/cudaexec:nocublas \
		cudaload:./weightstore/load/cudaload:cublas cudaload:./weightstore/load/cudaload:nocublas; do
		name=${spec%%:*}
		rest=${spec#*:}
		pkg=${rest%%:*}
		variant=${rest##*:}
		tags=cuda
		[ "$variant" = nocublas ] && tags=cuda,nocublas
		echo "go test -c -tags $tags $pkg"
		$GO test -c -tags "$tags" -trimpath -ldflags='-s -w' -o "$dir/bin/$name-$variant.test" "$pkg"
		gzip -9 "$dir/bin/$name-$variant.test"
	done
	src=../shared/models/stories260K
	if [ -d "$src" ]; then
		for f in config.json golden.json model.safetensors tokenizer.json tokenizer_config.json; do
			cp "$src/$f" "$dir/shared/models/stories260K/"
		done
	else
		echo "gpu-check.sh: no $src here: the golden tests will skip on the device" >&2
	fi
	size=$(du -sk "$dir" | cut -f1)
	echo "built $dir: ${size} KiB (at most 65536 travel)"
	if [ "$size" -gt 60000 ]; then
		echo "gpu-check.sh: $dir is too large to carry" >&2
		exit 1
	fi
}

run() {
	if [ ! -d "$dir/bin" ]; then
		echo "gpu-check.sh: no $dir/bin: run 'scripts/gpu-check.sh build' first and carry $dir" >&2
		exit 1
	fi
	out=${OUT:-$(mktemp -d)}
	work=${TMPDIR:-/tmp}/stoke-gpucheck
	rm -rf "$work/bin" "$work/root"
	mkdir -p "$work/bin" "$work/root" "$work/shared/models" "$work/data"
	# testmodel finds ../shared/models/stories260K beside the module root.
	: >"$work/root/go.mod"
	cp -r "$dir/shared/models/stories260K" "$work/shared/models/"
	for f in "$dir"/bin/*.test.gz; do
		b=$(basename "$f" .gz)
		gzip -dc "$f" >"$work/bin/$b"
		chmod +x "$work/bin/$b"
	done
	# The driver's libcuda.so.1, wherever the image keeps it.
	for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/local/cuda/compat /usr/lib64; do
		if [ -e "$d/libcuda.so.1" ]; then
			LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
		fi
	done
	export LD_LIBRARY_PATH
	variant=nocublas
	if ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.11 ' && ldconfig -p 2>/dev/null | grep -q 'libcublasLt\.so\.11 '; then
		variant=cublas
	fi
	{
		echo "variant: $variant (cuBLAS needs libcublas.so.11)"
		nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,clocks.max.memory --format=csv 2>&1 || true
	} | tee "$out/device.txt"
	status=0
	# check NAME BINARY TIMEOUT RUN-PATTERN: one test binary, from the
	# fake module root, its log under $out.
	check() {
		echo "== $1: $2 -test.run '$4'"
		if ! (cd "$work/root" && STOKE_GPUCHECK_DIR="$work/data" timeout "$3" "$work/bin/$2" -test.v -test.count=1 \
			-test.timeout "$(($3 - 5))s" -test.run "$4" 2>&1) | tee "$out/$1.log"; then
			status=1
		fi
		# On the device machine a binary that found no GPU is a failure.
		grep -q '^--- FAIL\|^FAIL\|^panic\|no usable CUDA device' "$out/$1.log" && status=1
		return 0
	}
	check device device-nocublas.test 90 'TestDeviceCopies|TestH2DBandwidth|TestLoaderStreamsIntoDevice'
	check forward "cudaexec-$variant.test" 120 'TestGPUForwardMatchesCPU|TestGPUGoldenStories|TestEmulated|TestPTX'
	check t2 "cudaload-$variant.test" 330 'TestServeStoriesFromBucket|TestT2LoadAndThroughput'
	echo "== figures"
	grep -h 'GPUCHECK' "$out"/*.log | sed 's/^ *//' | tee "$out/figures.txt"
	grep -h '^--- \(PASS\|FAIL\|SKIP\)' "$out"/*.log | tee "$out/results.txt"
	echo "gpu-check: status $status (logs in $out)"
	return $status
}

case "${1:-}" in
build) build ;;
run) run ;;
*)
	echo "usage: scripts/gpu-check.sh build|run" >&2
	exit 2
	;;
esac
