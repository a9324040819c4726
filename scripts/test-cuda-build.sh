#!/bin/sh
# Builds and vets stoke's CUDA code (-tags cuda, and -tags cuda,nocublas,
# the driver-only variant) on a machine with or without a GPU, for
# `make test`: it installs CUDA 11.8's headers when they are missing
# (scripts/install-cuda-headers.sh), runs `go vet` over the CUDA packages
# and `go test -run XXX` over them, which compiles and links every test
# binary and runs it: without a GPU each binary reports its tests skipped
# (engine/device/cuda/internal/cuinit) and passes. With a GPU, run the
# tests themselves with scripts/gpu-check.sh.
#
# STOKE_SKIP_CUDA_BUILD=1 skips it (a machine that cannot install the
# headers); otherwise a failed install fails it.
set -eu
cd "$(dirname "$0")/.."
GO=${GO:-go}

if [ "${STOKE_SKIP_CUDA_BUILD:-}" = 1 ]; then
	echo "test-cuda-build.sh: STOKE_SKIP_CUDA_BUILD=1: the CUDA code is not built" >&2
	exit 0
fi
sh ./scripts/install-cuda-headers.sh
# The CGO flags for where Debian puts the headers and libraries.
env=$(sh ./scripts/install-cuda-headers.sh --print-env)
cflags=$(echo "$env" | sed -n 's/^CGO_CFLAGS=//p')
ldflags=$(echo "$env" | sed -n 's/^CGO_LDFLAGS=//p')
export CGO_ENABLED=1
export CGO_CFLAGS="${CGO_CFLAGS:-} $cflags"
export CGO_LDFLAGS="${CGO_LDFLAGS:-} $ldflags"

pkgs="./engine/device/cuda/... ./engine/cudaexec/... ./weightstore/load/cudaload/..."
for tags in cuda cuda,nocublas; do
	echo "go vet -tags $tags $pkgs"
	# shellcheck disable=SC2086 # a list of packages
	$GO vet -tags "$tags" $pkgs
	echo "go test -tags $tags -run XXX $pkgs"
	# shellcheck disable=SC2086
	$GO test -count=1 -tags "$tags" -run XXX $pkgs
done
