// Package tenancy is who may use the platform: tenants, their API keys and
// the operator's admin key. Keys are "sk-stoke-" and 256 random bits; only
// their SHA-256 is stored (a key of that entropy needs no slow hash), and a
// presented key is checked against an in-memory table of the hashes, so
// authenticating a request costs one SHA-256 and a map read, never a
// database query. Keys appear in no log, metric or error: only their
// hints ("sk-stoke-AbC…wxyz") do.
package tenancy

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/store"
)

// KeyPrefix starts every tenant key.
const KeyPrefix = "sk-stoke-"

// Sentinel errors, matched with errors.Is. Read-only.
var (
	// ErrInvalidKey reports a key that is unknown, revoked or expired.
	ErrInvalidKey = errors.New("invalid API key")
	// ErrNotFound reports an unknown tenant or key.
	ErrNotFound = errors.New("not found")
	// ErrExists reports a tenant name already taken.
	ErrExists = errors.New("already exists")
	// ErrInvalid reports a bad request field.
	ErrInvalid = errors.New("invalid")
)

// Options configure a Service.
type Options struct {
	Store *store.Store
	// AdminKey, when set, is the key of the admin endpoints.
	AdminKey string
	// Price, when set, is a model's price, for money budgets and the
	// usage records' cost.
	Price func(model string) config.Price
	// RecordUsage turns usage records on: one per admitted request,
	// durable before its answer's end reaches the client.
	RecordUsage bool
	// Registerer, when set, receives the stoke_tenant_* series.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Service authenticates keys and manages tenants and keys. Safe for
// concurrent use.
type Service struct {
	o         Options
	adminHash [sha256.Size]byte

	mu           sync.RWMutex
	byHash       map[[sha256.Size]byte]store.APIKey
	tenantLimits map[string]Limits // by tenant id
	keyLimits    map[string]Limits // by key id
	tenantNames  map[string]string // by tenant id

	limits limiter
	usage  *usageLog // nil: usage records off
}

// New returns a Service with the state store's keys loaded.
func New(ctx context.Context, o Options) (*Service, error) {
	if o.Store == nil {
		return nil, errors.New("new tenancy service: a state store is required")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Service{o: o}
	if o.RecordUsage {
		s.usage = newUsageLog(o.Store, o.Logger.With("component", "usage"), o.Registerer)
	}
	if o.AdminKey != "" {
		s.adminHash = sha256.Sum256([]byte(o.AdminKey))
	}
	if err := s.reload(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// reload rereads every key and tenant's limits into the in-memory tables.
func (s *Service) reload(ctx context.Context) error {
	keys, err := s.o.Store.APIKeys(ctx, "")
	if err != nil {
		return fmt.Errorf("load API keys: %w", err)
	}
	tenants, err := s.o.Store.Tenants(ctx)
	if err != nil {
		return fmt.Errorf("load tenants: %w", err)
	}
	m := make(map[[sha256.Size]byte]store.APIKey, len(keys))
	kl, tl, names := map[string]Limits{}, map[string]Limits{}, map[string]string{}
	for _, k := range keys {
		var h [sha256.Size]byte
		copy(h[:], k.Hash)
		m[h] = k
		if kl[k.ID], err = parseLimits(k.Limits); err != nil {
			return fmt.Errorf("load key %s: %w", k.ID, err)
		}
	}
	for _, t := range tenants {
		names[t.ID] = t.Name
		if tl[t.ID], err = parseLimits(t.Limits); err != nil {
			return fmt.Errorf("load tenant %s: %w", t.ID, err)
		}
	}
	s.mu.Lock()
	s.byHash, s.keyLimits, s.tenantLimits, s.tenantNames = m, kl, tl, names
	s.mu.Unlock()
	return nil
}

// CallerOf is who sends a request, for the activator's route rules
// (activator.Options.CallerOf): its key's tenant, by id and name, and the
// key's priority class.
func (s *Service) CallerOf(ctx context.Context) activator.Caller {
	p, ok := FromContext(ctx)
	if !ok {
		return activator.Caller{}
	}
	s.mu.RLock()
	name := s.tenantNames[p.TenantID]
	s.mu.RUnlock()
	return activator.Caller{TenantID: p.TenantID, TenantName: name, Tier: p.Priority}
}

// HasAdminKey reports whether an admin key is configured.
func (s *Service) HasAdminKey() bool { return s.o.AdminKey != "" }

// HasKeys reports whether any tenant key is recorded (revoked or not).
func (s *Service) HasKeys() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.byHash) > 0
}

// IsAdmin reports whether token is the admin key (compared in constant
// time).
func (s *Service) IsAdmin(token string) bool {
	if s.o.AdminKey == "" {
		return false
	}
	h := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(h[:], s.adminHash[:]) == 1
}

// Authenticate returns the principal of a tenant key, or an error wrapping
// ErrInvalidKey (unknown, revoked or expired) whose message shows only the
// key's hint.
func (s *Service) Authenticate(token string) (Principal, error) {
	h := sha256.Sum256([]byte(token))
	s.mu.RLock()
	k, ok := s.byHash[h]
	s.mu.RUnlock()
	switch {
	case !ok || subtle.ConstantTimeCompare(h[:], k.Hash) != 1:
		return Principal{}, fmt.Errorf("%w: incorrect API key provided: %s", ErrInvalidKey, Hint(token))
	case !k.RevokedAt.IsZero():
		return Principal{}, fmt.Errorf("%w: the API key %s was revoked", ErrInvalidKey, k.Hint)
	case !k.ExpiresAt.IsZero() && !s.o.Now().Before(k.ExpiresAt):
		return Principal{}, fmt.Errorf("%w: the API key %s expired", ErrInvalidKey, k.Hint)
	}
	return Principal{TenantID: k.TenantID, KeyID: k.ID, Models: k.Models, Priority: k.Priority}, nil
}

// Hint is what may be shown of a key: its prefix and first and last
// characters, never enough to use it.
func Hint(key string) string {
	if len(key) < len(KeyPrefix)+12 {
		return "***"
	}
	return key[:len(KeyPrefix)+3] + "…" + key[len(key)-4:]
}

// CreateTenant records a tenant named name with limits.
func (s *Service) CreateTenant(ctx context.Context, name string, limits Limits) (store.Tenant, error) {
	name = strings.TrimSpace(name)
	if name == "" || len(name) > 128 {
		return store.Tenant{}, fmt.Errorf("%w: a tenant's name is 1 to 128 characters", ErrInvalid)
	}
	raw, err := encodeLimits(limits)
	if err != nil {
		return store.Tenant{}, err
	}
	id, err := newID("tnt_")
	if err != nil {
		return store.Tenant{}, err
	}
	t := store.Tenant{ID: id, Name: name, Limits: raw, CreatedAt: s.o.Now().UTC().Round(0)}
	if err := s.o.Store.CreateTenant(ctx, t); err != nil {
		if errors.Is(err, store.ErrExists) {
			return store.Tenant{}, fmt.Errorf("%w: a tenant named %q exists", ErrExists, name)
		}
		return store.Tenant{}, err
	}
	return t, s.reload(ctx)
}

// SetTenantLimits replaces a tenant's limits (by id or name).
func (s *Service) SetTenantLimits(ctx context.Context, tenant string, limits Limits) (store.Tenant, error) {
	t, err := s.tenant(ctx, tenant)
	if err != nil {
		return store.Tenant{}, err
	}
	if t.Limits, err = encodeLimits(limits); err != nil {
		return store.Tenant{}, err
	}
	if err := s.o.Store.SetTenantLimits(ctx, t.ID, t.Limits); err != nil {
		return store.Tenant{}, err
	}
	return t, s.reload(ctx)
}

// SetKeyLimits replaces a key's own limits.
func (s *Service) SetKeyLimits(ctx context.Context, id string, limits Limits) (store.APIKey, error) {
	raw, err := encodeLimits(limits)
	if err != nil {
		return store.APIKey{}, err
	}
	return s.changeKey(ctx, id, func() error { return s.o.Store.SetAPIKeyLimits(ctx, id, raw) })
}

// changeKey applies change to the key id, reloads the keys and returns it.
func (s *Service) changeKey(ctx context.Context, id string, change func() error) (store.APIKey, error) {
	if err := change(); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return store.APIKey{}, fmt.Errorf("%w: no key %s", ErrNotFound, id)
		}
		return store.APIKey{}, err
	}
	if err := s.reload(ctx); err != nil {
		return store.APIKey{}, err
	}
	return s.key(ctx, id)
}

// encodeLimits is limits as stored (nil for none).
func encodeLimits(l Limits) (json.RawMessage, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	if l.none() {
		return nil, nil
	}
	return json.Marshal(l)
}

// LimitsOf reads stored limits (for showing them).
func LimitsOf(raw json.RawMessage) Limits {
	l, _ := parseLimits(raw)
	return l
}

// Tenants lists the tenants.
func (s *Service) Tenants(ctx context.Context) ([]store.Tenant, error) { return s.o.Store.Tenants(ctx) }

// DeleteTenant forgets a tenant and its keys.
func (s *Service) DeleteTenant(ctx context.Context, id string) error {
	if err := s.o.Store.DeleteTenant(ctx, id); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: no tenant %s", ErrNotFound, id)
		}
		return err
	}
	return s.reload(ctx)
}

// KeyRequest is a key to create.
type KeyRequest struct {
	// Tenant is the tenant's id or name.
	Tenant string `json:"tenant"`
	Name   string `json:"name"`
	// Models, when set, are the only models the key may use.
	Models []string `json:"models"`
	// ExpiresIn, when set, is the key's lifetime ("720h").
	ExpiresIn string `json:"expires_in"`
	// Limits are the key's own, on top of its tenant's.
	Limits Limits `json:"limits"`
	// Priority is the key's priority class: interactive, standard (the
	// default) or batch.
	Priority string `json:"priority"`
}

// CreateKey makes a new key and returns its record and the key itself,
// which is not kept: this is the only time anyone sees it.
func (s *Service) CreateKey(ctx context.Context, req KeyRequest) (store.APIKey, string, error) {
	tenant, err := s.tenant(ctx, req.Tenant)
	if err != nil {
		return store.APIKey{}, "", err
	}
	now := s.o.Now().UTC().Round(0)
	k := store.APIKey{TenantID: tenant.ID, Name: req.Name, Models: req.Models, Priority: req.Priority, CreatedAt: now}
	if _, ok := classPriority(req.Priority); !ok && req.Priority != "" {
		return store.APIKey{}, "", fmt.Errorf("%w: priority is interactive, standard or batch, not %q", ErrInvalid, req.Priority)
	}
	if k.Limits, err = encodeLimits(req.Limits); err != nil {
		return store.APIKey{}, "", err
	}
	if req.ExpiresIn != "" {
		d, err := time.ParseDuration(req.ExpiresIn)
		if err != nil || d <= 0 {
			return store.APIKey{}, "", fmt.Errorf("%w: expires_in %q is not a positive duration", ErrInvalid, req.ExpiresIn)
		}
		k.ExpiresAt = now.Add(d)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return store.APIKey{}, "", fmt.Errorf("create key: %w", err)
	}
	key := KeyPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	h := sha256.Sum256([]byte(key))
	k.Hash, k.Hint = h[:], Hint(key)
	if k.ID, err = newID("key_"); err != nil {
		return store.APIKey{}, "", err
	}
	if err := s.o.Store.CreateAPIKey(ctx, k); err != nil {
		return store.APIKey{}, "", err
	}
	return k, key, s.reload(ctx)
}

// tenant finds a tenant by id or name.
func (s *Service) tenant(ctx context.Context, idOrName string) (store.Tenant, error) {
	ts, err := s.o.Store.Tenants(ctx)
	if err != nil {
		return store.Tenant{}, err
	}
	for _, t := range ts {
		if t.ID == idOrName || t.Name == idOrName {
			return t, nil
		}
	}
	return store.Tenant{}, fmt.Errorf("%w: no tenant %q", ErrNotFound, idOrName)
}

// Keys lists the keys of a tenant (its id or name; "" for every tenant's).
func (s *Service) Keys(ctx context.Context, tenant string) ([]store.APIKey, error) {
	id := ""
	if tenant != "" {
		t, err := s.tenant(ctx, tenant)
		if err != nil {
			return nil, err
		}
		id = t.ID
	}
	return s.o.Store.APIKeys(ctx, id)
}

// RevokeKey revokes the key id at once and returns it.
func (s *Service) RevokeKey(ctx context.Context, id string) (store.APIKey, error) {
	return s.changeKey(ctx, id, func() error { return s.o.Store.RevokeAPIKey(ctx, id) })
}

// key reads the key id back.
func (s *Service) key(ctx context.Context, id string) (store.APIKey, error) {
	keys, err := s.o.Store.APIKeys(ctx, "")
	if err != nil {
		return store.APIKey{}, err
	}
	for _, k := range keys {
		if k.ID == id {
			return k, nil
		}
	}
	return store.APIKey{}, fmt.Errorf("%w: no key %s", ErrNotFound, id)
}

// newID is prefix and 64 random bits in hex.
func newID(prefix string) (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("new id: %w", err)
	}
	return prefix + hex.EncodeToString(b[:]), nil
}
