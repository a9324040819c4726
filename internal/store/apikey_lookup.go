package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
)

// APIKeyByHash returns the key whose SHA-256 is hash (revoked and expired
// ones included) and its tenant, in one indexed query (api_keys.hash is
// unique): how a gateway replica finds a key made through another one.
// An unknown hash wraps ErrNotFound.
func (s *Store) APIKeyByHash(ctx context.Context, hash []byte) (APIKey, Tenant, error) {
	var k APIKey
	var t Tenant
	var models, limits, tlimits string
	var created, expires, revoked, tcreated int64
	err := s.db.QueryRowContext(ctx, `SELECT k.id, k.tenant_id, k.name, k.hash, k.hint, k.models, k.limits, k.priority,
			k.created_at, k.expires_at, k.revoked_at, t.name, t.limits, t.created_at
		FROM api_keys k JOIN tenants t ON t.id = k.tenant_id WHERE k.hash = ?`, hash).
		Scan(&k.ID, &k.TenantID, &k.Name, &k.Hash, &k.Hint, &models, &limits, &k.Priority,
			&created, &expires, &revoked, &t.Name, &tlimits, &tcreated)
	if errors.Is(err, sql.ErrNoRows) {
		return APIKey{}, Tenant{}, fmt.Errorf("look up key by hash: %w", ErrNotFound)
	}
	if err != nil {
		return APIKey{}, Tenant{}, fmt.Errorf("look up key by hash: %w", err)
	}
	if models != "" {
		if err := json.Unmarshal([]byte(models), &k.Models); err != nil {
			return APIKey{}, Tenant{}, fmt.Errorf("look up key by hash: key %s: models: %w", k.ID, err)
		}
	}
	k.CreatedAt, k.ExpiresAt, k.RevokedAt = unstamp(created), unoptStamp(expires), unoptStamp(revoked)
	k.Limits = rawOrNil(limits)
	t.ID, t.Limits, t.CreatedAt = k.TenantID, rawOrNil(tlimits), unstamp(tcreated)
	return k, t, nil
}
