package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/stokehq/stoke/bench"
	"github.com/stokehq/stoke/internal/tier"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Measure a running platform"}
	var (
		url, model, which string
		runs              int
		asJSON            bool
	)
	cold := &cobra.Command{
		Use:   "cold-start --model NAME",
		Short: "Time a request's first token from each cold-start tier",
		Long: `Cold-start drives the deployment into each tier through the admin API
(t1: a sleeping replica, t2: a warm runtime with the weights in the node
cache, t3: a warm runtime and the weights only in the bucket, t4: no runtime
started), sends one streaming request and prints its time to first token
with where it went. The deployment must allow zero replicas.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tiers := tier.Benchable()
			if which != "all" {
				tiers = tiers[:0]
				for _, s := range strings.Split(which, ",") {
					t, err := tier.Parse(s)
					if err != nil {
						return fmt.Errorf("--tier: %w (or all)", err)
					}
					tiers = append(tiers, t)
				}
			}
			rep, err := bench.ColdStart(cmd.Context(), bench.ColdStartOptions{URL: strings.TrimSuffix(url, "/"), Model: model, Tiers: tiers, Runs: runs})
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(rep)
			}
			rep.WriteTable(cmd.OutOrStdout())
			return nil
		},
	}
	f := cold.Flags()
	f.StringVar(&url, "url", "http://127.0.0.1:8080", "stoke serve's URL")
	f.StringVar(&model, "model", "", "the deployment to measure")
	f.StringVar(&which, "tier", "all", "t1, t2, t3, t4, a comma-separated list, or all")
	f.IntVar(&runs, "runs", 1, "requests per tier")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	cold.MarkFlagRequired("model")
	cmd.AddCommand(cold, newBenchLoadCmd())
	return cmd
}
