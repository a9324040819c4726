// Package watch turns uploads into a bucket into immutable model revisions
// in the state store.
//
// The bucket is opened at its root; every top-level prefix NAME/ is a model
// and the plain files directly under it (no deeper keys, no hidden names) are
// its checkpoint. Each pass of the Watcher lists the bucket once and handles
// every model in one of two ways:
//
//   - Committed: NAME/manifest.json exists (written last by `stoke push`, or
//     by the watcher itself) and no file is newer than it. The manifest's
//     revision is recorded as validating, then checked and moved to ready or
//     failed. A manifest that does not parse becomes a failed revision
//     whose digest is the sha256 of the manifest's bytes (it has no file
//     list to digest); delete it to let the prefix count as a plain upload.
//   - Plain upload (any S3 client, no manifest, or files newer than the
//     manifest, as after `aws s3 sync` over a pushed model): once
//     config.json and model.safetensors or model.safetensors.index.json are
//     present and no object of the prefix has changed (size, ETag,
//     LastModified) for the quiet period, every file is hashed and the
//     checkpoint checked. A valid one gets a manifest.json written by the
//     watcher and is recorded as ready; an invalid one (a shard the index
//     names is missing, a header that does not parse, …) is recorded as
//     failed under the digest of the files present, so that it is recorded
//     once, and waits for the upload to change.
//
// The checks read the metadata, not the tensors: every file listed exists
// with its listed size, config.json parses, the index parses and agrees with
// the shards' headers, every safetensors header parses (two ranged reads)
// and its tensors fill the object exactly, the manifest's dtype is the
// projection weights' dtype, config.json agrees with the tensors' shapes
// (checkpoint.CheckShapes: as many layers as present, embedding and every
// projection of the shape the config implies), and the tokenizer files
// build with the engine's loader, keep their token ids within vocab_size
// and carry a chat template that compiles (checkpoint.CheckTokenizer).
// Committed revisions are not re-hashed: the
// loader verifies the sha256 of every byte it reads, so hashing whole
// checkpoints here would double the reads for nothing.
//
// A LoRA adapter pushed under a model, BASE/adapters/NAME/ with its own
// manifest.json, is recorded as the revisions of BASE:NAME once committed
// (adapters count only when `stoke push` commits them): every listed file
// present with its size, adapter_config.json and the safetensors header
// fitting BASE's config.json (checkpoint.CheckAdapter).
//
// Quiet periods are measured from when this watcher first saw the prefix in
// its current form, so an upload that finished before the watcher started
// waits one quiet period. A multipart upload is invisible until it
// completes: a plain upload whose last shard takes longer than the quiet
// period to upload is recorded as failed (missing shard) and then, once the
// shard lands, as a new ready revision. `stoke push` does not have this
// race once its manifest is written, because a committed prefix is not
// judged by quiet time.
package watch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/manifest"
)

// Defaults of Options.
const (
	// DefaultInterval is the time between two passes of Run.
	DefaultInterval = 2 * time.Second
	// DefaultQuiet is how long a plain upload must stay unchanged before
	// the watcher commits it.
	DefaultQuiet = 10 * time.Second
	// DefaultParallel is how many objects are hashed or read at once.
	DefaultParallel = 4
)

// Options configure a Watcher. The zero value uses the defaults.
type Options struct {
	// Interval is the time between two passes of Run (DefaultInterval
	// when <= 0).
	Interval time.Duration
	// Quiet is how long every object of a plain upload must stay unchanged
	// before it is committed (DefaultQuiet when <= 0).
	Quiet time.Duration
	// Parallel is how many objects are hashed or read at once
	// (DefaultParallel when <= 0).
	Parallel int
	// Now is the clock quiet periods and manifests' creation times are
	// read from (time.Now when nil).
	Now func() time.Time
	// OnRevision, when set, is called with a revision each time this
	// watcher moves one to ready or failed, after the store has recorded
	// it. It runs on the scanning goroutine, inside the pass: hand long
	// work elsewhere, and do not call Scan from it.
	OnRevision func(store.Revision)
	// Logger receives the watcher's logs (slog.Default() when nil).
	Logger *slog.Logger
}

// Watcher records the revisions uploaded to one bucket. It is safe for
// concurrent use; passes run one at a time.
type Watcher struct {
	bucket bucket.Bucket
	store  *store.Store
	opts   Options
	log    *slog.Logger

	mu     sync.Mutex             // held for a whole pass
	models map[string]*modelState // guarded by mu
}

// modelState is what the watcher remembers about one prefix between passes.
type modelState struct {
	// settledManifest is the version of the manifest.json object last
	// brought to a final revision, "" when none.
	settledManifest string
	// fingerprint is the plain upload's objects as last seen, since when
	// it has been unchanged, and whether it has been committed or failed
	// already.
	fingerprint string
	since       time.Time
	settled     bool
	// pending is the manifest of a checked plain upload whose manifest.json
	// could not be written yet, kept to retry without hashing again.
	pending *manifest.Manifest
	// badName is set once an unusable prefix name has been logged.
	badName bool
}

// New returns a watcher recording the revisions of the models in b (opened
// at its root) into st.
func New(b bucket.Bucket, st *store.Store, opts Options) *Watcher {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Quiet <= 0 {
		opts.Quiet = DefaultQuiet
	}
	if opts.Parallel <= 0 {
		opts.Parallel = DefaultParallel
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("bucket", b.URL())
	return &Watcher{bucket: b, store: st, opts: opts, log: log, models: map[string]*modelState{}}
}

// Run scans the bucket every Interval until ctx is done, logging the
// failures of a pass and trying again on the next. It returns ctx's error.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.opts.Interval)
	defer t.Stop()
	for {
		if err := w.Scan(ctx); err != nil && ctx.Err() == nil {
			w.log.Warn("watch: scan failed; retrying next pass", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Scan makes one pass over the bucket. A checkpoint that fails its checks
// is not an error (it becomes a failed revision); the error reports what
// could not be done this pass (listing, reading, the store) and is retried
// on the next pass.
func (w *Watcher) Scan(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	objs, err := w.bucket.List(ctx, "")
	if err != nil {
		return fmt.Errorf("watch %s: %w", w.bucket.URL(), err)
	}
	groups := groupByModel(objs)
	for name := range w.models {
		if _, ok := groups[name]; !ok {
			delete(w.models, name)
		}
	}
	names := make([]string, 0, len(groups))
	for name := range groups {
		names = append(names, name)
	}
	slices.Sort(names)
	var errs []error
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		st := w.models[name]
		if st == nil {
			st = &modelState{}
			w.models[name] = st
		}
		if err := manifest.CheckName(name); err != nil {
			if !st.badName {
				w.log.Warn("watch: ignoring a prefix that is not a usable model name", "prefix", name, "err", err)
				st.badName = true
			}
			continue
		}
		if err := w.scanModel(ctx, name, groups[name], st); err != nil {
			errs = append(errs, fmt.Errorf("watch model %s at %s: %w", name, w.source(name), err))
		}
	}
	return errors.Join(errs...)
}

// groupByModel sorts the objects of a bucket listing by top-level prefix,
// keeping for each model the files directly under it by file name. Keys at
// the root, deeper keys and hidden files are not part of any checkpoint.
// The files directly under BASE/adapters/NAME/ make the group BASE:NAME,
// a LoRA adapter of BASE; a top-level prefix with a ':' is no model.
func groupByModel(objs []bucket.Object) map[string]map[string]bucket.Object {
	groups := map[string]map[string]bucket.Object{}
	for _, o := range objs {
		name, file, ok := strings.Cut(o.Key, "/")
		if !ok || strings.HasPrefix(name, ".") { // hidden prefixes are no models, on any bucket
			continue
		}
		if strings.Contains(name, engineapi.AdapterSeparator) {
			continue // BASE:NAME names an adapter: no model may be called so
		}
		if adapter, afile, ok := adapterKey(file); ok {
			name, file = engineapi.AdapterModel(name, adapter), afile
		}
		files := groups[name]
		if files == nil {
			files = map[string]bucket.Object{}
			groups[name] = files
		}
		if strings.Contains(file, "/") || strings.HasPrefix(file, ".") || manifest.CheckName(file) != nil {
			continue
		}
		files[file] = o
	}
	return groups
}

// scanModel handles one model's prefix, or one adapter's.
func (w *Watcher) scanModel(ctx context.Context, name string, files map[string]bucket.Object, st *modelState) error {
	man, ok := files[manifest.FileName]
	if ok && !stale(man, files) {
		st.fingerprint, st.settled, st.pending = "", false, nil
		return w.scanCommitted(ctx, name, man, files, st)
	}
	if _, _, adapter := engineapi.SplitAdapterModel(name); adapter {
		return nil // an adapter counts once `stoke push` commits it
	}
	return w.scanPlain(ctx, name, files, st)
}

// stale reports whether some file was written after the manifest, which
// therefore does not describe the prefix any more.
func stale(man bucket.Object, files map[string]bucket.Object) bool {
	for n, o := range files {
		if n != manifest.FileName && o.LastModified.After(man.LastModified) {
			return true
		}
	}
	return false
}

// version identifies one write of an object.
func version(o bucket.Object) string {
	return fmt.Sprintf("%d\x00%s\x00%d", o.Size, o.ETag, o.LastModified.UnixNano())
}

// scanCommitted records and checks the revision NAME/manifest.json
// describes, unless this exact manifest object has been settled already.
func (w *Watcher) scanCommitted(ctx context.Context, name string, man bucket.Object, files map[string]bucket.Object, st *modelState) error {
	ver := version(man)
	if st.settledManifest == ver {
		return nil
	}
	data, err := readSmall(ctx, w.bucket, man.Key, man.Size)
	if reason, err := split(err); reason != "" {
		// Too large to read, so there is no content to key a revision by.
		w.log.Warn("watch: ignoring an unreadable manifest", "model", name, "reason", reason)
		st.settledManifest = ver
		return nil
	} else if err != nil {
		return err
	}
	m, perr := manifest.Parse(data)
	if perr != nil {
		sum := sha256.Sum256(data)
		digest := manifest.RevisionPrefix + hex.EncodeToString(sum[:])
		reason := fmt.Sprintf("%s does not parse: %v", manifest.FileName, perr)
		err := w.record(ctx, store.Revision{Model: name, Digest: digest, Source: w.source(name)},
			func() (string, error) { return reason, nil })
		if err == nil {
			st.settledManifest = ver
		}
		return err
	}
	if m.Model != name {
		w.log.Warn("watch: manifest names another model; recording the revision under its prefix's name",
			"model", name, "manifest_model", m.Model, "revision", m.Revision)
	}
	err = w.record(ctx, store.Revision{Model: name, Digest: m.Revision, Source: w.source(name), Manifest: data},
		func() (string, error) {
			_, reason, err := w.check(ctx, name, m.Files, files, m.DType)
			return reason, err
		})
	if err == nil {
		st.settledManifest = ver
	}
	return err
}

// record makes sure rev is in the store and, unless it is final already,
// runs check and moves it to ready (check returns "") or failed (check
// returns the reason). An error from check leaves the revision validating,
// to be checked again on the next pass.
func (w *Watcher) record(ctx context.Context, rev store.Revision, check func() (reason string, err error)) error {
	cur, err := w.store.Revision(ctx, rev.Model, rev.Digest)
	switch {
	case err == nil && cur.State.Final():
		return nil
	case errors.Is(err, store.ErrNotFound):
		created, err := w.store.PutRevision(ctx, rev)
		if err != nil {
			return err
		}
		if created {
			w.log.Info("watch: new revision; validating", "model", rev.Model, "revision", rev.Digest)
		}
	case err != nil:
		return err
	}
	reason, err := check()
	if err != nil {
		return err
	}
	state := store.RevisionReady
	if reason != "" {
		state = store.RevisionFailed
	}
	err = w.store.SetRevisionState(ctx, rev.Model, rev.Digest, state, reason)
	if errors.Is(err, store.ErrIllegalTransition) {
		// Another watcher of the same store settled it first.
		w.log.Debug("watch: revision settled elsewhere", "model", rev.Model, "revision", rev.Digest)
		return nil
	}
	if err != nil {
		return err
	}
	final, err := w.store.Revision(ctx, rev.Model, rev.Digest)
	if err != nil {
		return err
	}
	if state == store.RevisionReady {
		w.log.Info("watch: revision ready", "model", rev.Model, "revision", rev.Digest)
	} else {
		w.log.Warn("watch: revision failed", "model", rev.Model, "revision", rev.Digest, "reason", reason)
	}
	if w.opts.OnRevision != nil {
		w.opts.OnRevision(final)
	}
	return nil
}

// source is the bucket URL of a model's prefix.
func (w *Watcher) source(name string) string { return w.bucket.URL() + "/" + prefixOf(name) }

// prefixOf is the key prefix of a model, or of an adapter BASE:NAME
// (BASE/adapters/NAME), in the bucket.
func prefixOf(name string) string {
	if base, adapter, ok := engineapi.SplitAdapterModel(name); ok {
		return base + "/" + manifest.AdaptersDir + "/" + adapter
	}
	return name
}

// adapterKey splits the key of a file under a model's prefix into the
// adapter it belongs to and its name there (adapters/NAME/FILE).
func adapterKey(key string) (adapter, file string, ok bool) {
	rest, ok := strings.CutPrefix(key, manifest.AdaptersDir+"/")
	if !ok {
		return "", "", false
	}
	adapter, file, ok = strings.Cut(rest, "/")
	if !ok || adapter == "" || strings.HasPrefix(adapter, ".") || manifest.CheckName(adapter) != nil ||
		strings.Contains(adapter, engineapi.AdapterSeparator) {
		return "", "", false
	}
	return adapter, file, true
}
