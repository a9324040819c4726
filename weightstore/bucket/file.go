package bucket

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/stokehq/stoke/internal/ctxio"
)

// tmpPrefix starts the names of files a Put is still writing; List skips
// them and keys may not use it.
const tmpPrefix = ".stoke-tmp-"

// ErrOutsideRoot reports a file:// key whose resolution leaves the bucket's
// directory: a symbolic link pointing out of it (or an absolute one, which
// os.Root refuses wherever it points). Links inside the bucket must be
// relative and stay inside it.
var ErrOutsideRoot = errors.New("path resolves outside the bucket's root directory")

// fileBucket stores objects as files under root, one file per key. Every
// access goes through an os.Root opened on root, so that no key, however
// its directories and symbolic links resolve, reaches a file outside it.
//
// List leaves out hidden names: a key with a path element starting with
// '.' (".hidden/config.json", "m/.cache/x", "..x/y") is not listed, as
// editors', rsync's and the Put's own temporary files are not. Such keys
// can still be read, written and deleted by name.
type fileBucket struct {
	root string // absolute, cleaned
}

// openRoot opens the bucket's directory; a missing one is reported as
// isMissing errors are.
func (b *fileBucket) openRoot() (*os.Root, error) {
	return os.OpenRoot(b.root)
}

// rootErr rewrites an error of an os.Root method on the path rel: one that
// says the path escapes the root wraps ErrOutsideRoot and names the path.
func (b *fileBucket) rootErr(rel string, err error) error {
	if err != nil && strings.Contains(err.Error(), "path escapes from parent") {
		return fmt.Errorf("%w: %s", ErrOutsideRoot, filepath.Join(b.root, rel))
	}
	return err
}

// hidden reports whether some '/'-separated element of key starts with '.'.
func hidden(key string) bool {
	for elem := range strings.SplitSeq(key, "/") {
		if strings.HasPrefix(elem, ".") {
			return true
		}
	}
	return false
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

// rel is key's path relative to the root, for the os.Root methods.
func rel(key string) string { return filepath.FromSlash(key) }

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
// files (and symbolic links to them within the root) whose keys start with
// prefix, leaving out hidden names and links that lead out of the root.
func (b *fileBucket) List(ctx context.Context, prefix string) ([]Object, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, fmt.Errorf("list %s: %w", b.URL(), err)
	}
	root, err := b.openRoot()
	if err != nil {
		if isMissing(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("list %s prefix %q: %w", b.URL(), prefix, err)
	}
	defer root.Close()
	start := "."
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		start = prefix[:i]
	}
	var objs []Object
	err = fs.WalkDir(root.FS(), start, func(key string, d fs.DirEntry, err error) error {
		if err != nil {
			if key == start && isMissing(err) {
				return fs.SkipAll
			}
			return b.rootErr(key, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if key == "." {
			return nil
		}
		if hidden(key) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			// Skip directories that cannot hold a matching key.
			if key != start && !strings.HasPrefix(key+"/", prefix) && !strings.HasPrefix(prefix, key+"/") {
				return fs.SkipDir
			}
			return nil
		}
		if !strings.HasPrefix(key, prefix) {
			return nil
		}
		fi, err := root.Stat(rel(key)) // follows symbolic links within the root
		if err != nil {
			if isMissing(err) || errors.Is(b.rootErr(key, err), ErrOutsideRoot) {
				return nil // deleted meanwhile, a dangling link, or a link out
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
	root, err := b.openRoot()
	if err == nil {
		defer root.Close()
		var fi fs.FileInfo
		if fi, err = root.Stat(rel(key)); err == nil {
			if !fi.Mode().IsRegular() {
				return nil, ErrNotExist
			}
			return fi, nil
		}
	}
	if isMissing(err) {
		return nil, ErrNotExist
	}
	return nil, b.rootErr(rel(key), err)
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
	root, err := b.openRoot()
	var f *os.File
	if err == nil {
		f, err = root.Open(rel(key))
		root.Close() // f stays open
	}
	if err != nil {
		if isMissing(err) {
			err = ErrNotExist
		}
		return nil, fmt.Errorf("read %s: %w", what, b.rootErr(rel(key), err))
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
	if err := b.put(ctx, rel(key), r, size); err != nil {
		return fmt.Errorf("put %s: %w", what, b.rootErr(rel(key), err))
	}
	return nil
}

func (b *fileBucket) put(ctx context.Context, dst string, r io.Reader, size int64) (err error) {
	// The root itself is the operator's directory (its parent was checked
	// by Open); everything under it goes through the os.Root.
	if err = os.MkdirAll(b.root, 0o755); err != nil {
		return err
	}
	root, err := b.openRoot()
	if err != nil {
		return err
	}
	defer root.Close()
	dir := filepath.Dir(dst)
	var f *os.File
	var tmp string
	// A concurrent Delete may remove the (then empty) directory between
	// MkdirAll and creating the file; try again a few times.
	for range 3 {
		if err = root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		f, tmp, err = createTemp(root, dir)
		if err == nil || !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			root.Remove(tmp)
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
	if err = root.Rename(tmp, dst); err != nil {
		return err
	}
	return syncDir(root, dir)
}

// createTemp creates a new file named tmpPrefix and a random suffix in the
// directory dir of root, as os.CreateTemp does outside a root.
func createTemp(root *os.Root, dir string) (*os.File, string, error) {
	for range 100 {
		name := filepath.Join(dir, tmpPrefix+strconv.FormatUint(rand.Uint64(), 36))
		f, err := root.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, name, err
	}
	return nil, "", fmt.Errorf("create a temporary file in %s: too many attempts", dir)
}

// syncDir makes a rename in dir durable.
func syncDir(root *os.Root, dir string) error {
	d, err := root.Open(dir)
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
	root, err := b.openRoot()
	if err != nil {
		if isMissing(err) {
			return nil
		}
		return fmt.Errorf("delete %s: %w", what, err)
	}
	defer root.Close()
	p := rel(key)
	fi, err := root.Lstat(p)
	if err != nil {
		if isMissing(err) {
			return nil
		}
		return fmt.Errorf("delete %s: %w", what, b.rootErr(p, err))
	}
	if fi.IsDir() { // a key prefix, not an object
		return nil
	}
	if err := root.Remove(p); err != nil && !isMissing(err) {
		return fmt.Errorf("delete %s: %w", what, b.rootErr(p, err))
	}
	for dir := filepath.Dir(p); dir != "."; dir = filepath.Dir(dir) {
		if root.Remove(dir) != nil { // not empty (or already gone): stop
			break
		}
	}
	return nil
}
