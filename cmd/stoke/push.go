package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/stokehq/stoke/weightstore/bucket"
	"github.com/stokehq/stoke/weightstore/manifest"
	"github.com/stokehq/stoke/weightstore/push"
)

func newPushCmd() *cobra.Command {
	var (
		quantize, shardSize string
		parallel            int
		s3                  *s3Flags
	)
	cmd := &cobra.Command{
		Use:   "push DIR s3://BUCKET/NAME|file:///DIR/NAME",
		Short: "Validate a checkpoint or a LoRA adapter and upload it to a bucket as an immutable revision",
		Long: `Push validates the checkpoint in DIR, optionally quantises it to FP8 and
reshards it, uploads every file in parallel and writes manifest.json last,
as the commit point. The model's name is the destination's last path
element. Pushing identical content again uploads nothing. S3 settings come
from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
AWS_REGION; --endpoint, --region and --path-style override them. The new
revision's digest is printed on standard output.

A PEFT LoRA adapter (a directory with adapter_config.json and
adapter_model.safetensors) goes under its base model, which must be pushed
first: stoke push ADAPTER_DIR s3://BUCKET/BASE/adapters/NAME. It is checked
against the base's config before anything is uploaded and served as the
model BASE:NAME.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, dest := args[0], args[1]
			var opts push.Options
			switch strings.ToLower(quantize) {
			case "":
			case "fp8":
				opts.Quantize = true
			default:
				return fmt.Errorf("--quantize: unsupported format %q (want fp8)", quantize)
			}
			var err error
			if opts.ShardSize, err = parseSize(shardSize); err != nil {
				return fmt.Errorf("--shard-size: %w", err)
			}
			if parallel < 1 {
				return fmt.Errorf("--parallel must be at least 1, got %d", parallel)
			}
			opts.Parallel = parallel
			if _, err := push.ModelName(dest); err != nil {
				return err
			}
			if push.IsAdapter(dir) {
				baseURL, _, ok := push.AdapterBase(dest)
				if !ok {
					return fmt.Errorf("%s holds a LoRA adapter: push it under its base model, to …/BASE/%s/NAME", dir, manifest.AdaptersDir)
				}
				var err error
				if opts.Base, err = bucket.Open(cmd.Context(), baseURL, s3.options()); err != nil {
					return fmt.Errorf("the adapter's base model: %w", err)
				}
				if scheme, _, path, _ := bucket.SplitURL(dest); scheme == "file" {
					// A file bucket's parent must exist: the base's adapters folder.
					if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
						return err
					}
				}
			}
			b, err := bucket.Open(cmd.Context(), dest, s3.options())
			if err != nil {
				return err
			}
			opts.Progress = cmd.ErrOrStderr()
			start := time.Now()
			m, err := push.Push(cmd.Context(), dir, b, opts)
			if err != nil {
				return err
			}
			slog.Info("pushed", "model", m.Model, "dest", b.URL(), "files", len(m.Files),
				"size", humanize.IBytes(uint64(m.TotalBytes)), "dtype", m.DType, "elapsed", time.Since(start).Round(time.Millisecond))
			fmt.Fprintln(cmd.OutOrStdout(), m.Revision)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&quantize, "quantize", "", "quantise before pushing: fp8 (E4M3, 128×128 block scales)")
	f.StringVar(&shardSize, "shard-size", "0", "reshard into files of at most this size, e.g. 512MiB (0 = keep the layout)")
	f.IntVar(&parallel, "parallel", push.DefaultParallel, "files uploaded at once")
	s3 = addS3Flags(f)
	return cmd
}
