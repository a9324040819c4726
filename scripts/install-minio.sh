#!/bin/sh
# Installs the MinIO server that the weight-store tests run against into
# $(go env GOPATH)/bin, once per pinned version (recorded in minio.version
# next to the binary). Quiet when it is already installed; one line when it
# builds (a few minutes the first time); the build log only when it fails.
set -eu

GO=${GO:-go}
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c

gopath=$($GO env GOPATH)
bindir=${gopath%%:*}/bin
bin=$bindir/minio
stamp=$bindir/minio.version

if [ -x "$bin" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$MINIO_VERSION" ]; then
	exit 0
fi

echo "building MinIO server $MINIO_VERSION into $bindir (a few minutes the first time)"
mkdir -p "$bindir"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! GOBIN=$bindir $GO install "github.com/minio/minio@$MINIO_VERSION" >"$log" 2>&1; then
	cat "$log" >&2
	echo "install-minio.sh: building MinIO failed" >&2
	exit 1
fi
printf '%s\n' "$MINIO_VERSION" >"$stamp"
