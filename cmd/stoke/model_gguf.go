package main

import (
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/stokehq/stoke/weightstore/gguf"
)

// newExportGGUFCmd is `stoke model export-gguf`.
func newExportGGUFCmd() *cobra.Command {
	var opts gguf.ExportOptions
	cmd := &cobra.Command{
		Use:   "export-gguf SRC_DIR OUT.gguf",
		Short: "Write a Llama checkpoint as a llama.cpp GGUF file (Q8_0 weights by default)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			start := time.Now()
			if err := gguf.Export(cmd.Context(), args[0], args[1], opts); err != nil {
				return err
			}
			slog.Info("wrote GGUF", "file", args[1], "weights", opts.Weights, "elapsed", time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Weights, "type", "q8_0", "type of the 2-D weights: q8_0, f16 or f32")
	f.StringVar(&opts.Name, "name", "", "general.name (default: the source directory's name)")
	f.BoolVar(&opts.KeepHFRoPELayout, "keep-hf-rope-layout", false, "do not permute q/k rows for llama.cpp's RoPE (gives a wrong model; for checks only)")
	f.MarkHidden("keep-hf-rope-layout")
	return cmd
}
