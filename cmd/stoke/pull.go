package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/stokehq/stoke/engine/device"
	"github.com/stokehq/stoke/internal/tier"
	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/loader"
	"github.com/stokehq/stoke/weightstore/push"
)

func newPullCmd() *cobra.Command {
	var (
		revision, chunk string
		parallel        int
		asJSON          bool
		cache           cacheFlags
		s3              *s3Flags
	)
	cmd := &cobra.Command{
		Use:   "pull s3://BUCKET/NAME|file:///DIR/NAME",
		Short: "Stream a pushed revision into memory through the node cache, verifying it",
		Long: `Pull loads a revision the way an engine does: from the node cache when it
holds the revision (tier t2), otherwise from the bucket with parallel ranged
reads, verifying every byte against manifest.json and teeing it into the
cache (tier t3). Run it to warm a node's cache before engines need the
model, or to measure load speed; it prints the tier and the rate.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := push.ModelName(args[0])
			if err != nil {
				return err
			}
			chunkSize, err := sizeFlag("chunk-size", chunk, 1, 1<<30)
			if err != nil {
				return err
			}
			root := strings.TrimSuffix(strings.TrimSuffix(args[0], "/"), name)
			b, err := bucket.Open(cmd.Context(), root, s3.options())
			if err != nil {
				return err
			}
			c, closeCache, err := cache.open(cmd.Context())
			if err != nil {
				return err
			}
			defer closeCache()
			start := time.Now()
			res, err := loader.LoadRevision(cmd.Context(), device.NewCPU(), c, loader.Request{Bucket: b, Model: name, Revision: revision},
				loader.Options{Parallel: parallel, ChunkSize: int(chunkSize)})
			if err != nil {
				return err
			}
			defer res.Free()
			if err := res.WaitCache(cmd.Context()); err != nil {
				return err
			}
			cacheCommit := time.Since(start) - res.Elapsed
			stream := res.Elapsed - res.Alloc
			out := pullReport{Model: name, Revision: res.Manifest.Revision, Tier: res.Tier, Bytes: res.Manifest.TotalBytes,
				FromBucket: res.FromBucket, FromCache: res.FromCache, Seconds: res.Elapsed.Seconds(), AllocSeconds: res.Alloc.Seconds(),
				CacheCommitSeconds: cacheCommit.Seconds(), GBps: float64(res.Manifest.TotalBytes) / stream.Seconds() / 1e9}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			slog.Info("pulled", "model", name, "revision", out.Revision, "tier", out.Tier, "size", humanize.IBytes(uint64(out.Bytes)),
				"seconds", fmt.Sprintf("%.3f", out.Seconds), "alloc_seconds", fmt.Sprintf("%.3f", out.AllocSeconds), "cache_commit_seconds", fmt.Sprintf("%.3f", out.CacheCommitSeconds), "GB/s", fmt.Sprintf("%.2f", out.GBps))
			fmt.Fprintln(cmd.OutOrStdout(), out.Revision)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&revision, "revision", "", "revision digest to pull (default: the bucket's current one)")
	f.IntVar(&parallel, "parallel", 8, "concurrent ranged reads")
	f.StringVar(&chunk, "chunk-size", "4MiB", "size of one ranged read")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	cache.add(f)
	s3 = addS3Flags(f)
	return cmd
}

// pullReport is what `stoke pull --json` prints. GBps is the streaming
// rate, device allocation excluded.
type pullReport struct {
	Model        string    `json:"model"`
	Revision     string    `json:"revision"`
	Tier         tier.Tier `json:"tier"`
	Bytes        int64     `json:"bytes"`
	FromBucket   int64     `json:"from_bucket"`
	FromCache    int64     `json:"from_cache"`
	Seconds      float64   `json:"seconds"`
	AllocSeconds float64   `json:"alloc_seconds"`
	// CacheCommitSeconds is how long committing to the node cache took
	// after the load (engines serve meanwhile).
	CacheCommitSeconds float64 `json:"cache_commit_seconds"`
	GBps               float64 `json:"gbps"`
}
