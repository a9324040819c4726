package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/watch"
)

func newWatchCmd() *cobra.Command {
	var (
		state           string
		interval, quiet time.Duration
		once            bool
		s3              *s3Flags
	)
	cmd := &cobra.Command{
		Use:   "watch s3://BUCKET|file:///DIR",
		Short: "Turn uploads in a bucket into immutable revisions in the state store",
		Long: `Watch polls a bucket whose top-level prefixes are models. A manifest.json
written by stoke push is validated and recorded as a revision; a plain upload
from any S3 client (config.json and every shard its index names, unchanged
for the quiet period) is hashed, given a manifest.json and recorded too.
Each revision that becomes ready or failed is printed as one JSON line.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			b, err := bucket.Open(ctx, args[0], s3.options())
			if err != nil {
				return err
			}
			if err := os.MkdirAll(filepath.Dir(state), 0o755); err != nil {
				return fmt.Errorf("--state: %w", err)
			}
			st, err := store.Open(ctx, state)
			if err != nil {
				return err
			}
			defer st.Close()
			enc := json.NewEncoder(cmd.OutOrStdout())
			w := watch.New(b, st, watch.Options{Interval: interval, Quiet: quiet, OnRevision: func(r store.Revision) {
				enc.Encode(revisionLine{Model: r.Model, Revision: r.Digest, State: string(r.State), Reason: r.Reason, Source: r.Source})
			}})
			if once {
				return w.Scan(ctx)
			}
			if err := w.Run(ctx); err != nil && ctx.Err() == nil {
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&state, "state", filepath.Join(".stoke", "state.db"), "the SQLite state store")
	f.DurationVar(&interval, "interval", watch.DefaultInterval, "time between two scans of the bucket")
	f.DurationVar(&quiet, "quiet", watch.DefaultQuiet, "how long a plain upload must stay unchanged before it becomes a revision")
	f.BoolVar(&once, "once", false, "scan once and exit")
	s3 = addS3Flags(f)
	return cmd
}

// revisionLine is one line `stoke watch` prints.
type revisionLine struct {
	Model    string `json:"model"`
	Revision string `json:"revision"`
	State    string `json:"state"`
	Reason   string `json:"reason,omitempty"`
	Source   string `json:"source"`
}
