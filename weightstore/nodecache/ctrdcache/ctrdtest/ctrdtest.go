// Package ctrdtest starts a private containerd for tests of the containerd
// node cache. The daemon comes from scripts/install-containerd.sh (Debian's
// containerd package), which `make deps` runs; tests skip when it is not
// installed or cannot start here (for instance when not run as root), unless
// STOKE_REQUIRE_CONTAINERD=1 (which .ci/run sets) turns that into a failure.
package ctrdtest

import (
	"time"
)

// Namespace is the containerd namespace tests use unless they need another.
const Namespace = "stoke-test"

// startTimeout bounds how long a daemon may take to answer.
const startTimeout = 30 * time.Second

// stopTimeout is how long a daemon gets to exit after SIGTERM before it and
// its process group are killed.
const stopTimeout = 10 * time.Second

// maxSocketPath is the longest socket path used: sun_path holds 108 bytes
// with the terminating NUL, and containerd adds ".ttrpc" for its second
// socket.
const maxSocketPath = 100
