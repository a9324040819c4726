package batch

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestLimiterAdapts(t *testing.T) {
	fast, slow := 6*time.Millisecond, 9*time.Millisecond
	for _, tc := range []struct {
		name     string
		outcomes []outcome
		want     int // the bound after them; -1: below what fast lines alone reach
	}{
		{"slow start grows by one per answer", repeat(outcome{answered: true, perToken: fast}, 10), initialLimit + 10},
		{"capped at max", repeat(outcome{answered: true, perToken: fast}, 100), 32},
		{"a refusal halves it", append(repeat(outcome{answered: true, perToken: fast}, 12), outcome{refused: true}), (initialLimit + 12) / 2},
		{"never below one", repeat(outcome{refused: true}, 10), 1},
		{"neither answered nor refused: unchanged", repeat(outcome{}, 5), initialLimit},
		// 20 fast answers grow it to 24; once the average of the slow ones is
		// past the tolerance, each shrinks it by 3%.
		{"slower than tolerated: it shrinks", append(repeat(outcome{answered: true, perToken: fast}, 20), repeat(outcome{answered: true, perToken: slow}, 40)...), -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLimiter(32, 1.1, prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}))
			for _, o := range tc.outcomes {
				if err := l.acquire(context.Background()); err != nil {
					t.Fatal(err)
				}
				l.release(o)
			}
			got := l.bound()
			if tc.want == -1 {
				if fastOnly := initialLimit + len(tc.outcomes); got >= fastOnly/2 {
					t.Fatalf("bound %d after slow lines, want well below the %d fast lines alone reach", got, fastOnly)
				}
				return
			}
			if got != tc.want {
				t.Fatalf("bound %d, want %d", got, tc.want)
			}
		})
	}
}

func TestLimiterAcquireWaitsForRoom(t *testing.T) {
	l := newLimiter(1, 1.1, prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}))
	if err := l.acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := l.acquire(ctx); err == nil {
		t.Fatal("a second line got room past a bound of 1")
	}
	got := make(chan error, 1)
	go func() { got <- l.acquire(context.Background()) }()
	l.release(outcome{})
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

func repeat(o outcome, n int) []outcome {
	out := make([]outcome, n)
	for i := range out {
		out[i] = o
	}
	return out
}
