#!/bin/sh
# Installs Debian's prometheus package (it brings prometheus and promtool)
# for the monitoring test, which checks deploy/helm/stoke's rules with
# promtool and starts its own private Prometheus on a free port. Quiet
# when prometheus and promtool are already on PATH. Without apt-get, root
# or password-less sudo it prints one line, and when apt-get fails it
# prints apt-get's output; either way it then succeeds, since the
# monitoring test skips without them and their absence must not fail
# `make deps` on a developer's machine. With STOKE_REQUIRE_PROMETHEUS=1
# (which makes that test fail instead of skip) it exits 1 instead, so CI
# stops at the cause.
# It leaves no system Prometheus running: while apt-get runs, a
# policy-rc.d (when the machine has none) tells the package's scripts not
# to start services, and a prometheus service the package started or
# enabled anyway is stopped and disabled.
set -eu

# cannot reports that prometheus cannot be installed here: exit 1 when the
# test requires it, else 0 after the message.
cannot() {
	if [ "${STOKE_REQUIRE_PROMETHEUS:-}" = 1 ]; then
		echo "install-prometheus.sh: $1; STOKE_REQUIRE_PROMETHEUS=1 requires prometheus and promtool" >&2
		exit 1
	fi
	echo "install-prometheus.sh: $1 (the monitoring test skips without them)" >&2
	exit 0
}

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
	exit 0
fi

# Root, or password-less sudo, for policy-rc.d and the service; when
# neither is there apt-install.sh says so.
sudo= root=
if [ "$(id -u)" -eq 0 ]; then
	root=1
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
	sudo="sudo -n" root=1
fi
policy=/usr/sbin/policy-rc.d
made_policy=
if [ -n "$root" ]; then
	if [ ! -e "$policy" ] && $sudo sh -c "printf '#!/bin/sh\n# install-prometheus.sh: no service starts while it installs\nexit 101\n' >$policy && chmod 755 $policy"; then
		made_policy=1
	fi
fi
trap 'if [ -n "$made_policy" ]; then $sudo rm -f "$policy"; fi' EXIT

installed=1
sh "$(dirname "$0")/apt-install.sh" prometheus || installed=

# Whatever policy-rc.d said, the tests start their own server: stop and
# disable the package's.
if [ -z "$root" ]; then
	:
elif [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	$sudo systemctl disable --now prometheus.service >/dev/null 2>&1 || true
elif [ -x /etc/init.d/prometheus ]; then
	$sudo /etc/init.d/prometheus stop >/dev/null 2>&1 || true
fi

if [ -z "$installed" ]; then
	cannot "could not install prometheus (see above)"
fi
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
	cannot "apt-get installed prometheus, but prometheus and promtool are not on PATH"
fi
