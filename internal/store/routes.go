package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// StoredRoute is a route made through the admin API, as stored: its name
// and its spec (a config.Route as JSON), which this package keeps but does
// not read.
type StoredRoute struct {
	Name      string
	Spec      json.RawMessage
	UpdatedAt time.Time
}

// Routes lists every stored route by name.
func (s *Store) Routes(ctx context.Context) ([]StoredRoute, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, spec, updated_at FROM routes ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	defer rows.Close()
	var out []StoredRoute
	for rows.Next() {
		var r StoredRoute
		var spec string
		var updated int64
		if err := rows.Scan(&r.Name, &spec, &updated); err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		r.Spec, r.UpdatedAt = json.RawMessage(spec), unstamp(updated)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	return out, nil
}

// PutRoute creates or replaces the route name with spec, which must be a
// JSON object (ErrInvalid otherwise), and returns it as stored.
func (s *Store) PutRoute(ctx context.Context, name string, spec json.RawMessage) (StoredRoute, error) {
	if name == "" {
		return StoredRoute{}, fmt.Errorf("put route: %w: a name is required", ErrInvalid)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(spec, &obj); err != nil || obj == nil {
		return StoredRoute{}, fmt.Errorf("put route %s: %w: spec is not a JSON object", name, ErrInvalid)
	}
	r := StoredRoute{Name: name, Spec: append(json.RawMessage(nil), spec...), UpdatedAt: unstamp(stamp(s.now()))}
	err := s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO routes (name, spec, updated_at) VALUES (?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at`,
			r.Name, string(r.Spec), stamp(r.UpdatedAt))
		if err != nil {
			return fmt.Errorf("put route %s: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return StoredRoute{}, err
	}
	return r, nil
}

// DeleteRoute forgets the route name; an unknown one wraps ErrNotFound.
func (s *Store) DeleteRoute(ctx context.Context, name string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM routes WHERE name = ?`, name)
		if err != nil {
			return fmt.Errorf("delete route %s: %w", name, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("delete route %s: %w", name, err)
		} else if n == 0 {
			return fmt.Errorf("delete route %s: %w", name, ErrNotFound)
		}
		return nil
	})
}
