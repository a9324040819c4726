// Package files is the store behind /v1/files: uploaded files' content in a
// blob store (a weightstore bucket, file:// or s3://) and their metadata in
// the state store. It has no HTTP in it; api/ serves it.
//
// An upload streams into the blob store while its bytes and lines are
// counted; past a limit it is refused and its blob removed. The blob is
// written first and the metadata row last, so a file is listed only once
// its content is complete. A crash between the two leaves a blob without
// a row: garbage that Sweep deletes (serve runs it at start).
//
// Only purpose "batch" is accepted: it is the only one stoke has a use for.
// Upload checks size, line count and the .jsonl name, as OpenAI does; the
// lines themselves (JSON, custom_id, method, url, body) are checked when a
// batch is created from the file (its "validating" status).
//
// Every file has an owner (a tenant's id; "" while auth is off), given
// when it is created. Get, Open, Delete and List take the caller's owner
// and see only that owner's files: another owner's file is ErrNotFound,
// exactly as an unknown id is.
package files

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/stokehq/stoke/internal/store"
	"github.com/stokehq/stoke/weightstore/bucket"
)

// Limits of a batch input file, as OpenAI's.
const (
	// DefaultMaxBytes is the largest file accepted: 200 MB (MiB, so that
	// every file OpenAI accepts is accepted here too).
	DefaultMaxBytes = 200 << 20
	// DefaultMaxLines is the most non-empty lines (requests) a file holds.
	DefaultMaxLines = 50_000
)

// PurposeBatch is the one purpose accepted from clients.
const PurposeBatch = "batch"

// PurposeBatchOutput is the purpose of a batch's output and error files,
// which the platform writes (CreateOutput); clients read and delete them.
const PurposeBatchOutput = "batch_output"

// IDPrefix starts every file id.
const IDPrefix = "file-"

// Sentinel errors, matched with errors.Is. Read-only.
var (
	// ErrNotFound reports an unknown file id, or another owner's.
	ErrNotFound = errors.New("no such file")
	// ErrTooLarge reports a file over the byte limit.
	ErrTooLarge = errors.New("file too large")
	// ErrTooManyLines reports a file over the line limit.
	ErrTooManyLines = errors.New("file has too many lines")
	// ErrPurpose reports a purpose other than "batch".
	ErrPurpose = errors.New("unsupported purpose")
	// ErrBadFile reports an upload that is not a usable file (empty, or a
	// batch file not named *.jsonl).
	ErrBadFile = errors.New("invalid file")
)

// File is an uploaded file's metadata.
type File = store.File

// Options configure a Store.
type Options struct {
	// Blobs holds the content.
	Blobs bucket.Bucket
	// Meta holds the metadata.
	Meta *store.Store
	// MaxBytes is the largest file accepted (0: DefaultMaxBytes).
	MaxBytes int64
	// MaxLines is the most non-empty lines accepted (0: DefaultMaxLines).
	MaxLines int
	// SpoolDir holds uploads to a blob store that is not file:// while
	// they are counted, so that the blob store is given a known size
	// (minio-go buffers a 512 MiB part in memory for an unknown one).
	// Empty: os.TempDir().
	SpoolDir string
	// Now stamps created_at (default time.Now).
	Now func() time.Time
}

// Store is the files store. It is safe for concurrent use.
type Store struct {
	o     Options
	spool bool
}

// New returns a Store on o's blob and state stores.
func New(o Options) (*Store, error) {
	if o.Blobs == nil || o.Meta == nil {
		return nil, errors.New("new files store: blob store and state store are required")
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxLines <= 0 {
		o.MaxLines = DefaultMaxLines
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Store{o: o, spool: !strings.HasPrefix(o.Blobs.URL(), "file://")}, nil
}

// MaxBytes is the largest file accepted.
func (s *Store) MaxBytes() int64 { return s.o.MaxBytes }

// MaxLines is the most non-empty lines a file may hold.
func (s *Store) MaxLines() int { return s.o.MaxLines }

// CheckPurpose reports (ErrPurpose) a purpose the store does not take.
func CheckPurpose(purpose string) error {
	if purpose != PurposeBatch {
		return fmt.Errorf("%w %q: stoke accepts purpose %q only", ErrPurpose, purpose, PurposeBatch)
	}
	return nil
}

// Create stores the content of r as a new file of owner named name:
// Stage, then Commit.
func (s *Store) Create(ctx context.Context, owner, name, purpose string, r io.Reader) (File, error) {
	if err := CheckPurpose(purpose); err != nil {
		return File{}, fmt.Errorf("create file %q: %w", name, err)
	}
	u, err := s.Stage(ctx, owner, name, r)
	if err != nil {
		return File{}, err
	}
	return u.Commit(ctx, purpose)
}

// Upload is a file whose content is stored but which is not recorded (nor
// listed) yet: Commit records it, Abort removes its content.
type Upload struct {
	s *Store
	f File
}

// Stage streams r into the blob store under a new id, counting its bytes
// and lines, for a file of owner that Commit records; past a limit
// (ErrTooLarge, ErrTooManyLines) nothing is left behind. It lets a caller
// read the content before the purpose (a multipart form may send them in
// either order).
func (s *Store) Stage(ctx context.Context, owner, name string, r io.Reader) (*Upload, error) {
	return s.stage(ctx, owner, name, r, s.o.MaxBytes, s.o.MaxLines)
}

// stage is Stage with the limits given.
func (s *Store) stage(ctx context.Context, owner, name string, r io.Reader, maxBytes int64, maxLines int) (*Upload, error) {
	if name == "" {
		return nil, fmt.Errorf("stage file: %w: no filename", ErrBadFile)
	}
	id, err := newID()
	if err != nil {
		return nil, fmt.Errorf("stage file %q: %w", name, err)
	}
	f := File{ID: id, Owner: owner, Filename: name, BlobKey: id}
	cr := &counter{r: r, maxBytes: maxBytes, maxLines: maxLines}
	if err := s.put(ctx, f.BlobKey, cr); err != nil {
		// A limit error may have been wrapped by the blob store; report it
		// plainly.
		if cr.err != nil {
			err = cr.err
		}
		s.o.Blobs.Delete(context.WithoutCancel(ctx), f.BlobKey)
		return nil, fmt.Errorf("stage file %q: %w", name, err)
	}
	f.Bytes, f.Lines = cr.n, cr.lines
	return &Upload{s: s, f: f}, nil
}

// put writes the counted stream under key: straight into a file://
// store, through a spool file for the others.
func (s *Store) put(ctx context.Context, key string, cr *counter) error {
	if !s.spool {
		return s.o.Blobs.Put(ctx, key, cr, -1)
	}
	tmp, err := os.CreateTemp(s.o.SpoolDir, "stoke-upload-*")
	if err != nil {
		return fmt.Errorf("spool upload: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if _, err := io.Copy(tmp, cr); err != nil {
		return fmt.Errorf("spool upload: %w", err)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("spool upload: %w", err)
	}
	return s.o.Blobs.Put(ctx, key, tmp, cr.n)
}

// Commit records the file, of the owner it was staged for, with purpose
// and returns it; on an error (ErrPurpose, ErrBadFile, the state store's)
// its content is removed.
func (u *Upload) Commit(ctx context.Context, purpose string) (File, error) {
	f := u.f
	f.Purpose = purpose
	err := CheckPurpose(purpose)
	switch {
	case err != nil:
	case f.Bytes == 0:
		err = fmt.Errorf("%w: the file is empty", ErrBadFile)
	case purpose == PurposeBatch && !strings.HasSuffix(strings.ToLower(f.Filename), ".jsonl"):
		err = fmt.Errorf("%w: a batch input file must be JSONL, named *.jsonl (got %q)", ErrBadFile, f.Filename)
	}
	if err == nil {
		// As the state store gives it back: UTC, no monotonic reading.
		f.CreatedAt = u.s.o.Now().UTC().Round(0)
		err = u.s.o.Meta.CreateFile(ctx, f)
	}
	if err != nil {
		u.Abort(ctx)
		return File{}, fmt.Errorf("create file %q: %w", f.Filename, err)
	}
	return f, nil
}

// CreateOutput stores the content of r as a new file of owner (the
// batch's) named name with purpose batch_output: a batch's output or error
// file, written by the platform, so without the upload limits (an answer
// is longer than its request).
func (s *Store) CreateOutput(ctx context.Context, owner, name string, r io.Reader) (File, error) {
	u, err := s.stage(ctx, owner, name, r, math.MaxInt64, math.MaxInt)
	if err != nil {
		return File{}, err
	}
	f := u.f
	f.Purpose = PurposeBatchOutput
	f.CreatedAt = s.o.Now().UTC().Round(0)
	if err := s.o.Meta.CreateFile(ctx, f); err != nil {
		u.Abort(ctx)
		return File{}, fmt.Errorf("create output file %q: %w", name, err)
	}
	return f, nil
}

// Abort removes the staged content.
func (u *Upload) Abort(ctx context.Context) error {
	if err := u.s.o.Blobs.Delete(context.WithoutCancel(ctx), u.f.BlobKey); err != nil {
		return fmt.Errorf("abort upload %s: %w", u.f.ID, err)
	}
	return nil
}

// Get returns owner's file id, or an error wrapping ErrNotFound (for
// another owner's file too).
func (s *Store) Get(ctx context.Context, owner, id string) (File, error) {
	f, err := s.o.Meta.File(ctx, id)
	if err == nil && f.Owner != owner {
		err = store.ErrNotFound
	}
	if err != nil {
		return File{}, notFound(id, err)
	}
	return f, nil
}

// notFound is err, turned into ErrNotFound (with nothing of the owner's
// in it) when it wraps the state store's.
func notFound(id string, err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("file %s: %w", id, ErrNotFound)
	}
	return err // the state store's, which names the file
}

// ListOptions select a page of List.
type ListOptions struct {
	// Purpose keeps only files of this purpose; empty keeps all.
	Purpose string
	// After is the id the page starts after (an unknown one, or another
	// owner's, is ErrNotFound).
	After string
	// Limit is the page's most files (at least 1).
	Limit int
	// Asc orders oldest first; the default (as OpenAI's) is newest first.
	Asc bool
}

// List returns a page of owner's files and whether more follow.
func (s *Store) List(ctx context.Context, owner string, o ListOptions) ([]File, bool, error) {
	page, more, err := s.o.Meta.Files(ctx, store.FileQuery{Owner: owner, Purpose: o.Purpose, After: o.After, Limit: o.Limit, Desc: !o.Asc})
	if err != nil {
		return nil, false, notFound(o.After, err)
	}
	return page, more, nil
}

// Open returns owner's file id and a reader of its content, which the
// caller closes; another owner's file is ErrNotFound.
func (s *Store) Open(ctx context.Context, owner, id string) (File, io.ReadCloser, error) {
	f, err := s.Get(ctx, owner, id)
	if err != nil {
		return File{}, nil, err
	}
	rc, err := s.o.Blobs.ReadRange(ctx, f.BlobKey, 0, -1)
	if err != nil {
		return File{}, nil, fmt.Errorf("open file %s: %w", id, err)
	}
	return f, rc, nil
}

// Delete removes owner's file id (another owner's is ErrNotFound): its row
// first (it is no longer listed), then its content (a crash in between
// leaves garbage for Sweep).
func (s *Store) Delete(ctx context.Context, owner, id string) (File, error) {
	// The owner is checked before the row goes: a file's owner never
	// changes and its id is never reused, so the check holds for the
	// delete.
	if _, err := s.Get(ctx, owner, id); err != nil {
		return File{}, err
	}
	f, err := s.o.Meta.DeleteFile(ctx, id)
	if err != nil {
		return File{}, notFound(id, err)
	}
	if err := s.o.Blobs.Delete(ctx, f.BlobKey); err != nil {
		return f, fmt.Errorf("delete content of file %s: %w", id, err)
	}
	return f, nil
}

// Sweep deletes the blobs that no file row names (left by a crash between
// writing the content and recording it, or between forgetting a file and
// deleting its content) and that are older than grace, so that uploads in
// flight (here or on another gateway) are spared. It returns how many it
// deleted.
func (s *Store) Sweep(ctx context.Context, grace time.Duration) (int, error) {
	objs, err := s.o.Blobs.List(ctx, IDPrefix)
	if err != nil {
		return 0, fmt.Errorf("sweep files: %w", err)
	}
	cutoff := s.o.Now().Add(-grace)
	n := 0
	for _, o := range objs {
		if o.LastModified.After(cutoff) {
			continue
		}
		_, err := s.o.Meta.File(ctx, o.Key)
		if err == nil {
			continue
		}
		if !errors.Is(err, store.ErrNotFound) {
			return n, fmt.Errorf("sweep files: %w", err)
		}
		if err := s.o.Blobs.Delete(ctx, o.Key); err != nil {
			return n, fmt.Errorf("sweep files: %w", err)
		}
		n++
	}
	return n, nil
}

// newID is "file-" and 128 random bits in lower-case base32 (26 chars).
func newID() (string, error) {
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	var b [17]byte // 136 bits: 26 chars of 5 bits use 130 of them
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("new file id: %w", err)
	}
	out := make([]byte, 0, len(IDPrefix)+26)
	out = append(out, IDPrefix...)
	var acc uint64
	bits := 0
	for _, c := range b {
		acc = acc<<8 | uint64(c)
		bits += 8
		for bits >= 5 && len(out) < len(IDPrefix)+26 {
			bits -= 5
			out = append(out, alphabet[acc>>bits&31])
		}
	}
	return string(out), nil
}

// counter passes a stream through, counting bytes and non-empty lines, and
// fails it once past a limit.
type counter struct {
	r        io.Reader
	maxBytes int64
	maxLines int
	n        int64
	lines    int
	inLine   bool // the current line has a byte other than '\r'
	err      error
}

func (c *counter) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	k, err := c.r.Read(p)
	c.n += int64(k)
	for _, b := range p[:k] {
		switch b {
		case '\n':
			c.inLine = false
		case '\r':
		default:
			if !c.inLine {
				c.inLine = true
				c.lines++
			}
		}
	}
	switch {
	case c.n > c.maxBytes:
		c.err = fmt.Errorf("%w: over the limit of %d bytes", ErrTooLarge, c.maxBytes)
	case c.lines > c.maxLines:
		c.err = fmt.Errorf("%w: over the limit of %d lines", ErrTooManyLines, c.maxLines)
	}
	if c.err != nil {
		return 0, c.err
	}
	return k, err
}
