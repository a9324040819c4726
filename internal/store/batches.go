package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// BatchStatus is where a batch (/v1/batches) stands, with OpenAI's names.
type BatchStatus string

// Batch statuses. A batch is created validating; it fails validation or
// runs (in_progress), then finalizes its output into completed; past its
// completion window it expires, and a cancel moves it through cancelling
// to cancelled. Expired and cancelled batches keep what finished.
const (
	BatchValidating BatchStatus = "validating"
	BatchFailed     BatchStatus = "failed"
	BatchInProgress BatchStatus = "in_progress"
	BatchFinalizing BatchStatus = "finalizing"
	BatchCompleted  BatchStatus = "completed"
	BatchExpired    BatchStatus = "expired"
	BatchCancelling BatchStatus = "cancelling"
	BatchCancelled  BatchStatus = "cancelled"
)

// batchTransitions lists, for each status, the statuses it may move to.
var batchTransitions = map[BatchStatus][]BatchStatus{
	BatchValidating: {BatchInProgress, BatchFailed, BatchCancelling},
	BatchInProgress: {BatchFinalizing, BatchExpired, BatchCancelling},
	BatchFinalizing: {BatchCompleted},
	BatchCancelling: {BatchCancelled},
	BatchFailed:     nil,
	BatchCompleted:  nil,
	BatchExpired:    nil,
	BatchCancelled:  nil,
}

// Valid reports whether s is one of the defined statuses.
func (s BatchStatus) Valid() bool {
	_, ok := batchTransitions[s]
	return ok
}

// CanMoveTo reports whether a batch in status s may move to next.
func (s BatchStatus) CanMoveTo(next BatchStatus) bool {
	return slices.Contains(batchTransitions[s], next)
}

// Final reports whether s is a status a batch never leaves.
func (s BatchStatus) Final() bool { return s.Valid() && len(batchTransitions[s]) == 0 }

// Batch is a batch's record: what was asked, where it stands, and the
// counts of its lines.
type Batch struct {
	ID string
	// Owner is the tenant the batch belongs to ("" while auth is off).
	Owner string
	// Models, when not empty, are the only models its lines may name (the
	// scope of the key that created it).
	Models           []string
	InputFileID      string
	Endpoint         string
	CompletionWindow string
	// Metadata is the client's metadata object (JSON), nil when none.
	Metadata json.RawMessage
	Status   BatchStatus
	// Errors is the validation errors' list (JSON), nil when none.
	Errors       json.RawMessage
	OutputFileID string
	ErrorFileID  string
	// Total, Completed and Failed count the batch's lines: all of them,
	// those answered, those that failed. Completed and Failed move only
	// with the lines' records (RecordLines), in the same transaction.
	Total, Completed, Failed int
	CreatedAt, ExpiresAt     time.Time
	// At holds when the batch entered each status it has been in (its
	// created_at is CreatedAt).
	At map[BatchStatus]time.Time
}

// LineState is where one line of a batch stands.
type LineState string

// Line states: a line is pending until its result is recorded, once.
const (
	LinePending   LineState = "pending"
	LineSucceeded LineState = "succeeded"
	LineFailed    LineState = "failed"
)

// BatchLine is one request of a batch.
type BatchLine struct {
	// Line is its 1-based position among the input file's lines.
	Line     int
	CustomID string
	// Body is the request to send.
	Body json.RawMessage
	// State and Result: the result is the line of the output (succeeded)
	// or error (failed) file, set once with the state.
	State  LineState
	Result json.RawMessage
}

// LineResult is a finished line to record.
type LineResult struct {
	Line   int
	Failed bool
	Result json.RawMessage
}

// BatchQuery selects a page of batches for Batches, newest first.
type BatchQuery struct {
	// Owner keeps only this owner's batches; it always filters ("" is the
	// owner of everything made while auth is off).
	Owner string
	// After is a batch id: the page starts after it. A missing batch, or
	// another owner's, is an error wrapping ErrNotFound.
	After string
	// Limit is the most batches returned (at least 1).
	Limit int
}

// batchTimes are the statuses with an *_at column, and their columns.
var batchTimes = []struct {
	status BatchStatus
	column string
}{
	{BatchInProgress, "in_progress_at"}, {BatchFinalizing, "finalizing_at"}, {BatchCompleted, "completed_at"},
	{BatchFailed, "failed_at"}, {BatchExpired, "expired_at"}, {BatchCancelling, "cancelling_at"}, {BatchCancelled, "cancelled_at"},
}

func batchColumns() string {
	cols := []string{"id", "owner", "models", "input_file_id", "endpoint", "completion_window", "metadata", "status", "errors",
		"output_file_id", "error_file_id", "total", "completed", "failed", "created_at", "expires_at"}
	for _, t := range batchTimes {
		cols = append(cols, t.column)
	}
	return strings.Join(cols, ", ")
}

func scanBatch(row interface{ Scan(...any) error }) (Batch, error) {
	var b Batch
	var meta, errs, models string
	var created, expires int64
	at := make([]int64, len(batchTimes))
	dest := []any{&b.ID, &b.Owner, &models, &b.InputFileID, &b.Endpoint, &b.CompletionWindow, &meta, &b.Status, &errs,
		&b.OutputFileID, &b.ErrorFileID, &b.Total, &b.Completed, &b.Failed, &created, &expires}
	for i := range at {
		dest = append(dest, &at[i])
	}
	if err := row.Scan(dest...); err != nil {
		return Batch{}, err
	}
	if meta != "" {
		b.Metadata = json.RawMessage(meta)
	}
	if models != "" {
		if err := json.Unmarshal([]byte(models), &b.Models); err != nil {
			return Batch{}, fmt.Errorf("batch %s: models: %w", b.ID, err)
		}
	}
	if errs != "" {
		b.Errors = json.RawMessage(errs)
	}
	b.CreatedAt, b.ExpiresAt = unstamp(created), unstamp(expires)
	b.At = map[BatchStatus]time.Time{}
	for i, t := range batchTimes {
		if at[i] != 0 {
			b.At[t.status] = unstamp(at[i])
		}
	}
	return b, nil
}

// CreateBatch records b in the validating status (b.Status, the counts and
// the *_at times are ignored). An id already recorded is an error wrapping
// ErrInvalid.
func (s *Store) CreateBatch(ctx context.Context, b Batch) error {
	if b.ID == "" || b.InputFileID == "" || b.Endpoint == "" || b.CompletionWindow == "" || b.ExpiresAt.IsZero() {
		return fmt.Errorf("create batch %q: %w: id, input file, endpoint, completion window and expiry are required", b.ID, ErrInvalid)
	}
	if b.CreatedAt.IsZero() {
		b.CreatedAt = s.now()
	}
	models := ""
	if len(b.Models) > 0 {
		m, err := json.Marshal(b.Models)
		if err != nil {
			return fmt.Errorf("create batch %s: %w", b.ID, err)
		}
		models = string(m)
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO batches (id, owner, models, input_file_id, endpoint, completion_window, metadata, status, created_at, expires_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, b.ID, b.Owner, models, b.InputFileID, b.Endpoint, b.CompletionWindow, string(b.Metadata),
			BatchValidating, stamp(b.CreatedAt), stamp(b.ExpiresAt))
		if err != nil {
			if isUniqueViolation(err) {
				return fmt.Errorf("create batch %s: %w: id already recorded", b.ID, ErrInvalid)
			}
			return fmt.Errorf("create batch %s: %w", b.ID, err)
		}
		return nil
	})
}

// Batch returns the batch id, whoever owns it, or an error wrapping
// ErrNotFound. Callers serving a tenant check Batch.Owner.
func (s *Store) Batch(ctx context.Context, id string) (Batch, error) {
	return readBatch(ctx, s.db, id)
}

type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func readBatch(ctx context.Context, q queryRower, id string) (Batch, error) {
	b, err := scanBatch(q.QueryRowContext(ctx, `SELECT `+batchColumns()+` FROM batches WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Batch{}, fmt.Errorf("batch %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Batch{}, fmt.Errorf("read batch %s: %w", id, err)
	}
	return b, nil
}

// Batches returns a page of q.Owner's batches, newest first, and whether
// more follow.
func (s *Store) Batches(ctx context.Context, q BatchQuery) (page []Batch, more bool, err error) {
	if q.Limit < 1 {
		return nil, false, fmt.Errorf("list batches: %w: limit %d is below 1", ErrInvalid, q.Limit)
	}
	where, args := "owner = ?", []any{q.Owner}
	if q.After != "" {
		after, err := s.Batch(ctx, q.After)
		if err == nil && after.Owner != q.Owner {
			// Another owner's batch is as unknown as a missing one.
			err = fmt.Errorf("batch %s: %w", q.After, ErrNotFound)
		}
		if err != nil {
			return nil, false, fmt.Errorf("list batches after %s: %w", q.After, err)
		}
		where, args = where+" AND (created_at, id) < (?, ?)", append(args, stamp(after.CreatedAt), after.ID)
	}
	return s.queryBatches(ctx, `SELECT `+batchColumns()+` FROM batches WHERE `+where+
		` ORDER BY created_at DESC, id DESC LIMIT ?`, q.Limit, append(args, q.Limit+1)...)
}

// UnfinishedBatches returns every batch whose status is not final, oldest
// first, whatever its owner: the work a runner has to do (or resume).
func (s *Store) UnfinishedBatches(ctx context.Context) ([]Batch, error) {
	page, _, err := s.queryBatches(ctx, `SELECT `+batchColumns()+` FROM batches
		WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling') ORDER BY created_at, id`, 0)
	return page, err
}

// queryBatches runs a batch query; with limit > 0 it keeps limit rows and
// reports whether there were more.
func (s *Store) queryBatches(ctx context.Context, query string, limit int, args ...any) ([]Batch, bool, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, false, fmt.Errorf("list batches: %w", err)
	}
	defer rows.Close()
	var page []Batch
	for rows.Next() {
		b, err := scanBatch(rows)
		if err != nil {
			return nil, false, fmt.Errorf("list batches: %w", err)
		}
		page = append(page, b)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("list batches: %w", err)
	}
	if limit > 0 && len(page) > limit {
		return page[:limit], true, nil
	}
	return page, false, nil
}

// BatchUpdate is what a move of a batch may set besides its status.
type BatchUpdate struct {
	// Errors, when set, replaces the validation errors.
	Errors json.RawMessage
	// OutputFileID and ErrorFileID, when set, name the result files.
	OutputFileID, ErrorFileID string
	// Lines, moving validating → in_progress, are the batch's lines,
	// recorded pending in the same transaction; Total becomes their count.
	Lines []BatchLine
}

// MoveBatch moves the batch id to status to, stamping its *_at time, and
// applies u, all in one transaction; it returns the batch as it now is. A
// move the status table does not allow is an error wrapping
// ErrIllegalTransition, and changes nothing.
func (s *Store) MoveBatch(ctx context.Context, id string, to BatchStatus, u BatchUpdate) (Batch, error) {
	var out Batch
	err := s.tx(ctx, func(tx *sql.Tx) error {
		b, err := readBatch(ctx, tx, id)
		if err != nil {
			return err
		}
		if !b.Status.CanMoveTo(to) {
			return fmt.Errorf("move batch %s from %s to %s: %w", id, b.Status, to, ErrIllegalTransition)
		}
		if len(u.Lines) > 0 && to != BatchInProgress {
			return fmt.Errorf("move batch %s to %s: %w: lines are recorded only when it starts", id, to, ErrInvalid)
		}
		if err := insertLines(ctx, tx, id, u.Lines); err != nil {
			return err
		}
		column := ""
		for _, t := range batchTimes {
			if t.status == to {
				column = t.column
			}
		}
		set := []string{"status = ?", column + " = ?"}
		args := []any{to, stamp(s.now())}
		if u.Errors != nil {
			set, args = append(set, "errors = ?"), append(args, string(u.Errors))
		}
		if u.OutputFileID != "" {
			set, args = append(set, "output_file_id = ?"), append(args, u.OutputFileID)
		}
		if u.ErrorFileID != "" {
			set, args = append(set, "error_file_id = ?"), append(args, u.ErrorFileID)
		}
		if to == BatchInProgress {
			set, args = append(set, "total = ?"), append(args, len(u.Lines))
		}
		if _, err := tx.ExecContext(ctx, `UPDATE batches SET `+strings.Join(set, ", ")+` WHERE id = ?`, append(args, id)...); err != nil {
			return fmt.Errorf("move batch %s to %s: %w", id, to, err)
		}
		out, err = readBatch(ctx, tx, id)
		return err
	})
	return out, err
}

func insertLines(ctx context.Context, tx *sql.Tx, id string, lines []BatchLine) error {
	if len(lines) == 0 {
		return nil
	}
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO batch_lines (batch_id, line, custom_id, body, state) VALUES (?, ?, ?, ?, 'pending')`)
	if err != nil {
		return fmt.Errorf("record lines of batch %s: %w", id, err)
	}
	defer stmt.Close()
	for _, l := range lines {
		if _, err := stmt.ExecContext(ctx, id, l.Line, l.CustomID, string(l.Body)); err != nil {
			if isUniqueViolation(err) {
				return fmt.Errorf("record line %d of batch %s: %w: custom_id %q or line already recorded", l.Line, id, ErrInvalid, l.CustomID)
			}
			return fmt.Errorf("record line %d of batch %s: %w", l.Line, id, err)
		}
	}
	return nil
}

// RecordLines records finished lines of the batch id, each only if it is
// still pending, and counts them in the batch's request counts, all in one
// transaction; it returns how many it recorded. A line already recorded is
// skipped (it keeps its first result): each line has exactly one. Lines
// are recorded only while the batch runs or is being cancelled or expired
// (in_progress, cancelling); otherwise nothing is and the error wraps
// ErrIllegalTransition.
func (s *Store) RecordLines(ctx context.Context, id string, results []LineResult) (int, error) {
	recorded := 0
	err := s.tx(ctx, func(tx *sql.Tx) error {
		recorded = 0
		var status BatchStatus
		err := tx.QueryRowContext(ctx, `SELECT status FROM batches WHERE id = ?`, id).Scan(&status)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("record lines of batch %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("record lines of batch %s: %w", id, err)
		}
		if status != BatchInProgress && status != BatchCancelling {
			return fmt.Errorf("record lines of batch %s: %w: it is %s", id, ErrIllegalTransition, status)
		}
		stmt, err := tx.PrepareContext(ctx, `UPDATE batch_lines SET state = ?, result = ? WHERE batch_id = ? AND line = ? AND state = 'pending'`)
		if err != nil {
			return fmt.Errorf("record lines of batch %s: %w", id, err)
		}
		defer stmt.Close()
		var completed, failed int
		for _, r := range results {
			state := LineSucceeded
			if r.Failed {
				state = LineFailed
			}
			res, err := stmt.ExecContext(ctx, state, string(r.Result), id, r.Line)
			if err != nil {
				return fmt.Errorf("record line %d of batch %s: %w", r.Line, id, err)
			}
			if n, _ := res.RowsAffected(); n == 1 {
				if r.Failed {
					failed++
				} else {
					completed++
				}
			}
		}
		if _, err := tx.ExecContext(ctx, `UPDATE batches SET completed = completed + ?, failed = failed + ? WHERE id = ?`, completed, failed, id); err != nil {
			return fmt.Errorf("count lines of batch %s: %w", id, err)
		}
		recorded = completed + failed
		return nil
	})
	return recorded, err
}

// BatchLines returns up to limit lines of the batch id in state, in line
// order, starting after line after (0: from the first).
func (s *Store) BatchLines(ctx context.Context, id string, state LineState, after, limit int) ([]BatchLine, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT line, custom_id, body, state, result FROM batch_lines
		WHERE batch_id = ? AND state = ? AND line > ? ORDER BY line LIMIT ?`, id, state, after, limit)
	if err != nil {
		return nil, fmt.Errorf("read lines of batch %s: %w", id, err)
	}
	defer rows.Close()
	var out []BatchLine
	for rows.Next() {
		var l BatchLine
		var body, result string
		if err := rows.Scan(&l.Line, &l.CustomID, &body, &l.State, &result); err != nil {
			return nil, fmt.Errorf("read lines of batch %s: %w", id, err)
		}
		l.Body = json.RawMessage(body)
		if result != "" {
			l.Result = json.RawMessage(result)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read lines of batch %s: %w", id, err)
	}
	return out, nil
}
