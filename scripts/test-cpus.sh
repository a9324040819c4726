#!/bin/sh
# Runs the engine's tests again on emulated CPUs (qemu-user from Debian's
# packages): an AMD EPYC 7001 (Zen 1: AVX2, FMA and F16C, no AVX-512), on
# which the avx2 kernel set is the fastest, and a baseline x86-64 without
# AVX, on which only the portable set runs. So a test that passes on this
# machine's CPU but would fail on another fails here, whatever CPU CI got.
# Each package's test binary runs in its own directory under
# `qemu-x86_64 -cpu NAME` with -test.short: the engine's packages on both
# CPUs, weightstore/load's TestConcurrentGreedyMatchesAlone on stories260K
# (32 concurrent requests against each alone) on the AVX2 one; its
# wide-GQA model runs natively only (over 25 minutes emulated on the Xeon
# below, against 4 for stories260K). About five minutes on 2
# cores where qemu emulates fast; on an Intel Xeon host (2026-12-08) it
# emulated 5x slower, the engine's packages took 27 minutes, and all of
# weightstore/load did not finish in 45.
#
# Without qemu-user (and no way to install it) it prints one line and
# succeeds, unless STOKE_REQUIRE_QEMU=1 (which .ci/run sets): then it fails.
set -eu

GO=${GO:-go}
# Each run is PACKAGE:CPU[,CPU...][:TESTS], TESTS a -test.run pattern
# (all tests when left out).
RUNS=${STOKE_CPU_TEST_RUNS:-"./engine/kernels:EPYC-v1,qemu64 ./engine/model:EPYC-v1,qemu64 ./engine/core:EPYC-v1,qemu64 ./weightstore/load:EPYC-v1:^TestConcurrentGreedyMatchesAlone\$/^stories260K\$"}

cannot() {
	if [ "${STOKE_REQUIRE_QEMU:-}" = 1 ]; then
		echo "test-cpus.sh: $1; STOKE_REQUIRE_QEMU=1 requires qemu-user" >&2
		exit 1
	fi
	echo "test-cpus.sh: $1 (the emulated-CPU tests did not run)" >&2
	exit 0
}

if ! command -v qemu-x86_64 >/dev/null 2>&1; then
	if ! sh "$(dirname "$0")/apt-install.sh" qemu-user; then
		cannot "could not install qemu-user (see above)"
	fi
	command -v qemu-x86_64 >/dev/null 2>&1 || cannot "apt-get installed qemu-user, but qemu-x86_64 is not on PATH"
fi

root=$(pwd)
bins=$(mktemp -d)
trap 'rm -rf "$bins"' EXIT
status=0
for run in $RUNS; do
	pkg=${run%%:*}
	rest=${run#*:}
	cpus=${rest%%:*}
	tests=.
	[ "$rest" = "$cpus" ] || tests=${rest#*:}
	name=$(echo "$pkg" | tr '/.' '__')
	$GO test -c -o "$bins/$name.test" "$pkg"
	for cpu in $(echo "$cpus" | tr ',' ' '); do
		start=$(date +%s)
		if (cd "$root/$pkg" && qemu-x86_64 -cpu "$cpu" "$bins/$name.test" -test.short -test.count=1 -test.run "$tests" -test.timeout=45m >"$bins/$name.$cpu.log" 2>&1); then
			echo "ok  	$pkg	on emulated $cpu	$(($(date +%s) - start))s"
		else
			grep -v '^qemu-x86_64: warning' "$bins/$name.$cpu.log" | tail -40 >&2
			echo "FAIL	$pkg	on emulated $cpu" >&2
			status=1
		fi
	done
done
exit $status
