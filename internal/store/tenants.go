package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ErrExists reports a record whose unique name is taken.
var ErrExists = errors.New("already exists")

// Tenant is a customer of the platform: the owner of API keys, files,
// batches and usage.
type Tenant struct {
	ID   string
	Name string
	// Limits is the tenant's limits (JSON; nil for none), which the
	// tenancy package reads.
	Limits    json.RawMessage
	CreatedAt time.Time
}

// APIKey is a tenant's API key as stored: its SHA-256 hash, never the key.
type APIKey struct {
	ID       string
	TenantID string
	Name     string
	// Hash is the SHA-256 of the key.
	Hash []byte
	// Hint shows the key's first and last characters, to tell keys apart.
	Hint string
	// Models, when not empty, are the only models the key may use.
	Models []string
	// Limits is the key's own limits (JSON; nil for none).
	Limits json.RawMessage
	// Priority is the key's priority class ("" for the default).
	Priority string
	// CreatedAt, ExpiresAt (zero: never) and RevokedAt (zero: not revoked).
	CreatedAt, ExpiresAt, RevokedAt time.Time
}

// CreateTenant records t. A name already taken wraps ErrExists.
func (s *Store) CreateTenant(ctx context.Context, t Tenant) error {
	if t.ID == "" || t.Name == "" {
		return fmt.Errorf("create tenant %q: %w: id and name are required", t.Name, ErrInvalid)
	}
	if t.CreatedAt.IsZero() {
		t.CreatedAt = s.now()
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO tenants (id, name, limits, created_at) VALUES (?, ?, ?, ?)`, t.ID, t.Name, string(t.Limits), stamp(t.CreatedAt))
		if err != nil {
			if isUniqueViolation(err) {
				return fmt.Errorf("create tenant %q: %w", t.Name, ErrExists)
			}
			return fmt.Errorf("create tenant %q: %w", t.Name, err)
		}
		return nil
	})
}

// Tenants lists every tenant, oldest first.
func (s *Store) Tenants(ctx context.Context) ([]Tenant, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, name, limits, created_at FROM tenants ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	defer rows.Close()
	var out []Tenant
	for rows.Next() {
		var t Tenant
		var limits string
		var created int64
		if err := rows.Scan(&t.ID, &t.Name, &limits, &created); err != nil {
			return nil, fmt.Errorf("list tenants: %w", err)
		}
		t.CreatedAt, t.Limits = unstamp(created), rawOrNil(limits)
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	return out, nil
}

// DeleteTenant forgets the tenant id and its keys; an unknown one wraps
// ErrNotFound.
func (s *Store) DeleteTenant(ctx context.Context, id string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM tenants WHERE id = ?`, id)
		if err != nil {
			return fmt.Errorf("delete tenant %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("delete tenant %s: %w", id, ErrNotFound)
		}
		return nil
	})
}

// CreateAPIKey records k; its tenant must exist (ErrNotFound otherwise).
func (s *Store) CreateAPIKey(ctx context.Context, k APIKey) error {
	if k.ID == "" || k.TenantID == "" || len(k.Hash) == 0 {
		return fmt.Errorf("create key %q: %w: id, tenant and hash are required", k.ID, ErrInvalid)
	}
	if k.CreatedAt.IsZero() {
		k.CreatedAt = s.now()
	}
	models := ""
	if len(k.Models) > 0 {
		b, err := json.Marshal(k.Models)
		if err != nil {
			return fmt.Errorf("create key %s: %w", k.ID, err)
		}
		models = string(b)
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		var one int
		if err := tx.QueryRowContext(ctx, `SELECT 1 FROM tenants WHERE id = ?`, k.TenantID).Scan(&one); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("create key for tenant %s: %w", k.TenantID, ErrNotFound)
			}
			return fmt.Errorf("create key for tenant %s: %w", k.TenantID, err)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO api_keys (id, tenant_id, name, hash, hint, models, limits, priority, created_at, expires_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, k.ID, k.TenantID, k.Name, k.Hash, k.Hint, models, string(k.Limits), k.Priority,
			stamp(k.CreatedAt), optStamp(k.ExpiresAt))
		if err != nil {
			return fmt.Errorf("create key %s: %w", k.ID, err)
		}
		return nil
	})
}

// APIKeys lists the keys of tenant (every key when tenant is ""), oldest
// first, revoked and expired ones included.
func (s *Store) APIKeys(ctx context.Context, tenant string) ([]APIKey, error) {
	q := `SELECT id, tenant_id, name, hash, hint, models, limits, priority, created_at, expires_at, revoked_at FROM api_keys`
	var args []any
	if tenant != "" {
		q, args = q+` WHERE tenant_id = ?`, []any{tenant}
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		var k APIKey
		var models, limits string
		var created, expires, revoked int64
		if err := rows.Scan(&k.ID, &k.TenantID, &k.Name, &k.Hash, &k.Hint, &models, &limits, &k.Priority, &created, &expires, &revoked); err != nil {
			return nil, fmt.Errorf("list keys: %w", err)
		}
		if models != "" {
			if err := json.Unmarshal([]byte(models), &k.Models); err != nil {
				return nil, fmt.Errorf("list keys: key %s: models: %w", k.ID, err)
			}
		}
		k.CreatedAt, k.ExpiresAt, k.RevokedAt = unstamp(created), unoptStamp(expires), unoptStamp(revoked)
		k.Limits = rawOrNil(limits)
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return out, nil
}

// RevokeAPIKey marks the key id revoked now (once: a revoked key keeps
// its first revocation time); an unknown one wraps ErrNotFound.
func (s *Store) RevokeAPIKey(ctx context.Context, id string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE api_keys SET revoked_at = CASE WHEN revoked_at = 0 THEN ? ELSE revoked_at END WHERE id = ?`,
			stamp(s.now()), id)
		if err != nil {
			return fmt.Errorf("revoke key %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("revoke key %s: %w", id, ErrNotFound)
		}
		return nil
	})
}

// SetTenantLimits replaces the tenant id's limits (nil: none).
func (s *Store) SetTenantLimits(ctx context.Context, id string, limits json.RawMessage) error {
	return s.setLimits(ctx, "tenants", id, limits)
}

// SetAPIKeyLimits replaces the key id's limits (nil: none).
func (s *Store) SetAPIKeyLimits(ctx context.Context, id string, limits json.RawMessage) error {
	return s.setLimits(ctx, "api_keys", id, limits)
}

// setLimits sets the limits column of a row of table (tenants or
// api_keys, never a caller's string).
func (s *Store) setLimits(ctx context.Context, table, id string, limits json.RawMessage) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE `+table+` SET limits = ? WHERE id = ?`, string(limits), id)
		if err != nil {
			return fmt.Errorf("set limits of %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("set limits of %s: %w", id, ErrNotFound)
		}
		return nil
	})
}

// rawOrNil is a stored JSON value, nil when empty.
func rawOrNil(s string) json.RawMessage {
	if s == "" {
		return nil
	}
	return json.RawMessage(s)
}

// optStamp is stamp for a time that may be unset (zero: 0).
func optStamp(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return stamp(t)
}

// unoptStamp is unstamp for a time that may be unset.
func unoptStamp(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return unstamp(ns)
}
