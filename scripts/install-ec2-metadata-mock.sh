#!/bin/sh
# Installs AWS's EC2 instance metadata mock (amazon-ec2-metadata-mock),
# which the spot interruption tests run against, into $(go env GOPATH)/bin,
# once per pinned version (recorded in ec2-metadata-mock.version next to the
# binary). Quiet when it is already installed; one line when it builds (a
# few seconds); the build log only when it fails.
set -eu

GO=${GO:-go}
AEMM_VERSION=v1.13.0

gopath=$($GO env GOPATH)
bindir=${gopath%%:*}/bin
bin=$bindir/ec2-metadata-mock
stamp=$bindir/ec2-metadata-mock.version

if [ -x "$bin" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$AEMM_VERSION" ]; then
	exit 0
fi

echo "building ec2-metadata-mock $AEMM_VERSION into $bindir"
mkdir -p "$bindir"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! GOBIN=$bindir $GO install "github.com/aws/amazon-ec2-metadata-mock/cmd/ec2-metadata-mock@$AEMM_VERSION" >"$log" 2>&1; then
	cat "$log" >&2
	echo "install-ec2-metadata-mock.sh: building ec2-metadata-mock failed" >&2
	exit 1
fi
printf '%s\n' "$AEMM_VERSION" >"$stamp"
