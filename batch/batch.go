// Package batch runs the Batch API: batches of requests read from a JSONL
// file (/v1/files), answered through the activator at batch priority, with
// their results assembled into output and error files.
//
// Durability is the line record. A batch's lines are recorded pending in
// the state store when it starts; each finished line's result is recorded
// (in a group commit) before it counts in request_counts, and only a
// pending line can be recorded, so each line has exactly one result. A line
// whose answer was cut short (preempted by interactive demand or a spot
// drain, refused for want of capacity, or in flight when serve stopped)
// stays pending and runs again; a restarted serve resumes every unfinished
// batch from its records. Output and error files are written from the
// records alone, so each custom_id appears in exactly one of them, once.
//
// Every batch has an owner (a tenant's id; "" while auth is off), its
// creator's. Create, Get, List and Cancel take the caller's owner and see
// only that owner's batches and input files: another owner's is not found,
// exactly as an unknown id is. The runner works on every owner's batches
// and writes each one's files with the batch's owner.
//
// Service has no HTTP in it; api/ serves it.
package batch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stokehq/stoke/batch/files"
	"github.com/stokehq/stoke/internal/store"
)

// Batch is a batch's record.
type Batch = store.Batch

// Endpoints are the endpoints a batch may target.
var Endpoints = []string{"/v1/chat/completions", "/v1/completions"}

// DefaultWindow is the one completion window OpenAI offers.
const DefaultWindow = "24h"

// IDPrefix starts every batch id.
const IDPrefix = "batch_"

// Limits of a batch's metadata, as OpenAI's.
const (
	maxMetadataPairs = 16
	maxMetadataKey   = 64
	maxMetadataValue = 512
)

// Sentinel errors, matched with errors.Is. Read-only.
var (
	// ErrNotFound reports an unknown batch id, or another owner's.
	ErrNotFound = errors.New("no such batch")
	// ErrInvalid reports a create request with a bad field; the error
	// says which (see InvalidError).
	ErrInvalid = errors.New("invalid batch request")
	// ErrNotCancellable reports a cancel of a batch that has finished.
	ErrNotCancellable = errors.New("batch cannot be cancelled")
)

// InvalidError is a create request's bad field.
type InvalidError struct {
	// Param is the field.
	Param   string
	Message string
}

func (e *InvalidError) Error() string { return e.Message }

// Unwrap makes an *InvalidError match ErrInvalid.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

func invalid(param, format string, args ...any) error {
	return &InvalidError{Param: param, Message: fmt.Sprintf(format, args...)}
}

// Dispatcher answers a batch line in-process at a priority no client may
// ask for: the activator. It returns an error wrapping
// activator.ErrPreempted when the line's room was taken back.
type Dispatcher interface {
	ServeAt(priority int, w http.ResponseWriter, req *http.Request) error
}

// Models says which model names are served, for validating lines.
type Models interface {
	// Known reports whether a model is served.
	Known(name string) bool
}

// Options configure a Service.
type Options struct {
	Store *store.Store
	Files *files.Store
	// Dispatcher answers the lines (the activator).
	Dispatcher Dispatcher
	// Models validates the lines' models.
	Models Models
	// Windows are the completion windows accepted (default: "24h" only).
	// A shorter one is for tests.
	Windows []string
	// MaxInFlight caps the lines in flight per model (default 64); the
	// runner adapts below it (see limiter).
	MaxInFlight int
	// LatencyTolerance is how much batch lines may slow the node's time
	// per output token, as a factor over the lowest seen (default
	// DefaultLatencyTolerance, 1.1: 10%); past it their concurrency shrinks.
	LatencyTolerance float64
	// Priority is the lines' priority in the activator's buffer and, through
	// it, the engine's scheduler (the caller passes activator.PriorityBatch).
	Priority int
	// AsOwner, when set, makes a line's request context the batch owner's
	// (the tenant's limits, budgets, usage records and fair share apply
	// to its lines as to its own requests).
	AsOwner func(ctx context.Context, owner string) context.Context
	// Registerer, when set, receives the stoke_batch_* series.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Service is the batches: it creates, lists and cancels them, and runs
// them (Run). Safe for concurrent use.
type Service struct {
	o       Options
	log     *slog.Logger
	metrics *metrics
	poke    chan struct{}

	mu       sync.Mutex
	active   map[string]context.CancelCauseFunc // running batch → its cancel
	limiters map[string]*limiter                // model → its lines' concurrency
}

// New returns a Service.
func New(o Options) (*Service, error) {
	if o.Store == nil || o.Files == nil || o.Dispatcher == nil || o.Models == nil {
		return nil, errors.New("new batch service: store, files, dispatcher and models are required")
	}
	if len(o.Windows) == 0 {
		o.Windows = []string{DefaultWindow}
	}
	for _, w := range o.Windows {
		if d, err := time.ParseDuration(w); err != nil || d <= 0 {
			return nil, fmt.Errorf("new batch service: completion window %q is not a positive duration", w)
		}
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 64
	}
	switch {
	case o.LatencyTolerance == 0:
		o.LatencyTolerance = DefaultLatencyTolerance
	case o.LatencyTolerance < 1:
		return nil, fmt.Errorf("new batch service: latency tolerance %g is below 1", o.LatencyTolerance)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Service{o: o, log: o.Logger.With("component", "batch"), metrics: newMetrics(o.Registerer),
		poke: make(chan struct{}, 1), active: map[string]context.CancelCauseFunc{}, limiters: map[string]*limiter{}}, nil
}

// CreateRequest is POST /v1/batches's body.
type CreateRequest struct {
	InputFileID      string            `json:"input_file_id"`
	Endpoint         string            `json:"endpoint"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata"`
	// Models, when set, are the only models the lines may name: the scope
	// of the key creating the batch (not part of the body).
	Models []string `json:"-"`
}

// Create records a new batch of owner, wakes the runner and returns the
// batch as created (validating, as the store records every new batch). A
// bad field is an *InvalidError; an unknown input file, or another owner's,
// wraps files.ErrNotFound.
func (s *Service) Create(ctx context.Context, owner string, req CreateRequest) (Batch, error) {
	switch {
	case req.InputFileID == "":
		return Batch{}, invalid("input_file_id", "missing required parameter: input_file_id")
	case req.Endpoint == "":
		return Batch{}, invalid("endpoint", "missing required parameter: endpoint")
	case !slices.Contains(Endpoints, req.Endpoint):
		return Batch{}, invalid("endpoint", "endpoint %q is not supported; batches may target %v", req.Endpoint, Endpoints)
	case req.CompletionWindow == "":
		return Batch{}, invalid("completion_window", "missing required parameter: completion_window")
	case !slices.Contains(s.o.Windows, req.CompletionWindow):
		return Batch{}, invalid("completion_window", "completion_window %q is not supported; this server accepts %v", req.CompletionWindow, s.o.Windows)
	}
	if len(req.Metadata) > maxMetadataPairs {
		return Batch{}, invalid("metadata", "metadata holds at most %d pairs", maxMetadataPairs)
	}
	for k, v := range req.Metadata {
		if len(k) > maxMetadataKey || len(v) > maxMetadataValue {
			return Batch{}, invalid("metadata", "metadata keys are at most %d characters, values at most %d", maxMetadataKey, maxMetadataValue)
		}
	}
	f, err := s.o.Files.Get(ctx, owner, req.InputFileID)
	if err != nil {
		return Batch{}, err
	}
	if f.Purpose != files.PurposeBatch {
		return Batch{}, invalid("input_file_id", "file %s has purpose %q; a batch's input file has purpose %q", f.ID, f.Purpose, files.PurposeBatch)
	}
	window, _ := time.ParseDuration(req.CompletionWindow)
	id, err := newID(IDPrefix)
	if err != nil {
		return Batch{}, err
	}
	now := s.o.Now().UTC().Round(0)
	b := Batch{ID: id, Owner: owner, Models: req.Models, InputFileID: f.ID, Endpoint: req.Endpoint, CompletionWindow: req.CompletionWindow,
		CreatedAt: now, ExpiresAt: now.Add(window)}
	if len(req.Metadata) > 0 {
		if b.Metadata, err = json.Marshal(req.Metadata); err != nil {
			return Batch{}, fmt.Errorf("create batch: %w", err)
		}
	}
	if err := s.o.Store.CreateBatch(ctx, b); err != nil {
		return Batch{}, fmt.Errorf("create batch: %w", err)
	}
	s.wake()
	// The answer is the batch as recorded, not read back: the runner may
	// already have moved it on.
	b.Status = store.BatchValidating
	return b, nil
}

// Get returns owner's batch id, or an error wrapping ErrNotFound (for
// another owner's batch too).
func (s *Service) Get(ctx context.Context, owner, id string) (Batch, error) {
	b, err := s.o.Store.Batch(ctx, id)
	if err == nil && b.Owner != owner {
		err = store.ErrNotFound
	}
	if errors.Is(err, store.ErrNotFound) {
		return Batch{}, fmt.Errorf("batch %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Batch{}, err // the state store's, which names the batch
	}
	return b, nil
}

// List returns a page of owner's batches, newest first, starting after
// the batch after (an unknown one, or another owner's, wraps ErrNotFound),
// and whether more follow.
func (s *Service) List(ctx context.Context, owner, after string, limit int) ([]Batch, bool, error) {
	page, more, err := s.o.Store.Batches(ctx, store.BatchQuery{Owner: owner, After: after, Limit: limit})
	if errors.Is(err, store.ErrNotFound) {
		return nil, false, fmt.Errorf("list batches after %s: %w", after, ErrNotFound)
	}
	return page, more, err
}

// Cancel moves owner's batch id to cancelling and stops its lines; the
// runner then records its unfinished lines as cancelled, writes its files
// and moves it to cancelled. Another owner's batch is ErrNotFound; a batch
// that has finished (or is finalizing) is ErrNotCancellable; cancelling
// one already cancelling returns it as is.
func (s *Service) Cancel(ctx context.Context, owner, id string) (Batch, error) {
	// The owner is checked before the move: a batch's owner never changes
	// and its id is never reused, so the check holds for it.
	b, err := s.Get(ctx, owner, id)
	if err != nil {
		return Batch{}, err
	}
	if b.Status == store.BatchCancelling {
		return b, nil
	}
	b, err = s.o.Store.MoveBatch(ctx, id, store.BatchCancelling, store.BatchUpdate{})
	if errors.Is(err, store.ErrIllegalTransition) {
		cur, _ := s.Get(ctx, owner, id)
		return Batch{}, fmt.Errorf("%w: batch %s is %s", ErrNotCancellable, id, cur.Status)
	}
	if err != nil {
		return Batch{}, fmt.Errorf("cancel batch %s: %w", id, err)
	}
	s.mu.Lock()
	stop := s.active[id]
	s.mu.Unlock()
	if stop != nil {
		stop(errCancelled)
	}
	s.wake()
	return b, nil
}

// wake makes the runner look at the batches now.
func (s *Service) wake() {
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// newID is prefix and 96 random bits in hex.
func newID(prefix string) (string, error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("new id: %w", err)
	}
	return prefix + hex.EncodeToString(b[:]), nil
}
