#!/bin/sh
# Builds the Kubernetes control plane the cluster tests run against —
# kube-apiserver, kube-controller-manager, kube-scheduler and kubelet
# v1.37.2 — from the Go module proxy through the wrapper module in
# scripts/kubernetes, into $(go env GOPATH)/bin, once per pinned version
# (recorded in kubernetes.version next to the binaries): 12–16 minutes
# cold on 2 cores, nothing once built. It also installs Debian's etcd,
# PostgreSQL, Redis and CNI plugins (apt-install.sh). Quiet when all is
# installed. Without apt-get the Debian parts are skipped with one line
# (the tests that need them skip); with STOKE_REQUIRE_KUBERNETES=1 (which
# .ci/run sets) a missing part fails instead.
set -eu

GO=${GO:-go}
KUBE_VERSION=v1.37.2
here=$(cd "$(dirname "$0")" && pwd)

gopath=$($GO env GOPATH)
bindir=${gopath%%:*}/bin
stamp=$bindir/kubernetes.version
cmds="kube-apiserver kube-controller-manager kube-scheduler kubelet"

cannot() {
	if [ "${STOKE_REQUIRE_KUBERNETES:-}" = 1 ]; then
		echo "install-kubernetes.sh: $1; STOKE_REQUIRE_KUBERNETES=1 requires it" >&2
		exit 1
	fi
	echo "install-kubernetes.sh: $1 (the cluster tests skip without it)" >&2
}

built=1
for c in $cmds; do
	[ -x "$bindir/$c" ] || built=0
done
if [ "$built" = 0 ] || [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$KUBE_VERSION" ]; then
	echo "building Kubernetes $KUBE_VERSION ($cmds) into $bindir (12-16 minutes the first time)"
	mkdir -p "$bindir"
	log=$(mktemp)
	pkg=k8s.io/component-base/version
	ldflags="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=37 -X $pkg.gitTreeState=clean"
	if ! (cd "$here/kubernetes" && CGO_ENABLED=0 GOBIN=$bindir $GO install -trimpath -ldflags "$ldflags" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet) >"$log" 2>&1; then
		cat "$log" >&2
		rm -f "$log"
		echo "install-kubernetes.sh: building Kubernetes failed" >&2
		exit 1
	fi
	rm -f "$log"
	printf '%s\n' "$KUBE_VERSION" >"$stamp"
fi

need=
command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ] || need="$need etcd-server"
[ -x /usr/lib/cni/bridge ] || [ -x /opt/cni/bin/bridge ] || need="$need containernetworking-plugins"
command -v redis-server >/dev/null 2>&1 || need="$need redis-server"
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need="$need postgresql"
if [ -n "$need" ]; then
	# shellcheck disable=SC2086
	sh "$here/apt-install.sh" $need || cannot "could not install$need (see above)"
fi
exit 0
