package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/stokehq/stoke/weightstore/checkpoint"
	"github.com/stokehq/stoke/weightstore/synth"
)

func newModelCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "model", Short: "Create and convert model checkpoints"}
	cmd.AddCommand(newSynthCmd(), newSynthAdapterCmd(), newQuantizeCmd(), newExportGGUFCmd())
	return cmd
}

func newSynthCmd() *cobra.Command {
	var (
		preset, out, dt, shardSize string
		seed                       uint64
	)
	cmd := &cobra.Command{
		Use:   "synth --preset tiny|small|100m|1b --out DIR",
		Short: "Write a synthetic Llama checkpoint with random weights",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := synth.ParseDType(dt)
			if err != nil {
				return err
			}
			shard, err := parseSize(shardSize)
			if err != nil {
				return fmt.Errorf("--shard-size: %w", err)
			}
			start := time.Now()
			if err := synth.Write(cmd.Context(), out, synth.Options{Preset: preset, DType: d, ShardSize: shard, Seed: seed}); err != nil {
				return err
			}
			slog.Info("wrote synthetic checkpoint", "dir", out, "preset", preset, "dtype", d, "elapsed", time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&preset, "preset", "tiny", "model shape: tiny, small, 100m or 1b")
	f.StringVar(&out, "out", "", "directory to create")
	f.StringVar(&dt, "dtype", "f32", "weight dtype: f32, bf16 or fp8")
	f.StringVar(&shardSize, "shard-size", "0", "largest shard, e.g. 512MiB (0 = one file)")
	f.Uint64Var(&seed, "seed", 0, "random seed")
	cmd.MarkFlagRequired("out")
	return cmd
}

func newSynthAdapterCmd() *cobra.Command {
	var (
		base, out string
		rank      int
		modules   []string
		seed      uint64
	)
	cmd := &cobra.Command{
		Use:   "synth-adapter --base DIR --out DIR",
		Short: "Write a PEFT LoRA adapter with random weights for a checkpoint",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if rank < 1 {
				return fmt.Errorf("--rank must be positive, got %d", rank)
			}
			ck, err := checkpoint.Open(base)
			if err != nil {
				return fmt.Errorf("--base: %w", err)
			}
			cfg := ck.Config()
			ck.Close()
			if err := synth.WriteAdapter(out, cfg, synth.AdapterOptions{Rank: rank, TargetModules: modules, Seed: seed}); err != nil {
				return err
			}
			slog.Info("wrote synthetic adapter", "dir", out, "base", base, "rank", rank)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&base, "base", "", "the checkpoint the adapter applies to")
	f.StringVar(&out, "out", "", "directory to create")
	f.IntVar(&rank, "rank", 8, "LoRA rank (r)")
	f.StringSliceVar(&modules, "target-modules", []string{"q_proj", "v_proj"}, "projections it changes (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)")
	f.Uint64Var(&seed, "seed", 0, "random seed")
	cmd.MarkFlagRequired("base")
	cmd.MarkFlagRequired("out")
	return cmd
}

func newQuantizeCmd() *cobra.Command {
	var (
		in, out, shardSize string
		block              int
	)
	cmd := &cobra.Command{
		Use:   "quantize --in DIR --out DIR",
		Short: "Write an FP8 (E4M3, block-scaled) copy of a checkpoint",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			shard, err := parseSize(shardSize)
			if err != nil {
				return fmt.Errorf("--shard-size: %w", err)
			}
			if block <= 0 {
				return fmt.Errorf("--block must be positive, got %d", block)
			}
			start := time.Now()
			if err := checkpoint.Quantize(cmd.Context(), in, out, checkpoint.QuantizeOptions{Block: block, ShardSize: shard}); err != nil {
				return err
			}
			slog.Info("wrote FP8 checkpoint", "dir", out, "block", block, "elapsed", time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&in, "in", "", "checkpoint directory to read")
	f.StringVar(&out, "out", "", "directory to create")
	f.IntVar(&block, "block", checkpoint.DefaultBlock, "FP8 scale block size (rows and columns)")
	f.StringVar(&shardSize, "shard-size", "512MiB", "largest shard (0 = one file)")
	cmd.MarkFlagRequired("in")
	cmd.MarkFlagRequired("out")
	return cmd
}

// sizeFlag parses the size flag called name, refusing values outside
// [lo, hi] with one line naming the flag.
func sizeFlag(name, value string, lo, hi int64) (int64, error) {
	n, err := parseSize(value)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("--%s: %q is not a size from %s to %s", name, value, humanize.IBytes(uint64(lo)), humanize.IBytes(uint64(hi)))
	}
	return n, nil
}

// maxSize bounds size flags that have no bound of their own.
const maxSize = 1 << 50

func parseSize(s string) (int64, error) {
	if s == "" || s == "0" {
		return 0, nil
	}
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return 0, err
	}
	return int64(n), nil
}
