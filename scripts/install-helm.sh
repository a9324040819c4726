#!/bin/sh
# Installs the Helm CLI that deploy/'s chart tests lint and render the chart
# with into $(go env GOPATH)/bin, built from the Go module proxy once per
# pinned version (recorded in helm.version next to the binary). Quiet when
# it is already installed; one line when it builds (a few minutes the first
# time); the build log only when it fails. The link flags do what Helm's
# own Makefile does: stamp the version, and make the Kubernetes version
# that `helm template` and `helm lint` assume (.Capabilities.KubeVersion,
# the deprecated-API check) the one of the client-go it is built with
# rather than 1.20.
set -eu

GO=${GO:-go}
HELM_VERSION=v3.22.0
# The Kubernetes minor of the k8s.io/client-go in Helm's go.mod (v0.37.x).
HELM_KUBE_MINOR=37

gopath=$($GO env GOPATH)
bindir=${gopath%%:*}/bin
bin=$bindir/helm
stamp=$bindir/helm.version

if [ -x "$bin" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$HELM_VERSION" ]; then
	exit 0
fi

echo "building Helm $HELM_VERSION into $bindir (a few minutes the first time)"
mkdir -p "$bindir"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
	ldflags="$ldflags -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$HELM_KUBE_MINOR"
done
if ! CGO_ENABLED=0 GOBIN=$bindir $GO install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >"$log" 2>&1; then
	cat "$log" >&2
	echo "install-helm.sh: building Helm failed" >&2
	exit 1
fi
printf '%s\n' "$HELM_VERSION" >"$stamp"
