package store

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"
)

// usageFixture records usage of two tenants and of no tenant, on two
// models, over three UTC days (one record a nanosecond before midnight,
// one at midnight), and returns the store.
func usageFixture(t *testing.T, bk backend) *Store {
	t.Helper()
	s := bk.open(t)
	day := func(d, h, m int) time.Time { return time.Date(2025, 3, d, h, m, 0, 0, time.UTC) }
	rec := func(id, tenant, model string, at time.Time, prompt, completion, cached int) UsageRecord {
		return UsageRecord{RequestID: id, TenantID: tenant, KeyID: "key-" + tenant, Model: model, Status: 200,
			PromptTokens: prompt, CompletionTokens: completion, CachedTokens: cached, TTFT: time.Millisecond, Duration: time.Second, CreatedAt: at}
	}
	rs := []UsageRecord{
		rec("a1", "tnt_a", "chat", day(1, 9, 0), 10, 5, 0),
		rec("a2", "tnt_a", "chat", day(1, 23, 59).Add(59*time.Second+999999999*time.Nanosecond), 20, 6, 4),
		rec("a3", "tnt_a", "chat", day(2, 0, 0), 30, 7, 0),
		rec("a4", "tnt_a", "embed", day(2, 12, 0), 40, 0, 0),
		rec("b1", "tnt_b", "chat", day(1, 10, 0), 1, 1, 1),
		rec("b2", "tnt_b", "chat", day(3, 10, 0), 2, 2, 2),
		rec("n1", "", "chat", day(2, 8, 0), 100, 50, 25),
	}
	// Out of order, half through the journal (not yet drained when the
	// totals are read) and half straight into the table: the totals must
	// not care.
	if err := s.InsertUsage(context.Background(), rs[4:]); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendUsage(rs[:4]); err != nil {
		t.Fatal(err)
	}
	return s
}

// totalsString shows totals one per line, for comparisons.
func totalsString(us []UsageTotal) string {
	out := ""
	for _, u := range us {
		out += fmt.Sprintf("%s %q %s %d %d %d %d\n", u.Day, u.TenantID, u.Model, u.Requests, u.PromptTokens, u.CompletionTokens, u.CachedTokens)
	}
	return out
}

func TestUsageTotalsGroupsAndFilters(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		s := usageFixture(t, bk)
		ctx := context.Background()
		since := time.Date(2025, 3, 2, 0, 0, 0, 0, time.UTC)
		until := time.Date(2025, 3, 3, 0, 0, 0, 0, time.UTC)
		for _, c := range []struct {
			name string
			q    UsageQuery
			want string
		}{
			{"all, by day then tenant then model", UsageQuery{}, `2025-03-01 "tnt_a" chat 2 30 11 4
2025-03-01 "tnt_b" chat 1 1 1 1
2025-03-02 "" chat 1 100 50 25
2025-03-02 "tnt_a" chat 1 30 7 0
2025-03-02 "tnt_a" embed 1 40 0 0
2025-03-03 "tnt_b" chat 1 2 2 2
`},
			{"one tenant", UsageQuery{Tenant: "tnt_a"}, `2025-03-01 "tnt_a" chat 2 30 11 4
2025-03-02 "tnt_a" chat 1 30 7 0
2025-03-02 "tnt_a" embed 1 40 0 0
`},
			{"no tenant only", UsageQuery{ExactTenant: true}, `2025-03-02 "" chat 1 100 50 25
`},
			{"exact tenant named", UsageQuery{Tenant: "tnt_b", ExactTenant: true}, `2025-03-01 "tnt_b" chat 1 1 1 1
2025-03-03 "tnt_b" chat 1 2 2 2
`},
			{"one model", UsageQuery{Model: "embed"}, `2025-03-02 "tnt_a" embed 1 40 0 0
`},
			{"tenant and model", UsageQuery{Tenant: "tnt_b", Model: "chat"}, `2025-03-01 "tnt_b" chat 1 1 1 1
2025-03-03 "tnt_b" chat 1 2 2 2
`},
			{"since included, until excluded", UsageQuery{Since: since, Until: until}, `2025-03-02 "" chat 1 100 50 25
2025-03-02 "tnt_a" chat 1 30 7 0
2025-03-02 "tnt_a" embed 1 40 0 0
`},
			{"since only", UsageQuery{Since: until}, `2025-03-03 "tnt_b" chat 1 2 2 2
`},
			{"until only, a nanosecond before midnight kept", UsageQuery{Until: since, Tenant: "tnt_a"}, `2025-03-01 "tnt_a" chat 2 30 11 4
`},
			{"unknown tenant", UsageQuery{Tenant: "tnt_zzz"}, ""},
			{"unknown model", UsageQuery{Model: "nope"}, ""},
			{"empty range", UsageQuery{Since: until, Until: since}, ""},
		} {
			t.Run(c.name, func(t *testing.T) {
				got, err := s.UsageTotals(ctx, c.q)
				if err != nil {
					t.Fatal(err)
				}
				if g := totalsString(got); g != c.want {
					t.Errorf("totals of %+v:\n%s\nwant:\n%s", c.q, g, c.want)
				}
			})
		}
	})
}

// TestUsageTotalsAddUp: whatever the filter, the totals' sums are the
// records' sums, and the per-tenant totals partition the whole.
func TestUsageTotalsAddUp(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		s := usageFixture(t, bk)
		ctx := context.Background()
		sum := func(us []UsageTotal) [4]int64 {
			var out [4]int64
			for _, u := range us {
				out[0] += int64(u.Requests)
				out[1] += u.PromptTokens
				out[2] += u.CompletionTokens
				out[3] += u.CachedTokens
			}
			return out
		}
		all, err := s.UsageTotals(ctx, UsageQuery{})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := sum(all), [4]int64{7, 203, 71, 32}; got != want {
			t.Fatalf("sums of every total = %v, want %v", got, want)
		}
		var parts [4]int64
		for _, q := range []UsageQuery{{Tenant: "tnt_a"}, {Tenant: "tnt_b"}, {ExactTenant: true}} {
			us, err := s.UsageTotals(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range sum(us) {
				parts[i] += v
			}
		}
		if parts != sum(all) {
			t.Fatalf("per-tenant sums %v, every tenant's %v", parts, sum(all))
		}
		ids, err := s.UsageRequestIDs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string]int{"a1": 1, "a2": 1, "a3": 1, "a4": 1, "b1": 1, "b2": 1, "n1": 1}; !reflect.DeepEqual(ids, want) {
			t.Fatalf("request ids %v, want %v", ids, want)
		}
	})
}

func TestUsageTotalsEmpty(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		s := bk.open(t)
		got, err := s.UsageTotals(context.Background(), UsageQuery{Tenant: "tnt_a", Model: "chat"})
		if err != nil || len(got) != 0 {
			t.Fatalf("totals of an empty store = %v, %v", got, err)
		}
		if err := s.InsertUsage(context.Background(), nil); err != nil {
			t.Fatalf("inserting nothing: %v", err)
		}
	})
}

func TestUsageTotalsClosedStore(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		s := bk.open(t)
		s.Close()
		if _, err := s.UsageTotals(context.Background(), UsageQuery{}); err == nil {
			t.Fatal("totals of a closed store: no error")
		}
	})
}
