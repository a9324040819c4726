package loader

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/manifest"
)

// ReadFile reads one file of revision m from the bucket (at most limit
// bytes) and checks it against the manifest's size and sha256: a file
// pushed over since is an error, never read as the revision's.
func ReadFile(ctx context.Context, b bucket.Bucket, m *manifest.Manifest, name string, limit int64) ([]byte, error) {
	what := fmt.Sprintf("read %s of revision %s of %s", name, m.Revision, m.Model)
	var file *manifest.File
	for i := range m.Files {
		if m.Files[i].Name == name {
			file = &m.Files[i]
		}
	}
	switch {
	case file == nil:
		return nil, fmt.Errorf("%s: the revision has no such file", what)
	case file.Size > limit:
		return nil, fmt.Errorf("%s: %d bytes exceed the limit of %d", what, file.Size, limit)
	}
	rc, err := b.ReadRange(ctx, m.Model+"/"+name, 0, -1)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	size, sum, err := manifest.Hash(ctx, bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if size != file.Size || sum != file.SHA256 {
		return nil, fmt.Errorf("%s: the bucket's copy changed since the revision was pushed (%d bytes, sha256 %s; the manifest says %d, %s)",
			what, size, sum, file.Size, file.SHA256)
	}
	return data, nil
}
