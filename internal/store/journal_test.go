package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stokehq/stoke/internal/store/pgtest"
)

func journalRecord(id string) UsageRecord {
	return UsageRecord{RequestID: id, TenantID: "tnt_a", KeyID: "key_a", Model: "chat", Status: 200, PromptTokens: 3, CompletionTokens: 2,
		TTFT: time.Millisecond, Duration: 2 * time.Millisecond, CostMicroUSD: 7}
}

// copyFiles copies the files src+suffix that exist to dst+suffix.
func copyFiles(t *testing.T, src, dst string, suffixes ...string) {
	t.Helper()
	for _, suffix := range suffixes {
		data, err := os.ReadFile(src + suffix)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst+suffix, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// killed is what a gateway killed with the store at tg open leaves, where
// the next one to open it finds it: its database and its usage journal
// (the lock file aside: the kernel drops a dead process's flock). On
// SQLite that is a copy of the database's and the journal's files in a new
// directory. A PostgreSQL database is not copied: the journal's files are,
// into a new data directory beside a fresh database when drained is false
// (the state of one the journal was never drained into), beside tg's own
// when it is true.
func (b backend) killed(t *testing.T, tg target, drained bool) target {
	t.Helper()
	to := target{dir: t.TempDir()}
	if !b.postgres {
		src := filepath.Join(tg.dir, "state.db")
		copyFiles(t, src, filepath.Join(to.dir, "state.db"), "", "-wal", "-shm", "-usage", "-usage.1")
		return to
	}
	copyFiles(t, b.journal(tg), b.journal(to), "", ".1")
	to.state = tg.state
	if !drained {
		to.state = pgtest.Start(t)
	}
	return to
}

// TestUsageJournalReplay: records appended but never drained (the process
// killed) are in the usage table once the database is opened again, each
// once even when a drain's batch was also inserted before the kill; a
// line cut short is dropped, never half-recorded.
func TestUsageJournalReplay(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		tg := bk.fresh(t)
		s := openAt(t, tg)
		// No drain runs until the copy is taken (and the lock goes before
		// the store closes, should the test stop early).
		s.journal.drainMu.Lock()
		letDrain := sync.OnceFunc(s.journal.drainMu.Unlock)
		t.Cleanup(letDrain)
		for i := range 5 {
			if err := s.AppendUsage([]UsageRecord{journalRecord(fmt.Sprint("r", i))}); err != nil {
				t.Fatal(err)
			}
		}
		crashed := bk.killed(t, tg, false)
		letDrain()
		f, err := os.OpenFile(bk.journal(crashed), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(`{"e":"cut-1","r":"torn","t":"tnt_a","m":"chat","s":200,"p":99`) // the power went
		f.Close()

		// A drain that inserted its batch and was killed before removing it
		// leaves the same lines in the table and in the file being drained.
		if err := s.FlushUsage(ctx); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(bk.journal(crashed))
		if err != nil {
			t.Fatal(err)
		}
		twice := bk.killed(t, tg, true)
		if err := os.WriteFile(bk.journal(twice)+".1", data, 0o600); err != nil {
			t.Fatal(err)
		}

		for name, tg := range map[string]target{"never drained": crashed, "drained and killed": twice} {
			t.Run(name, func(t *testing.T) {
				again := openAt(t, tg)
				ids, err := again.UsageRequestIDs(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if len(ids) != 5 || ids["torn"] != 0 {
					t.Fatalf("records %v, want r0…r4 once each and no torn one", ids)
				}
				for id, n := range ids {
					if n != 1 {
						t.Fatalf("%s recorded %d times", id, n)
					}
				}
				tokens, micro, err := again.UsageSpend(ctx, "tnt_a", "", time.Time{})
				if err != nil || tokens != 25 || micro != 35 {
					t.Fatalf("spend %d tokens, %d micro-dollars (%v); want 25 and 35", tokens, micro, err)
				}
				if _, err := os.Stat(bk.journal(tg) + ".1"); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("the drained journal is still there: %v", err)
				}
			})
		}
	})
}

// TestUsageJournalKeepsRouting: a routed record's route, what served it
// and its fallbacks survive the journal and its drain.
func TestUsageJournalKeepsRouting(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		r := journalRecord("routed")
		r.Route, r.Served, r.Fallbacks = "chat", "small", 2
		if err := s.AppendUsage([]UsageRecord{r}); err != nil {
			t.Fatal(err)
		}
		if err := s.FlushUsage(ctx); err != nil {
			t.Fatal(err)
		}
		var route, served string
		var fallbacks int
		if err := s.db.QueryRowContext(ctx, `SELECT route, served, fallbacks FROM usage WHERE request_id = 'routed'`).Scan(&route, &served, &fallbacks); err != nil {
			t.Fatal(err)
		}
		if route != "chat" || served != "small" || fallbacks != 2 {
			t.Fatalf("recorded route %q served %q fallbacks %d; want chat, small, 2", route, served, fallbacks)
		}
	})
}

// TestUsageJournalConcurrent: records appended from many goroutines while
// drains run are all read back, once each.
func TestUsageJournalConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 50 {
					if err := s.AppendUsage([]UsageRecord{journalRecord(fmt.Sprintf("w%d-%d", w, i))}); err != nil {
						t.Error(err)
						return
					}
					if i%10 == 0 {
						if err := s.FlushUsage(ctx); err != nil {
							t.Error(err)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		ids, err := s.UsageRequestIDs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != 400 {
			t.Fatalf("%d records, want 400", len(ids))
		}
		for id, n := range ids {
			if n != 1 {
				t.Fatalf("%s recorded %d times", id, n)
			}
		}
	})
}

// TestUsageJournalOneOwner: a second opener of a database (on PostgreSQL:
// with the same data directory) whose journal another owns reads the table
// but cannot append; once the owner closes (draining its journal), an
// opener owns the journal and sees every record.
func TestUsageJournalOneOwner(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		tg := bk.fresh(t)
		owner := openAt(t, tg)
		if err := owner.AppendUsage([]UsageRecord{journalRecord("r1")}); err != nil {
			t.Fatal(err)
		}
		other, err := OpenState(ctx, tg.state, tg.dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := other.AppendUsage([]UsageRecord{journalRecord("r2")}); !errors.Is(err, ErrJournalHeld) {
			t.Fatalf("append beside the owner: %v, want ErrJournalHeld", err)
		}
		other.Close()
		if err := owner.Close(); err != nil {
			t.Fatal(err)
		}
		if err := owner.AppendUsage([]UsageRecord{journalRecord("r3")}); err == nil {
			t.Fatal("appended to a closed store")
		}
		next := openAt(t, tg)
		ids, err := next.UsageRequestIDs(ctx)
		if err != nil || len(ids) != 1 || ids["r1"] != 1 {
			t.Fatalf("records %v (%v), want r1 alone", ids, err)
		}
		if err := next.AppendUsage([]UsageRecord{journalRecord("r4")}); err != nil {
			t.Fatalf("the next owner cannot append: %v", err)
		}
	})
}
