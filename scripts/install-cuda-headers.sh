#!/bin/sh
# Installs what building stoke's CUDA code (`-tags cuda`, gorgonia.org/cu
# v0.9.6) needs on a machine without a GPU: Debian bookworm's CUDA 11.8
# development files (nvidia-cuda-dev, from the contrib and non-free
# components, which it enables in a private apt sources file of its own:
# /etc/apt/sources.list.d/stoke-bookworm-non-free.sources). The headers
# (cuda.h, cublas_v2.h) and the link libraries (libcuda, libcublas) are
# what cgo needs; a binary built against them runs on newer drivers, which
# keep the _v2 symbols CUDA 11.8 links to.
#
# Quick and quiet when the headers and libraries are already there. It
# exits 1, saying why on stderr, when it cannot install them (no apt-get,
# not root, apt-get failed), so callers that require the CUDA build stop
# at the cause. `install-cuda-headers.sh --print-env` prints, once they are
# installed, the CGO_CFLAGS and CGO_LDFLAGS the build uses (see
# scripts/test-cuda-build.sh). `install-cuda-headers.sh --with-ptxas`
# also installs nvidia-cuda-toolkit (ptxas, about 130 MB more), with which
# engine/cudaexec's tests assemble every PTX kernel for sm_90.
# A cold install downloads about 1.5 GB (50 packages, 2.8 GB installed)
# and took 1m37s on a 2-core machine; with ptxas, 15 packages and 14 s more.
set -eu

ptxas=
if [ "${1:-}" = --with-ptxas ]; then
	ptxas=1
	shift
fi

sources=/etc/apt/sources.list.d/stoke-bookworm-non-free.sources

# libdir prints the directory holding libNAME.so (the unversioned link
# name cgo's -lNAME needs), or nothing.
libdir() {
	for d in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib \
		/usr/lib/x86_64-linux-gnu/stubs /usr/lib/aarch64-linux-gnu/stubs /usr/local/cuda/lib64 /usr/local/cuda/lib64/stubs; do
		if [ -e "$d/lib$1.so" ]; then
			echo "$d"
			return 0
		fi
	done
	return 1
}

# incdir prints the directory holding cuda.h, or nothing.
incdir() {
	for d in /usr/include /usr/local/cuda/include; do
		if [ -e "$d/cuda.h" ] && [ -e "$d/cublas_v2.h" ]; then
			echo "$d"
			return 0
		fi
	done
	return 1
}

installed() {
	incdir >/dev/null && libdir cuda >/dev/null && libdir cublas >/dev/null &&
		{ [ -z "$ptxas" ] || command -v ptxas >/dev/null 2>&1; }
}

print_env() {
	inc=$(incdir)
	ldflags=
	for lib in cuda cublas; do
		d=$(libdir "$lib")
		case " $ldflags " in
		*" -L$d "*) ;;
		*) ldflags="$ldflags -L$d" ;;
		esac
	done
	echo "CGO_CFLAGS=-I$inc"
	echo "CGO_LDFLAGS=${ldflags# }"
}

if [ "${1:-}" = --print-env ]; then
	if ! installed; then
		echo "install-cuda-headers.sh: the CUDA headers are not installed; run scripts/install-cuda-headers.sh" >&2
		exit 1
	fi
	print_env
	exit 0
fi

if installed; then
	exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-cuda-headers.sh: no apt-get here; install CUDA 11.8's headers and libraries (cuda.h, cublas_v2.h, libcuda.so, libcublas.so) by hand" >&2
	exit 1
fi
sudo=
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		sudo="sudo -n"
	else
		echo "install-cuda-headers.sh: not root and no password-less sudo; install nvidia-cuda-dev (bookworm contrib non-free) by hand" >&2
		exit 1
	fi
fi

# nvidia-cuda-dev is in non-free; the libcuda1 it depends on needs
# nvidia-support from contrib.
if [ ! -f "$sources" ]; then
	echo "adding bookworm contrib non-free in $sources"
	printf '%s\n' \
		'# Written by stoke scripts/install-cuda-headers.sh: CUDA 11.8 headers (nvidia-cuda-dev).' \
		'Types: deb' \
		'URIs: http://deb.debian.org/debian' \
		'Suites: bookworm' \
		'Components: contrib non-free' \
		'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' |
		$sudo tee "$sources" >/dev/null
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Refresh only the private source's lists: quick, and it leaves the
# system's other lists as they are.
if ! $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q \
	-o Dir::Etc::sourcelist="$sources" -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0 >"$log" 2>&1; then
	cat "$log" >&2
	echo "install-cuda-headers.sh: apt-get update of $sources failed" >&2
	exit 1
fi
pkgs=nvidia-cuda-dev
if [ -n "$ptxas" ]; then
	pkgs="$pkgs nvidia-cuda-toolkit"
fi
# shellcheck disable=SC2086 # two package names
if ! sh "$(dirname "$0")/apt-install.sh" $pkgs; then
	echo "install-cuda-headers.sh: could not install $pkgs (see above)" >&2
	exit 1
fi
if ! installed; then
	echo "install-cuda-headers.sh: nvidia-cuda-dev is installed, but cuda.h, cublas_v2.h, libcuda.so or libcublas.so is still missing" >&2
	exit 1
fi
