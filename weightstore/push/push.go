// Package push uploads a local checkpoint directory to a bucket as one
// immutable revision: it validates the checkpoint, optionally quantises it
// to FP8 and reshards it, hashes every file, uploads the files in parallel
// and writes manifest.json last, as the commit point. A push that fails or
// is cancelled never writes a manifest, and pushing identical content again
// uploads nothing.
package push

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"gopkg.in/yaml.v3"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/manifest"
)

// SpecFile is the optional deployment spec pushed beside the checkpoint.
const SpecFile = "stoke.yaml"

// DefaultParallel is the number of concurrent uploads when
// Options.Parallel is not set.
const DefaultParallel = 4

// Options control a push.
type Options struct {
	// Parallel is how many files are hashed and uploaded at once
	// (DefaultParallel when <= 0).
	Parallel int
	// Quantize pushes an FP8 (E4M3, block-scaled) copy of the checkpoint
	// instead of the checkpoint itself.
	Quantize bool
	// ShardSize, when > 0, rewrites the checkpoint into shards of at most
	// this many tensor bytes before pushing (with or without Quantize).
	ShardSize int64
	// Progress receives a multi-line progress bar when it is a terminal, or
	// one line per file otherwise; nil shows nothing.
	Progress io.Writer
	// Base is the prefix of the base model when dir holds a LoRA adapter
	// (IsAdapter): the adapter is checked against the base's committed
	// revision there before anything is uploaded.
	Base bucket.Bucket
}

// Push uploads the checkpoint in dir to dest and returns the manifest of the
// revision now committed there. The model's name is dest's last path
// element.
func Push(ctx context.Context, dir string, dest bucket.Bucket, opts Options) (*manifest.Manifest, error) {
	if opts.Parallel <= 0 {
		opts.Parallel = DefaultParallel
	}
	name, err := ModelName(dest.URL())
	if err != nil {
		return nil, fmt.Errorf("push %s: %w", dir, err)
	}
	var base *manifest.Manifest
	src, dt, cleanup := dir, dtype.Invalid, func() {}
	if IsAdapter(dir) {
		base, dt, err = checkAdapter(ctx, dir, opts)
	} else {
		src, dt, cleanup, err = prepare(ctx, dir, opts)
	}
	if err != nil {
		return nil, err
	}
	defer cleanup()
	files, err := hashDir(ctx, src, opts.Parallel)
	if err != nil {
		return nil, fmt.Errorf("push %s: %w", dir, err)
	}
	spec, err := readSpec(src)
	if err != nil {
		return nil, fmt.Errorf("push %s: %w", dir, err)
	}
	m := &manifest.Manifest{
		Model:    name,
		Revision: manifest.Revision(files),
		Files:    files,
		DType:    dt.String(),
		Spec:     spec,
	}
	for _, f := range files {
		m.TotalBytes += f.Size
	}
	if base != nil {
		m.Base, m.BaseRevision = base.Model, base.Revision
	}

	prev, err := readManifest(ctx, dest)
	if err != nil {
		return nil, fmt.Errorf("push %s to %s: %w", dir, dest.URL(), err)
	}
	todo, err := plan(ctx, dest, files, prev)
	if err != nil {
		return nil, fmt.Errorf("push %s to %s: %w", dir, dest.URL(), err)
	}
	if prev != nil && prev.Revision == m.Revision && len(todo) == 0 {
		return prev, nil
	}
	if prev != nil && prev.Revision != m.Revision {
		// The prefix is about to hold a mix of two revisions; no manifest
		// may vouch for it until the new one is complete.
		if err := dest.Delete(ctx, manifest.FileName); err != nil {
			return nil, fmt.Errorf("push %s to %s: retire the previous manifest (%s): %w", dir, dest.URL(), prev.Revision, err)
		}
	}
	if err := upload(ctx, src, dest, files, todo, opts); err != nil {
		return nil, fmt.Errorf("push %s to %s: %w", dir, dest.URL(), err)
	}
	m.CreatedAt = time.Now().UTC()
	data, err := m.Marshal()
	if err != nil {
		return nil, fmt.Errorf("push %s to %s: %w", dir, dest.URL(), err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("push %s to %s: %w", dir, dest.URL(), err)
	}
	if err := dest.Put(ctx, manifest.FileName, bytes.NewReader(data), int64(len(data))); err != nil {
		return nil, fmt.Errorf("push %s to %s: commit: %w", dir, dest.URL(), err)
	}
	return m, nil
}

// ModelName returns the last path element of a bucket URL (its prefix's
// last element, or the bucket's name when there is no prefix), which names
// the model pushed there.
func ModelName(url string) (string, error) {
	scheme, bkt, prefix, err := bucket.SplitURL(url)
	if err != nil {
		return "", fmt.Errorf("model name from destination: %w", err)
	}
	var name string
	switch {
	case scheme == "file":
		name = filepath.Base(prefix)
	case prefix == "":
		name = bkt
	default:
		name = prefix[strings.LastIndexByte(prefix, '/')+1:]
	}
	if err := manifest.CheckName(name); err != nil {
		return "", fmt.Errorf("model name from destination %s: %w", url, err)
	}
	return name, nil
}

// prepare validates the checkpoint in dir and, when opts ask for it, writes
// its FP8 or resharded copy into a temporary directory. It returns the
// directory to push, the projection weights' dtype and a function removing
// the temporary copy.
func prepare(ctx context.Context, dir string, opts Options) (src string, dt dtype.DType, cleanup func(), err error) {
	cleanup = func() {}
	ck, err := checkpoint.Open(dir)
	if err != nil {
		return "", 0, nil, fmt.Errorf("push %s: refusing a broken checkpoint: %w", dir, err)
	}
	dt = ck.WeightDType()
	if !opts.Quantize && opts.ShardSize <= 0 {
		ck.Close()
		return dir, dt, cleanup, nil
	}
	tmp, err := os.MkdirTemp("", "stoke-push-")
	if err != nil {
		ck.Close()
		return "", 0, nil, fmt.Errorf("push %s: %w", dir, err)
	}
	cleanup = func() { os.RemoveAll(tmp) }
	out := filepath.Join(tmp, "checkpoint")
	if opts.Quantize {
		ck.Close()
		err = checkpoint.Quantize(ctx, dir, out, checkpoint.QuantizeOptions{ShardSize: opts.ShardSize})
	} else {
		err = reshard(ctx, ck, out, opts.ShardSize)
		ck.Close()
	}
	if err != nil {
		cleanup()
		return "", 0, nil, fmt.Errorf("push %s: %w", dir, err)
	}
	re, err := checkpoint.Open(out)
	if err != nil {
		cleanup()
		return "", 0, nil, fmt.Errorf("push %s: the rewritten copy does not open: %w", dir, err)
	}
	dt = re.WeightDType()
	re.Close()
	return out, dt, cleanup, nil
}

// reshard rewrites ck's tensors, unchanged, into shards of at most
// shardSize bytes in out, copying the other files beside them.
func reshard(ctx context.Context, ck *checkpoint.Checkpoint, out string, shardSize int64) error {
	var entries []checkpoint.Entry
	for _, name := range ck.Names() {
		t, _ := ck.Lookup(name)
		entries = append(entries, checkpoint.Entry{Name: name, DType: t.DType, Shape: t.Shape, Bytes: func() ([]byte, error) { return t.Data, nil }})
	}
	ents, err := os.ReadDir(ck.Dir())
	if err != nil {
		return fmt.Errorf("reshard %s: %w", ck.Dir(), err)
	}
	files := map[string][]byte{}
	for _, e := range ents {
		n := e.Name()
		if strings.HasSuffix(n, ".safetensors") || n == checkpoint.IndexFile || !pushable(n) {
			continue
		}
		p := filepath.Join(ck.Dir(), n)
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if files[n], err = os.ReadFile(p); err != nil {
			return fmt.Errorf("reshard %s: %w", ck.Dir(), err)
		}
	}
	if err := checkpoint.Write(ctx, out, entries, checkpoint.WriteOptions{ShardSize: shardSize, Files: files}); err != nil {
		return fmt.Errorf("reshard %s: %w", ck.Dir(), err)
	}
	return nil
}

// pushable reports whether a file in the checkpoint directory belongs in the
// revision: everything but hidden files and a manifest left from elsewhere.
func pushable(name string) bool {
	return !strings.HasPrefix(name, ".") && name != manifest.FileName
}

// hashDir lists and hashes, parallel files at a time, every regular file of
// dir (following symbolic links) that belongs in the revision. The result is
// sorted by name.
func hashDir(ctx context.Context, dir string, parallel int) ([]manifest.File, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		if !pushable(n) {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, n))
		if err != nil {
			return nil, fmt.Errorf("stat %s: %w", filepath.Join(dir, n), err)
		}
		if !fi.Mode().IsRegular() {
			slog.Debug("push: skipping a non-regular file", "path", filepath.Join(dir, n), "mode", fi.Mode())
			continue
		}
		if err := manifest.CheckName(n); err != nil {
			return nil, fmt.Errorf("file %s: %w", filepath.Join(dir, n), err)
		}
		names = append(names, n)
	}
	files := make([]manifest.File, len(names))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallel)
	for i, n := range names {
		g.Go(func() error {
			size, sum, err := hashFile(gctx, filepath.Join(dir, n))
			files[i] = manifest.File{Name: n, Size: size, SHA256: sum}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return files, nil
}

// hashFile returns a file's size and hex sha256, stopping when ctx is done.
func hashFile(ctx context.Context, path string) (int64, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	n, sum, err := manifest.Hash(ctx, f)
	if err != nil {
		return 0, "", fmt.Errorf("hash %s: %w", path, err)
	}
	return n, sum, nil
}

// readSpec converts dir's stoke.yaml, if any, to a JSON object.
func readSpec(dir string) (json.RawMessage, error) {
	raw, err := os.ReadFile(filepath.Join(dir, SpecFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", SpecFile, err)
	}
	var spec map[string]any
	if err := yaml.Unmarshal(raw, &spec); err != nil {
		return nil, fmt.Errorf("parse %s: %w", SpecFile, err)
	}
	if spec == nil {
		return nil, nil
	}
	out, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("convert %s to JSON: %w", SpecFile, err)
	}
	return out, nil
}

// readManifest returns dest's current manifest, or nil when there is none
// or it does not parse (a later commit replaces it).
func readManifest(ctx context.Context, dest bucket.Bucket) (*manifest.Manifest, error) {
	r, err := dest.ReadRange(ctx, manifest.FileName, 0, -1)
	if errors.Is(err, bucket.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the current manifest: %w", err)
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("read the current manifest: %w", err)
	}
	m, err := manifest.Parse(data)
	if err != nil {
		slog.Warn("push: ignoring an invalid manifest at the destination", "url", dest.URL()+"/"+manifest.FileName, "err", err)
		return nil, nil
	}
	return m, nil
}

// plan returns the indices of the files that must be uploaded: those the
// destination lacks or holds with another size, whose content its current
// manifest records differently, or which no manifest vouches for and whose
// bytes do not hash to the source's.
func plan(ctx context.Context, dest bucket.Bucket, files []manifest.File, prev *manifest.Manifest) ([]int, error) {
	recorded := map[string]string{}
	if prev != nil {
		for _, f := range prev.Files {
			recorded[f.Name] = f.SHA256
		}
	}
	var todo []int
	for i, f := range files {
		obj, err := dest.Stat(ctx, f.Name)
		switch {
		case errors.Is(err, bucket.ErrNotExist):
			todo = append(todo, i)
			continue
		case err != nil:
			return nil, err
		}
		if obj.Size != f.Size {
			todo = append(todo, i)
			continue
		}
		if sum, ok := recorded[f.Name]; ok {
			if sum != f.SHA256 {
				todo = append(todo, i)
			}
			continue
		}
		// Left by an interrupted push: trust it only once its bytes hash right.
		sum, err := remoteSHA256(ctx, dest, f.Name)
		if err != nil {
			return nil, err
		}
		if sum != f.SHA256 {
			todo = append(todo, i)
		}
	}
	// Largest first keeps the parallel uploads busy to the end.
	slices.SortStableFunc(todo, func(a, b int) int { return cmpDesc(files[a].Size, files[b].Size) })
	return todo, nil
}

// remoteSHA256 hashes an object as the destination holds it.
func remoteSHA256(ctx context.Context, dest bucket.Bucket, key string) (string, error) {
	r, err := dest.ReadRange(ctx, key, 0, -1)
	if err != nil {
		return "", fmt.Errorf("verify %s: %w", key, err)
	}
	defer r.Close()
	_, sum, err := manifest.Hash(ctx, r)
	if err != nil {
		return "", fmt.Errorf("verify %s: %w", key, err)
	}
	return sum, nil
}

func cmpDesc(a, b int64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// upload puts the files listed in todo, opts.Parallel at a time.
func upload(ctx context.Context, src string, dest bucket.Bucket, files []manifest.File, todo []int, opts Options) error {
	prog := newProgress(ctx, opts.Progress, files, todo)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(opts.Parallel)
	for _, i := range todo {
		f := files[i]
		g.Go(func() error {
			t := prog.start(f)
			err := putFile(gctx, filepath.Join(src, f.Name), dest, f, t)
			t.done(err)
			return err
		})
	}
	err := g.Wait()
	prog.wait(err == nil)
	return err
}

// putFile uploads one file, checking first that it still has the size it was
// hashed with.
func putFile(ctx context.Context, path string, dest bucket.Bucket, f manifest.File, t tracker) error {
	fh, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("upload %s: %w", f.Name, err)
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return fmt.Errorf("upload %s: %w", f.Name, err)
	}
	if fi.Size() != f.Size {
		return fmt.Errorf("upload %s: the file changed during the push (%d bytes, hashed %d)", f.Name, fi.Size(), f.Size)
	}
	r := &countingSection{SectionReader: io.NewSectionReader(fh, 0, f.Size), add: t.add}
	if err := dest.Put(ctx, f.Name, r, f.Size); err != nil {
		return fmt.Errorf("upload %s: %w", f.Name, err)
	}
	return nil
}

// countingSection reports the bytes read through it. It keeps ReadAt and
// Seek so that S3 multipart uploads can send parts in parallel and retry
// them.
type countingSection struct {
	*io.SectionReader
	add func(int64)
}

func (c *countingSection) Read(p []byte) (int, error) {
	n, err := c.SectionReader.Read(p)
	c.add(int64(n))
	return n, err
}

func (c *countingSection) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.SectionReader.ReadAt(p, off)
	c.add(int64(n))
	return n, err
}
