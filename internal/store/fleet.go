package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// Endpoint is a routable replica of a deployment, as the leading gateway
// publishes it for the others.
type Endpoint struct {
	Deployment, Replica, Addr string
	Capacity                  int
}

// CanaryShare is a deployment's canary pool and its share of requests.
type CanaryShare struct {
	Deployment, Pool string
	Percent          int
}

// PutEndpoint records a routable replica (replacing one of the same id).
func (s *Store) PutEndpoint(ctx context.Context, e Endpoint) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO fleet_endpoints (deployment, replica, addr, capacity) VALUES (?, ?, ?, ?)
			ON CONFLICT (deployment, replica) DO UPDATE SET addr = excluded.addr, capacity = excluded.capacity`,
			e.Deployment, e.Replica, e.Addr, e.Capacity)
		if err != nil {
			return fmt.Errorf("put endpoint %s/%s: %w", e.Deployment, e.Replica, err)
		}
		return nil
	})
}

// DeleteEndpoint removes a replica; removing one not there is no error.
func (s *Store) DeleteEndpoint(ctx context.Context, deployment, replica string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM fleet_endpoints WHERE deployment = ? AND replica = ?`, deployment, replica); err != nil {
			return fmt.Errorf("delete endpoint %s/%s: %w", deployment, replica, err)
		}
		return nil
	})
}

// SetCanaryShare records a deployment's canary pool and share; an empty
// pool removes it.
func (s *Store) SetCanaryShare(ctx context.Context, c CanaryShare) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		var err error
		if c.Pool == "" {
			_, err = tx.ExecContext(ctx, `DELETE FROM fleet_canaries WHERE deployment = ?`, c.Deployment)
		} else {
			_, err = tx.ExecContext(ctx, `INSERT INTO fleet_canaries (deployment, pool, percent) VALUES (?, ?, ?)
				ON CONFLICT (deployment) DO UPDATE SET pool = excluded.pool, percent = excluded.percent`, c.Deployment, c.Pool, c.Percent)
		}
		if err != nil {
			return fmt.Errorf("set the canary share of %s: %w", c.Deployment, err)
		}
		return nil
	})
}

// ClearFleet removes every published endpoint and canary share: a new
// leader publishes its own.
func (s *Store) ClearFleet(ctx context.Context) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		for _, table := range []string{"fleet_endpoints", "fleet_canaries"} {
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+table); err != nil {
				return fmt.Errorf("clear %s: %w", table, err)
			}
		}
		return nil
	})
}

// Fleet returns the published endpoints and canary shares.
func (s *Store) Fleet(ctx context.Context) ([]Endpoint, []CanaryShare, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT deployment, replica, addr, capacity FROM fleet_endpoints ORDER BY deployment, replica`)
	if err != nil {
		return nil, nil, fmt.Errorf("list endpoints: %w", err)
	}
	defer rows.Close()
	var eps []Endpoint
	for rows.Next() {
		var e Endpoint
		if err := rows.Scan(&e.Deployment, &e.Replica, &e.Addr, &e.Capacity); err != nil {
			return nil, nil, fmt.Errorf("list endpoints: %w", err)
		}
		eps = append(eps, e)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("list endpoints: %w", err)
	}
	crows, err := s.db.QueryContext(ctx, `SELECT deployment, pool, percent FROM fleet_canaries ORDER BY deployment`)
	if err != nil {
		return nil, nil, fmt.Errorf("list canary shares: %w", err)
	}
	defer crows.Close()
	var cs []CanaryShare
	for crows.Next() {
		var c CanaryShare
		if err := crows.Scan(&c.Deployment, &c.Pool, &c.Percent); err != nil {
			return nil, nil, fmt.Errorf("list canary shares: %w", err)
		}
		cs = append(cs, c)
	}
	return eps, cs, crows.Err()
}

// ReportLoad replaces gateway's requests in flight (and buffered) per
// deployment.
func (s *Store) ReportLoad(ctx context.Context, gateway string, load map[string]float64) error {
	now := stamp(s.now())
	return s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM fleet_load WHERE gateway = ?`, gateway); err != nil {
			return fmt.Errorf("report the load of gateway %s: %w", gateway, err)
		}
		for d, c := range load {
			if _, err := tx.ExecContext(ctx, `INSERT INTO fleet_load (gateway, deployment, concurrency, updated_at) VALUES (?, ?, ?, ?)`,
				gateway, d, c, now); err != nil {
				return fmt.Errorf("report the load of gateway %s: %w", gateway, err)
			}
		}
		return nil
	})
}

// Load sums, per deployment, the load the gateways other than except
// reported within maxAge.
func (s *Store) Load(ctx context.Context, except string, maxAge time.Duration) (map[string]float64, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT deployment, concurrency FROM fleet_load WHERE gateway <> ? AND updated_at >= ?`,
		except, stamp(s.now().Add(-maxAge)))
	if err != nil {
		return nil, fmt.Errorf("read the gateways' load: %w", err)
	}
	defer rows.Close()
	out := map[string]float64{}
	for rows.Next() {
		var d string
		var c float64
		if err := rows.Scan(&d, &c); err != nil {
			return nil, fmt.Errorf("read the gateways' load: %w", err)
		}
		out[d] += c
	}
	return out, rows.Err()
}
