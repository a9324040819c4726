package tenancy

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stokehq/stoke/api/tenancy/redistest"
	"github.com/stokehq/stoke/internal/store"
)

func newService(t *testing.T, admin string, now func() time.Time) *Service {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := New(context.Background(), Options{Store: st, AdminKey: admin, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestKeysAuthenticate(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	s := newService(t, "admin-secret", clock)
	if s.HasKeys() || !s.HasAdminKey() || !s.IsAdmin("admin-secret") || s.IsAdmin("admin-secreT") || s.IsAdmin("") {
		t.Fatal("admin key checks are wrong")
	}
	acme, err := s.CreateTenant(ctx, "acme", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateTenant(ctx, "acme", Limits{}); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate tenant: %v", err)
	}
	k, key, err := s.CreateKey(ctx, KeyRequest{Tenant: "acme", Name: "ci", Models: []string{"chat"}, ExpiresIn: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, KeyPrefix) || len(key) < len(KeyPrefix)+40 || strings.Contains(k.Hint, key[len(KeyPrefix)+3:len(key)-4]) {
		t.Fatalf("key %q, hint %q", key, k.Hint)
	}
	if _, other, _ := s.CreateKey(ctx, KeyRequest{Tenant: acme.ID}); other == key {
		t.Fatal("two keys are the same")
	}
	p, err := s.Authenticate(key)
	if err != nil || p.TenantID != acme.ID || p.KeyID != k.ID || !p.Allows("chat") || p.Allows("other") {
		t.Fatalf("Authenticate = %+v, %v", p, err)
	}
	for _, bad := range []string{"", "sk-stoke-nope", key + "x", key[:len(key)-1]} {
		if _, err := s.Authenticate(bad); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Authenticate(%q) = %v, want ErrInvalidKey", bad, err)
		} else if len(bad) > 20 && strings.Contains(err.Error(), bad[12:len(bad)-4]) {
			t.Errorf("the error shows the key: %v", err)
		}
	}
	now = now.Add(2 * time.Hour)
	if _, err := s.Authenticate(key); !errors.Is(err, ErrInvalidKey) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("an expired key: %v", err)
	}
	_, key2, _ := s.CreateKey(ctx, KeyRequest{Tenant: "acme"})
	keys, _ := s.Keys(ctx, "acme")
	if len(keys) != 3 {
		t.Fatalf("%d keys listed, want 3", len(keys))
	}
	last := keys[2]
	if _, err := s.RevokeKey(ctx, last.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(key2); !errors.Is(err, ErrInvalidKey) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("a revoked key: %v", err)
	}
	if _, _, err := s.CreateKey(ctx, KeyRequest{Tenant: "nobody"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("key for an unknown tenant: %v", err)
	}
	if _, _, err := s.CreateKey(ctx, KeyRequest{Tenant: "acme", ExpiresIn: "soon"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad expires_in: %v", err)
	}
	if err := s.DeleteTenant(ctx, acme.ID); err != nil {
		t.Fatal(err)
	}
	if s.HasKeys() {
		t.Fatal("the deleted tenant's keys are still known")
	}
}

// meterKind is where a test's limits' counters live.
type meterKind struct {
	name string
	// redis: in a private Redis (redistest), else in the process.
	redis bool
}

// meterKinds are the meters every limits test runs against.
func meterKinds() []meterKind {
	return []meterKind{{name: "memory"}, {name: "redis", redis: true}}
}

// client is a client of a fresh private Redis for the redis kind (nil
// for memory).
func (k meterKind) client(t *testing.T) redis.UniversalClient {
	t.Helper()
	if !k.redis {
		return nil
	}
	c := redis.NewClient(&redis.Options{Addr: redistest.Start(t)})
	t.Cleanup(func() { c.Close() })
	return c
}

// service is a Service of o (on a fresh store unless o has one) with the
// kind's meters.
func (k meterKind) service(t *testing.T, o Options) *Service {
	t.Helper()
	if o.Store == nil {
		st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		o.Store = st
	}
	if o.Redis == nil {
		o.Redis = k.client(t)
	}
	s, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// testService is a Service of o on a fresh store unless o has one (its
// meters o's: in Redis when o.Redis is set).
func testService(t *testing.T, o Options) *Service {
	t.Helper()
	return meterKind{}.service(t, o)
}

// redisClient is a client of a fresh private Redis.
func redisClient(t *testing.T) redis.UniversalClient {
	t.Helper()
	return meterKind{redis: true}.client(t)
}
