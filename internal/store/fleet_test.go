package store

import (
	"context"
	"testing"
	"time"
)

// TestFleet publishes endpoints and canary shares through one gateway's
// handle and reads them through another's, and sums the load the other
// gateways report, leaving out stale reports and the reader's own.
func TestFleet(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		tg := b.fresh(t)
		leader := openAt(t, tg)
		var follower *Store
		if b.postgres {
			follower = openAt(t, b.replica(t, tg))
		} else {
			follower = leader // one file, one journal: the same handle
		}
		for _, e := range []Endpoint{{"a", "rt-1", "unix:///x.sock", 8}, {"a", "rt-2", "10.0.0.2:8000", 8}, {"b", "rt-3", "10.0.0.3:8000", 4}} {
			if err := leader.PutEndpoint(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		if err := leader.PutEndpoint(ctx, Endpoint{"a", "rt-1", "unix:///y.sock", 16}); err != nil { // replaced
			t.Fatal(err)
		}
		if err := leader.DeleteEndpoint(ctx, "b", "rt-3"); err != nil {
			t.Fatal(err)
		}
		if err := leader.SetCanaryShare(ctx, CanaryShare{"a", "a@canary", 10}); err != nil {
			t.Fatal(err)
		}
		eps, cs, err := follower.Fleet(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := []Endpoint{{"a", "rt-1", "unix:///y.sock", 16}, {"a", "rt-2", "10.0.0.2:8000", 8}}
		if len(eps) != len(want) || eps[0] != want[0] || eps[1] != want[1] || len(cs) != 1 || cs[0] != (CanaryShare{"a", "a@canary", 10}) {
			t.Fatalf("fleet read through the other handle: %+v %+v, want %+v and a@canary 10%%", eps, cs, want)
		}
		if err := leader.ClearFleet(ctx); err != nil {
			t.Fatal(err)
		}
		if eps, cs, err := follower.Fleet(ctx); err != nil || len(eps) != 0 || len(cs) != 0 {
			t.Fatalf("after ClearFleet: %v %v %v", eps, cs, err)
		}

		now := time.Unix(1000, 0)
		leader.now = func() time.Time { return now }
		follower.now = leader.now
		if err := follower.ReportLoad(ctx, "gw-2", map[string]float64{"a": 3, "b": 1}); err != nil {
			t.Fatal(err)
		}
		if err := follower.ReportLoad(ctx, "gw-3", map[string]float64{"a": 2}); err != nil {
			t.Fatal(err)
		}
		if err := leader.ReportLoad(ctx, "gw-1", map[string]float64{"a": 100}); err != nil {
			t.Fatal(err)
		}
		load, err := leader.Load(ctx, "gw-1", 5*time.Second)
		if err != nil || load["a"] != 5 || load["b"] != 1 {
			t.Fatalf("load seen by gw-1: %v %v, want a 5 and b 1", load, err)
		}
		if err := follower.ReportLoad(ctx, "gw-2", map[string]float64{"b": 2}); err != nil { // replaces gw-2's report
			t.Fatal(err)
		}
		now = now.Add(3 * time.Second)
		if err := follower.ReportLoad(ctx, "gw-3", map[string]float64{"a": 1}); err != nil {
			t.Fatal(err)
		}
		load, err = leader.Load(ctx, "gw-1", 2*time.Second) // gw-2's report is stale now
		if err != nil || load["a"] != 1 || load["b"] != 0 {
			t.Fatalf("load seen by gw-1 later: %v %v, want a 1 and no b", load, err)
		}
	})
}
