// Package bucket is the object-store interface the weight store pushes to,
// watches and loads from: s3:// buckets (AWS S3, MinIO and other
// S3-compatible servers, through minio-go) and file:// directories.
//
// Keys are '/'-separated paths relative to the bucket's root (the URL's
// prefix or directory). The same keys are valid for both implementations: no
// empty, "." or ".." elements, no leading or trailing '/', no NUL bytes.
package bucket

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"time"
)

// Object describes one stored object.
type Object struct {
	// Key is the object's key relative to the bucket's root.
	Key string
	// Size is the object's length in bytes.
	Size int64
	// ETag changes whenever the object is rewritten. On S3 it is the
	// server's ETag (an MD5 for simple uploads, "md5-N" for multipart ones);
	// for file:// it is derived from the modification time and size and is
	// not a content hash.
	ETag string
	// LastModified is when the object was last written. On S3, Stat's time
	// (an HTTP date) has whole seconds while List's has milliseconds.
	LastModified time.Time
}

// Bucket is an object store rooted at a URL. Implementations are safe for
// concurrent use.
type Bucket interface {
	// URL returns the bucket's root as s3://bucket/prefix or file:///dir.
	URL() string
	// List returns every object whose key starts with prefix (a plain
	// string prefix, as in S3, not only a directory), recursively, sorted by
	// key. An empty prefix lists the whole bucket.
	List(ctx context.Context, prefix string) ([]Object, error)
	// Stat describes one object; the error wraps ErrNotExist when it is
	// missing.
	Stat(ctx context.Context, key string) (Object, error)
	// ReadRange streams n bytes of key starting at off; n < 0 reads to the
	// end. A range running past the end is cut short at the end; an offset
	// past the end is an error wrapping ErrInvalidRange. The caller closes
	// the reader.
	ReadRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error)
	// Put stores size bytes from r under key (size < 0: until r's EOF).
	// The write is atomic: readers see the old object or the complete new
	// one, never a partial one. Large objects go up in parts on S3.
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// Delete removes key. Deleting a missing key is not an error.
	Delete(ctx context.Context, key string) error
}

// Sentinel errors, matched with errors.Is. Read-only.
var (
	// ErrNotExist reports a missing object; it matches fs.ErrNotExist too.
	ErrNotExist = fmt.Errorf("object does not exist: %w", fs.ErrNotExist)
	// ErrBucketNotExist reports a missing bucket or file:// root
	// directory; it matches fs.ErrNotExist too.
	ErrBucketNotExist = fmt.Errorf("bucket does not exist: %w", fs.ErrNotExist)
	// ErrAccessDenied reports credentials the store refused.
	ErrAccessDenied = errors.New("access denied (check the credentials)")
	// ErrInvalidKey reports a key that is not a clean relative path.
	ErrInvalidKey = errors.New("invalid object key")
	// ErrInvalidRange reports a read offset past the end of an object.
	ErrInvalidRange = errors.New("range not satisfiable")
)

// Open opens the bucket at url: "s3://bucket/prefix" through minio-go with
// the given options, "file:///abs/dir", "file://rel/dir" or a plain path
// through the local filesystem. It makes one cheap call to check that the
// bucket exists and, for S3, that the credentials are accepted.
func Open(ctx context.Context, url string, s3 S3Options) (Bucket, error) {
	scheme, bkt, prefix, err := SplitURL(url)
	if err != nil {
		return nil, err
	}
	switch scheme {
	case "s3":
		return openS3(ctx, bkt, prefix, s3)
	case "file":
		return openFile(prefix)
	}
	return nil, fmt.Errorf("open bucket %q: unsupported scheme %q", url, scheme)
}

// SplitURL splits a bucket URL into its scheme ("s3" or "file"), bucket name
// (empty for file) and prefix. For s3 the prefix is the key prefix without
// leading or trailing '/'; for file it is the cleaned directory path
// (absolute for file:///dir, relative for file://dir or a relative plain
// path). Other schemes are an error.
func SplitURL(url string) (scheme, bucket, prefix string, err error) {
	if url == "" {
		return "", "", "", errors.New("split bucket URL: empty URL")
	}
	if strings.ContainsRune(url, 0) {
		return "", "", "", fmt.Errorf("split bucket URL %q: contains a NUL byte", url)
	}
	i := strings.Index(url, "://")
	if i < 0 {
		return "file", "", filepath.Clean(url), nil
	}
	scheme, rest := strings.ToLower(url[:i]), url[i+3:]
	switch scheme {
	case "file":
		if rest == "" {
			return "", "", "", fmt.Errorf("split bucket URL %q: no directory", url)
		}
		return "file", "", filepath.Clean(rest), nil
	case "s3":
		bucket, prefix, _ = strings.Cut(rest, "/")
		if bucket == "" {
			return "", "", "", fmt.Errorf("split bucket URL %q: no bucket name", url)
		}
		prefix = strings.Trim(prefix, "/")
		if prefix != "" {
			if err := checkKey(prefix); err != nil {
				return "", "", "", fmt.Errorf("split bucket URL %q: prefix: %w", url, err)
			}
		}
		return "s3", bucket, prefix, nil
	}
	return "", "", "", fmt.Errorf("split bucket URL %q: unsupported scheme %q (want s3:// or file://)", url, scheme)
}

// checkKey reports whether key is a clean relative '/'-separated path.
func checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case strings.ContainsRune(key, 0):
		return fmt.Errorf("%w %q: contains a NUL byte", ErrInvalidKey, key)
	case strings.HasPrefix(key, "/"):
		return fmt.Errorf("%w %q: absolute", ErrInvalidKey, key)
	}
	for elem := range strings.SplitSeq(key, "/") {
		switch elem {
		case "":
			return fmt.Errorf("%w %q: empty path element", ErrInvalidKey, key)
		case ".", "..":
			return fmt.Errorf("%w %q: %q path element", ErrInvalidKey, key, elem)
		}
	}
	return nil
}

// checkPrefix reports whether prefix is usable for List: empty, or a key
// optionally followed by '/', or a key with a partial last element.
func checkPrefix(prefix string) error {
	p := strings.TrimSuffix(prefix, "/")
	if p == "" {
		if prefix != "" {
			return fmt.Errorf("%w: list prefix %q is absolute", ErrInvalidKey, prefix)
		}
		return nil
	}
	if err := checkKey(p); err != nil {
		return fmt.Errorf("list prefix: %w", err)
	}
	return nil
}
