// Package manifest is the format of manifest.json, the file `stoke push`
// writes last into a model's bucket prefix as the commit point of a
// revision: the model's name, its revision digest, every file with its size
// and sha256, the total size, the weights' dtype and the optional stoke.yaml
// deployment spec.
package manifest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stokehq/stoke/internal/ctxio"
	"github.com/stokehq/stoke/internal/dtype"
)

// FileName is the manifest's object key inside a model's prefix.
const FileName = "manifest.json"

// RevisionPrefix starts every revision digest.
const RevisionPrefix = "sha256:"

// AdaptersDir is the folder of a model's prefix that holds its LoRA
// adapters, one prefix each: BASE/adapters/NAME/, with a manifest of its
// own.
const AdaptersDir = "adapters"

// File is one file of a revision.
type File struct {
	// Name is a plain file name (no directories) inside the model's prefix.
	Name string `json:"name"`
	// Size is the file's length in bytes.
	Size int64 `json:"size"`
	// SHA256 is the lowercase hex sha256 of the file's content.
	SHA256 string `json:"sha256"`
}

// Manifest describes one immutable revision of a model.
type Manifest struct {
	// Model is the model's name: the last element of the bucket prefix.
	Model string `json:"model"`
	// Revision is Revision(Files).
	Revision string `json:"revision"`
	// Files lists every file of the revision except the manifest itself.
	Files []File `json:"files"`
	// TotalBytes is the sum of the files' sizes.
	TotalBytes int64 `json:"total_bytes"`
	// DType is the safetensors name of the projection weights' dtype
	// ("BF16", "F8_E4M3", …).
	DType string `json:"dtype"`
	// Spec is the stoke.yaml deployment spec converted to a JSON object,
	// or empty when none was pushed.
	Spec json.RawMessage `json:"spec,omitempty"`
	// Base, set on an adapter's manifest, names the model the adapter
	// applies to, and BaseRevision the revision it was checked against
	// when pushed.
	Base         string `json:"base,omitempty"`
	BaseRevision string `json:"base_revision,omitempty"`
	// CreatedAt is when the manifest was written.
	CreatedAt time.Time `json:"created_at"`
}

// Revision is the digest of a file list: "sha256:" and the hex sha256 of the
// lines "name\x00size\x00sha256\n" sorted. Identical content gives an
// identical revision whatever the order of files.
func Revision(files []File) string {
	lines := make([]string, len(files))
	for i, f := range files {
		lines[i] = f.Name + "\x00" + strconv.FormatInt(f.Size, 10) + "\x00" + f.SHA256 + "\n"
	}
	slices.Sort(lines)
	h := sha256.New()
	for _, l := range lines {
		h.Write([]byte(l))
	}
	return RevisionPrefix + hex.EncodeToString(h.Sum(nil))
}

// Hash reads r to its end, as a file's content, and returns its size and
// lowercase hex sha256 (File.Size and File.SHA256); it stops when ctx ends.
func Hash(ctx context.Context, r io.Reader) (size int64, sum string, err error) {
	h := sha256.New()
	size, err = io.CopyBuffer(h, ctxio.Reader(ctx, r), make([]byte, 1<<20))
	if err != nil {
		return 0, "", err
	}
	return size, hex.EncodeToString(h.Sum(nil)), nil
}

// Parse decodes and validates a manifest.
func Parse(data []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("parse %s: %w", FileName, err)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("parse %s: %w", FileName, err)
	}
	return &m, nil
}

// Marshal validates m and encodes it as indented JSON.
func (m *Manifest) Marshal() ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("marshal %s: %w", FileName, err)
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("marshal %s: %w", FileName, err)
	}
	return append(data, '\n'), nil
}

// Validate checks every field; the error names the first bad one.
func (m *Manifest) Validate() error {
	if err := CheckName(m.Model); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	if len(m.Files) == 0 {
		return errors.New("files: empty")
	}
	seen := make(map[string]int, len(m.Files))
	var total int64
	for i, f := range m.Files {
		if err := CheckName(f.Name); err != nil {
			return fmt.Errorf("files[%d].name: %w", i, err)
		}
		if f.Name == FileName {
			return fmt.Errorf("files[%d].name: %q is the manifest itself", i, f.Name)
		}
		if j, ok := seen[f.Name]; ok {
			return fmt.Errorf("files[%d].name: %q duplicates files[%d]", i, f.Name, j)
		}
		seen[f.Name] = i
		if f.Size < 0 {
			return fmt.Errorf("files[%d].size: %d is negative (file %s)", i, f.Size, f.Name)
		}
		if err := checkHex(f.SHA256); err != nil {
			return fmt.Errorf("files[%d].sha256: %w (file %s)", i, err, f.Name)
		}
		if total+f.Size < total {
			return fmt.Errorf("files[%d].size: total overflows (file %s)", i, f.Name)
		}
		total += f.Size
	}
	if m.TotalBytes != total {
		return fmt.Errorf("total_bytes: %d, but the files add up to %d", m.TotalBytes, total)
	}
	if !strings.HasPrefix(m.Revision, RevisionPrefix) {
		return fmt.Errorf("revision: %q does not start with %q", m.Revision, RevisionPrefix)
	}
	if err := checkHex(strings.TrimPrefix(m.Revision, RevisionPrefix)); err != nil {
		return fmt.Errorf("revision: %w", err)
	}
	if want := Revision(m.Files); m.Revision != want {
		return fmt.Errorf("revision: %s does not match the files (their digest is %s)", m.Revision, want)
	}
	if _, err := dtype.Parse(m.DType); err != nil {
		return fmt.Errorf("dtype: %w", err)
	}
	if len(m.Spec) > 0 {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(m.Spec, &obj); err != nil || obj == nil {
			return errors.New("spec: not a JSON object")
		}
	}
	if m.CreatedAt.IsZero() {
		return errors.New("created_at: missing")
	}
	return nil
}

// CheckName reports whether name is a plain file name: not empty, not "."
// or "..", without '/', '\\', NUL or other control characters.
func CheckName(name string) error {
	switch name {
	case "":
		return errors.New("empty name")
	case ".", "..":
		return fmt.Errorf("%q is not a file name", name)
	}
	if i := strings.IndexFunc(name, func(r rune) bool { return r == '/' || r == '\\' || r < 0x20 || r == 0x7f }); i >= 0 {
		return fmt.Errorf("%q is not a plain file name (character %q at byte %d)", name, name[i], i)
	}
	return nil
}

// checkHex reports whether s is a lowercase hex sha256 digest.
func checkHex(s string) error {
	if len(s) != 2*sha256.Size {
		return fmt.Errorf("%q is not a sha256 digest (want %d hex digits, got %d characters)", s, 2*sha256.Size, len(s))
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return !('0' <= r && r <= '9' || 'a' <= r && r <= 'f') }); i >= 0 {
		return fmt.Errorf("%q is not a sha256 digest (want lowercase hex, byte %d is %q)", s, i, s[i])
	}
	return nil
}
