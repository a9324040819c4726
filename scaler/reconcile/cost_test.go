package reconcile

import (
	"fmt"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/runtime"
)

// tokenRouter is idleRouter with the tokens each deployment served.
type tokenRouter struct {
	idleRouter
	tokens map[string]int64
}

func (r tokenRouter) Tokens(name string) int64 { return r.tokens[name] }

// TestOperatingCost: replica-seconds count every replica held (acquiring,
// ready, draining) for as long as it was held, at the cost the spec had
// then; the cost per million tokens is that over the tokens served, and
// absent for a deployment without a cost.
func TestOperatingCost(t *testing.T) {
	t0 := time.Now().Add(-time.Hour)
	priced := config.Default()
	priced.Cost.ReplicaHourlyUSD = 3.6 // a dollar-thousandth a second
	c := &Controller{log: slog.New(slog.DiscardHandler), opts: Options{Router: tokenRouter{tokens: map[string]int64{"chat": 20_000, "free": 500}}},
		deps: map[string]*deployment{
			"chat": {spec: priced, replicas: map[string]*runtime.Replica{"r1": {}, "r2": {}}, draining: map[string]bool{"r2": true}, pending: 1,
				cost: replicaMeter{since: t0}},
			"free": {spec: config.Default(), replicas: map[string]*runtime.Replica{"r3": {}}, draining: map[string]bool{}, cost: replicaMeter{since: t0}},
		}}
	chat := c.deps["chat"]
	chat.meter(t0.Add(10 * time.Second)) // 3 replicas for 10 s
	chat.forget(t0.Add(10*time.Second), "r2")
	chat.meter(t0.Add(20 * time.Second)) // then 2 for 10 s
	if !near(chat.cost.seconds, 50) || !near(chat.cost.usd, 0.05) {
		t.Fatalf("metered %v replica-seconds, $%v; want 50 and $0.05", chat.cost.seconds, chat.cost.usd)
	}
	chat.meter(t0.Add(5 * time.Second)) // a clock read before the last does not count twice
	if !near(chat.cost.seconds, 50) {
		t.Fatalf("an earlier reading changed the replica-seconds to %v", chat.cost.seconds)
	}
	chat.cost = replicaMeter{since: time.Now().Add(time.Hour), seconds: 50, usd: 0.05} // no time passes before the scrape
	c.deps["free"].cost = replicaMeter{since: time.Now().Add(time.Hour), seconds: 7}
	got := collect(t, newCostCollector(c))
	want := map[string]float64{
		`stoke_replica_seconds_total{model="chat"}`:    50,
		`stoke_operating_cost_usd_total{model="chat"}`: 0.05,
		`stoke_cost_per_1m_tokens{model="chat"}`:       2.5, // $0.05 over 20,000 tokens
		`stoke_replica_seconds_total{model="free"}`:    7,
		`stoke_operating_cost_usd_total{model="free"}`: 0,
	}
	if len(got) != len(want) {
		t.Fatalf("series %v, want %v", got, want)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || !near(g, v) {
			t.Errorf("%s = %v, want %v", k, g, v)
		}
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9+1e-9*math.Abs(b) }

// collect reads every series of cc as name{model="…"} → value.
func collect(t *testing.T, cc prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(cc)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			out[fmt.Sprintf(`%s{model=%q}`, f.GetName(), m.GetLabel()[0].GetValue())] = v
		}
	}
	return out
}
