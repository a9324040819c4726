package scaler

import (
	"math"
	"testing"
	"time"
)

func TestWindowAverage(t *testing.T) {
	const sec = int64(time.Second)
	type sample struct {
		at int64 // seconds
		v  float64
	}
	tests := []struct {
		name    string
		gran    int64
		samples []sample
		now     int64 // seconds
		span    int64 // seconds
		want    float64
	}{
		{"constant", sec, []sample{{0, 5}}, 60, 60, 5},
		{"only time since the first sample counts", sec, []sample{{50, 4}}, 60, 60, 4},
		{"step halfway", sec, []sample{{0, 2}, {30, 6}}, 60, 60, 4},
		{"short window sees only the recent step", sec, []sample{{0, 2}, {30, 6}}, 60, 6, 6},
		{"window straddling the step", sec, []sample{{0, 0}, {57, 10}}, 60, 6, 5},
		{"old samples fall out of the window", sec, []sample{{0, 100}, {10, 1}}, 200, 60, 1},
		{"mid-bucket step, coarse buckets", 4 * sec, []sample{{0, 0}, {58, 8}}, 60, 6, 8 * 2.0 / 6},
		{"zero after load", sec, []sample{{0, 9}, {60, 0}}, 120, 60, 0},
		{"sub-second samples", sec, []sample{{0, 1}, {1, 3}}, 2, 2, 2},
		{"nothing recorded", sec, nil, 60, 60, 0},
		{"gap longer than the ring", sec, []sample{{0, 3}}, 10_000, 60, 3},
		{"before 1970", sec, []sample{{-100, 2}, {-70, 4}}, -40, 60, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWindow(tc.gran, 60*sec)
			for _, s := range tc.samples {
				w.set(s.at*sec, s.v)
			}
			w.advance(tc.now * sec)
			got := w.average(tc.now*sec, tc.span*sec)
			if math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("average = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestMaxHold(t *testing.T) {
	type push struct {
		at   int64
		v    int
		want int
	}
	tests := []struct {
		name   string
		delay  int64
		pushes []push
	}{
		{"increases pass at once", 30, []push{{0, 1, 1}, {1, 5, 5}, {2, 9, 9}}},
		{"drop waits for the delay", 30, []push{{0, 5, 5}, {1, 1, 5}, {30, 1, 5}, {31, 1, 1}}},
		{"drops to the largest recent value", 30, []push{{0, 9, 9}, {10, 6, 9}, {20, 2, 9}, {40, 2, 6}, {50, 2, 2}}},
		{"a rise restarts the hold", 10, []push{{0, 4, 4}, {5, 1, 4}, {9, 4, 4}, {12, 1, 4}, {22, 1, 1}}},
		{"no delay", 0, []push{{0, 5, 5}, {1, 1, 1}, {2, 3, 3}, {3, 0, 0}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := maxHold{delay: tc.delay}
			for _, p := range tc.pushes {
				if got := h.push(p.at, p.v); got != p.want {
					t.Fatalf("push(%d, %d) = %d, want %d", p.at, p.v, got, p.want)
				}
			}
			if len(h.entries) > len(tc.pushes) {
				t.Errorf("%d entries kept for %d pushes", len(h.entries), len(tc.pushes))
			}
		})
	}
}
