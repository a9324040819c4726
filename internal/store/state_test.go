package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/store/pgtest"
)

// withPassword is the URL u with the user info user:password.
func withPassword(t *testing.T, u, user, password string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	parsed.User = url.UserPassword(user, password)
	return parsed.String()
}

// TestOpenStateForms: "" is SQLite in the data directory (the file Open
// reads), a postgres:// or postgresql:// URL is PostgreSQL; Location never
// shows the password.
func TestOpenStateForms(t *testing.T) {
	ctx := context.Background()
	t.Run("sqlite", func(t *testing.T) {
		dir := t.TempDir()
		s, err := OpenState(ctx, "", dir)
		if err != nil {
			t.Fatal(err)
		}
		want := filepath.Join(dir, "state.db")
		if s.Path() != want || s.Location() != want {
			t.Errorf("Path() = %q, Location() = %q; want %q for both", s.Path(), s.Location(), want)
		}
		if err := s.PutDeployment(ctx, Deployment{Name: "d", Revision: "r"}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		again, err := Open(ctx, want)
		if err != nil {
			t.Fatal(err)
		}
		defer again.Close()
		if d, err := again.Deployment(ctx, "d"); err != nil || d.Revision != "r" {
			t.Errorf("Open of %s: deployment %+v, %v; want what OpenState wrote", want, d, err)
		}
	})
	for _, scheme := range []string{"postgres", "postgresql"} {
		t.Run(scheme, func(t *testing.T) {
			u := pgtest.Start(t)
			u = scheme + "://" + strings.TrimPrefix(u, "postgres://")
			parsed, err := url.Parse(u)
			if err != nil {
				t.Fatal(err)
			}
			password, _ := parsed.User.Password()
			s := openAt(t, target{state: u, dir: t.TempDir()})
			if s.Path() != "" || !strings.HasPrefix(s.Location(), scheme+"://") || strings.Contains(s.Location(), password) {
				t.Errorf("Path() = %q, Location() = %q; want \"\" and the URL without its password", s.Path(), s.Location())
			}
			if err := s.PutDeployment(ctx, Deployment{Name: "d", Revision: "r"}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestOpenStateErrors: what is neither "" nor a PostgreSQL URL is refused
// with the forms accepted, and no error shows a password, whatever failed.
func TestOpenStateErrors(t *testing.T) {
	const secret = "hunter2-s3cret"
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		state func(t *testing.T) string
		dir   func(t *testing.T) string
		want  string // in the error
	}{
		{"empty data directory", func(*testing.T) string { return "" }, func(*testing.T) string { return "" }, "empty data directory"},
		{"another scheme", func(*testing.T) string { return "mysql://u:" + secret + "@db/stoke" }, nil, `"" (SQLite in the data directory) or a postgres:// or postgresql:// URL`},
		{"a file path", func(*testing.T) string { return "/var/lib/stoke/state.db" }, nil, "postgres://"},
		{"a key=value string", func(*testing.T) string { return "host=db password=" + secret }, nil, "postgres://"},
		{"upper case", func(*testing.T) string { return "POSTGRES://u:" + secret + "@db/stoke" }, nil, "postgres://"},
		{"a URL that does not parse", func(*testing.T) string { return "postgres://u:" + secret + "@db:port/stoke" }, nil, "cannot parse"},
		{"nothing listening", func(*testing.T) string {
			return "postgres://u:" + secret + "@127.0.0.1:1/stoke?connect_timeout=10"
		}, nil, "127.0.0.1"},
		{"password in the query", func(*testing.T) string {
			return "postgres://u@127.0.0.1:1/stoke?connect_timeout=10&password=" + secret
		}, nil, "127.0.0.1"},
		{"a wrong password", func(t *testing.T) string { return withPassword(t, pgtest.Start(t), "postgres", secret) }, nil, "password"},
		{"no such user", func(t *testing.T) string { return withPassword(t, pgtest.Start(t), "nobody", secret) }, nil, "nobody"},
		{"no such data directory", func(t *testing.T) string {
			return withPassword(t, pgtest.Start(t), "postgres", secret) // wrong, but the directory is checked first
		}, func(t *testing.T) string { return filepath.Join(t.TempDir(), "missing") }, "data directory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if c.dir != nil {
				dir = c.dir(t)
			}
			s, err := OpenState(ctx, c.state(t), dir)
			if err == nil {
				s.Close()
				t.Fatal("OpenState succeeded")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error %q shows the password", err)
			}
		})
	}
}

// TestCrossHandleVisibility: what one gateway writes, another sharing the
// database reads at once (the usage a gateway appended, once its journal
// drains or it reads usage itself).
func TestCrossHandleVisibility(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		tg := bk.fresh(t)
		one, two := openAt(t, tg), openAt(t, bk.replica(t, tg))
		if err := one.CreateTenant(ctx, Tenant{ID: "tnt_1", Name: "acme", Limits: json.RawMessage(`{"rpm":5}`)}); err != nil {
			t.Fatal(err)
		}
		if err := two.CreateTenant(ctx, Tenant{ID: "tnt_2", Name: "acme"}); !errors.Is(err, ErrExists) {
			t.Errorf("the second handle creating a taken name: %v, want ErrExists", err)
		}
		hash := sha256.Sum256([]byte("sk-stoke-one"))
		key := APIKey{ID: "key_1", TenantID: "tnt_1", Name: "ci", Hash: hash[:], Hint: "sk-…one", Models: []string{"chat"}, Priority: "batch"}
		if err := one.CreateAPIKey(ctx, key); err != nil {
			t.Fatal(err)
		}
		keys, err := two.APIKeys(ctx, "tnt_1")
		if err != nil || len(keys) != 1 || keys[0].ID != "key_1" || string(keys[0].Hash) != string(hash[:]) ||
			fmt.Sprint(keys[0].Models) != "[chat]" || keys[0].Priority != "batch" || !keys[0].RevokedAt.IsZero() {
			t.Fatalf("the second handle reads keys %+v, %v; want key_1 as created", keys, err)
		}
		if err := two.RevokeAPIKey(ctx, "key_1"); err != nil {
			t.Fatal(err)
		}
		if keys, err := one.APIKeys(ctx, ""); err != nil || len(keys) != 1 || keys[0].RevokedAt.IsZero() {
			t.Errorf("the first handle reads keys %+v, %v; want key_1 revoked by the second", keys, err)
		}
		if err := one.PutDeployment(ctx, Deployment{Name: "chat", Revision: "sha256:a", Pinned: true}); err != nil {
			t.Fatal(err)
		}
		if d, err := two.Deployment(ctx, "chat"); err != nil || d.Revision != "sha256:a" || !d.Pinned {
			t.Errorf("the second handle reads deployment %+v, %v; want chat pinned at sha256:a", d, err)
		}
		// Usage appended on one handle is in the shared table once that
		// handle reads it (its drain, within a fraction of a second).
		appender := one
		if bk.postgres {
			appender = two // each replica has a journal of its own
		}
		if err := appender.AppendUsage([]UsageRecord{journalRecord("req-1")}); err != nil {
			t.Fatal(err)
		}
		if err := appender.FlushUsage(ctx); err != nil {
			t.Fatal(err)
		}
		for _, s := range []*Store{one, two} {
			if ids, err := s.UsageRequestIDs(ctx); err != nil || ids["req-1"] != 1 {
				t.Errorf("usage read by a handle: %v, %v; want req-1 once", ids, err)
			}
		}
		if err := two.DeleteTenant(ctx, "tnt_1"); err != nil {
			t.Fatal(err)
		}
		if keys, err := one.APIKeys(ctx, ""); err != nil || len(keys) != 0 {
			t.Errorf("keys after the tenant's deletion: %+v, %v; want none", keys, err)
		}
	})
}

// TestConcurrentHandlesKeepCounts: goroutines on two handles of one
// database (two gateways) record usage and finish a batch's lines at once,
// and race to move the batch on: every record is kept once, every line is
// recorded by exactly one call and counted once, and exactly one move of
// the batch wins.
func TestConcurrentHandlesKeepCounts(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		tg := bk.fresh(t)
		stores := []*Store{openAt(t, tg), openAt(t, bk.replica(t, tg))}
		const workers, perWorker, lines = 8, 40, 60

		b := Batch{ID: "batch_1", InputFileID: "file-1", Endpoint: "/v1/completions", CompletionWindow: "24h", ExpiresAt: time.Now().Add(time.Hour)}
		if err := stores[0].CreateBatch(ctx, b); err != nil {
			t.Fatal(err)
		}
		var ls []BatchLine
		for i := 1; i <= lines; i++ {
			ls = append(ls, BatchLine{Line: i, CustomID: fmt.Sprint("c", i), Body: json.RawMessage(`{}`)})
		}
		if _, err := stores[1].MoveBatch(ctx, b.ID, BatchInProgress, BatchUpdate{Lines: ls}); err != nil {
			t.Fatal(err)
		}

		var recorded atomic.Int64
		var wg sync.WaitGroup
		for w := range workers {
			s := stores[w%2]
			wg.Go(func() {
				for i := range perWorker {
					r := journalRecord(fmt.Sprintf("w%d-%d", w, i))
					var err error
					// SQLite's second handle shares the first's journal
					// (held by it): it inserts directly.
					if bk.postgres || w%2 == 0 {
						err = s.AppendUsage([]UsageRecord{r})
					} else {
						err = s.InsertUsage(ctx, []UsageRecord{r})
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
				// Each worker tries every line, from its own starting
				// point, in batches of 7.
				for start := 0; start < lines; start += 7 {
					var rs []LineResult
					for j := start; j < start+7 && j < lines; j++ {
						line := (j+w*11)%lines + 1
						rs = append(rs, LineResult{Line: line, Failed: w%3 == 0, Result: json.RawMessage(fmt.Sprintf(`{"by":%d}`, w))})
					}
					n, err := s.RecordLines(ctx, b.ID, rs)
					if err != nil {
						t.Error(err)
						return
					}
					recorded.Add(int64(n))
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		for _, s := range stores {
			if err := s.FlushUsage(ctx); err != nil {
				t.Fatal(err)
			}
		}
		ids, err := stores[1].UsageRequestIDs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != workers*perWorker {
			t.Errorf("%d usage records, want %d", len(ids), workers*perWorker)
		}
		for id, n := range ids {
			if n != 1 {
				t.Errorf("%s recorded %d times", id, n)
			}
		}
		tokens, micro, err := stores[0].UsageSpend(ctx, "tnt_a", "", time.Time{})
		if want := int64(workers * perWorker); err != nil || tokens != 5*want || micro != 7*want {
			t.Errorf("spend %d tokens, %d micro-dollars (%v); want %d and %d", tokens, micro, err, 5*want, 7*want)
		}

		if recorded.Load() != lines {
			t.Errorf("the calls recorded %d lines, want %d", recorded.Load(), lines)
		}
		got, err := stores[0].Batch(ctx, b.ID)
		if err != nil {
			t.Fatal(err)
		}
		ok, err := stores[1].BatchLines(ctx, b.ID, LineSucceeded, 0, lines)
		if err != nil {
			t.Fatal(err)
		}
		failed, err := stores[1].BatchLines(ctx, b.ID, LineFailed, 0, lines)
		if err != nil {
			t.Fatal(err)
		}
		if got.Completed != len(ok) || got.Failed != len(failed) || len(ok)+len(failed) != lines {
			t.Errorf("batch counts %d completed, %d failed; lines %d succeeded, %d failed; want them equal and %d in all",
				got.Completed, got.Failed, len(ok), len(failed), lines)
		}

		// Every handle's goroutines race to finalize: one wins.
		var won atomic.Int64
		for w := range workers {
			s := stores[w%2]
			wg.Go(func() {
				_, err := s.MoveBatch(ctx, b.ID, BatchFinalizing, BatchUpdate{OutputFileID: fmt.Sprint("file-out-", w)})
				switch {
				case err == nil:
					won.Add(1)
				case !errors.Is(err, ErrIllegalTransition):
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if won.Load() != 1 {
			t.Errorf("%d moves to finalizing won, want 1", won.Load())
		}
		if got, err := stores[1].Batch(ctx, b.ID); err != nil || got.Status != BatchFinalizing || got.OutputFileID == "" {
			t.Errorf("batch %+v, %v; want finalizing with the winner's output file", got, err)
		}
	})
}

// TestWritersSerializedUnderStricterDefault: a database whose default
// isolation is repeatable read still serializes the store's writers (its
// write transactions are read committed), where a snapshot taken before
// the lock would let two moves of one batch both pass their check.
func TestWritersSerializedUnderStricterDefault(t *testing.T) {
	ctx := context.Background()
	u := pgtest.Start(t) + "&default_transaction_isolation=repeatable%20read"
	stores := []*Store{openAt(t, target{state: u, dir: t.TempDir()}), openAt(t, target{state: u, dir: t.TempDir()})}
	var level string
	if err := stores[0].db.QueryRowContext(ctx, "SHOW default_transaction_isolation").Scan(&level); err != nil || level != "repeatable read" {
		t.Fatalf("default isolation %q, %v; want repeatable read", level, err)
	}
	const batches, workers = 20, 8
	for i := range batches {
		b := Batch{ID: fmt.Sprint("batch_", i), InputFileID: "f", Endpoint: "/v1/completions", CompletionWindow: "24h", ExpiresAt: time.Now().Add(time.Hour)}
		if err := stores[0].CreateBatch(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	// For each batch, every worker is let go at once to move it.
	var won atomic.Int64
	for i := range batches {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for w := range workers {
			s := stores[w%2]
			wg.Go(func() {
				<-start
				_, err := s.MoveBatch(ctx, fmt.Sprint("batch_", i), BatchInProgress, BatchUpdate{})
				switch {
				case err == nil:
					won.Add(1)
				case !errors.Is(err, ErrIllegalTransition):
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
	}
	if won.Load() != batches {
		t.Errorf("%d moves to in_progress won, want %d (one per batch)", won.Load(), batches)
	}
}

// TestConcurrentOpens: gateways starting together on a new PostgreSQL
// database all open it, and the schema is migrated once (a second
// migration would fail on the tables the first made). SQLite, a single
// gateway's, is not raced so: processes creating a new database file at
// the same instant may get SQLITE_BUSY while it turns to WAL mode.
func TestConcurrentOpens(t *testing.T) {
	bk := backend{name: "postgres", postgres: true}
	ctx := context.Background()
	tg := bk.fresh(t)
	const gateways = 4
	var wg sync.WaitGroup
	opened := make([]*Store, gateways)
	for i := range gateways {
		at := bk.replica(t, tg)
		wg.Go(func() {
			s, err := OpenState(ctx, at.state, at.dir)
			if err != nil {
				t.Error(err)
				return
			}
			opened[i] = s
		})
	}
	wg.Wait()
	for _, s := range opened {
		if s != nil {
			t.Cleanup(func() { s.Close() })
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	var v int
	err := opened[0].tx(ctx, func(tx *sql.Tx) error {
		var err error
		v, err = opened[0].schemaVersion(ctx, tx)
		return err
	})
	if err != nil || v != SchemaVersion {
		t.Errorf("schema version %d, %v; want %d", v, err, SchemaVersion)
	}
}

// TestTenantsAndKeys: tenants and keys round-trip on each backend (the
// key's hash as bytes), a taken tenant name or key hash is refused, and
// deleting a tenant deletes its keys.
func TestTenantsAndKeys(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		s.now = fakeClock()
		for _, tn := range []Tenant{{ID: "tnt_a", Name: "a"}, {ID: "tnt_b", Name: "b", Limits: json.RawMessage(`{"rpm":1}`)}} {
			if err := s.CreateTenant(ctx, tn); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.CreateTenant(ctx, Tenant{ID: "tnt_c", Name: "a"}); !errors.Is(err, ErrExists) {
			t.Errorf("a taken name: %v, want ErrExists", err)
		}
		hash := []byte{0, 1, 2, 0xff, 0}
		expires := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
		if err := s.CreateAPIKey(ctx, APIKey{ID: "key_1", TenantID: "tnt_a", Hash: hash, Hint: "h", ExpiresAt: expires}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateAPIKey(ctx, APIKey{ID: "key_2", TenantID: "tnt_b", Hash: hash, Hint: "h"}); err == nil || errors.Is(err, ErrNotFound) {
			t.Errorf("a taken hash: %v, want an error", err)
		}
		if err := s.CreateAPIKey(ctx, APIKey{ID: "key_3", TenantID: "tnt_zz", Hash: []byte{9}, Hint: "h"}); !errors.Is(err, ErrNotFound) {
			t.Errorf("an unknown tenant: %v, want ErrNotFound", err)
		}
		if err := s.SetAPIKeyLimits(ctx, "key_1", json.RawMessage(`{"tpm":9}`)); err != nil {
			t.Fatal(err)
		}
		if err := s.SetTenantLimits(ctx, "tnt_zz", nil); !errors.Is(err, ErrNotFound) {
			t.Errorf("limits of an unknown tenant: %v, want ErrNotFound", err)
		}
		keys, err := s.APIKeys(ctx, "")
		if err != nil || len(keys) != 1 || string(keys[0].Hash) != string(hash) || !keys[0].ExpiresAt.Equal(expires) ||
			string(keys[0].Limits) != `{"tpm":9}` || keys[0].Models != nil {
			t.Fatalf("keys %+v, %v", keys, err)
		}
		tenants, err := s.Tenants(ctx)
		if err != nil || len(tenants) != 2 || tenants[0].ID != "tnt_a" || string(tenants[1].Limits) != `{"rpm":1}` {
			t.Fatalf("tenants %+v, %v", tenants, err)
		}
		if err := s.DeleteTenant(ctx, "tnt_a"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteTenant(ctx, "tnt_a"); !errors.Is(err, ErrNotFound) {
			t.Errorf("a second delete: %v, want ErrNotFound", err)
		}
		if keys, err := s.APIKeys(ctx, "tnt_a"); err != nil || len(keys) != 0 {
			t.Errorf("keys of a deleted tenant: %+v, %v", keys, err)
		}
	})
}
