#!/bin/sh
# Installs containerd and runc from the distribution's packages (Debian's
# containerd 1.6) for the node-cache tests, which start their own private
# containerd. Quiet when containerd is already on PATH. Without apt-get,
# root or password-less sudo it prints one line and succeeds, and when apt-get
# fails it prints apt-get's output and succeeds: the containerd tests skip
# without containerd, so its absence must not fail `make deps`.
# It never starts or configures a system containerd service.
set -eu

if command -v containerd >/dev/null 2>&1; then
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-containerd.sh: no apt-get here; install containerd and runc by hand (the containerd tests skip without them)"
	exit 0
fi

sudo=
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		sudo="sudo -n"
	else
		echo "install-containerd.sh: not root and no password-less sudo; install containerd and runc by hand (the containerd tests skip without them)"
		exit 0
	fi
fi

echo "installing containerd and runc with apt-get"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Whether the package starts a containerd service does not matter: the
# tests run their own. apt-get update only when the plain install fails.
if ! { $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends containerd runc ||
	{ $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
		$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends containerd runc; }; } >"$log" 2>&1; then
	cat "$log" >&2
	echo "install-containerd.sh: apt-get install containerd runc failed; the containerd tests will skip" >&2
fi
