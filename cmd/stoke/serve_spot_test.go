package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/stokehq/stoke/runtime"
	"github.com/stokehq/stoke/runtime/spot"
)

func TestSpotDrainDeadline(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)
	cases := []struct {
		name   string
		notice time.Time
		want   time.Time
	}{
		{"two minutes ahead", now.Add(2 * time.Minute), now.Add(110 * time.Second)},
		{"closer than the margin", now.Add(4 * time.Second), now.Add(4 * time.Second)},
		{"no time", time.Time{}, now.Add(90 * time.Second)},
		{"a time past", now.Add(-time.Minute), now.Add(90 * time.Second)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := spotDrainDeadline(spot.Notice{Action: spot.ActionTerminate, Time: tc.notice}, now); !got.Equal(tc.want) {
				t.Fatalf("deadline %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSpotFlags(t *testing.T) {
	var f spotFlags
	fl := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f.add(fl)
	if err := fl.Parse([]string{"--spot-slots", "2", "--spot-imds", "http://127.0.0.1:1338"}); err != nil {
		t.Fatal(err)
	}
	if f.slots != 2 || f.imds != "http://127.0.0.1:1338" {
		t.Fatalf("flags %+v", f)
	}
	if err := startSpotWatcher(context.Background(), spotFlags{imds: "127.0.0.1:1338"}, nil, slog.New(slog.DiscardHandler), nil); err == nil {
		t.Fatal("an endpoint that is no URL was accepted")
	}
}

// TestStartSpotWatcherDrains serves a spot notice from a stand-in IMDS:
// drain runs once, for the spot slots, with the notice's time less the
// margin as its deadline.
func TestStartSpotWatcherDrains(t *testing.T) {
	at := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second)
	imds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
			w.Header().Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", "60")
			fmt.Fprint(w, "token")
		case r.URL.Path == "/latest/meta-data/"+spot.Path && r.Header.Get("X-Aws-Ec2-Metadata-Token") == "token":
			fmt.Fprintf(w, `{"action":"terminate","time":%q}`, at.Format(time.RFC3339))
		default:
			http.Error(w, "no", http.StatusUnauthorized)
		}
	}))
	defer imds.Close()
	type call struct {
		class    runtime.Class
		deadline time.Time
	}
	calls := make(chan call, 10)
	drain := func(ctx context.Context, class runtime.Class) error {
		d, _ := ctx.Deadline()
		calls <- call{class, d}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := startSpotWatcher(ctx, spotFlags{slots: 1, imds: imds.URL}, drain, slog.New(slog.DiscardHandler), prometheus.NewRegistry()); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-calls:
		if c.class != runtime.Spot || !c.deadline.Equal(at.Add(-spotDrainMargin)) {
			t.Fatalf("drain(%s) with deadline %v, want spot with %v", c.class, c.deadline, at.Add(-spotDrainMargin))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no drain after a spot notice")
	}
}
