// Package images builds OCI images of the stoke binary without a Docker
// daemon and imports them into containerd.
//
// Two images come from one static stoke binary and share its single layer:
//
//   - stoke (default reference stoke.local/stoke:dev): entrypoint
//     /usr/local/bin/stoke, command ["serve"], the platform itself;
//   - engine (default stoke.local/engine:dev): the same entrypoint with the
//     command ["engine", "--blank", "--listen", "unix:///run/stoke/engine.sock"],
//     the blank runtime the warm pool starts and loads models into.
//
// Build writes each as an OCI image-layout tar archive, the format
// `ctr images import`, `docker load` (Docker 25 and later), podman and
// skopeo read. Everything that goes into an image is fixed by the binary,
// the reference and the creation time, so the same binary gives the same
// digests on every build. Import puts an archive into containerd's content
// store and unpacks it into a snapshotter, ready for runtimes to run.
//
// Dockerfile.stoke and Dockerfile.engine beside this package build the
// same two images with Docker for those who prefer it.
package images
