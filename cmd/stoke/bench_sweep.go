package main

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/vbauerster/cupwriter"
	"github.com/vbauerster/mpb/v8"

	"github.com/stokehq/stoke/bench/load"
)

// runBenchSweep is `stoke bench load --sweep …`: a load a point, the
// table, and the files in --out.
func runBenchSweep(cmd *cobra.Command, fl *benchLoadFlags, slo load.SLO) error {
	param, values, err := load.ParseSweep(fl.sweep)
	if err != nil {
		return fmt.Errorf("--sweep: %w", err)
	}
	dir := fl.out
	if dir == "" {
		dir = "sweep-" + time.Now().Format("20060102-150405")
	}
	so := load.SweepOptions{Load: fl.o, Param: param, Values: values, Pause: fl.pause, SLO: slo,
		Command: commandLine(cmd)}
	var bars *mpb.Progress
	if w := cmd.ErrOrStderr(); !fl.asJSON && cupwriter.New(w, false).IsTerminal() {
		bars = mpb.New(mpb.WithOutput(w))
		so.Point = func(i int, o *load.Options) func() {
			return addLiveBar(bars, o, fmt.Sprintf("%s=%-6g ", param, values[i]))
		}
	}
	s, runErr := load.RunSweep(cmd.Context(), so)
	if bars != nil {
		bars.Wait()
	}
	if runErr != nil && len(s.Points) == 0 {
		return runErr
	}
	if err := load.WriteSweepFiles(dir, s); err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if fl.asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(s); err != nil {
			return err
		}
	} else {
		writeSweepReport(out, s, dir)
	}
	if runErr != nil {
		return fmt.Errorf("%w (the %d points done are in %s)", runErr, len(s.Points), dir)
	}
	return nil
}

// writeSweepReport prints the sweep's table, its findings and where its
// files are.
func writeSweepReport(w io.Writer, s load.Sweep, dir string) {
	fmt.Fprintf(w, "sweep of %s: %s, %s in, %s out, SLO %s\n", s.URL, s.Param, s.InputTokens, s.OutputTokens, s.SLO)
	s.WriteTable(w)
	fmt.Fprintf(w, "wrote %s, %s and %s\n", filepath.Join(dir, load.SweepJSONFile), filepath.Join(dir, load.SweepPNGFile),
		filepath.Join(dir, load.SweepHTMLFile))
}

// commandLine is the command as run, for the sweep's record: its path and
// the flags set (the API key's value left out).
func commandLine(cmd *cobra.Command) string {
	parts := []string{cmd.CommandPath()}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		v := f.Value.String()
		if f.Name == "api-key" {
			v = "…"
		}
		parts = append(parts, "--"+f.Name+"="+v)
	})
	return strings.Join(parts, " ")
}
