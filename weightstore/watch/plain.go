package watch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"
	"gopkg.in/yaml.v3"

	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/manifest"
)

// SpecFile is the optional deployment spec beside a checkpoint, recorded in
// the manifest as JSON (as `stoke push` does).
const SpecFile = "stoke.yaml"

// errChanged reports an upload that changed while it was being committed.
var errChanged = errors.New("the upload changed while it was being committed")

// scanPlain handles a prefix without a manifest that vouches for it: it
// waits for the upload to be complete and quiet, then commits it.
func (w *Watcher) scanPlain(ctx context.Context, name string, files map[string]bucket.Object, st *modelState) error {
	fp := fingerprint(files)
	now := w.opts.Now()
	if fp != st.fingerprint {
		if st.fingerprint == "" {
			w.log.Debug("watch: upload seen", "model", name, "objects", len(files))
		}
		st.fingerprint, st.since, st.settled, st.pending = fp, now, false, nil
	}
	if st.settled {
		return nil
	}
	_, hasConfig := files[checkpoint.ConfigFile]
	_, hasSingle := files[checkpoint.SingleFile]
	_, hasIndex := files[checkpoint.IndexFile]
	if !hasConfig || !hasSingle && !hasIndex {
		return nil // not a checkpoint yet
	}
	if now.Sub(st.since) < w.opts.Quiet {
		return nil
	}
	if st.pending == nil {
		m, reason, err := w.inspect(ctx, name, files)
		if errors.Is(err, errChanged) {
			w.log.Debug("watch: upload changed while being committed; waiting for it to settle", "model", name)
			st.fingerprint = ""
			return nil
		}
		if err != nil {
			return err
		}
		if reason != "" {
			raw, err := json.Marshal(m)
			if err != nil {
				return fmt.Errorf("encode the file list: %w", err)
			}
			err = w.record(ctx, store.Revision{Model: name, Digest: m.Revision, Source: w.source(name), Manifest: raw},
				func() (string, error) { return reason, nil })
			if err == nil {
				st.settled = true
			}
			return err
		}
		st.pending = m
	}
	return w.commit(ctx, name, st)
}

// fingerprint identifies the current form of an upload: every object but the
// manifest, with its size, ETag and modification time.
func fingerprint(files map[string]bucket.Object) string {
	names := make([]string, 0, len(files))
	for n := range files {
		if n != manifest.FileName {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "%s\x00%s\n", n, version(files[n]))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// inspect checks and hashes a quiet plain upload and returns its manifest,
// with a reason when the checkpoint is broken (the manifest then lists the
// files present and may lack a dtype). It fails with errChanged when the
// objects changed meanwhile.
func (w *Watcher) inspect(ctx context.Context, name string, files map[string]bucket.Object) (*manifest.Manifest, string, error) {
	var listed []manifest.File
	for n, o := range files {
		if n != manifest.FileName {
			listed = append(listed, manifest.File{Name: n, Size: o.Size})
		}
	}
	slices.SortFunc(listed, func(a, b manifest.File) int { return strings.Compare(a.Name, b.Name) })
	dt, reason, err := w.check(ctx, name, listed, files, "")
	if err != nil {
		return nil, "", err
	}
	if err := w.hashAll(ctx, name, listed); err != nil {
		return nil, "", err
	}
	// The hashes are of this form of the upload only if it still has it.
	now, err := w.bucket.List(ctx, name+"/")
	if err != nil {
		return nil, "", err
	}
	if fingerprint(groupByModel(now)[name]) != fingerprint(files) {
		return nil, "", errChanged
	}
	m := &manifest.Manifest{Model: name, Revision: manifest.Revision(listed), Files: listed, CreatedAt: w.opts.Now().UTC()}
	for _, f := range listed {
		m.TotalBytes += f.Size
	}
	if dt != dtype.Invalid {
		m.DType = dt.String()
	}
	if reason != "" {
		return m, reason, nil
	}
	if o, ok := files[SpecFile]; ok {
		raw, err := readSmall(ctx, w.bucket, o.Key, o.Size)
		if err != nil {
			reason, err := split(err)
			return m, reason, err
		}
		if m.Spec, err = specJSON(raw); err != nil {
			return m, fmt.Sprintf("%s: %v", SpecFile, err), nil
		}
	}
	if err := m.Validate(); err != nil {
		return m, fmt.Sprintf("the checkpoint makes an invalid %s: %v", manifest.FileName, err), nil
	}
	return m, "", nil
}

// hashAll fills in the sha256 of every file, Parallel at a time, streaming
// each object once.
func (w *Watcher) hashAll(ctx context.Context, name string, files []manifest.File) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(w.opts.Parallel)
	for i := range files {
		g.Go(func() error {
			sum, err := w.hash(gctx, name+"/"+files[i].Name, files[i].Size)
			files[i].SHA256 = sum
			return err
		})
	}
	return g.Wait()
}

// hash streams one object of the listed size through sha256.
func (w *Watcher) hash(ctx context.Context, key string, size int64) (string, error) {
	r, err := w.bucket.ReadRange(ctx, key, 0, -1)
	if errors.Is(err, bucket.ErrNotExist) {
		return "", errChanged
	}
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", key, err)
	}
	defer r.Close()
	n, sum, err := manifest.Hash(ctx, r)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", key, err)
	}
	if n != size {
		return "", errChanged
	}
	return sum, nil
}

// commit writes the checked upload's manifest.json, the commit point, and
// records its revision as ready.
func (w *Watcher) commit(ctx context.Context, name string, st *modelState) error {
	m := st.pending
	data, err := m.Marshal()
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if err := w.bucket.Put(ctx, name+"/"+manifest.FileName, bytes.NewReader(data), int64(len(data))); err != nil {
		return fmt.Errorf("commit: write %s: %w", manifest.FileName, err)
	}
	w.log.Info("watch: plain upload committed", "model", name, "revision", m.Revision, "files", len(m.Files), "bytes", m.TotalBytes)
	err = w.record(ctx, store.Revision{Model: name, Digest: m.Revision, Source: w.source(name), Manifest: data},
		func() (string, error) { return "", nil })
	if err != nil {
		return err
	}
	st.settled, st.pending = true, nil
	return nil
}

// specJSON converts a stoke.yaml document to a JSON object (nil when the
// document is empty).
func specJSON(raw []byte) (json.RawMessage, error) {
	var spec map[string]any
	if err := yaml.Unmarshal(raw, &spec); err != nil {
		return nil, err
	}
	if spec == nil {
		return nil, nil
	}
	return json.Marshal(spec)
}
