#!/bin/sh
# Installs containerd and runc from the distribution's packages (Debian's
# containerd 1.6) for the node-cache tests, which start their own private
# containerd. Quiet when containerd and runc are already on PATH. Without apt-get,
# root or password-less sudo it prints one line, and when apt-get fails it
# prints apt-get's output; either way it then succeeds, since the
# containerd tests skip without containerd and its absence must not fail
# `make deps` on a developer's machine. With STOKE_REQUIRE_CONTAINERD=1
# (which .ci/run sets, and which makes those tests fail instead of skip) it
# exits 1 instead, so CI stops at the cause.
# It never starts or configures a system containerd service.
set -eu

# cannot reports that containerd cannot be installed here: exit 1 when the
# tests require it, else 0 after the message.
cannot() {
	if [ "${STOKE_REQUIRE_CONTAINERD:-}" = 1 ]; then
		echo "install-containerd.sh: $1; STOKE_REQUIRE_CONTAINERD=1 requires containerd" >&2
		exit 1
	fi
	echo "install-containerd.sh: $1 (the containerd tests skip without them)" >&2
	exit 0
}

if command -v containerd >/dev/null 2>&1 && command -v runc >/dev/null 2>&1; then
	exit 0
fi
# Whether the package starts a containerd service does not matter: the
# tests run their own.
if ! sh "$(dirname "$0")/apt-install.sh" containerd runc; then
	cannot "could not install containerd and runc (see above)"
fi
if ! command -v containerd >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
	cannot "apt-get installed containerd and runc, but they are not on PATH"
fi
