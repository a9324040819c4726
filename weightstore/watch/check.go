package watch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/internal/dtype"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/safetensors"
)

// maxSmallFile bounds the JSON and YAML files read whole (manifest, config,
// index, spec).
const maxSmallFile = 64 << 20

// invalidError is a finding of a check: the checkpoint is broken, as opposed
// to the bucket or store failing to answer.
type invalidError struct{ reason string }

func (e *invalidError) Error() string { return e.reason }

// invalidf returns an invalidError with a formatted reason.
func invalidf(format string, args ...any) error {
	return &invalidError{reason: fmt.Sprintf(format, args...)}
}

// split separates a check's findings from failures to check: it returns the
// reason of an invalidError and passes any other error on.
func split(err error) (reason string, _ error) {
	var inv *invalidError
	if errors.As(err, &inv) {
		return inv.reason, nil
	}
	return "", err
}

// check checks the checkpoint made of the listed files of model name
// against the objects present, as described in the package comment. It
// returns the projection weights' dtype, and a reason when the checkpoint
// is broken; wantDType, when set, is the dtype the manifest claims.
func (w *Watcher) check(ctx context.Context, name string, listed []manifest.File, objs map[string]bucket.Object, wantDType string) (dtype.DType, string, error) {
	sizes := make(map[string]int64, len(listed))
	for _, f := range listed {
		o, ok := objs[f.Name]
		switch {
		case !ok:
			return dtype.Invalid, fmt.Sprintf("file %s listed in %s is missing", f.Name, manifest.FileName), nil
		case o.Size != f.Size:
			return dtype.Invalid, fmt.Sprintf("file %s is %d bytes but %s lists %d", f.Name, o.Size, manifest.FileName, f.Size), nil
		}
		sizes[f.Name] = f.Size
	}
	check := w.checkCheckpoint
	if _, _, ok := engineapi.SplitAdapterModel(name); ok {
		check = w.checkAdapter
	}
	dt, err := check(ctx, name, sizes)
	if err != nil {
		reason, err := split(err)
		return dtype.Invalid, reason, err
	}
	if wantDType != "" && dt.String() != wantDType {
		return dt, fmt.Sprintf("%s says dtype %s but the projection weights are %s", manifest.FileName, wantDType, dt), nil
	}
	return dt, "", nil
}

// checkCheckpoint checks the structure of the checkpoint made of the given
// files (name to size) of model name and returns its projection weights'
// dtype. Findings are invalidErrors.
func (w *Watcher) checkCheckpoint(ctx context.Context, name string, sizes map[string]int64) (dtype.DType, error) {
	key := func(file string) string { return prefixOf(name) + "/" + file }
	size, ok := sizes[checkpoint.ConfigFile]
	if !ok {
		return dtype.Invalid, invalidf("%s is missing", checkpoint.ConfigFile)
	}
	raw, err := readSmall(ctx, w.bucket, key(checkpoint.ConfigFile), size)
	if err != nil {
		return dtype.Invalid, err
	}
	cfg, err := model.ParseConfig(raw)
	if err != nil {
		return dtype.Invalid, invalidf("%s: %v", checkpoint.ConfigFile, err)
	}

	var idx *checkpoint.Index
	if size, ok := sizes[checkpoint.IndexFile]; ok {
		if idx, err = w.readIndex(ctx, key(checkpoint.IndexFile), size); err != nil {
			return dtype.Invalid, err
		}
		for _, shard := range idx.Shards() {
			if err := manifest.CheckName(shard); err != nil {
				return dtype.Invalid, invalidf("%s names shard %q outside the model's prefix", checkpoint.IndexFile, shard)
			}
			if _, ok := sizes[shard]; !ok {
				return dtype.Invalid, invalidf("shard %s named in %s is missing", shard, checkpoint.IndexFile)
			}
		}
	} else if _, ok := sizes[checkpoint.SingleFile]; !ok {
		return dtype.Invalid, invalidf("neither %s nor %s is present", checkpoint.SingleFile, checkpoint.IndexFile)
	}

	var shards []string
	for f := range sizes {
		if strings.HasSuffix(f, ".safetensors") {
			shards = append(shards, f)
		}
	}
	slices.Sort(shards)
	headers, err := w.readHeaders(ctx, name, shards, sizes)
	if err != nil {
		return dtype.Invalid, err
	}
	if idx != nil {
		if err := checkIndex(idx, headers); err != nil {
			return dtype.Invalid, err
		}
	} else {
		// Without an index only model.safetensors is loaded.
		headers = map[string]*safetensors.Header{checkpoint.SingleFile: headers[checkpoint.SingleFile]}
	}
	loaded := slices.Collect(maps.Values(headers))
	dt := checkpoint.WeightDType(loaded...)
	if dt == dtype.Invalid {
		return dtype.Invalid, invalidf("the safetensors files hold no tensors")
	}
	if err := checkpoint.CheckShapes(&cfg, loaded...); err != nil {
		return dtype.Invalid, invalidf("%v", err)
	}
	if err := w.checkTokenizer(ctx, name, &cfg, sizes); err != nil {
		return dtype.Invalid, err
	}
	return dt, nil
}

// checkAdapter checks the adapter made of the given files of BASE:NAME
// against its base model's config.json and returns its dtype. Findings
// are invalidErrors.
func (w *Watcher) checkAdapter(ctx context.Context, name string, sizes map[string]int64) (dtype.DType, error) {
	base, _, _ := engineapi.SplitAdapterModel(name)
	for _, f := range []string{checkpoint.AdapterConfigFile, checkpoint.AdapterWeightsFile} {
		if _, ok := sizes[f]; !ok {
			return dtype.Invalid, invalidf("%s is missing", f)
		}
	}
	acfg, err := readSmall(ctx, w.bucket, prefixOf(name)+"/"+checkpoint.AdapterConfigFile, sizes[checkpoint.AdapterConfigFile])
	if err != nil {
		return dtype.Invalid, err
	}
	baseKey := base + "/" + checkpoint.ConfigFile
	o, err := w.bucket.Stat(ctx, baseKey)
	if errors.Is(err, bucket.ErrNotExist) {
		return dtype.Invalid, invalidf("the base model %s has no %s", base, checkpoint.ConfigFile)
	} else if err != nil {
		return dtype.Invalid, err
	}
	bcfg, err := readSmall(ctx, w.bucket, baseKey, o.Size)
	if err != nil {
		return dtype.Invalid, err
	}
	headers, err := w.readHeaders(ctx, name, []string{checkpoint.AdapterWeightsFile}, sizes)
	if err != nil {
		return dtype.Invalid, err
	}
	dt, err := checkpoint.CheckAdapter(bcfg, acfg, headers[checkpoint.AdapterWeightsFile])
	if err != nil {
		return dtype.Invalid, invalidf("%v", err)
	}
	return dt, nil
}

// tokenizerFiles are the small files the engine builds its tokenizer from.
var tokenizerFiles = []string{checkpoint.TokenizerFile, checkpoint.TokenizerConfig, checkpoint.ChatTemplateFile}

// checkTokenizer reads the tokenizer files present and checks them with
// the engine's loader against the config (checkpoint.CheckTokenizer).
// Findings are invalidErrors.
func (w *Watcher) checkTokenizer(ctx context.Context, name string, cfg *model.Config, sizes map[string]int64) error {
	files := map[string][]byte{}
	for _, f := range tokenizerFiles {
		size, ok := sizes[f]
		if !ok {
			continue
		}
		raw, err := readSmall(ctx, w.bucket, name+"/"+f, size)
		if err != nil {
			return err
		}
		files[f] = raw
	}
	if err := checkpoint.CheckTokenizer(cfg, files); err != nil {
		return invalidf("tokenizer: %v", err)
	}
	return nil
}

// readIndex reads and parses model.safetensors.index.json.
func (w *Watcher) readIndex(ctx context.Context, key string, size int64) (*checkpoint.Index, error) {
	raw, err := readSmall(ctx, w.bucket, key, size)
	if err != nil {
		return nil, err
	}
	var idx checkpoint.Index
	if err := json.Unmarshal(raw, &idx); err != nil {
		return nil, invalidf("%s: %v", checkpoint.IndexFile, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, invalidf("%s has an empty weight_map", checkpoint.IndexFile)
	}
	return &idx, nil
}

// readHeaders reads and checks the header of every shard, Parallel at a
// time, each with two ranged reads. A header that does not parse, or whose
// tensors do not fill the object exactly, is a finding naming the first such
// shard in name order.
func (w *Watcher) readHeaders(ctx context.Context, name string, shards []string, sizes map[string]int64) (map[string]*safetensors.Header, error) {
	headers := make([]*safetensors.Header, len(shards))
	reasons := make([]string, len(shards))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(w.opts.Parallel)
	for i, shard := range shards {
		g.Go(func() error {
			r := &rangeReaderAt{ctx: gctx, b: w.bucket, key: prefixOf(name) + "/" + shard}
			h, err := safetensors.ReadHeader(r, sizes[shard])
			switch {
			case errors.Is(err, safetensors.ErrInvalidHeader):
				reasons[i] = fmt.Sprintf("%s: %v", shard, err)
			case err != nil:
				return fmt.Errorf("read the header of %s: %w", r.key, err)
			}
			headers[i] = h
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	out := make(map[string]*safetensors.Header, len(shards))
	for i, shard := range shards {
		if reasons[i] != "" {
			return nil, invalidf("%s", reasons[i])
		}
		out[shard] = headers[i]
	}
	return out, nil
}

// checkIndex checks that the index and the shards' headers agree on where
// every tensor is.
func checkIndex(idx *checkpoint.Index, headers map[string]*safetensors.Header) error {
	tensors := make([]string, 0, len(idx.WeightMap))
	for t := range idx.WeightMap {
		tensors = append(tensors, t)
	}
	slices.Sort(tensors)
	for _, t := range tensors {
		shard := idx.WeightMap[t]
		if _, ok := headers[shard].Lookup(t); !ok {
			return invalidf("%s maps tensor %s to %s, which does not hold it", checkpoint.IndexFile, t, shard)
		}
	}
	for _, shard := range idx.Shards() {
		for _, t := range headers[shard].Tensors {
			if idx.WeightMap[t.Name] != shard {
				return invalidf("tensor %s in %s is not mapped to it by %s", t.Name, shard, checkpoint.IndexFile)
			}
		}
	}
	return nil
}

// readSmall reads a whole object of the listed size, refusing one larger
// than maxSmallFile. An object shorter than listed has changed since the
// listing: that is an error to retry, not a finding.
func readSmall(ctx context.Context, b bucket.Bucket, key string, size int64) ([]byte, error) {
	file := key[strings.LastIndexByte(key, '/')+1:]
	if size > maxSmallFile {
		return nil, invalidf("%s is %d bytes, more than the %d a metadata file may have", file, size, maxSmallFile)
	}
	r, err := b.ReadRange(ctx, key, 0, -1)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, maxSmallFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	if int64(len(data)) != size {
		return nil, fmt.Errorf("read %s: %d bytes, listed as %d: it changed meanwhile", key, len(data), size)
	}
	return data, nil
}

// rangeReaderAt reads an object through one ranged GET per ReadAt.
type rangeReaderAt struct {
	ctx context.Context
	b   bucket.Bucket
	key string
}

func (r *rangeReaderAt) ReadAt(p []byte, off int64) (int, error) {
	rc, err := r.b.ReadRange(r.ctx, r.key, off, int64(len(p)))
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	n, err := io.ReadFull(rc, p)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = io.EOF
	}
	return n, err
}
