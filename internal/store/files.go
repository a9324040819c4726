package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// File is the metadata of an uploaded file (/v1/files); its content is a
// blob in the files store under BlobKey.
type File struct {
	// ID is the file's id ("file-…").
	ID string
	// Owner is the tenant the file belongs to ("" while auth is off).
	Owner string
	// Filename is the name the client uploaded it with.
	Filename string
	// Purpose is what it is for ("batch").
	Purpose string
	// Bytes is its length.
	Bytes int64
	// Lines is how many non-empty lines it holds.
	Lines int
	// BlobKey is the key of its content in the files store.
	BlobKey string
	// CreatedAt is when it was recorded (set by CreateFile when zero).
	CreatedAt time.Time
}

// FileQuery selects a page of files for Files.
type FileQuery struct {
	// Owner keeps only this owner's files; it always filters ("" is the
	// owner of everything made while auth is off).
	Owner string
	// Purpose keeps only the files of this purpose; empty keeps all.
	Purpose string
	// After is a file id: the page starts after it, in the page's order.
	// A missing file, or another owner's, is an error wrapping ErrNotFound.
	After string
	// Limit is the most files returned (at least 1).
	Limit int
	// Desc orders newest first; otherwise oldest first.
	Desc bool
}

// CreateFile records a file. An id already recorded is an error wrapping
// ErrInvalid.
func (s *Store) CreateFile(ctx context.Context, f File) error {
	if f.ID == "" || f.BlobKey == "" || f.Purpose == "" || f.Bytes < 0 || f.Lines < 0 {
		return fmt.Errorf("create file %q: %w: id, blob key and purpose are required, sizes non-negative", f.ID, ErrInvalid)
	}
	if f.CreatedAt.IsZero() {
		f.CreatedAt = s.now()
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO files (id, owner, filename, purpose, bytes, lines, blob_key, created_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, f.ID, f.Owner, f.Filename, f.Purpose, f.Bytes, f.Lines, f.BlobKey, stamp(f.CreatedAt))
		if err != nil {
			if isUniqueViolation(err) {
				return fmt.Errorf("create file %s: %w: id already recorded", f.ID, ErrInvalid)
			}
			return fmt.Errorf("create file %s: %w", f.ID, err)
		}
		return nil
	})
}

const fileColumns = `id, owner, filename, purpose, bytes, lines, blob_key, created_at`

func scanFile(row interface{ Scan(...any) error }) (File, error) {
	var f File
	var created int64
	if err := row.Scan(&f.ID, &f.Owner, &f.Filename, &f.Purpose, &f.Bytes, &f.Lines, &f.BlobKey, &created); err != nil {
		return File{}, err
	}
	f.CreatedAt = unstamp(created)
	return f, nil
}

// File returns the file id, whoever owns it, or an error wrapping
// ErrNotFound. Callers serving a tenant check File.Owner.
func (s *Store) File(ctx context.Context, id string) (File, error) {
	f, err := scanFile(s.db.QueryRowContext(ctx, `SELECT `+fileColumns+` FROM files WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return File{}, fmt.Errorf("file %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return File{}, fmt.Errorf("read file %s: %w", id, err)
	}
	return f, nil
}

// Files returns a page of q.Owner's files ordered by creation time (then
// id), and whether more follow it.
func (s *Store) Files(ctx context.Context, q FileQuery) (page []File, more bool, err error) {
	if q.Limit < 1 {
		return nil, false, fmt.Errorf("list files: %w: limit %d is below 1", ErrInvalid, q.Limit)
	}
	cmp, order := ">", "ASC"
	if q.Desc {
		cmp, order = "<", "DESC"
	}
	where, args := []string{"owner = ?"}, []any{q.Owner}
	if q.Purpose != "" {
		where, args = append(where, "purpose = ?"), append(args, q.Purpose)
	}
	if q.After != "" {
		after, err := s.File(ctx, q.After)
		if err == nil && after.Owner != q.Owner {
			// Another owner's file is as unknown as a missing one.
			err = fmt.Errorf("file %s: %w", q.After, ErrNotFound)
		}
		if err != nil {
			return nil, false, fmt.Errorf("list files after %s: %w", q.After, err)
		}
		where = append(where, "(created_at, id) "+cmp+" (?, ?)")
		args = append(args, stamp(after.CreatedAt), after.ID)
	}
	args = append(args, q.Limit+1)
	rows, err := s.db.QueryContext(ctx, `SELECT `+fileColumns+` FROM files WHERE `+strings.Join(where, " AND ")+
		` ORDER BY created_at `+order+`, id `+order+` LIMIT ?`, args...)
	if err != nil {
		return nil, false, fmt.Errorf("list files: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		f, err := scanFile(rows)
		if err != nil {
			return nil, false, fmt.Errorf("list files: %w", err)
		}
		page = append(page, f)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("list files: %w", err)
	}
	if len(page) > q.Limit {
		return page[:q.Limit], true, nil
	}
	return page, false, nil
}

// DeleteFile forgets the file id, whoever owns it, and returns what it
// was, or an error wrapping ErrNotFound. Callers serving a tenant check
// the owner first (File): an owner never changes, nor is an id reused.
func (s *Store) DeleteFile(ctx context.Context, id string) (File, error) {
	var f File
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var err error
		f, err = scanFile(tx.QueryRowContext(ctx, `DELETE FROM files WHERE id = ? RETURNING `+fileColumns, id))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("delete file %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("delete file %s: %w", id, err)
		}
		return nil
	})
	return f, err
}
