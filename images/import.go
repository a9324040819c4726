package images

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
)

// defaultSnapshotters are the snapshotters Import tries, in order: overlay
// mounts where the kernel and the filesystem under containerd allow them,
// plain copies everywhere else.
var defaultSnapshotters = []string{"overlayfs", "native"}

// dialTimeout bounds how long Import waits for containerd to answer.
const dialTimeout = 10 * time.Second

// ImportOptions says where ImportArchive puts an archive.
type ImportOptions struct {
	// Socket is containerd's gRPC socket. Required.
	Socket string
	// Namespace is the containerd namespace the images land in. Required.
	Namespace string
	// Snapshotters are tried in order until one unpacks the image;
	// default overlayfs, then native.
	Snapshotters []string
}

// Imported is one image ImportArchive created or updated.
type Imported struct {
	// Name is the image's name in containerd, its reference.
	Name string
	// Digest is the digest of its manifest.
	Digest string
	// Snapshotter is the one it was unpacked into; containers of the image
	// must use it.
	Snapshotter string
}

// Import imports the image archive at archivePath (OCI image layout or
// docker-archive tar) into containerd at socket under namespace, unpacks
// it into overlayfs or, failing that, native snapshots, and returns the
// names of the images it holds.
func Import(ctx context.Context, socket, namespace, archivePath string) ([]string, error) {
	imported, err := ImportArchive(ctx, archivePath, ImportOptions{Socket: socket, Namespace: namespace})
	if err != nil {
		return nil, err
	}
	names := make([]string, len(imported))
	for i, im := range imported {
		names[i] = im.Name
	}
	return names, nil
}

// ImportArchive is Import that also says which snapshotter holds each
// image, and lets the caller choose the snapshotters to try.
func ImportArchive(ctx context.Context, archivePath string, opts ImportOptions) ([]Imported, error) {
	if opts.Socket == "" {
		return nil, errors.New("import images: no containerd socket")
	}
	if opts.Namespace == "" {
		return nil, errors.New("import images: no containerd namespace")
	}
	snapshotters := opts.Snapshotters
	if len(snapshotters) == 0 {
		snapshotters = defaultSnapshotters
	}
	f, err := os.Open(archivePath)
	if err != nil {
		return nil, fmt.Errorf("open image archive: %w", err)
	}
	defer f.Close()

	client, err := containerd.New(opts.Socket, containerd.WithTimeout(dialTimeout))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", opts.Socket, err)
	}
	defer client.Close()
	ctx = namespaces.WithNamespace(ctx, opts.Namespace)

	imgs, err := client.Import(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("import %s into containerd at %s: %w", archivePath, opts.Socket, err)
	}
	if len(imgs) == 0 {
		return nil, fmt.Errorf("import %s: the archive names no image for this platform", archivePath)
	}
	out := make([]Imported, 0, len(imgs))
	for _, rec := range imgs {
		img := containerd.NewImage(client, rec)
		var errs []error
		used := ""
		for _, sn := range snapshotters {
			if err := img.Unpack(ctx, sn); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", sn, err))
				continue
			}
			used = sn
			break
		}
		if used == "" {
			return nil, fmt.Errorf("unpack image %s from %s: %w", rec.Name, archivePath, errors.Join(errs...))
		}
		out = append(out, Imported{Name: rec.Name, Digest: rec.Target.Digest.String(), Snapshotter: used})
	}
	return out, nil
}
