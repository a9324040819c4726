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
)

func journalRecord(id string) UsageRecord {
	return UsageRecord{RequestID: id, TenantID: "tnt_a", KeyID: "key_a", Model: "chat", Status: 200, PromptTokens: 3, CompletionTokens: 2,
		TTFT: time.Millisecond, Duration: 2 * time.Millisecond, CostMicroUSD: 7}
}

// copyDB copies the database and journal files of the store at src into
// a new directory, as a process killed with them open leaves them (the
// lock file aside: the kernel drops a dead process's flock), and returns
// the new database's path.
func copyDB(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "state.db")
	for _, suffix := range []string{"", "-wal", "-shm", "-usage", "-usage.1"} {
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
	return dst
}

// TestUsageJournalReplay: records appended but never drained (the process
// killed) are in the usage table once the database is opened again, each
// once even when a drain's batch was also inserted before the kill; a
// line cut short is dropped, never half-recorded.
func TestUsageJournalReplay(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t)
	for i := range 5 {
		if err := s.AppendUsage([]UsageRecord{journalRecord(fmt.Sprint("r", i))}); err != nil {
			t.Fatal(err)
		}
	}
	crashed := copyDB(t, s.Path()) // before any drain: journalDrainInterval has not passed
	f, err := os.OpenFile(journalPath(crashed), os.O_WRONLY|os.O_APPEND, 0)
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
	data, err := os.ReadFile(journalPath(crashed))
	if err != nil {
		t.Fatal(err)
	}
	twice := copyDB(t, s.Path())
	if err := os.WriteFile(journalPath(twice)+".1", data, 0o600); err != nil {
		t.Fatal(err)
	}

	for name, path := range map[string]string{"never drained": crashed, "drained and killed": twice} {
		t.Run(name, func(t *testing.T) {
			again, err := Open(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			defer again.Close()
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
			if _, err := os.Stat(journalPath(path) + ".1"); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the drained journal is still there: %v", err)
			}
		})
	}
}

// TestUsageJournalKeepsRouting: a routed record's route, what served it
// and its fallbacks survive the journal and its drain.
func TestUsageJournalKeepsRouting(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t)
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
}

// TestUsageJournalConcurrent: records appended from many goroutines while
// drains run are all read back, once each.
func TestUsageJournalConcurrent(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t)
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
}

// TestUsageJournalOneOwner: a second opener of a database whose journal
// another owns reads the table but cannot append; once the owner closes
// (draining its journal), an opener owns the journal and sees every record.
func TestUsageJournalOneOwner(t *testing.T) {
	ctx := context.Background()
	owner := openTemp(t)
	if err := owner.AppendUsage([]UsageRecord{journalRecord("r1")}); err != nil {
		t.Fatal(err)
	}
	other, err := Open(ctx, owner.Path())
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
	next, err := Open(ctx, owner.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	ids, err := next.UsageRequestIDs(ctx)
	if err != nil || len(ids) != 1 || ids["r1"] != 1 {
		t.Fatalf("records %v (%v), want r1 alone", ids, err)
	}
	if err := next.AppendUsage([]UsageRecord{journalRecord("r4")}); err != nil {
		t.Fatalf("the next owner cannot append: %v", err)
	}
}
