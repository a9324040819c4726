package tenancy

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/store"
)

// usageLog writes usage records: each is durable (one write to the state
// store's usage journal) before record returns, and reaches the usage
// table in the store's group commits, off the request's path.
type usageLog struct {
	st       *store.Store
	log      *slog.Logger
	requests *prometheus.CounterVec
	tokens   *prometheus.CounterVec
	cost     *prometheus.CounterVec
}

func newUsageLog(st *store.Store, log *slog.Logger, reg prometheus.Registerer) *usageLog {
	u := &usageLog{st: st, log: log,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_tenant_requests_total",
			Help: "Requests admitted, by tenant id, the model (deployment or provider) that answered and HTTP status code."},
			[]string{"tenant", "model", "code"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_tenant_tokens_total",
			Help: "Tokens answered, by tenant id, the model that answered and kind (prompt or completion), as recorded in the usage records."},
			[]string{"tenant", "model", "kind"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_tenant_cost_usd_total",
			Help: "What the answered tokens cost tenants, in US dollars at the prices they were admitted at, by tenant id and the model that answered."},
			[]string{"tenant", "model"})}
	if reg != nil {
		reg.MustRegister(u.requests, u.tokens, u.cost)
	}
	return u
}

// record writes r and returns once it is durable (or failed to be).
func (u *usageLog) record(r store.UsageRecord) error {
	if err := u.st.AppendUsage([]store.UsageRecord{r}); err != nil {
		u.log.Error("record usage", "request", r.RequestID, "err", err)
		return err
	}
	tenant := r.TenantID
	if tenant == "" {
		tenant = "none"
	}
	model := r.Served // a routed request's answerer, not the route's first choice
	if model == "" {
		model = r.Model
	}
	u.requests.WithLabelValues(tenant, model, strconv.Itoa(r.Status)).Inc()
	u.tokens.WithLabelValues(tenant, model, "prompt").Add(float64(r.PromptTokens))
	u.tokens.WithLabelValues(tenant, model, "completion").Add(float64(r.CompletionTokens))
	u.cost.WithLabelValues(tenant, model).Add(float64(r.CostMicroUSD) / 1e6)
	return nil
}

// Admit is the activator's admission check (activator.Options.Admit): the
// limits (see admitLimits), and, with usage recording on, a usage record
// of every admitted request, durable before the end of its answer reaches
// the client (activator.Admitted.Hold).
func (s *Service) Admit(ctx context.Context, w http.ResponseWriter, r activator.AdmitRequest) (activator.Admitted, *openai.Error) {
	adm, e := s.admitLimits(ctx, w, r)
	if e != nil {
		return adm, e
	}
	p, _ := FromContext(ctx)
	adm.Flow = p.TenantID // tenants take turns in the activator's buffer
	if prio, ok := classPriority(p.Priority); ok {
		adm.Priority = &prio
	}
	if s.usage == nil {
		return adm, nil
	}
	limitsDone := adm.Done
	adm.Hold = true
	adm.Done = func(o activator.Outcome) {
		if limitsDone != nil {
			limitsDone(o)
		}
		rec := store.UsageRecord{RequestID: r.RequestID, TenantID: p.TenantID, KeyID: p.KeyID, Model: r.Model, Status: o.Status,
			TTFT: o.TTFT, Duration: o.Duration, CreatedAt: s.o.Now(), Route: o.Route, Served: o.Served, Fallbacks: o.Fallbacks}
		if o.Known {
			rec.PromptTokens, rec.CompletionTokens = o.Usage.PromptTokens, o.Usage.CompletionTokens
			if d := o.Usage.PromptTokensDetails; d != nil {
				rec.CachedTokens = d.CachedTokens
			}
			rec.CostMicroUSD = costMicro(s.price(r.Model), o.Usage)
		}
		s.usage.record(rec)
	}
	return adm, nil
}
