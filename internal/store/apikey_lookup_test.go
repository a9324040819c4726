package store_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/internal/store/pgtest"
)

// TestAPIKeyByHash runs on SQLite and on PostgreSQL (pgtest's, skipped
// where it is not installed).
func TestAPIKeyByHash(t *testing.T) {
	for _, db := range []struct {
		name  string
		state func(t *testing.T) string // OpenState's state
	}{
		{"sqlite", func(*testing.T) string { return "" }},
		{"postgres", func(t *testing.T) string { return pgtest.Start(t) }},
	} {
		t.Run(db.name, func(t *testing.T) {
			st, err := store.OpenState(context.Background(), db.state(t), t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			testAPIKeyByHash(t, st)
		})
	}
}

func testAPIKeyByHash(t *testing.T, st *store.Store) {
	ctx := context.Background()
	created := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	tnt := store.Tenant{ID: "tnt_1", Name: "acme", Limits: json.RawMessage(`{"requests_per_minute":5}`), CreatedAt: created}
	if err := st.CreateTenant(ctx, tnt); err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256([]byte("sk-stoke-one"))
	want := store.APIKey{ID: "key_1", TenantID: "tnt_1", Name: "ci", Hash: h[:], Hint: "sk-stoke-one…", Models: []string{"chat"},
		Limits: json.RawMessage(`{"max_tokens":40}`), Priority: "batch", CreatedAt: created, ExpiresAt: created.Add(time.Hour)}
	if err := st.CreateAPIKey(ctx, want); err != nil {
		t.Fatal(err)
	}
	if err := st.RevokeAPIKey(ctx, "key_1"); err != nil {
		t.Fatal(err)
	}
	other := sha256.Sum256([]byte("sk-stoke-unknown"))
	for _, tc := range []struct {
		name    string
		hash    []byte
		wantErr error
	}{
		{"known", h[:], nil},
		{"unknown", other[:], store.ErrNotFound},
		{"empty", nil, store.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, gotTenant, err := st.APIKeyByHash(ctx, tc.hash)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("APIKeyByHash: %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr != nil {
				return
			}
			if k.ID != want.ID || k.TenantID != want.TenantID || k.Name != want.Name || !bytes.Equal(k.Hash, want.Hash) || k.Hint != want.Hint ||
				len(k.Models) != 1 || k.Models[0] != "chat" || string(k.Limits) != string(want.Limits) || k.Priority != want.Priority ||
				!k.CreatedAt.Equal(created) || !k.ExpiresAt.Equal(want.ExpiresAt) || k.RevokedAt.IsZero() {
				t.Errorf("key %+v, want %+v (revoked)", k, want)
			}
			if gotTenant.ID != tnt.ID || gotTenant.Name != tnt.Name || string(gotTenant.Limits) != string(tnt.Limits) || !gotTenant.CreatedAt.Equal(created) {
				t.Errorf("tenant %+v, want %+v", gotTenant, tnt)
			}
		})
	}
}
