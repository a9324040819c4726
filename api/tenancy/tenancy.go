// Package tenancy is who may use the platform: tenants, their API keys and
// the operator's admin key. Keys are "sk-stoke-" and 256 random bits; only
// their SHA-256 is stored (a key of that entropy needs no slow hash), and a
// presented key is checked against an in-memory table of the hashes, so
// authenticating a request costs one SHA-256 and a map read; only a hash
// the table lacks (a key made through another gateway replica since the
// last reload) costs one indexed query, and an unknown one is remembered
// for a while. Keys appear in no log, metric or error: only their hints
// ("sk-stoke-AbC…wxyz") do.
//
// The limits' counters live in this process (the default) or, for
// several gateway replicas, in Redis (Options.Redis), where every replica
// admits against the same counters.
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
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

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
	// Now is the clock (default time.Now). Set, it is also the clock of
	// the Redis meters' windows (else Redis's own; see Redis).
	Now func() time.Time

	// Redis, when set, holds the limits' counters (each tenant's and
	// key's window of reservations, requests in flight, and budgets'
	// reservations and spend), shared by every gateway replica on it:
	// each admission is checked and reserved in one Lua script, each end
	// settled in another, so the limits hold across replicas as they do
	// in one process. Their windows run on Redis's clock (TIME) unless Now
	// is set. When Redis cannot be reached, a limited request is refused
	// with 503 service_unavailable, never admitted unlimited. Nil: the
	// counters are this process's own.
	Redis redis.UniversalClient
	// RedisPrefix starts the name of every Redis key (default
	// DefaultRedisPrefix), so that one Redis can serve several installs.
	RedisPrefix string
	// RedisLease is how long an admitted request counts as in flight (for
	// max_concurrent and the budgets' reservations) when its end is never
	// settled, as when its replica died (default DefaultRedisLease). A
	// request running longer stops counting then.
	RedisLease time.Duration
	// Refresh, when positive, is how often Run rereads every key and
	// limit from the state store, so that revocations and limit changes
	// made through other replicas are seen here (0: never, as when one
	// gateway is alone; changes made through this Service are seen at
	// once either way).
	Refresh time.Duration
}

// NegativeTTL is how long an unknown key's hash is remembered as
// unknown: a flood of bad keys costs the state store one query per key
// per NegativeTTL, and a key made through another replica is refused here
// for at most this long when it was tried here before it existed.
const NegativeTTL = 10 * time.Second

// Bounds on looking keys up in the state store.
const (
	// maxNegative bounds the hashes remembered as unknown.
	maxNegative = 1 << 16
	// lookupSlots is how many lookups of different hashes run at once
	// (the same hash's share one).
	lookupSlots = 4
	// lookupTimeout bounds one lookup.
	lookupTimeout = 10 * time.Second
)

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
	// negative holds hashes the store did not know, until when.
	negative map[[sha256.Size]byte]time.Time
	// generation counts reloads: a lookup that raced one (and may have
	// read the store before a change this Service made) adds nothing.
	generation uint64

	// lookups coalesces concurrent lookups of one hash; lookupSlots
	// bounds those of different hashes.
	lookups     singleflight.Group
	lookupSlots chan struct{}

	meters meters
	usage  *usageLog // nil: usage records off
}

// New returns a Service with the state store's keys loaded.
func New(ctx context.Context, o Options) (*Service, error) {
	if o.Store == nil {
		return nil, errors.New("new tenancy service: a state store is required")
	}
	serverClock := o.Now == nil
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Service{o: o, lookupSlots: make(chan struct{}, lookupSlots)}
	if o.RecordUsage {
		s.usage = newUsageLog(o.Store, o.Logger.With("component", "usage"), o.Registerer)
	}
	if o.Redis != nil {
		s.meters = newRedisMeters(ctx, o.Redis, o.RedisPrefix, o.RedisLease, serverClock, s.spendSince, o.Logger.With("component", "limits"))
	} else {
		s.meters = &memMeters{spend: s.spendSince}
	}
	if o.AdminKey != "" {
		s.adminHash = sha256.Sum256([]byte(o.AdminKey))
	}
	if err := s.Reload(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Run rereads the keys and limits every Options.Refresh (Reload) until
// ctx ends; with no Refresh it returns at once. A failed reload is logged
// and the tables of the last one kept.
func (s *Service) Run(ctx context.Context) {
	if s.o.Refresh <= 0 {
		return
	}
	t := time.NewTicker(s.o.Refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.Reload(ctx); err != nil && ctx.Err() == nil {
				s.o.Logger.Error("reload API keys and limits", "err", err)
			}
		}
	}
}

// Reload rereads every key and tenant's limits from the state store into
// the in-memory tables and forgets the hashes remembered as unknown: what
// other replicas changed (a revoked key, new limits) holds here from now
// on. Run calls it every Options.Refresh.
func (s *Service) Reload(ctx context.Context) error {
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
	s.negative = map[[sha256.Size]byte]time.Time{}
	s.generation++
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

// Authenticate is AuthenticateContext with no deadline but the lookup's
// own, for callers without a context; prefer AuthenticateContext.
func (s *Service) Authenticate(token string) (Principal, error) {
	return s.AuthenticateContext(context.Background(), token)
}

// AuthenticateContext returns the principal of a tenant key, or an error
// wrapping ErrInvalidKey (unknown, revoked or expired) whose message shows
// only the key's hint. A key this Service has not loaded is looked up in
// the state store (it may have been made through another replica); a
// failure of that lookup is an error not wrapping ErrInvalidKey, to answer
// as the server's failure (503), not the client's.
func (s *Service) AuthenticateContext(ctx context.Context, token string) (Principal, error) {
	h := sha256.Sum256([]byte(token))
	s.mu.RLock()
	k, ok := s.byHash[h]
	s.mu.RUnlock()
	if !ok {
		var err error
		if k, ok, err = s.lookup(ctx, h); err != nil {
			return Principal{}, fmt.Errorf("authenticate %s: %w", Hint(token), err)
		}
	}
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

// lookup finds the key whose hash is h in the state store and adds it,
// with its tenant's limits, to the tables; ok is false for a hash the
// store does not know, which is then remembered as unknown for
// NegativeTTL. Concurrent lookups of one hash share one query, and at
// most lookupSlots queries run at once.
func (s *Service) lookup(ctx context.Context, h [sha256.Size]byte) (k store.APIKey, ok bool, err error) {
	now := s.o.Now()
	s.mu.RLock()
	until, unknown := s.negative[h]
	s.mu.RUnlock()
	if unknown && now.Before(until) {
		return store.APIKey{}, false, nil
	}
	ch := s.lookups.DoChan(string(h[:]), func() (any, error) {
		// Shared by every caller waiting on this hash: none's end ends it.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lookupTimeout)
		defer cancel()
		select {
		case s.lookupSlots <- struct{}{}:
			defer func() { <-s.lookupSlots }()
		case <-ctx.Done():
			return nil, fmt.Errorf("look up the key: %w", ctx.Err())
		}
		s.mu.RLock()
		gen := s.generation
		s.mu.RUnlock()
		k, t, err := s.o.Store.APIKeyByHash(ctx, h[:])
		if errors.Is(err, store.ErrNotFound) {
			s.rememberUnknown(gen, h, now)
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("look up the key: %w", err)
		}
		if err := s.learn(gen, h, k, t); err != nil {
			return nil, err
		}
		return k, nil
	})
	select {
	case r := <-ch:
		if r.Err != nil || r.Val == nil {
			return store.APIKey{}, false, r.Err
		}
		return r.Val.(store.APIKey), true, nil
	case <-ctx.Done():
		return store.APIKey{}, false, fmt.Errorf("look up the key: %w", ctx.Err())
	}
}

// rememberUnknown notes h as unknown to the store until NegativeTTL after
// now (unless maxNegative live hashes are noted already, or the tables
// were reloaded since generation gen).
func (s *Service) rememberUnknown(gen uint64, h [sha256.Size]byte, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.generation {
		return
	}
	if len(s.negative) >= maxNegative {
		for k, until := range s.negative {
			if !now.Before(until) {
				delete(s.negative, k)
			}
		}
		if len(s.negative) >= maxNegative {
			return
		}
	}
	s.negative[h] = now.Add(NegativeTTL)
}

// learn adds the key k (hash h), found in the store, and its tenant t to
// the tables, unless they were reloaded since generation gen (the reload
// may know better).
func (s *Service) learn(gen uint64, h [sha256.Size]byte, k store.APIKey, t store.Tenant) error {
	kl, err := parseLimits(k.Limits)
	if err != nil {
		return fmt.Errorf("load key %s: %w", k.ID, err)
	}
	tl, err := parseLimits(t.Limits)
	if err != nil {
		return fmt.Errorf("load tenant %s: %w", t.ID, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.generation {
		return nil
	}
	s.byHash[h], s.keyLimits[k.ID] = k, kl
	s.tenantLimits[t.ID], s.tenantNames[t.ID] = tl, t.Name
	return nil
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
	return t, s.Reload(ctx)
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
	return t, s.Reload(ctx)
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
	if err := s.Reload(ctx); err != nil {
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
	return s.Reload(ctx)
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
	return k, key, s.Reload(ctx)
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
