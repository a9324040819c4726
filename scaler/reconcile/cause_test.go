package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/scaler"
)

// TestColdStartCause: an acquisition the predictive floor decided is
// counted as predicted, one that demand decided as demand; and a spec's
// forecast reaches the autoscaler (predictive off: no floor).
func TestColdStartCause(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recorder(t, st)("chat", store.RevisionReady, `{"replicas":{"max":2}}`)
	dec := &fixedDecider{desired: 1, signal: scaler.SignalPredictive}
	reg := prometheus.NewRegistry()
	c, err := New(ctx, Options{Store: st, Runtimes: &loadingRuntimes{fail: map[string]bool{}}, Router: idleRouter{}, Registerer: reg,
		NewDecider: func(string, config.Spec) Decider { return dec }, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	c.reconcile(ctx, "chat")
	c.wg.Wait()
	dec.desired, dec.signal = 2, scaler.SignalConcurrency
	c.reconcile(ctx, "chat")
	c.wg.Wait()
	for cause, want := range map[string]float64{CausePredicted: 1, CauseDemand: 1} {
		if got := testutil.ToFloat64(c.coldStarts.WithLabelValues("chat", "", cause)); got != want {
			t.Errorf("cold starts caused by %s: %v, want %v", cause, got, want)
		}
	}

	// Steady arrivals for two seasons: with prediction the forecast keeps
	// a floor, without it none.
	floor := func(predictive bool) int {
		spec, err := config.Parse([]byte(fmt.Sprintf(`{"forecast":{"predictive":%v,"period":"60s","bucket":"5s"}}`, predictive)))
		if err != nil {
			t.Fatal(err)
		}
		a := NewAutoscaler("chat", spec)
		start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
		for s := range 120 {
			now := start.Add(time.Duration(s) * time.Second)
			a.RecordArrivals(now, 10)
			a.Record(now, 4)
		}
		return a.Decide(start.Add(120*time.Second), scaler.Signals{AvgLatency: 2 * time.Second}).PredictiveFloor
	}
	if on, off := floor(true), floor(false); on < 1 || off != 0 {
		t.Errorf("predictive floor %d on, %d off; want one on and none off", on, off)
	}
}
