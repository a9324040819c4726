package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/scaler/rollout"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/loader"
	"github.com/stokehq/stoke/weightstore/manifest"
)

// revisionFiles reads a file of a recorded revision from the bucket, for
// the rollouts' eval sets (reconcile.Options.ReadFile).
func revisionFiles(b bucket.Bucket, st *store.Store) func(ctx context.Context, model, revision, name string) ([]byte, error) {
	return func(ctx context.Context, model, revision, name string) ([]byte, error) {
		r, err := st.Revision(ctx, model, revision)
		if err != nil {
			return nil, err
		}
		m, err := manifest.Parse(r.Manifest)
		if err != nil {
			return nil, fmt.Errorf("revision %s of %s: %w", revision, model, err)
		}
		return loader.ReadFile(ctx, b, m, name, rollout.MaxSetBytes)
	}
}

// evalOn answers an eval's completions request on one revision of a
// deployment through the activator (reconcile.Options.Evaluate).
func evalOn(act *activator.Activator) func(ctx context.Context, deployment, revision string, body []byte) (int, []byte, error) {
	return func(ctx context.Context, deployment, revision string, body []byte) (int, []byte, error) {
		var req map[string]any
		if err := json.Unmarshal(body, &req); err != nil {
			return 0, nil, fmt.Errorf("eval request: %w", err)
		}
		req["model"] = deployment + activator.RevisionSep + revision
		pinned, err := json.Marshal(req)
		if err != nil {
			return 0, nil, err
		}
		return act.Do(ctx, activator.PriorityInteractive, "/v1/completions", pinned)
	}
}
