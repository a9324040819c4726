package store

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The usage journal is where usage records become durable on a request's
// path: one write(2) of JSON lines to an append-only file beside the
// database (on PostgreSQL, in the gateway's data directory: each gateway
// has its own, all draining into the shared table), which the kernel keeps
// whatever happens to the process. A
// drainer moves the lines into the usage table in batches, off the path,
// and Open replays what a killed process left behind. A line cut short
// (only the machine losing power mid-write can do that) does not parse and
// is dropped: no record is ever half there. Each line carries an entry id
// the table keeps unique, so lines drained twice (a kill between their
// insert and the journal's removal) are recorded once.
//
// One process owns a journal at a time (a flock); another that opens the
// same SQLite database (or a PostgreSQL one with the same data directory)
// reads the usage table as drained so far and cannot append
// (ErrJournalHeld).

// ErrJournalHeld is returned by AppendUsage when another process owns the
// database's usage journal.
var ErrJournalHeld = errors.New("the usage journal is held by another process")

// journalDrainInterval is how long appended records wait to be drained
// into the usage table, so one drain takes many of them.
const journalDrainInterval = 200 * time.Millisecond

// usageJournal is a database's usage journal (see above).
type usageJournal struct {
	path   string   // the journal; path+".1" is one being drained
	lock   *os.File // flocked path+".lock" (nil: another process owns it)
	nonce  string
	seq    atomic.Uint64
	insert func(ctx context.Context, rs []UsageRecord) error

	mu       sync.Mutex // guards f, pending, draining, closed
	f        *os.File
	pending  int  // records appended since the last rotation
	draining bool // a drainer goroutine runs
	closed   bool

	drainMu   sync.Mutex // one drain at a time
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// journalLine is one record in the journal.
type journalLine struct {
	Entry      string `json:"e"`
	RequestID  string `json:"r"`
	TenantID   string `json:"t"`
	KeyID      string `json:"k"`
	Model      string `json:"m"`
	Status     int    `json:"s"`
	Prompt     int    `json:"p"`
	Completion int    `json:"c"`
	Cached     int    `json:"h"`
	TTFTus     int64  `json:"f"`
	DurationUs int64  `json:"d"`
	CostMicro  int64  `json:"u"`
	CreatedNs  int64  `json:"at"`
	Route      string `json:"rt,omitempty"`
	Served     string `json:"sv,omitempty"`
	Fallbacks  int    `json:"fb,omitempty"`
}

// openUsageJournal takes the journal at path, replays into insert what an
// earlier process left in it, and opens it for appending; when another
// process owns it, the journal returned only reads (flush does nothing).
func openUsageJournal(ctx context.Context, path string, insert func(context.Context, []UsageRecord) error) (*usageJournal, error) {
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, fmt.Errorf("usage journal: %w", err)
	}
	j := &usageJournal{path: path, nonce: hex.EncodeToString(nonce[:]), insert: insert, stop: make(chan struct{})}
	lock, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the usage journal's lock: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return j, nil
		}
		return nil, fmt.Errorf("lock the usage journal: %w", err)
	}
	j.lock = lock
	if err := j.drainFile(ctx, path+".1"); err != nil {
		lock.Close()
		return nil, err
	}
	if err := j.drainFile(ctx, path); err != nil {
		lock.Close()
		return nil, err
	}
	if j.f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err != nil {
		lock.Close()
		return nil, fmt.Errorf("open the usage journal: %w", err)
	}
	return j, nil
}

// append makes rs durable against the process being killed with one
// write, and has them drained into the table soon.
func (j *usageJournal) append(rs []UsageRecord) error {
	var buf bytes.Buffer
	for _, r := range rs {
		line, err := json.Marshal(journalLine{Entry: j.nonce + "-" + strconv.FormatUint(j.seq.Add(1), 36), RequestID: r.RequestID,
			TenantID: r.TenantID, KeyID: r.KeyID, Model: r.Model, Status: r.Status, Prompt: r.PromptTokens, Completion: r.CompletionTokens,
			Cached: r.CachedTokens, TTFTus: r.TTFT.Microseconds(), DurationUs: r.Duration.Microseconds(), CostMicro: r.CostMicroUSD,
			CreatedNs: stamp(r.CreatedAt), Route: r.Route, Served: r.Served, Fallbacks: r.Fallbacks})
		if err != nil {
			return fmt.Errorf("record usage of %s: %w", r.RequestID, err)
		}
		buf.Write(line)
		buf.WriteByte('\n')
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case j.lock == nil:
		return ErrJournalHeld
	case j.closed:
		return errors.New("record usage: the state store is closed")
	case j.f == nil:
		return errors.New("record usage: the usage journal is not open (a drain failed to reopen it)")
	}
	if _, err := j.f.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("record usage: write the journal: %w", err)
	}
	j.pending += len(rs)
	if !j.draining {
		j.draining = true
		j.wg.Add(1)
		go j.drainer()
	}
	return nil
}

// drainer drains the journal every journalDrainInterval until it stays
// empty (or the journal closes).
func (j *usageJournal) drainer() {
	defer j.wg.Done()
	t := time.NewTimer(journalDrainInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-j.stop:
			return
		}
		j.flush(context.Background()) // a failure is retried next time
		j.mu.Lock()
		if j.pending == 0 {
			j.draining = false
			j.mu.Unlock()
			return
		}
		j.mu.Unlock()
		t.Reset(journalDrainInterval)
	}
}

// flush drains every record appended so far into the table.
func (j *usageJournal) flush(ctx context.Context) error {
	if j.lock == nil {
		return nil
	}
	j.drainMu.Lock()
	defer j.drainMu.Unlock()
	j.mu.Lock()
	closed := j.closed
	j.mu.Unlock()
	if closed {
		return nil
	}
	if err := j.drainFile(ctx, j.path+".1"); err != nil { // left by a failed drain
		return err
	}
	j.mu.Lock()
	if j.f == nil { // a rotation failed half-way: append to what is there
		f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			j.mu.Unlock()
			return fmt.Errorf("reopen the usage journal: %w", err)
		}
		j.f = f
	}
	if j.pending == 0 {
		j.mu.Unlock()
		return nil
	}
	err := j.rotateLocked()
	j.mu.Unlock()
	if err != nil {
		return err
	}
	return j.drainFile(ctx, j.path+".1")
}

// rotateLocked moves the journal aside for draining and starts a new one;
// j.mu is held.
func (j *usageJournal) rotateLocked() error {
	if err := j.f.Close(); err != nil {
		return fmt.Errorf("rotate the usage journal: %w", err)
	}
	j.f = nil
	if err := os.Rename(j.path, j.path+".1"); err != nil {
		return fmt.Errorf("rotate the usage journal: %w", err)
	}
	f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("rotate the usage journal: %w", err)
	}
	j.f, j.pending = f, 0
	return nil
}

// The journal's files beside a database at path.
func journalPath(path string) string { return path + "-usage" }

// drainFile inserts the records of the journal file at path (none when
// it does not exist) and removes it.
func (j *usageJournal) drainFile(ctx context.Context, path string) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the usage journal: %w", err)
	}
	var rs []UsageRecord
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l journalLine
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Entry == "" {
			continue // cut short by a power loss
		}
		rs = append(rs, UsageRecord{entry: l.Entry, RequestID: l.RequestID, TenantID: l.TenantID, KeyID: l.KeyID, Model: l.Model,
			Status: l.Status, PromptTokens: l.Prompt, CompletionTokens: l.Completion, CachedTokens: l.Cached,
			TTFT: time.Duration(l.TTFTus) * time.Microsecond, Duration: time.Duration(l.DurationUs) * time.Microsecond,
			CostMicroUSD: l.CostMicro, CreatedAt: unstamp(l.CreatedNs), Route: l.Route, Served: l.Served, Fallbacks: l.Fallbacks})
	}
	if err := j.insert(ctx, rs); err != nil {
		return fmt.Errorf("drain the usage journal: %w", err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("drain the usage journal: %w", err)
	}
	return nil
}

// close drains what is left and lets the journal go; later appends fail
// and flushes do nothing.
func (j *usageJournal) close(ctx context.Context) error {
	if j.lock == nil {
		return nil
	}
	j.closeOnce.Do(func() {
		close(j.stop)
		j.wg.Wait()
		err := j.flush(ctx)
		j.drainMu.Lock()
		defer j.drainMu.Unlock()
		j.mu.Lock()
		if j.f != nil {
			err = errors.Join(err, j.f.Close())
			j.f = nil
		}
		j.closed = true
		j.mu.Unlock()
		j.closeErr = errors.Join(err, j.lock.Close())
	})
	return j.closeErr
}
