// Command stoke is the single binary of the stoke inference platform.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCmd().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "stoke:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	var (
		verbose    bool
		cpuProfile string
		stopProf   = func() {}
	)
	root := &cobra.Command{
		Use:           "stoke",
		Short:         "Serverless LLM inference: push weights, get an OpenAI-compatible endpoint",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRun: func(cmd *cobra.Command, args []string) {
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
			if cpuProfile != "" {
				stopProf = startCPUProfile(cpuProfile)
			}
		},
		PersistentPostRun: func(*cobra.Command, []string) { stopProf() },
	}
	root.PersistentFlags().BoolVarP(&verbose, "verbose", "v", false, "log debug messages")
	root.PersistentFlags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the command to this file")
	root.PersistentFlags().MarkHidden("cpuprofile")
	root.AddCommand(newModelCmd(), newGenerateCmd(), newEngineCmd(), newPushCmd(), newPullCmd(), newWatchCmd(), newImagesCmd(), newServeCmd(), newBenchCmd(), newBatchCmd(), newAdminCmd(), newRouteCmd(), newDeploymentCmd(), newPlanCmd())
	return root
}

// startCPUProfile profiles the process into path until the returned stop.
func startCPUProfile(path string) (stop func()) {
	f, err := os.Create(path)
	if err != nil {
		slog.Warn("no CPU profile", "err", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		slog.Warn("no CPU profile", "err", err)
		f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}
