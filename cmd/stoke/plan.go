package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/stokehq/stoke/bench/load"
	"github.com/stokehq/stoke/bench/plan"
	"github.com/stokehq/stoke/engine/sim"
)

// newPlanCmd is `stoke plan`.
func newPlanCmd() *cobra.Command {
	var (
		traffic                  plan.Traffic
		m                        plan.Model
		input, output, slo       string
		sweepFile, profile       string
		sweepReplicas            int
		headroom                 float64
		asJSON                   bool
		accelerators             int
		goodput, acceleratorUSDh float64
	)
	cmd := &cobra.Command{
		Use:   "plan --rps R --input-tokens N --output-tokens M (--sweep FILE | --sim-profile NAME | --goodput R)",
		Short: "Size a fleet: replicas, accelerators, $/hour and $ per 1M tokens for a traffic model",
		Long: `Plan sizes the fleet that serves a traffic model: --rps at peak,
--peak-to-average, --ramp (how long demand takes to climb from its average
to its peak; 0: a burst), request lengths (--input-tokens, --output-tokens:
N or a distribution as stoke bench load takes, by its mean) and the SLO.
What one replica serves within the SLO (its goodput: at least 90% of
requests meeting it) comes from a load sweep (--sweep sweep.json from
stoke bench load --sweep, run against --sweep-replicas replicas), from a
sim profile's step-time model (--sim-profile, an estimate), or is given
(--goodput). It prints replicas at peak and at the average with
--headroom, accelerators, dollars an hour and per million tokens, and the
replicas to keep asleep and warm so that a climb to the peak is served
while cold starts (--cold-start, as stoke bench cold-start measures t2/t3)
are under way, each with the arithmetic that gave it.`,
		Args: cobra.NoArgs,
		RunE: oneLine(func(cmd *cobra.Command, _ []string) error {
			in, err := load.ParseDist(input)
			if err != nil {
				return fmt.Errorf("--input-tokens: %w", err)
			}
			out, err := load.ParseDist(output)
			if err != nil {
				return fmt.Errorf("--output-tokens: %w", err)
			}
			bounds, err := parseSLO(slo)
			if err != nil {
				return err
			}
			m.Share, m.InputTokens, m.OutputTokens = 1, in.Mean(), out.Mean()
			var steps []string
			sources := 0
			for _, set := range []bool{sweepFile != "", profile != "", goodput > 0} {
				if set {
					sources++
				}
			}
			if sources != 1 {
				return errors.New("give one of --sweep, --sim-profile and --goodput")
			}
			m.Accelerators = 1
			switch {
			case sweepFile != "":
				if m.Goodput, m.GoodputSource, err = sweepGoodput(sweepFile, sweepReplicas); err != nil {
					return err
				}
			case profile != "":
				p, err := sim.LoadProfile(profile)
				if err != nil {
					return err
				}
				m.Accelerators = p.Accelerators
				model := plan.StepModel{Name: p.Name, Hardware: p.Hardware, Overhead: p.StepOverhead, PrefillPerToken: p.PrefillPerToken,
					DecodePerSeq: p.DecodePerSeq, DecodePerContextToken: p.DecodePerContextToken, MaxNumSeqs: p.MaxNumSeqs, KVCapacityTokens: p.KVCapacityTokens}
				if m.Goodput, steps, err = plan.SimGoodput(model, m.InputTokens, m.OutputTokens, bounds); err != nil {
					return err
				}
				m.GoodputSource = "estimated from sim profile " + p.Name
			default:
				m.Goodput, m.GoodputSource = goodput, "given"
			}
			if accelerators > 0 {
				m.Accelerators = accelerators
			}
			if m.HourlyUSD == 0 && acceleratorUSDh > 0 {
				m.HourlyUSD = acceleratorUSDh * float64(m.Accelerators)
			}
			p, err := plan.Make(traffic, []plan.Model{m}, headroom)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(p)
			}
			writePlan(cmd.OutOrStdout(), p, steps, bounds)
			return nil
		}),
	}
	f := cmd.Flags()
	f.Float64Var(&traffic.PeakRPS, "rps", 0, "peak requests a second")
	f.Float64Var(&traffic.PeakToAverage, "peak-to-average", 1, "the peak rate over the average one")
	f.DurationVar(&traffic.Ramp, "ramp", 0, "how long demand takes to climb from its average to its peak (0: a burst)")
	f.StringVar(&input, "input-tokens", "1500", "prompt length: N or a distribution (its mean is used)")
	f.StringVar(&output, "output-tokens", "300", "answer length: N or a distribution (its mean is used)")
	f.StringVar(&slo, "slo", "ttft=800ms,tpot=40ms", "the SLO requests must meet")
	f.StringVar(&m.Name, "model", "model", "the model's name in the plan")
	f.StringVar(&sweepFile, "sweep", "", "per-replica goodput from this stoke bench load --sweep file (sweep.json)")
	f.IntVar(&sweepReplicas, "sweep-replicas", 1, "the replicas the sweep ran against")
	f.StringVar(&profile, "sim-profile", "", "per-replica goodput estimated from this sim profile (name or file)")
	f.Float64Var(&goodput, "goodput", 0, "per-replica goodput, requests a second within the SLO")
	f.Float64Var(&headroom, "headroom", 0.2, "capacity kept above the peak, a fraction")
	f.IntVar(&accelerators, "accelerators", 0, "GPUs one replica holds (default: the sim profile's, else 1)")
	f.Float64Var(&m.HourlyUSD, "replica-hourly-usd", 0, "one replica's cost an hour")
	f.Float64Var(&acceleratorUSDh, "accelerator-hourly-usd", 0, "one GPU's cost an hour (a replica costs its accelerators' share)")
	f.DurationVar(&m.ColdStart, "cold-start", 30*time.Second, "a cold start's lead time from a warm runtime (t2/t3)")
	f.DurationVar(&m.Wake, "wake", 2*time.Second, "a sleeping replica's wake time (t1)")
	f.BoolVar(&asJSON, "json", false, "print the plan as JSON")
	return cmd
}

// sweepGoodput is the per-replica goodput a sweep measured: the highest
// load at which at least 90% of requests met its SLO, as the request rate
// achieved there, shared by the replicas it ran against.
func sweepGoodput(path string, replicas int) (float64, string, error) {
	if replicas < 1 {
		return 0, "", fmt.Errorf("--sweep-replicas: %d must be at least 1", replicas)
	}
	s, err := load.ReadSweep(path)
	if err != nil {
		return 0, "", err
	}
	best := s.MaxSLO
	if best == nil {
		return 0, "", fmt.Errorf("--sweep %s: no point of the sweep had %.0f%% of its requests within its SLO (%s)", path, s.SLOTarget*100, s.SLO)
	}
	rate := best.RequestRate / float64(replicas)
	return rate, fmt.Sprintf("measured by %s: %.4g req/s with %.0f%% within %s, on %d replica(s)", path, best.RequestRate,
		best.SLOAttainment*100, s.SLO, replicas), nil
}

// writePlan prints a plan for people: a table per model, then the
// arithmetic.
func writePlan(w io.Writer, p plan.Plan, goodputSteps []string, slo load.SLO) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tPEAK RPS\tPREFILL TOK/S\tDECODE TOK/S\tGOODPUT/REPLICA\tREPLICAS\tAT AVERAGE\tACCELERATORS\t$/HOUR PEAK\t$/HOUR AVG\t$/1M TOKENS\tSLEEPING\tWARM")
	for _, m := range p.Models {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%.2f\t%.2f\t%.4g\t%d\t%d\n", m.Name, figure(m.PeakRPS), figure(m.PrefillTokensPerSec),
			figure(m.DecodeTokensPerSec), figure(m.Goodput), m.Replicas, m.ReplicasAtAverage, m.Accelerators, m.HourlyUSDPeak, m.HourlyUSDAverage,
			m.USDPer1MTokens, m.Sleeping, m.Warm)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nSLO: TTFT %v, TPOT %v (goodput: ≥ 90%% of requests within it); headroom %.0f%%\n", slo.TTFT, slo.TPOT, p.Headroom*100)
	for _, m := range p.Models {
		fmt.Fprintf(w, "\n%s:\n", m.Name)
		for _, s := range append(goodputSteps, m.Steps...) {
			fmt.Fprintf(w, "  %s\n", strings.TrimSpace(s))
		}
	}
}

// figure writes a rate for people: whole numbers with thousands
// separators from 1,000 on, four significant digits below.
func figure(v float64) string {
	if v < 1000 {
		return fmt.Sprintf("%.4g", v)
	}
	digits := fmt.Sprintf("%.0f", v)
	var b strings.Builder
	for i, c := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
