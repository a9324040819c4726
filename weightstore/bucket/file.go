package bucket

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/stokehq/stoke/internal/ctxio"
)

// tmpPrefix starts the names of files a Put is still writing; List skips
// them and keys may not use it.
const tmpPrefix = ".stoke-tmp-"

// fileBucket stores objects as files under root, one file per key.
type fileBucket struct {
	root string // absolute, cleaned
}

// openFile opens the directory dir as a bucket. The directory itself may be
// missing (the first Put creates it, as the first upload creates an S3
// prefix) but its parent must exist, as an S3 bucket must.
func openFile(dir string) (*fileBucket, error) {
	root, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open file bucket %s: %w", dir, err)
	}
	fi, err := os.Stat(root)
	switch {
	case err == nil && !fi.IsDir():
		return nil, fmt.Errorf("open file bucket %s: %w: not a directory", root, ErrBucketNotExist)
	case err == nil:
		return &fileBucket{root: root}, nil
	case !isMissing(err):
		return nil, fmt.Errorf("open file bucket %s: %w", root, err)
	}
	parent := filepath.Dir(root)
	if fi, err := os.Stat(parent); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("open file bucket %s: %w: parent directory %s is missing", root, ErrBucketNotExist, parent)
	}
	return &fileBucket{root: root}, nil
}

// URL returns file:// followed by the absolute root directory.
func (b *fileBucket) URL() string { return "file://" + filepath.ToSlash(b.root) }

func (b *fileBucket) path(key string) string {
	return filepath.Join(b.root, filepath.FromSlash(key))
}

// checkFileKey adds the file bucket's one reserved name to checkKey.
func checkFileKey(key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if strings.HasPrefix(key[strings.LastIndexByte(key, '/')+1:], tmpPrefix) {
		return fmt.Errorf("%w %q: names starting with %q are reserved", ErrInvalidKey, key, tmpPrefix)
	}
	return nil
}

// isMissing reports whether err from the filesystem means "no such object":
// the file or one of its directories is missing, or a directory along the
// path is a file.
func isMissing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

func (b *fileBucket) object(key string, fi fs.FileInfo) Object {
	return Object{
		Key:          key,
		Size:         fi.Size(),
		ETag:         fmt.Sprintf("%x-%x", fi.ModTime().UnixNano(), fi.Size()),
		LastModified: fi.ModTime(),
	}
}

// List walks the deepest directory the prefix names and keeps the regular
// files (and symbolic links to them) whose keys start with prefix.
func (b *fileBucket) List(ctx context.Context, prefix string) ([]Object, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, fmt.Errorf("list %s: %w", b.URL(), err)
	}
	start := b.root
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		start = b.path(prefix[:i])
	}
	var objs []Object
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == start && isMissing(err) {
				return fs.SkipAll
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(b.root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if d.IsDir() {
			// Skip directories that cannot hold a matching key.
			if p != start && !strings.HasPrefix(key+"/", prefix) && !strings.HasPrefix(prefix, key+"/") {
				return fs.SkipDir
			}
			return nil
		}
		if strings.HasPrefix(d.Name(), tmpPrefix) || !strings.HasPrefix(key, prefix) {
			return nil
		}
		fi, err := os.Stat(p) // follows symbolic links
		if err != nil {
			if isMissing(err) { // deleted meanwhile, or a dangling link
				return nil
			}
			return err
		}
		if fi.Mode().IsRegular() {
			objs = append(objs, b.object(key, fi))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s prefix %q: %w", b.URL(), prefix, err)
	}
	slices.SortFunc(objs, func(x, y Object) int { return strings.Compare(x.Key, y.Key) })
	return objs, nil
}

// stat returns the file info of key, with missing or non-regular files
// reported as ErrNotExist.
func (b *fileBucket) stat(key string) (fs.FileInfo, error) {
	if err := checkFileKey(key); err != nil {
		return nil, err
	}
	fi, err := os.Stat(b.path(key))
	if err != nil {
		if isMissing(err) {
			return nil, ErrNotExist
		}
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, ErrNotExist
	}
	return fi, nil
}

// Stat describes key.
func (b *fileBucket) Stat(ctx context.Context, key string) (Object, error) {
	if err := ctx.Err(); err != nil {
		return Object{}, fmt.Errorf("stat %s/%s: %w", b.URL(), key, err)
	}
	fi, err := b.stat(key)
	if err != nil {
		return Object{}, fmt.Errorf("stat %s/%s: %w", b.URL(), key, err)
	}
	return b.object(key, fi), nil
}

// ReadRange opens key and returns a reader over the requested section.
func (b *fileBucket) ReadRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	what := fmt.Sprintf("%s/%s [%d, +%d)", b.URL(), key, off, n)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	if off < 0 {
		return nil, fmt.Errorf("read %s: %w: negative offset", what, ErrInvalidRange)
	}
	if err := checkFileKey(key); err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	f, err := os.Open(b.path(key))
	if err != nil {
		if isMissing(err) {
			err = ErrNotExist
		}
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	fi, err := f.Stat()
	switch {
	case err != nil:
	case !fi.Mode().IsRegular():
		err = ErrNotExist
	case off > fi.Size():
		err = fmt.Errorf("%w: offset past the end of a %d-byte object", ErrInvalidRange, fi.Size())
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	end := fi.Size()
	if n >= 0 && n < end-off {
		end = off + n
	}
	return &fileRange{Reader: io.NewSectionReader(f, off, end-off), f: f}, nil
}

// fileRange reads a section of an open file and closes the file.
type fileRange struct {
	io.Reader
	f *os.File
}

func (r *fileRange) Close() error { return r.f.Close() }

// Put writes a temporary file next to the target, syncs it and renames it
// into place, so readers see either the old file or the complete new one.
func (b *fileBucket) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	what := b.URL() + "/" + key
	if err := checkFileKey(key); err != nil {
		return fmt.Errorf("put %s: %w", what, err)
	}
	if err := b.put(ctx, b.path(key), r, size); err != nil {
		return fmt.Errorf("put %s: %w", what, err)
	}
	return nil
}

func (b *fileBucket) put(ctx context.Context, dst string, r io.Reader, size int64) (err error) {
	dir := filepath.Dir(dst)
	var f *os.File
	// A concurrent Delete may remove the (then empty) directory between
	// MkdirAll and CreateTemp; try again a few times.
	for range 3 {
		if err = os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		f, err = os.CreateTemp(dir, tmpPrefix+"*")
		if err == nil || !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	src := ctxio.Reader(ctx, r)
	if size >= 0 {
		var n int64
		n, err = io.CopyN(f, src, size)
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("short input: %d of %d bytes", n, size)
		}
	} else {
		_, err = io.Copy(f, src)
	}
	if err != nil {
		return err
	}
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = ctx.Err(); err != nil {
		return err
	}
	if err = os.Rename(tmp, dst); err != nil {
		return err
	}
	return syncDir(dir)
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// Delete removes key's file and then the directories it leaves empty, up to
// (not including) the root.
func (b *fileBucket) Delete(ctx context.Context, key string) error {
	what := b.URL() + "/" + key
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("delete %s: %w", what, err)
	}
	if err := checkFileKey(key); err != nil {
		return fmt.Errorf("delete %s: %w", what, err)
	}
	p := b.path(key)
	fi, err := os.Lstat(p)
	if err != nil {
		if isMissing(err) {
			return nil
		}
		return fmt.Errorf("delete %s: %w", what, err)
	}
	if fi.IsDir() { // a key prefix, not an object
		return nil
	}
	if err := os.Remove(p); err != nil && !isMissing(err) {
		return fmt.Errorf("delete %s: %w", what, err)
	}
	for dir := filepath.Dir(p); dir != b.root && strings.HasPrefix(dir, b.root); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil { // not empty (or already gone): stop
			break
		}
	}
	return nil
}
