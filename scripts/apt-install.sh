#!/bin/sh
# Installs Debian packages for the tests: `apt-install.sh PKG...` runs
# apt-get install (apt-get update first only when the plain install
# fails), as root or through password-less sudo. When it cannot, it says
# why in one line on stderr (with apt-get's output when apt-get failed)
# and exits 1; the caller decides whether that fails the run.
set -eu

if ! command -v apt-get >/dev/null 2>&1; then
	echo "apt-install.sh: no apt-get here; install $* by hand" >&2
	exit 1
fi
sudo=
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		sudo="sudo -n"
	else
		echo "apt-install.sh: not root and no password-less sudo; install $* by hand" >&2
		exit 1
	fi
fi

echo "installing $* with apt-get"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" ||
	{ $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
		$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"; }; } >"$log" 2>&1; then
	cat "$log" >&2
	echo "apt-install.sh: apt-get install $* failed" >&2
	exit 1
fi
