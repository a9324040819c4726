package redistest_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/stokehq/stoke/api/tenancy/redistest"
)

// TestStart: the server answers, keeps what it is told, and two servers
// are two (each test its own).
func TestStart(t *testing.T) {
	ctx := context.Background()
	a, b := redistest.Start(t), redistest.Start(t)
	if a == b {
		t.Fatalf("two servers on one address %s", a)
	}
	ca, cb := redis.NewClient(&redis.Options{Addr: a}), redis.NewClient(&redis.Options{Addr: b})
	defer ca.Close()
	defer cb.Close()
	if err := ca.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		c    *redis.Client
		want string
	}{{"the same server", ca, "v"}, {"the other server", cb, ""}} {
		got, err := tc.c.Get(ctx, "k").Result()
		if err != nil && err != redis.Nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got != tc.want {
			t.Errorf("%s: GET k = %q, want %q", tc.name, got, tc.want)
		}
	}
	cfg, err := ca.ConfigGet(ctx, "save").Result()
	if err != nil {
		t.Fatal(err)
	}
	if cfg["save"] != "" {
		t.Errorf("save = %q, want no snapshots", cfg["save"])
	}
	if cfg, _ := ca.ConfigGet(ctx, "appendonly").Result(); cfg["appendonly"] != "no" {
		t.Errorf("appendonly = %q, want no", cfg["appendonly"])
	}
}
