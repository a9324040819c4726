package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Deployment is a served model: the name clients call, the revision it
// serves and its deployment spec (stoke.yaml as JSON).
type Deployment struct {
	Name     string
	Revision string
	Spec     json.RawMessage
	// Pinned is set when an operator pinned the revision: a newly pushed
	// revision is recorded but not deployed until it is unpinned.
	Pinned    bool
	UpdatedAt time.Time
}

// PutDeployment creates or replaces the deployment d.Name.
func (s *Store) PutDeployment(ctx context.Context, d Deployment) error {
	if d.Name == "" || d.Revision == "" {
		return fmt.Errorf("put deployment %q: %w: name and revision are required", d.Name, ErrInvalid)
	}
	spec := string(d.Spec)
	if spec == "" {
		spec = "{}"
	}
	if !json.Valid([]byte(spec)) {
		return fmt.Errorf("put deployment %s: %w: spec is not JSON", d.Name, ErrInvalid)
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO deployments (name, revision, spec, pinned, updated_at) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET revision = excluded.revision, spec = excluded.spec, pinned = excluded.pinned,
				updated_at = excluded.updated_at`,
			d.Name, d.Revision, spec, boolInt(d.Pinned), time.Now().UnixMilli())
		if err != nil {
			return fmt.Errorf("put deployment %s: %w", d.Name, err)
		}
		return nil
	})
}

// Deployment returns the deployment called name, or an error wrapping
// ErrNotFound.
func (s *Store) Deployment(ctx context.Context, name string) (Deployment, error) {
	row := s.db.QueryRowContext(ctx, `SELECT name, revision, spec, pinned, updated_at FROM deployments WHERE name = ?`, name)
	d, err := scanDeployment(row.Scan)
	if errors.Is(err, sql.ErrNoRows) {
		return Deployment{}, fmt.Errorf("deployment %s: %w", name, ErrNotFound)
	}
	return d, err
}

// Deployments lists every deployment by name.
func (s *Store) Deployments(ctx context.Context) ([]Deployment, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, revision, spec, pinned, updated_at FROM deployments ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list deployments: %w", err)
	}
	defer rows.Close()
	var out []Deployment
	for rows.Next() {
		d, err := scanDeployment(rows.Scan)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

func scanDeployment(scan func(...any) error) (Deployment, error) {
	var d Deployment
	var spec string
	var updated int64
	if err := scan(&d.Name, &d.Revision, &spec, &d.Pinned, &updated); err != nil {
		return Deployment{}, err
	}
	d.Spec, d.UpdatedAt = json.RawMessage(spec), time.UnixMilli(updated)
	return d, nil
}

// boolInt is the storage form of a flag: 1 or 0 (both databases' INTEGER
// columns; pgx does not write a bool into one).
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
