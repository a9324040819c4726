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

// RolloutState is where a rollout stands.
type RolloutState string

// Rollout states. A rollout starts in canary and ends once, in one of the
// others, all final.
const (
	// RolloutCanary: the candidate serves its canary share beside the
	// stable revision while its eval gate (if any) runs.
	RolloutCanary RolloutState = "canary"
	// RolloutPromoted: the candidate became what the deployment serves.
	RolloutPromoted RolloutState = "promoted"
	// RolloutRejected: the eval gate found the candidate worse (or could
	// not run it); the candidate revision is rejected.
	RolloutRejected RolloutState = "rejected"
	// RolloutRolledBack: an operator ended the canary; traffic is back on
	// the stable revision.
	RolloutRolledBack RolloutState = "rolled_back"
	// RolloutSuperseded: a newer revision was pushed during the canary and
	// took the candidate's place in a rollout of its own.
	RolloutSuperseded RolloutState = "superseded"
)

// rolloutTransitions lists, for each state, the states it may move to.
var rolloutTransitions = map[RolloutState][]RolloutState{
	RolloutCanary:     {RolloutPromoted, RolloutRejected, RolloutRolledBack, RolloutSuperseded},
	RolloutPromoted:   nil,
	RolloutRejected:   nil,
	RolloutRolledBack: nil,
	RolloutSuperseded: nil,
}

// CanMoveTo reports whether a rollout in state s may move to next.
func (s RolloutState) CanMoveTo(next RolloutState) bool {
	return slices.Contains(rolloutTransitions[s], next)
}

// Rollout is one candidate revision of a deployment tried against the
// revision it serves.
type Rollout struct {
	ID         int64
	Deployment string
	// Stable is the revision the deployment served when the rollout
	// began; Candidate the one being tried.
	Stable, Candidate string
	// CanaryPercent is the share of the deployment's requests the
	// candidate serves during the canary.
	CanaryPercent int
	// Spec is the candidate's deployment spec (pushed beside it), which
	// the deployment takes on promotion.
	Spec   json.RawMessage
	State  RolloutState
	Reason string
	// Eval is the eval gate's figures (JSON), once it ran.
	Eval                 json.RawMessage
	CreatedAt, UpdatedAt time.Time
}

// StartRollout records r in the canary state and returns it with its id
// and timestamps. A deployment has at most one rollout in canary: another
// is an error wrapping ErrIllegalTransition.
func (s *Store) StartRollout(ctx context.Context, r Rollout) (Rollout, error) {
	what := fmt.Sprintf("start the rollout of revision %s on deployment %s", r.Candidate, r.Deployment)
	if r.Deployment == "" || r.Stable == "" || r.Candidate == "" {
		return Rollout{}, fmt.Errorf("%s: %w: deployment, stable and candidate revisions are required", what, ErrInvalid)
	}
	if r.CanaryPercent < 0 || r.CanaryPercent > 100 {
		return Rollout{}, fmt.Errorf("%s: %w: canary percent %d is outside [0, 100]", what, ErrInvalid, r.CanaryPercent)
	}
	spec := r.Spec
	if len(spec) == 0 {
		spec = json.RawMessage("{}")
	}
	if !json.Valid(spec) {
		return Rollout{}, fmt.Errorf("%s: %w: spec is not JSON", what, ErrInvalid)
	}
	now := s.now()
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM rollouts WHERE deployment = ? AND state = ?`,
			r.Deployment, string(RolloutCanary)).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%w: a rollout is in canary already", ErrIllegalTransition)
		}
		return tx.QueryRowContext(ctx, `INSERT INTO rollouts (deployment, stable, candidate, canary_percent, spec, state, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`, r.Deployment, r.Stable, r.Candidate, r.CanaryPercent, string(spec), string(RolloutCanary),
			stamp(now), stamp(now)).Scan(&r.ID)
	})
	if err != nil {
		return Rollout{}, fmt.Errorf("%s: %w", what, err)
	}
	r.Spec, r.State, r.Reason, r.Eval = spec, RolloutCanary, "", nil
	r.CreatedAt, r.UpdatedAt = unstamp(stamp(now)), unstamp(stamp(now))
	return r, nil
}

// FinishRollout moves rollout id out of canary to state, with reason and
// the eval figures (nil for none), in one transaction with what the end
// means for the deployment and the candidate: promoted makes the
// deployment serve the candidate with the rollout's spec (unpinned);
// rejected marks a ready candidate revision rejected with reason. The
// error wraps ErrNotFound for an unknown rollout and ErrIllegalTransition
// for one that ended already.
func (s *Store) FinishRollout(ctx context.Context, id int64, state RolloutState, reason string, eval json.RawMessage) (Rollout, error) {
	what := fmt.Sprintf("end rollout %d as %s", id, state)
	if len(eval) > 0 && !json.Valid(eval) {
		return Rollout{}, fmt.Errorf("%s: %w: eval figures are not JSON", what, ErrInvalid)
	}
	var r Rollout
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var err error
		r, err = scanRollout(tx.QueryRowContext(ctx, `SELECT `+rolloutColumns+` FROM rollouts WHERE id = ?`, id))
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if !r.State.CanMoveTo(state) {
			return fmt.Errorf("%w from %s", ErrIllegalTransition, r.State)
		}
		now := stamp(s.now())
		if _, err := tx.ExecContext(ctx, `UPDATE rollouts SET state = ?, reason = ?, eval = ?, updated_at = ? WHERE id = ?`,
			string(state), reason, string(eval), now, id); err != nil {
			return err
		}
		switch state {
		case RolloutPromoted:
			if _, err := tx.ExecContext(ctx, `UPDATE deployments SET revision = ?, spec = ?, pinned = 0, updated_at = ? WHERE name = ?`,
				r.Candidate, string(r.Spec), time.Now().UnixMilli(), r.Deployment); err != nil {
				return err
			}
		case RolloutRejected:
			if _, err := tx.ExecContext(ctx, `UPDATE revisions SET state = ?, reason = ?, updated_at = ? WHERE model = ? AND digest = ? AND state = ?`,
				string(RevisionRejected), reason, now, r.Deployment, r.Candidate, string(RevisionReady)); err != nil {
				return err
			}
		}
		r.State, r.Reason, r.Eval, r.UpdatedAt = state, reason, eval, unstamp(now)
		return nil
	})
	if err != nil {
		return Rollout{}, fmt.Errorf("%s: %w", what, err)
	}
	return r, nil
}

// rolloutColumns are the columns scanRollout reads, in its order.
const rolloutColumns = `id, deployment, stable, candidate, canary_percent, spec, state, reason, eval, created_at, updated_at`

func scanRollout(row interface{ Scan(...any) error }) (Rollout, error) {
	var r Rollout
	var spec, state, eval string
	var created, updated int64
	if err := row.Scan(&r.ID, &r.Deployment, &r.Stable, &r.Candidate, &r.CanaryPercent, &spec, &state, &r.Reason, &eval, &created, &updated); err != nil {
		return Rollout{}, err
	}
	r.Spec, r.State = json.RawMessage(spec), RolloutState(state)
	if eval != "" {
		r.Eval = json.RawMessage(eval)
	}
	r.CreatedAt, r.UpdatedAt = unstamp(created), unstamp(updated)
	return r, nil
}

// Rollouts lists a deployment's rollouts, newest first; all deployments'
// when deployment is empty.
func (s *Store) Rollouts(ctx context.Context, deployment string) ([]Rollout, error) {
	return s.rollouts(ctx, "list the rollouts of "+deployment, `deployment = ? OR ? = ''`, deployment, deployment)
}

// ActiveRollouts lists the rollouts in canary, one at most per deployment.
func (s *Store) ActiveRollouts(ctx context.Context) ([]Rollout, error) {
	return s.rollouts(ctx, "list the rollouts in canary", `state = ?`, string(RolloutCanary))
}

func (s *Store) rollouts(ctx context.Context, what, where string, args ...any) ([]Rollout, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+rolloutColumns+` FROM rollouts WHERE `+where+` ORDER BY id DESC`, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	var out []Rollout
	for rows.Next() {
		r, err := scanRollout(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}
