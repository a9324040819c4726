package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// RevisionState is where a revision stands in its validation.
type RevisionState string

// Revision states. A revision is created validating and moves once, to ready
// or failed, by its validation (SetRevisionState). A ready revision may
// later fail to load (FailLoadedRevision) or be rejected by a rollout's
// eval gate (FinishRollout); failed and rejected are final.
const (
	// RevisionValidating: recorded, its files are being checked.
	RevisionValidating RevisionState = "validating"
	// RevisionReady: every check passed; deployments may pin it.
	RevisionReady RevisionState = "ready"
	// RevisionFailed: a check failed; Reason says which.
	RevisionFailed RevisionState = "failed"
	// RevisionRejected: a rollout's eval gate found it worse than the
	// revision it was to replace; Reason holds the figures. An operator may
	// still pin it by hand.
	RevisionRejected RevisionState = "rejected"
)

// revisionTransitions lists, for each state, the states it may move to.
var revisionTransitions = map[RevisionState][]RevisionState{
	RevisionValidating: {RevisionReady, RevisionFailed},
	RevisionReady:      nil,
	RevisionFailed:     nil,
	RevisionRejected:   nil,
}

// Valid reports whether s is one of the defined states.
func (s RevisionState) Valid() bool {
	_, ok := revisionTransitions[s]
	return ok
}

// CanMoveTo reports whether a revision in state s may move to next.
func (s RevisionState) CanMoveTo(next RevisionState) bool {
	return slices.Contains(revisionTransitions[s], next)
}

// Final reports whether s is a state a revision never leaves.
func (s RevisionState) Final() bool { return s.Valid() && len(revisionTransitions[s]) == 0 }

// Revision is one immutable version of a model's weights, identified by the
// model's name and the digest of its file list.
type Revision struct {
	// Model is the model's name (its prefix in the bucket).
	Model string
	// Digest is the revision digest ("sha256:…", as manifest.Revision).
	Digest string
	// State is the validation state.
	State RevisionState
	// Reason says why a failed revision failed; empty otherwise.
	Reason string
	// Source is the bucket URL of the model's prefix.
	Source string
	// Manifest is the revision's manifest (manifest.json's JSON), nil when
	// it has none (say, a manifest that did not parse). A failed revision
	// may hold the file list it was judged by instead.
	Manifest json.RawMessage
	// CreatedAt is when the revision was first recorded, UpdatedAt when its
	// state last changed.
	CreatedAt, UpdatedAt time.Time
}

// PutRevision records r in the validating state and reports whether it was
// new. r.State, r.Reason and the timestamps are ignored. Revisions are
// immutable: when model and digest are already recorded, nothing changes
// (not even the source or manifest) and created is false.
func (s *Store) PutRevision(ctx context.Context, r Revision) (created bool, err error) {
	if r.Model == "" || r.Digest == "" {
		return false, fmt.Errorf("put revision %q of model %q: %w: model and digest are required", r.Digest, r.Model, ErrInvalid)
	}
	if len(r.Manifest) > 0 && !json.Valid(r.Manifest) {
		return false, fmt.Errorf("put revision %s of model %s: %w: manifest is not valid JSON", r.Digest, r.Model, ErrInvalid)
	}
	err = s.tx(ctx, func(tx *sql.Tx) error {
		now := stamp(s.now())
		res, err := tx.ExecContext(ctx, `INSERT INTO revisions (model, digest, state, source, manifest, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (model, digest) DO NOTHING`,
			r.Model, r.Digest, string(RevisionValidating), r.Source, string(r.Manifest), now, now)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		created = n == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("put revision %s of model %s: %w", r.Digest, r.Model, err)
	}
	return created, nil
}

// SetRevisionState moves a revision to state, recording reason (required for
// failed, which it explains). The error wraps ErrNotFound for an unknown
// revision and ErrIllegalTransition for a move the state machine forbids
// (any move out of ready or failed).
func (s *Store) SetRevisionState(ctx context.Context, model, digest string, state RevisionState, reason string) error {
	what := fmt.Sprintf("set revision %s of model %s to %s", digest, model, state)
	if !state.Valid() {
		return fmt.Errorf("%s: %w: unknown state", what, ErrInvalid)
	}
	if state == RevisionFailed && reason == "" {
		return fmt.Errorf("%s: %w: a failed revision needs a reason", what, ErrInvalid)
	}
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var cur string
		err := tx.QueryRowContext(ctx, `SELECT state FROM revisions WHERE model = ? AND digest = ?`, model, digest).Scan(&cur)
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if !RevisionState(cur).CanMoveTo(state) {
			return fmt.Errorf("%w from %s", ErrIllegalTransition, cur)
		}
		_, err = tx.ExecContext(ctx, `UPDATE revisions SET state = ?, reason = ?, updated_at = ? WHERE model = ? AND digest = ?`,
			string(state), reason, stamp(s.now()), model, digest)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// revisionColumns are the columns scanRevision reads, in its order.
const revisionColumns = `model, digest, state, reason, source, manifest, created_at, updated_at`

// scanRevision reads one row of revisionColumns.
func scanRevision(row interface{ Scan(...any) error }) (Revision, error) {
	var r Revision
	var state, manifest string
	var created, updated int64
	if err := row.Scan(&r.Model, &r.Digest, &state, &r.Reason, &r.Source, &manifest, &created, &updated); err != nil {
		return Revision{}, err
	}
	r.State = RevisionState(state)
	if manifest != "" {
		r.Manifest = json.RawMessage(manifest)
	}
	r.CreatedAt, r.UpdatedAt = unstamp(created), unstamp(updated)
	return r, nil
}

// Revision returns one revision; the error wraps ErrNotFound when it is not
// recorded.
func (s *Store) Revision(ctx context.Context, model, digest string) (Revision, error) {
	r, err := scanRevision(s.db.QueryRowContext(ctx,
		`SELECT `+revisionColumns+` FROM revisions WHERE model = ? AND digest = ?`, model, digest))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return Revision{}, fmt.Errorf("get revision %s of model %s: %w", digest, model, err)
	}
	return r, nil
}

// Revisions lists a model's revisions, newest (last recorded) first; an
// unknown model has none.
func (s *Store) Revisions(ctx context.Context, model string) ([]Revision, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT `+revisionColumns+` FROM revisions WHERE model = ? ORDER BY id DESC`, model)
	if err != nil {
		return nil, fmt.Errorf("list revisions of model %s: %w", model, err)
	}
	defer rows.Close()
	var out []Revision
	for rows.Next() {
		r, err := scanRevision(rows)
		if err != nil {
			return nil, fmt.Errorf("list revisions of model %s: %w", model, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list revisions of model %s: %w", model, err)
	}
	return out, nil
}

// LatestReady returns the model's most recently recorded revision that is
// ready; the error wraps ErrNotFound when it has none.
func (s *Store) LatestReady(ctx context.Context, model string) (Revision, error) {
	r, err := scanRevision(s.db.QueryRowContext(ctx,
		`SELECT `+revisionColumns+` FROM revisions WHERE model = ? AND state = ? ORDER BY id DESC LIMIT 1`,
		model, string(RevisionReady)))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return Revision{}, fmt.Errorf("latest ready revision of model %s: %w", model, err)
	}
	return r, nil
}

// ReadyAdapters returns the latest ready revision of every LoRA adapter
// recorded (a model named BASE:NAME, as the watcher records an adapter
// pushed under BASE), sorted by name: what a gateway serves BASE:NAME
// with.
func (s *Store) ReadyAdapters(ctx context.Context) ([]Revision, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT `+revisionColumns+` FROM revisions WHERE state = ? AND model LIKE '%:%' ORDER BY model, id DESC`, string(RevisionReady))
	if err != nil {
		return nil, fmt.Errorf("list ready adapters: %w", err)
	}
	defer rows.Close()
	var out []Revision
	for rows.Next() {
		r, err := scanRevision(rows)
		if err != nil {
			return nil, fmt.Errorf("list ready adapters: %w", err)
		}
		if len(out) == 0 || out[len(out)-1].Model != r.Model {
			out = append(out, r)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list ready adapters: %w", err)
	}
	return out, nil
}

// Models lists, sorted, every model with at least one recorded revision.
func (s *Store) Models(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT DISTINCT model FROM revisions ORDER BY model`)
	if err != nil {
		return nil, fmt.Errorf("list models: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var m string
		if err := rows.Scan(&m); err != nil {
			return nil, fmt.Errorf("list models: %w", err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list models: %w", err)
	}
	return out, nil
}

// FailLoadedRevision moves a ready revision to failed, recording reason
// (required): its checks passed but it does not load, as the controller
// concludes after repeated load failures. It is the one move out of ready
// and is not part of validation (SetRevisionState still refuses it). A
// revision already failed keeps its state and first reason (no error). The
// error wraps ErrNotFound for an unknown revision and ErrIllegalTransition
// for one still validating.
func (s *Store) FailLoadedRevision(ctx context.Context, model, digest, reason string) error {
	what := fmt.Sprintf("fail revision %s of model %s after loading", digest, model)
	if reason == "" {
		return fmt.Errorf("%s: %w: a failed revision needs a reason", what, ErrInvalid)
	}
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var cur string
		err := tx.QueryRowContext(ctx, `SELECT state FROM revisions WHERE model = ? AND digest = ?`, model, digest).Scan(&cur)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return ErrNotFound
		case err != nil:
			return err
		case RevisionState(cur) == RevisionFailed:
			return nil
		case RevisionState(cur) != RevisionReady:
			return fmt.Errorf("%w from %s", ErrIllegalTransition, cur)
		}
		_, err = tx.ExecContext(ctx, `UPDATE revisions SET state = ?, reason = ?, updated_at = ? WHERE model = ? AND digest = ?`,
			string(RevisionFailed), reason, stamp(s.now()), model, digest)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}
