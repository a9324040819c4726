package store

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"
)

// UsageRecord is what one inference request used.
type UsageRecord struct {
	RequestID, TenantID, KeyID, Model string
	// Status is the answer's HTTP status.
	Status                                       int
	PromptTokens, CompletionTokens, CachedTokens int
	// TTFT is the time to the answer's first byte, Duration to its end.
	TTFT, Duration time.Duration
	// CostMicroUSD is what it cost, in millionths of a US dollar.
	CostMicroUSD int64
	CreatedAt    time.Time
	// Route is the route the client named ("" for none), Served the
	// deployment or provider that answered (Model is the one the route
	// chose first, whose price it is charged), Fallbacks how many targets
	// passed it on before.
	Route, Served string
	Fallbacks     int
	// entry is the record's id in the usage journal ("" for none).
	entry string
}

// AppendUsage records rs on a request's path: durable, against the
// process being killed, when it returns (one write to the usage journal;
// the machine losing power may lose the last ones), in the usage table
// within a fraction of a second, and seen by every read of usage through
// this Store at once (through other gateways sharing a PostgreSQL
// database, once drained).
func (s *Store) AppendUsage(rs []UsageRecord) error {
	for i := range rs {
		if rs[i].CreatedAt.IsZero() {
			rs[i].CreatedAt = s.now()
		}
	}
	return s.journal.append(rs)
}

// FlushUsage moves the records appended so far into the usage table.
// Every read of usage does it first; it is for readers of the database
// file itself.
func (s *Store) FlushUsage(ctx context.Context) error {
	return s.journal.flush(ctx)
}

// InsertUsage records rs in the usage table in one transaction: all of
// them or none (a record already there from the journal is kept once).
func (s *Store) InsertUsage(ctx context.Context, rs []UsageRecord) error {
	if len(rs) == 0 {
		return nil
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO usage (request_id, tenant_id, key_id, model, status, prompt_tokens,
			completion_tokens, cached_tokens, ttft_us, duration_us, cost_micro_usd, created_at, entry, route, served, fallbacks)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`)
		if err != nil {
			return fmt.Errorf("record usage: %w", err)
		}
		defer stmt.Close()
		for _, r := range rs {
			if r.CreatedAt.IsZero() {
				r.CreatedAt = s.now()
			}
			if _, err := stmt.ExecContext(ctx, r.RequestID, r.TenantID, r.KeyID, r.Model, r.Status, r.PromptTokens, r.CompletionTokens,
				r.CachedTokens, r.TTFT.Microseconds(), r.Duration.Microseconds(), r.CostMicroUSD, stamp(r.CreatedAt), sql.NullString{String: r.entry, Valid: r.entry != ""},
				r.Route, r.Served, r.Fallbacks); err != nil {
				return fmt.Errorf("record usage of %s: %w", r.RequestID, err)
			}
		}
		return nil
	})
}

// UsageQuery selects usage for UsageTotals.
type UsageQuery struct {
	// Tenant keeps one tenant's records ("" keeps every tenant's, unless
	// ExactTenant).
	Tenant string
	// ExactTenant makes Tenant a filter even when it is "": then only the
	// records of requests with no tenant (auth off, the admin key) are
	// kept.
	ExactTenant bool
	// Model keeps one model's records ("" keeps every model's).
	Model string
	// Since and Until bound the records' times: Since included, Until
	// excluded (zero: unbounded).
	Since, Until time.Time
}

// UsageTotal sums the records of one tenant, model and UTC day.
type UsageTotal struct {
	TenantID, Model, Day                         string
	Requests                                     int
	PromptTokens, CompletionTokens, CachedTokens int64
}

// UsageTotals sums the selected records by tenant, model and UTC day
// (YYYY-MM-DD), ordered by day, tenant and model.
func (s *Store) UsageTotals(ctx context.Context, q UsageQuery) ([]UsageTotal, error) {
	if err := s.FlushUsage(ctx); err != nil {
		return nil, err
	}
	where, args := "1 = 1", []any{}
	if q.Tenant != "" || q.ExactTenant {
		where, args = where+" AND tenant_id = ?", append(args, q.Tenant)
	}
	if q.Model != "" {
		where, args = where+" AND model = ?", append(args, q.Model)
	}
	if !q.Since.IsZero() {
		where, args = where+" AND created_at >= ?", append(args, stamp(q.Since))
	}
	if !q.Until.IsZero() {
		where, args = where+" AND created_at < ?", append(args, stamp(q.Until))
	}
	// The day is the number of whole UTC days since the epoch (integer
	// division, as both databases do it), named in Go.
	rows, err := s.db.QueryContext(ctx, `SELECT tenant_id, model, created_at / `+strconv.FormatInt(int64(24*time.Hour), 10)+` AS day, COUNT(*),
		CAST(SUM(prompt_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT), CAST(SUM(cached_tokens) AS BIGINT) FROM usage WHERE `+where+`
		GROUP BY tenant_id, model, day ORDER BY day, tenant_id, model`, args...)
	if err != nil {
		return nil, fmt.Errorf("sum usage: %w", err)
	}
	defer rows.Close()
	var out []UsageTotal
	for rows.Next() {
		var u UsageTotal
		var day int64
		if err := rows.Scan(&u.TenantID, &u.Model, &day, &u.Requests, &u.PromptTokens, &u.CompletionTokens, &u.CachedTokens); err != nil {
			return nil, fmt.Errorf("sum usage: %w", err)
		}
		u.Day = unstamp(day * int64(24*time.Hour)).Format(time.DateOnly)
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sum usage: %w", err)
	}
	return out, nil
}

// UsageRequestIDs returns the request ids of every record (for checks).
func (s *Store) UsageRequestIDs(ctx context.Context) (map[string]int, error) {
	if err := s.FlushUsage(ctx); err != nil {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, `SELECT request_id FROM usage`)
	if err != nil {
		return nil, fmt.Errorf("read usage: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("read usage: %w", err)
		}
		out[id]++
	}
	return out, rows.Err()
}

// UsageSpend sums the tokens and cost of the answered (200) requests of a
// tenant (keyID "") or of one key, recorded since since.
func (s *Store) UsageSpend(ctx context.Context, tenantID, keyID string, since time.Time) (tokens, microUSD int64, err error) {
	if err := s.FlushUsage(ctx); err != nil {
		return 0, 0, err
	}
	col, id := "tenant_id", tenantID
	if keyID != "" {
		col, id = "key_id", keyID
	}
	err = s.db.QueryRowContext(ctx, `SELECT CAST(COALESCE(SUM(prompt_tokens + completion_tokens), 0) AS BIGINT),
		CAST(COALESCE(SUM(cost_micro_usd), 0) AS BIGINT)
		FROM usage WHERE `+col+` = ? AND status = 200 AND created_at >= ?`, id, stamp(since)).Scan(&tokens, &microUSD)
	if err != nil {
		return 0, 0, fmt.Errorf("sum spend of %s: %w", id, err)
	}
	return tokens, microUSD, nil
}
