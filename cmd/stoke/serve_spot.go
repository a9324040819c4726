package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/stokehq/stoke/runtime"
	"github.com/stokehq/stoke/runtime/spot"
)

// spotFlags say which of the node's slots are spot capacity and where to
// watch for the notices that reclaim it.
type spotFlags struct {
	// slots is how many of --slots are spot capacity (the last ones).
	slots int
	// imds is the instance metadata endpoint watched for spot
	// interruption notices: "" watches none, "aws" the instance's own.
	imds string
}

// spotIMDSDefault is the --spot-imds value that watches the instance's own
// metadata service (the SDK's default endpoint).
const spotIMDSDefault = "aws"

func (f *spotFlags) add(fl *pflag.FlagSet) {
	fl.IntVar(&f.slots, "spot-slots", 0, "how many of --slots are spot capacity (the last ones); a spot interruption notice drains them")
	fl.StringVar(&f.imds, "spot-imds", "", `EC2 instance metadata endpoint watched for spot interruption notices, e.g. http://127.0.0.1:1338 ("aws": the instance's own; empty: none watched)`)
}

// spotDrainMargin is how long before a notice's time its drain must be
// done: the instance is stopping by then.
const spotDrainMargin = 10 * time.Second

// spotDrainWindow is the drain's time when the notice gives none ahead (no
// time, or one already past): AWS's two minutes, less a margin.
const spotDrainWindow = 90 * time.Second

// spotDrainDeadline is when the drain for notice n, seen at now, must be
// done: spotDrainMargin before the notice's time; the notice's time itself
// when that is closer than the margin; now+spotDrainWindow when the notice
// has no time or its time is past.
func spotDrainDeadline(n spot.Notice, now time.Time) time.Time {
	switch {
	case n.Time.IsZero() || !n.Time.After(now):
		return now.Add(spotDrainWindow)
	case n.Time.Add(-spotDrainMargin).After(now):
		return n.Time.Add(-spotDrainMargin)
	}
	return n.Time
}

// startSpotWatcher watches f's IMDS endpoint (when set) for spot
// interruption notices until ctx ends, in a goroutine of its own; on each
// new notice it logs it and calls drain for the spot slots, in another
// goroutine, with a context whose deadline is spotDrainDeadline's. The
// watcher's series go to reg. It fails only on a bad endpoint or metrics
// that do not register.
func startSpotWatcher(ctx context.Context, f spotFlags, drain func(ctx context.Context, class runtime.Class) error, log *slog.Logger, reg prometheus.Registerer) error {
	if f.imds == "" {
		if f.slots > 0 {
			log.Info("spot slots without --spot-imds: no spot interruption notice is watched", "spot_slots", f.slots)
		}
		return nil
	}
	endpoint := f.imds
	if endpoint == spotIMDSDefault {
		endpoint = ""
	}
	if f.slots == 0 {
		log.Warn("--spot-imds without --spot-slots: a spot interruption notice will find no spot slot to drain", "imds", f.imds)
	}
	w, err := spot.New(spot.Options{Endpoint: endpoint, Logger: log, Registerer: reg,
		OnNotice: func(ctx context.Context, n spot.Notice) {
			deadline := spotDrainDeadline(n, time.Now())
			log.Warn("spot interruption notice: draining the spot slots", "action", n.Action, "time", n.Time, "deadline", deadline, "spot_slots", f.slots)
			go func() {
				dctx, cancel := context.WithDeadline(ctx, deadline)
				defer cancel()
				if err := drain(dctx, runtime.Spot); err != nil {
					log.Warn("spot drain", "action", n.Action, "err", err)
				}
			}()
		}})
	if err != nil {
		return fmt.Errorf("--spot-imds: %w", err)
	}
	go w.Run(ctx)
	return nil
}
