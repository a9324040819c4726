package loader

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/stokehq/stoke/weightstore/bucket"
)

// BucketObject reads ranges of one object with ranged GETs.
func BucketObject(b bucket.Bucket, key string) Source { return bucketSource{b, key} }

type bucketSource struct {
	b   bucket.Bucket
	key string
}

func (s bucketSource) ReadAt(ctx context.Context, p []byte, off int64) error {
	rc, err := s.b.ReadRange(ctx, s.key, off, int64(len(p)))
	if err != nil {
		if permanentBucketErr(err) {
			return fmt.Errorf("%w: %w", ErrPermanent, err)
		}
		return err
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, p); err != nil {
		return fmt.Errorf("read %s [%d, +%d): %w", s.key, off, len(p), err)
	}
	return nil
}

func permanentBucketErr(err error) bool {
	return errors.Is(err, bucket.ErrNotExist) || errors.Is(err, bucket.ErrBucketNotExist) ||
		errors.Is(err, bucket.ErrAccessDenied) || errors.Is(err, bucket.ErrInvalidKey) ||
		errors.Is(err, bucket.ErrInvalidRange)
}

// LocalFile reads ranges of a file on this node (the node cache). Reads
// are not retried: a local read error is not transient.
func LocalFile(r io.ReaderAt) Source { return localSource{r} }

type localSource struct{ r io.ReaderAt }

func (s localSource) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n, err := s.r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%w: %w", ErrPermanent, err)
}
